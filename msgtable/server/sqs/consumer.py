"""The consumer side: msgtable's push streams as SQS's pull receive.

Each queue a ReceiveMessage names gets one engine subscriber (:class:`Puller`) while its
queue is received from: a window of IN_FLIGHT_LIMIT (SQS's own limit of messages in flight
per queue), so that what SQS clients hold for their visibility timeout does not stop the
sends. A receive takes the batches the table's sender put in that subscriber's small buffer,
or waits for one (long polling: the engine sends a row as soon as the binlog shows its
INSERT, or this server's own SendMessage commits). A batch holds up to vt_batch_size
messages; those a receive did not ask for (MaxNumberOfMessages) are kept for the next
receive, in order, while their ack wait leaves them time (then they are left to come back
after it, as any message whose consumer went away). A queue that nobody received from for
LINGER_S (and, while messages are kept for it, for their ack wait) closes its subscriber:
the batches claimed for it and not taken are due again at once, and the table's cache is
another subscriber's or dropped, as for a gRPC stream that ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from msgtable.core.rows import Batch, Values
from msgtable.errors import MsgtableError, Unavailable

log = logging.getLogger(__name__)

IN_FLIGHT_LIMIT = 120_000
LINGER_S = 2.0
# A kept message is handed out only while at least this much of its ack wait is left
FRESH_LEFT_NS = 2_000_000_000


class Subscriber(Protocol):
    def next_batch(self, timeout_s: float | None = None, /) -> Batch: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Received:
    """One message as a receive takes it: its values (id first), its attempt, when it was
    sent (unix ns)."""

    values: Values
    attempt: int
    sent_ns: int


class Puller:
    """One queue's subscriber and the messages kept for its next receive."""

    def __init__(
        self,
        subscribe: Callable[[], Subscriber],
        ack_wait_s: Callable[[], float],
        now_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._subscribe = subscribe
        self._ack_wait_s = ack_wait_s
        self._now_ns = now_ns
        self._lock = threading.Lock()
        self._sub: Subscriber | None = None
        self._kept: deque[Received] = deque()
        self.waiting = 0
        self.used = time.monotonic()
        self.closed = False

    def receive(self, most: int, wait_s: float) -> list[Received]:
        """Up to ``most`` messages: those at hand at once, else the first batch within
        ``wait_s``."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            self.waiting += 1
            out = self._take_kept(most)
        try:
            while len(out) < most:
                left = 0.0 if out else max(0.0, deadline - time.monotonic())
                sub = self._subscriber()
                try:
                    batch = sub.next_batch(left)
                except MsgtableError:
                    self._drop(sub)
                    if out or self.closed:
                        break
                    raise
                if not batch:
                    if out or time.monotonic() >= deadline:
                        break
                    continue
                rows = _received(batch)
                take = most - len(out)
                out += rows[:take]
                if rows[take:]:
                    with self._lock:
                        self._kept.extend(rows[take:])
        finally:
            with self._lock:
                self.waiting -= 1
                self.used = time.monotonic()
        return out

    def closable(self, now: float, linger_s: float) -> bool:
        """Nobody received for ``linger_s`` (and, with messages kept for the next receive,
        for their ack wait: closing would leave them to come back only after it)."""
        with self._lock:
            if self.waiting:
                return False
            idle = now - self.used
            return idle >= linger_s and (not self._kept or idle >= self._ack_wait_s())

    def close(self) -> None:
        with self._lock:
            self.closed = True
            sub, self._sub = self._sub, None
            self._kept.clear()
        if sub is not None:
            sub.close()

    def _subscriber(self) -> Subscriber:
        with self._lock:
            if self.closed:
                raise Unavailable("server shutting down")
            if self._sub is None:
                self._sub = self._subscribe()
            return self._sub

    def _drop(self, sub: Subscriber) -> None:
        with self._lock:
            if self._sub is sub:
                self._sub = None
        sub.close()

    def _take_kept(self, most: int) -> list[Received]:
        """Kept messages with time left (under the lock)."""
        out: list[Received] = []
        if not self._kept:
            return out
        horizon = self._now_ns() - round(self._ack_wait_s() * 1e9) + FRESH_LEFT_NS
        while self._kept and len(out) < most:
            r = self._kept.popleft()
            if r.sent_ns >= horizon:
                out.append(r)
        return out


def _received(batch: Batch) -> list[Received]:
    before = batch.sent_before
    sent = batch.sent_ns or time.time_ns()
    return [
        Received(tuple(values), (before[i] if before else 0) + 1, sent)
        for i, values in enumerate(batch)
    ]


class Consumer:
    """Every queue's :class:`Puller`, and the loop that closes those nobody uses."""

    def __init__(self, linger_s: float = LINGER_S) -> None:
        self._lock = threading.Lock()
        self._pullers: dict[str, Puller] = {}
        self._linger_s = linger_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, daemon=True, name="msgtable-sqs-idle"
            )
            self._thread.start()

    def puller(self, key: str, make: Callable[[], Puller]) -> Puller:
        with self._lock:
            if self._stop.is_set():
                raise Unavailable("server shutting down")
            p = self._pullers.get(key)
            if p is None or p.closed:
                p = self._pullers[key] = make()
            return p

    def receive(
        self, key: str, make: Callable[[], Puller], most: int, wait_s: float
    ) -> list[Received]:
        """A receive from queue ``key`` (its puller made by ``make`` when it has none):
        a puller closed for idleness under the receive is replaced once."""
        for attempt in range(2):
            p = self.puller(key, make)
            try:
                return p.receive(most, wait_s)
            except Unavailable:
                if attempt or not p.closed or self._stop.is_set():
                    raise
        raise AssertionError("unreachable")

    def receivers(self) -> int:
        """Receives waiting now (metrics)."""
        with self._lock:
            return sum(p.waiting for p in self._pullers.values())

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            pullers, self._pullers = list(self._pullers.values()), {}
        for p in pullers:
            p.close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def close_idle(self) -> int:
        now = time.monotonic()
        with self._lock:
            idle = [(k, p) for k, p in self._pullers.items() if p.closable(now, self._linger_s)]
            for k, _ in idle:
                del self._pullers[k]
        for _, p in idle:
            p.close()
        return len(idle)

    def _loop(self) -> None:
        while not self._stop.wait(min(1.0, self._linger_s / 2)):
            try:
                self.close_idle()
            except Exception:
                log.exception("sqs: closing idle queues' subscribers failed; going on")
