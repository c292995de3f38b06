"""Receipt handles: each names one delivery of one message of one queue.

A handle is the queue's tag (4 bytes of the SHA-256 of its name: a handle of another queue
is refused), a nonce (8 random bytes made at the hand-out), the delivery's attempt (the
message's send count then, msgtable.core.settlement) and the id, base64url-encoded. The
server keeps what it handed out (:class:`Deliveries`): a handle is *current* while its
delivery is the last one this server handed out of that message and its visibility has not
ended; a handle of an earlier delivery is *stale* and changes nothing (a DeleteMessage
answers success and deletes nothing; a ChangeMessageVisibility answers MessageNotInflight).
A handle the server does not know (handed out before a restart, or by another server; or
its record expired) is checked against the table: its release or renew names the attempt
(msgtable.core.settlement), and its delete first renews naming the attempt, then acks only
if that renew found the delivery current.

SQS is looser: there the last handle received deletes the message whatever happened since,
and an older handle may too.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import struct
import threading
from collections.abc import Hashable
from dataclasses import dataclass

from msgtable.server.sqs.protocol import SqsError

VERSION = 1
_KINDS = {b"i": int, b"s": str, b"b": bytes}
# How long before its visibility ends a delivery stops being current for a delete by this
# server's record alone (the engine may be about to send it again): then it is checked.
MARGIN_NS = 200_000_000
MAX_RECORDS = 1_000_000


@dataclass(frozen=True)
class Handle:
    tag: bytes
    nonce: bytes
    attempt: int
    id: Hashable

    def encode(self) -> str:
        if isinstance(self.id, bool):
            raise TypeError("a bool is no id")
        if isinstance(self.id, int):
            kind, raw = b"i", str(self.id).encode()
        elif isinstance(self.id, str):
            kind, raw = b"s", self.id.encode("utf-8")
        else:
            kind, raw = b"b", bytes(self.id)  # type: ignore[call-overload]
        data = struct.pack(">B4s8sI", VERSION, self.tag, self.nonce, self.attempt) + kind + raw
        return base64.urlsafe_b64encode(data).decode().rstrip("=")


def tag_of(queue_name: str) -> bytes:
    return hashlib.sha256(queue_name.encode()).digest()[:4]


def new_nonce() -> bytes:
    return os.urandom(8)


def decode(text: str, tag: bytes) -> Handle:
    """The handle ``text`` names for the queue of ``tag``; ReceiptHandleIsInvalid if it is
    none of this queue's."""
    bad = SqsError(
        "ReceiptHandleIsInvalid",
        f'The input receipt handle "{text[:200]}" is not a valid receipt handle.',
    )
    if not isinstance(text, str) or not text or len(text) > 1024:
        raise bad
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise bad from None
    if len(data) < 18 or data[0] != VERSION:
        raise bad
    _, got_tag, nonce, attempt = struct.unpack(">B4s8sI", data[:17])
    kind, raw = data[17:18], data[18:]
    if got_tag != tag or kind not in _KINDS:
        raise bad
    rid: Hashable
    try:
        if kind == b"i":
            if not raw or not raw.lstrip(b"-").isdigit():
                raise bad
            rid = int(raw)
        elif kind == b"s":
            rid = raw.decode("utf-8")
        else:
            rid = raw
    except UnicodeDecodeError:
        raise bad from None
    return Handle(got_tag, nonce, attempt, rid)


@dataclass
class Delivery:
    attempt: int
    nonce: bytes
    deadline_ns: int  # when its visibility ends
    first_ms: int  # when this server first handed the message out (unix ms)


class Deliveries:
    """What this server handed out, by (queue tag, id): the last delivery of each."""

    def __init__(self, max_records: int = MAX_RECORDS) -> None:
        self._lock = threading.Lock()
        self._by: dict[tuple[bytes, Hashable], Delivery] = {}
        self._max = max_records

    def __len__(self) -> int:
        return len(self._by)

    def handed(self, h: Handle, deadline_ns: int, now_ms: int) -> int:
        """Record a hand-out; returns when the message was first handed out (unix ms)."""
        key = (h.tag, h.id)
        with self._lock:
            old = self._by.get(key)
            first = old.first_ms if old is not None else now_ms
            if old is None and len(self._by) >= self._max:
                self._sweep(deadline_ns - 3600 * 10**9)
            self._by[key] = Delivery(h.attempt, h.nonce, deadline_ns, first)
        return first

    def state(self, h: Handle, now_ns: int) -> str:
        """``current``, ``stale`` (a later delivery was handed out since) or ``unknown``
        (not recorded, or its visibility is over or about to be: the table decides)."""
        with self._lock:
            d = self._by.get((h.tag, h.id))
        if d is None:
            return "unknown"
        if d.nonce != h.nonce:
            return "stale" if d.attempt >= h.attempt else "unknown"
        return "current" if now_ns < d.deadline_ns - MARGIN_NS else "unknown"

    def extend(self, h: Handle, deadline_ns: int) -> None:
        with self._lock:
            d = self._by.get((h.tag, h.id))
            if d is not None and d.nonce == h.nonce:
                d.deadline_ns = deadline_ns

    def forget(self, h: Handle) -> None:
        with self._lock:
            d = self._by.get((h.tag, h.id))
            if d is not None and d.nonce == h.nonce:
                del self._by[(h.tag, h.id)]

    def _sweep(self, before_ns: int) -> None:
        """Drop records whose visibility ended long ago (under the lock)."""
        for key in [k for k, d in self._by.items() if d.deadline_ns < before_ns]:
            del self._by[key]
        if len(self._by) >= self._max:  # still full: drop the oldest half
            for key in sorted(self._by, key=lambda k: self._by[k].deadline_ns)[: self._max // 2]:
                del self._by[key]
