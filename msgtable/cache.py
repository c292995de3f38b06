"""The bounded per-table cache of due rows.

Rows move through three places, keyed by id:

* **queued**: due rows read by the poller, ordered by (priority, time_next) in a heap;
* **sending**: popped by the sender, being claimed in the database and handed to a subscriber;
  the poller must not queue them again meanwhile;
* **in flight**: sent by this server, lease (ack wait) not over, not acked through us. Kept for
  operators' counts only: the database, not this set, decides what is due again.

Capacity (``size``) bounds queued + sending. The cache is not thread-safe: its owner (the
manager) guards it with one lock and never holds that lock across a database call.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence


class CachedRow:
    """One due message: engine fields for ordering and claiming, and the values to send."""

    __slots__ = ("epoch", "id", "priority", "time_next", "values")

    def __init__(
        self,
        priority: int | None,
        time_next: int | None,
        epoch: int | None,
        values: tuple[object, ...],
    ) -> None:
        self.priority = priority or 0
        self.time_next = time_next or 0
        self.epoch = epoch  # as read; may be NULL, the claim compares NULL-safely
        self.values = values  # message columns, id first
        self.id: Hashable = values[0]

    def __repr__(self) -> str:
        return f"CachedRow(id={self.id!r}, priority={self.priority}, time_next={self.time_next})"


class MessageCache:
    """Queued rows by (priority, time_next); sending and in-flight ids; a pending flag."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pending = False  # the last poll filled its limit: more due rows may wait in the DB
        self._queued: dict[Hashable, CachedRow] = {}
        self._heap: list[tuple[int, int, int, CachedRow]] = []
        self._seq = itertools.count()
        self._sending: set[Hashable] = set()
        self._in_flight: OrderedDict[Hashable, int] = OrderedDict()

    # -- filling -------------------------------------------------------------------------
    def add(self, rows: Iterable[CachedRow]) -> int:
        """Queue due rows; refresh rows already queued. Returns how many are new."""
        added = 0
        for row in rows:
            rid = row.id
            if rid in self._sending:
                continue
            old = self._queued.get(rid)
            if old is None:
                if len(self._queued) + len(self._sending) >= self.size:
                    continue
                self._in_flight.pop(rid, None)  # the database says it is due again
                added += 1
            elif (old.priority, old.time_next) == (row.priority, row.time_next):
                old.epoch, old.values = row.epoch, row.values
                continue
            self._queued[rid] = row
            heapq.heappush(self._heap, (row.priority, row.time_next, next(self._seq), row))
        self._compact()
        return added

    # -- sending -------------------------------------------------------------------------
    def pop(self, n: int) -> list[CachedRow]:
        """Take up to n rows, best first, and mark them as sending."""
        batch: list[CachedRow] = []
        heap, queued = self._heap, self._queued
        while heap and len(batch) < n:
            row = heapq.heappop(heap)[3]
            if queued.get(row.id) is row:
                del queued[row.id]
                self._sending.add(row.id)
                batch.append(row)
        return batch

    def finish(
        self,
        batch: Sequence[CachedRow],
        sent_ids: Iterable[Hashable],
        now_ns: int,
        ack_wait_ns: int,
    ) -> None:
        """The batch's claim is over; the ids actually sent are in flight for ack_wait."""
        for row in batch:
            self._sending.discard(row.id)
        deadline = now_ns + ack_wait_ns
        for rid in sent_ids:
            self._in_flight[rid] = deadline
            self._in_flight.move_to_end(rid)
        self.in_flight(now_ns)  # expire old leases so the set stays bounded by rate x ack wait

    # -- acks and resets -----------------------------------------------------------------
    def forget(self, ids: Iterable[Hashable]) -> None:
        """Acked ids: never send them from the cache, and no longer in flight."""
        for rid in ids:
            self._queued.pop(rid, None)  # its heap entry goes stale and is skipped
            self._in_flight.pop(rid, None)
        self._compact()

    def clear(self) -> None:
        """Drop everything queued (the last subscriber left). Sending rows finish normally."""
        self._queued.clear()
        self._heap.clear()
        self._in_flight.clear()
        self.pending = False

    # -- counts --------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        return len(self._queued)

    @property
    def sending(self) -> int:
        return len(self._sending)

    def room(self) -> int:
        return max(0, self.size - len(self._queued) - len(self._sending))

    def in_flight(self, now_ns: int) -> int:
        """Ids sent whose lease is not over (expired ones are dropped here, oldest first)."""
        flight = self._in_flight
        while flight:
            rid, deadline = next(iter(flight.items()))
            if deadline > now_ns:
                break
            del flight[rid]
        return len(flight)

    def _compact(self) -> None:
        if len(self._heap) > 2 * len(self._queued) + 64:
            self._heap = [e for e in self._heap if self._queued.get(e[3].id) is e[3]]
            heapq.heapify(self._heap)
