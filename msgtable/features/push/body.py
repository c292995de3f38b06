"""What a push POSTs: a CloudEvents batch (JSON batch mode), signed the Standard Webhooks way.

Each message is one event (CloudEvents 1.0): ``id`` ``<table>/<message id>`` (the same on
every attempt), ``source`` ``msgtable://<database>/<table>[/<subscription>]``, ``type``
``msgtable.message``, ``time`` (the message's time_created, else the send time, RFC 3339),
``datacontenttype`` application/json, ``data`` the message's columns (bytes as base64, times
ISO 8601, decimals as strings), and the extensions ``attempt`` (1 on the first send) and
``orderkey`` (an ordered table's key, as text). The body is one JSON array of them, content
type ``application/cloudevents-batch+json``.

The signature (https://www.standardwebhooks.com): ``webhook-id`` (one id per batch attempt),
``webhook-timestamp`` (unix seconds) and ``webhook-signature`` ``v1,<base64 of
HMAC-SHA256(secret, "<id>.<timestamp>.<body>")>``. A secret ``whsec_<base64>`` is those bytes
(the Standard Webhooks form); any other secret is its UTF-8 bytes. Written with hmac rather
than the ``standardwebhooks`` package, which pulls an HTTP client and its own dependencies
in for these ten lines.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import hashlib
import hmac
import json
from collections.abc import Sequence
from typing import Any

from msgtable.errors import InvalidArgument

CONTENT_TYPE = "application/cloudevents-batch+json"
EVENT_TYPE = "msgtable.message"
SECRET_PREFIX = "whsec_"
MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 512


def secret_bytes(secret: str) -> bytes:
    """The key of ``secret``; InvalidArgument (never quoting it) when it is not usable."""
    if not isinstance(secret, str) or not secret:
        raise InvalidArgument("an endpoint needs a secret (--secret-file or MSGTABLE_PUSH_SECRET)")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in secret):
        raise InvalidArgument("the endpoint secret has a control character (a newline?)")
    if secret.startswith(SECRET_PREFIX):
        try:
            key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgument(
                "the endpoint secret starts with whsec_ but the rest is not base64"
            ) from None
    else:
        key = secret.encode("utf-8")
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise InvalidArgument(
            f"the endpoint secret must be {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes, "
            f"not {len(key)}"
        )
    return key


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header of one request."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def headers(key: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """Every header of one push request."""
    return {
        "content-type": CONTENT_TYPE,
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(key, msg_id, timestamp, body),
    }


def _json(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, set | frozenset):
        return sorted(value)
    return value


def _time(ns: int) -> str:
    t = dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC)
    return t.isoformat(timespec="microseconds").replace("+00:00", "Z")


class BatchEncoder:
    """Builds the body of one endpoint's batches (the parts that never change, once)."""

    def __init__(
        self,
        database: str,
        table: str,
        subscription: str,
        columns: Sequence[str],
        order_key: str = "",
    ) -> None:
        self.table = table
        self.source = f"msgtable://{database}/{table}" + (
            f"/{subscription}" if subscription else ""
        )
        self.columns = tuple(columns)
        self._created = self.columns.index("time_created") if "time_created" in columns else -1
        self._key = self.columns.index(order_key) if order_key in columns else -1

    def events(
        self, rows: Sequence[Sequence[Any]], attempts: Sequence[int], now_ns: int
    ) -> list[dict[str, Any]]:
        out = []
        for values, attempt in zip(rows, attempts, strict=True):
            created = values[self._created] if self._created >= 0 else None
            event: dict[str, Any] = {
                "specversion": "1.0",
                "id": f"{self.table}/{values[0]}",
                "source": self.source,
                "type": EVENT_TYPE,
                "time": _time(created if isinstance(created, int) and created > 0 else now_ns),
                "datacontenttype": "application/json",
                "attempt": attempt,
                "data": {c: _json(v) for c, v in zip(self.columns, values, strict=True)},
            }
            if self._key >= 0 and values[self._key] is not None:
                event["orderkey"] = str(_json(values[self._key]))
            out.append(event)
        return out

    def body(self, rows: Sequence[Sequence[Any]], attempts: Sequence[int], now_ns: int) -> bytes:
        events = self.events(rows, attempts, now_ns)
        return json.dumps(events, separators=(",", ":"), default=str).encode("utf-8")
