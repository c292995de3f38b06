"""A message row as the engine moves it: as a poll reads it, where a pass of polls stopped,
cached waiting for its send, and changed by another client (as the binlog shows it).

The store, the cache and the binlog follower share these shapes; none of them needs the others
to know what a row is.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

# A row as a poll reads it: priority, time_next, epoch, then the message columns (id first),
# and time_created last when the poll was asked for it (``created``).
PolledRow = tuple[Any, ...]
# Where a poll stopped: (priority, time_next as read, possibly NULL, id) of its last row.
PollKey = tuple[int, int | None, Hashable]
# A message's values as a subscriber gets them: the message columns, id first.
Values = tuple[object, ...]


def poll_key(row: PolledRow) -> PollKey:
    """The key a poll continues after, of a row as a poll read it."""
    return (row[0], row[1], row[3])


class CachedRow:
    """One due message: engine fields for ordering and claiming, and the values to send."""

    __slots__ = ("created", "epoch", "id", "priority", "time_next", "values")

    def __init__(
        self,
        priority: int | None,
        time_next: int | None,
        epoch: int | None,
        values: Values,
        created: int | None = 0,
    ) -> None:
        self.priority = priority or 0
        self.time_next = time_next or 0
        self.epoch = epoch  # as read; may be NULL, the claim compares NULL-safely
        self.values = values  # message columns, id first
        self.id: Hashable = values[0]
        # time_created when the poll read it (0: not read, or NULL): the created -> sent delay
        self.created = created or 0

    def __repr__(self) -> str:
        return f"CachedRow(id={self.id!r}, priority={self.priority}, time_next={self.time_next})"


class Batch(list[Values]):
    """A batch as the sender hands it to a subscriber: the messages' values (id first), how
    many times each was sent before (``sent_before``, in the same order; None when none was,
    the usual case) and when the batch was sent (``sent_ns``, unix nanoseconds)."""

    __slots__ = ("sent_before", "sent_ns")

    def __init__(
        self, rows: list[Values], sent_before: list[int] | None = None, sent_ns: int = 0
    ) -> None:
        super().__init__(rows)
        self.sent_before = sent_before
        self.sent_ns = sent_ns

    @classmethod
    def of(cls, rows: Sequence[CachedRow], sent_ns: int) -> Batch:
        epochs = [r.epoch or 0 for r in rows]
        return cls([r.values for r in rows], epochs if any(epochs) else None, sent_ns)


class RelayedBatch(Batch):
    """A batch as another msgtable server sent it (msgtable.gateway.merge, a shard's): its response,
    relayed as it is; its rows decoded to values only when asked (a stream's projection)."""

    __slots__ = ("_decode", "response")

    def __init__(self, response: Any, decode: Any) -> None:
        super().__init__([], None, response.sent_ns)
        self.response = response  # a msgtable.v1 MessageStreamResponse with rows
        self._decode = decode  # a row -> its values (msgtable.core.codec.RowDecoder.decode)

    def __bool__(self) -> bool:
        return len(self.response.rows) > 0

    def decoded(self) -> Batch:
        rows = self.response.rows
        before = [r.sent_before for r in rows]
        return Batch([self._decode(r) for r in rows], before if any(before) else None, self.sent_ns)


def order_of(by: object, rid: object) -> tuple[Any, ...]:
    """Where a message of an ordered table stands among its key's (msgtable.engine.ordered): by its
    order value (as SQL sorts, NULL first), then by id."""
    return (0, 0, rid) if by is None else (1, by, rid)


def group_by_epoch(batch: Sequence[CachedRow]) -> dict[int | None, list[CachedRow]]:
    """Rows of one batch by the epoch they were read at (usually one group)."""
    groups: dict[int | None, list[CachedRow]] = {}
    for row in batch:
        groups.setdefault(row.epoch, []).append(row)
    return groups


@dataclass(frozen=True)
class RowChange:
    """One row of an UPDATE or DELETE by another client, as the binlog shows it."""

    id: object
    gone: bool  # deleted or acked
    moved: bool  # time_next, epoch or priority changed (and not acked)
    acked: bool = False  # acked by another client (as its annotation shows: not msgtable)
