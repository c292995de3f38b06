"""A subscriber: one MessageStream as the server sees it.

The table's sender puts batches into a subscriber's small bounded buffer (at most
SUBSCRIBER_BUFFER_BATCHES batches claimed for it and not yet taken by its stream) while its
:class:`~msgtable.core.window.Window` is open; the stream's thread takes them out. Round-robin over
the subscribers that have room decides who gets the next batch.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from msgtable.core.rows import Batch, RelayedBatch, Values
from msgtable.core.tables import Column
from msgtable.core.window import Window
from msgtable.errors import InvalidArgument, MsgtableError, Unavailable
from msgtable.limits import SUBSCRIBER_BUFFER_BATCHES


class Subscriber:
    """One MessageStream: its window, and a small bounded queue of batches the sender fills.

    ``on_taken(batch)`` runs when the stream took a batch (the table counts its sends there,
    what went out, never taken back, and its sender may have another for it);
    ``on_close(subscriber, unsent)`` when the client went away, with the batches it never
    took."""

    def __init__(
        self,
        fields: tuple[Column, ...],
        window: Window,
        on_taken: Callable[[Batch], object],
        on_close: Callable[[Subscriber, list[Batch]], object],
        max_batches: int = SUBSCRIBER_BUFFER_BATCHES,
        accepts: Callable[[Values], bool] | None = None,
        ack_wait_s: float = 0.0,
    ) -> None:
        self.fields = fields
        self.ack_wait_s = ack_wait_s  # the table's (or subscription's), as it subscribed
        # a filter of this stream (msgtable.core.filters): the messages it takes; None: all
        self.accepts = accepts
        self.window = window
        self._on_taken = on_taken
        self._on_close = on_close
        self._max = max_batches
        self._cond = threading.Condition()
        self._batches: deque[Batch] = deque()
        self._ended: MsgtableError | None = None
        self._closed = False

    def has_room(self) -> bool:
        return (
            self.window.room > 0
            and len(self._batches) < self._max
            and self._ended is None
            and not self._closed
        )

    def put(self, batch: Batch) -> None:
        """Queue a batch (never blocks; the sender checked has_room first)."""
        with self._cond:
            self._batches.append(batch)
            self._cond.notify()

    def next_batch(self, timeout_s: float | None = None) -> Batch:
        """The next batch; an empty one on timeout; raises the error that ended the
        subscriber."""
        with self._cond:
            self._cond.wait_for(lambda: self._batches or self._ended or self._closed, timeout_s)
            if self._batches:
                batch = self._batches.popleft()
            elif self._ended is not None:
                raise self._ended
            elif self._closed:
                raise Unavailable("subscription closed")
            else:
                return Batch([])
        self._on_taken(batch)
        return batch

    def end(self, error: MsgtableError) -> None:
        """End the subscriber; batches already queued are still handed out first."""
        with self._cond:
            if self._ended is None:
                self._ended = error
            self._cond.notify_all()

    def close(self) -> None:
        """The client went away. Idempotent. Its queued batches never went out: they are due
        again at once, or after their ack wait where their postpone was already written."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            unsent = list(self._batches)
            self._batches.clear()
            self._cond.notify_all()
        self._on_close(self, unsent)


def select_subscribers(subscribers: Sequence[Subscriber], start: int) -> list[int]:
    """Round-robin: the subscribers that have room, in turn from ``start`` on.

    The one place that decides who gets the next batches (filters and consumer groups will
    choose here too).
    """
    n = len(subscribers)
    return [i for i in ((start + k) % n for k in range(n)) if subscribers[i].has_room()]


class Projected:
    """A subscriber as one stream asked for it: only some of its message columns (``id``
    first, always), a projection of each batch as the stream takes it."""

    def __init__(self, sub: Subscriber, names: Sequence[str], table: str) -> None:
        by_name = {c.name: i for i, c in enumerate(sub.fields)}
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise InvalidArgument(
                f"table {table}: unknown column {unknown[0]!r} in columns "
                f"(message columns: {', '.join(by_name)})"
            )
        if len(set(names)) != len(names):
            raise InvalidArgument(f"table {table}: a column is named twice in columns")
        self._index = [0, *(by_name[n] for n in names if n != sub.fields[0].name)]
        self._sub = sub
        self.fields = tuple(sub.fields[i] for i in self._index)
        self.ack_wait_s = sub.ack_wait_s

    def next_batch(self, timeout_s: float | None = None) -> Batch:
        batch = self._sub.next_batch(timeout_s)
        if not batch:
            return batch
        if isinstance(batch, RelayedBatch):  # a shard's, relayed by a gateway
            batch = batch.decoded()
        index = self._index
        rows = [tuple(values[i] for i in index) for values in batch]
        return Batch(rows, batch.sent_before, batch.sent_ns)

    def end(self, error: MsgtableError) -> None:
        self._sub.end(error)

    def close(self) -> None:
        self._sub.close()


def narrowed(sub: Any, columns: Sequence[str], table: str) -> Any:
    """``sub`` with one stream's projection (its filter is the engine's); the subscriber is
    closed when the request is malformed."""
    try:
        return Projected(sub, columns, table) if columns else sub
    except InvalidArgument:
        sub.close()
        raise
