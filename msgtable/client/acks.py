"""Acks sent without waiting: a subscriber's queue of acks and the thread that sends them.

``Subscriber.ack_async`` queues the ids of a batch; the thread sends what is queued in one
MessageAck once the oldest queued ack has waited ``linger_s`` and no other call is on the
wire, so a busy subscriber makes far fewer calls than it acks batches (a call costs client
and server about 0.25 ms of CPU each).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from msgtable.errors import MsgtableError, Unavailable
from msgtable.limits import MAX_ACK_IDS
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb

# How long ack_async holds the first queued ack for others to join it in one MessageAck: a
# call costs the server and the client each about 0.25 ms of CPU, so merging matters when
# small batches come fast; a message acked a few ms later changes nothing else.
DEFAULT_ACK_LINGER_S = 0.005


class AckQueue:
    """The acks of one subscriber waiting to be sent, and the thread that sends them.

    Acks queued while a MessageAck is on the wire go together in the next one (at most
    MAX_ACK_IDS ids); each queued batch gets a future that completes with its call.
    """

    def __init__(self, name: str, send: Callable[[list[pb.Value]], int], linger_s: float) -> None:
        self._name = name
        self._send = send  # one MessageAck: how many it acked
        self._lock = threading.Condition()
        self._queued: list[tuple[list[pb.Value], Future[None]]] = []
        self._busy = False  # a call is on the wire
        self._closed = False
        self._error: BaseException | None = None  # the first failed call's error
        self._thread: threading.Thread | None = None
        self.acked = 0
        self.calls = 0  # MessageAck calls made for ack_async
        self.linger_s = linger_s
        self._oldest = 0.0  # when the oldest queued ack was queued (monotonic)
        self._size = 0  # ids queued
        self._flushing = 0  # flushes waiting: send without lingering

    def counted(self, count: int) -> None:
        with self._lock:
            self.acked += count

    def add(self, ids: list[pb.Value]) -> Future[None]:
        future: Future[None] = Future()
        if not ids:
            future.set_result(None)
            return future
        with self._lock:
            if self._closed:
                raise MsgtableError(f"the subscriber to {self._name} is closed")
            if not self._queued:
                self._oldest = time.monotonic()
            self._queued.append((ids, future))
            self._size += len(ids)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"msgtable-acks-{self._name}", daemon=True
                )
                self._thread.start()
            self._lock.notify_all()
        return future

    def _take(self) -> list[tuple[list[pb.Value], Future[None]]] | None:
        """The next call's share of the queue (whole batches, up to MAX_ACK_IDS ids unless one
        batch alone is larger), once the oldest queued ack waited ``linger_s`` (sooner when
        the queue holds MAX_ACK_IDS ids or a flush asks); None once closed and empty."""
        with self._lock:
            while not self._queued and not self._closed:
                self._lock.wait()
            if not self._queued:
                return None
            if self.linger_s > 0:
                until = self._oldest + self.linger_s
                self._lock.wait_for(
                    lambda: self._closed or self._flushing or self._size >= MAX_ACK_IDS,
                    max(0.0, until - time.monotonic()),
                )
            taken, size = 0, 0
            for ids, _ in self._queued:
                if taken and size + len(ids) > MAX_ACK_IDS:
                    break
                taken += 1
                size += len(ids)
            batch, self._queued = self._queued[:taken], self._queued[taken:]
            self._size -= size
            self._oldest = time.monotonic()
            self._busy = True
            return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            ids = [v for chunk, _ in batch for v in chunk]
            error: BaseException | None = None
            count = 0
            try:
                count = self._send(ids)
            except BaseException as exc:  # handed to the futures
                error = exc
            with self._lock:
                self.acked += count
                self.calls += 1
                self._busy = False
                if error is not None and self._error is None:
                    self._error = error
                self._lock.notify_all()
            for _, future in batch:
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)

    def flush(self, timeout_s: float | None) -> None:
        with self._lock:
            self._flushing += 1
            self._lock.notify_all()
            try:
                done = self._lock.wait_for(lambda: not self._queued and not self._busy, timeout_s)
            finally:
                self._flushing -= 1
            error, self._error = self._error, None
        if error is not None:
            raise error
        if not done:
            raise Unavailable(f"acks of {self._name} not answered within {timeout_s}s")

    def close(self, timeout_s: float | None) -> None:
        """Send what is queued (waiting up to ``timeout_s``), then stop the thread."""
        try:
            self.flush(timeout_s)
        finally:
            with self._lock:
                self._closed = True
                self._lock.notify_all()
