"""Calls for a table another server sends, forwarded to that server's SQS API.

With several servers on one database (msgtable.engine.placement) one server sends each
table, and it alone hands out its messages and knows the deliveries it handed out
(msgtable.server.sqs.handles). Every server advertises its API's address in the placement;
a ReceiveMessage, DeleteMessage(Batch) or ChangeMessageVisibility(Batch) at a server that
does not send the queue's table goes to the API of the server that does, as the client sent
it (its body and headers, its signature with them), and the answer comes back as it came.
SendMessage needs no sender (an INSERT): every server answers it itself.

A forwarded call carries :data:`FORWARDED` and is never forwarded again: a server that no
longer sends the table (a hand-over since) answers it itself, ServiceUnavailable (503, which
SDKs retry) at worst. A handle received through one server deletes at any other: the new
sender does not know it, and checks it against the table (msgtable.server.sqs.handles), so
a hand-over never loses or doubles an ack.
"""

from __future__ import annotations

import http.client
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from msgtable.server.sqs.protocol import SqsError

FORWARDED = "x-msgtable-forwarded"  # the header a forwarded call carries
ENVIRON_KEY = "HTTP_X_MSGTABLE_FORWARDED"
# Past the longest receive (WaitTimeSeconds 20): a sender that says nothing for this long is
# taken as gone
TIMEOUT_S = 50.0
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
    "content-length",
}
_ANSWER_HEADERS = ("content-type", "x-amzn-requestid", "x-amzn-query-error")


class Elsewhere(Exception):
    """Raised by an action: the call belongs to the SQS API at ``address`` (the sender of
    ``table``)."""

    def __init__(self, address: str, table: str) -> None:
        super().__init__(address)
        self.address = address
        self.table = table


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    headers: list[tuple[str, str]]


def forwarded(environ: Mapping[str, Any]) -> bool:
    return bool(environ.get(ENVIRON_KEY))


def forward(
    to: Elsewhere, environ: Mapping[str, Any], body: bytes, timeout_s: float = TIMEOUT_S
) -> Answer:
    """The answer of the API at ``to.address`` to the request (``environ``, ``body``) as it
    came; ServiceUnavailable when that server does not answer."""
    host, _, port = to.address.rpartition(":")
    uri = str(environ.get("REQUEST_URI") or environ.get("RAW_URI") or "")
    if not uri:
        uri = str(environ.get("PATH_INFO") or "/")
        if environ.get("QUERY_STRING"):
            uri += "?" + str(environ["QUERY_STRING"])
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout_s)
    try:
        conn.putrequest("POST", uri, skip_host=True, skip_accept_encoding=True)
        for name, value in _headers(environ):
            conn.putheader(name, value)
        conn.putheader(FORWARDED, "1")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        data = response.read()
        headers = [(k, v) for k, v in response.getheaders() if k.lower() in _ANSWER_HEADERS]
        return Answer(response.status, data, headers)
    except (OSError, http.client.HTTPException) as exc:
        raise SqsError(
            "ServiceUnavailable",
            f"the server that sends table {to.table} (its SQS API at {to.address}) did not "
            f"answer ({type(exc).__name__}: {exc}); retry: another server takes the table over "
            "if it is gone",
            503,
        ) from None
    finally:
        conn.close()


def _headers(environ: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The request's headers as the client sent them (WSGI's names turned back: header
    names are case-insensitive, and signatures take them in lower case)."""
    out = []
    for key, value in environ.items():
        if key.startswith("HTTP_") and key != ENVIRON_KEY:
            name = key[5:].replace("_", "-").lower()
            if name not in _HOP_BY_HOP:
                out.append((name, str(value)))
    if environ.get("CONTENT_TYPE"):
        out.append(("content-type", str(environ["CONTENT_TYPE"])))
    return out
