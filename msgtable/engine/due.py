"""The rows of one table that are due, or fall due before the next poll: Vitess's cache.

Rows read by the poller wait here, keyed by id, in one of three places:

* **queued**, once due, in a heap by (priority, rank): the best row goes first. The rank puts
  the rows given a time first (a redelivery, a release, a delayed message: time_next > 0),
  in time order, then the fresh ones (time_next 0 or NULL) in the order read, so that a
  redelivery never waits behind a backlog of fresh rows (the poll's order would make it);
* **scheduled**, until due (a poll also reads the rows due before the next poll), in a second
  heap by time_next, so that each goes out at its time, not at the next poll;
* **sending**: popped by the sender, being checked in the database and handed to a
  subscriber; a poll must not queue them again meanwhile.

While a stream with a filter is connected, the due rows are also kept by the filters that
pass them (msgtable.engine.routes), so that such a stream pops only rows it takes (:meth:`pop_for`).

Capacity (``size``) bounds queued + sending. Heap entries of rows that left (acked, re-keyed by
a newer read) go stale and are skipped, and compacted when they outnumber the live ones. Not
thread-safe: the table's manager guards it with its lock (msgtable.engine.cache says how).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence

from msgtable.core.rows import CachedRow, PolledRow, Values
from msgtable.core.tables import TableConfig
from msgtable.engine.routes import Routes

# A queued row's rank within its priority is ``row.time_next or FRESH`` (written inline: no
# call per row): a row with no time (time_next 0 or NULL) goes after every timed one.
FRESH = 2**63


class DueRows:
    """Queued, scheduled and sending rows (see the module docstring)."""

    def __init__(self, size: int, flying: Callable[[Hashable], bool] | None = None) -> None:
        self.size = size
        self._flying = flying  # whether a row is in flight (msgtable.engine.inflight)
        self.pending = False  # the last poll filled its limit: more due rows may wait in the DB
        self._queued: dict[Hashable, CachedRow] = {}
        self._heap: list[tuple[int, int, int, CachedRow]] = []  # due: (priority, time_next)
        self._scheduled: list[tuple[int, int, CachedRow]] = []  # not due yet: (time_next, seq)
        self._seq = itertools.count()
        self._back = itertools.count(-1, -1)  # put_back's: before every _seq
        self.sending: set[Hashable] = set()
        # rows a poll read (and skipped) while they were being sent: if one is not in
        # flight when its send ends (settled meanwhile: a release), that read was its current
        # state, and the pass went on past it (finish says so)
        self.read_sending: set[Hashable] = set()
        self._routes: Routes | None = None  # while a stream with a filter is connected

    # -- filling -------------------------------------------------------------------------
    def add(
        self,
        rows: Sequence[PolledRow],
        now_ns: int | None,
        unclaimed: Collection[Hashable],
        held: Collection[Hashable],
        changed: Collection[Hashable],
        created: bool = False,
    ) -> tuple[list[Hashable], int]:
        """Queue rows as a poll read them (in the poll's order); refresh rows already
        queued. A row whose time_next is after ``now_ns`` waits for it (None: every row is
        due). Rows being sent, and the ids of ``unclaimed``, ``held`` and ``changed`` (sent
        and not postponed yet; their ack or postpone being written; changed since the poll's
        read began), are skipped: the table's copy is stale or still to be overwritten.

        Returns the ids that are new here, and how many of ``rows`` were taken in: all,
        unless the cache filled up first (the rest must be read again). A row object is made
        only for a new or re-keyed row: most of a busy poll's rows are already here.
        ``created``: each row ends with its time_created (not a message column)."""
        end = -1 if created else None
        new: list[Hashable] = []
        taken = 0
        queued, sending, routes = self._queued, self.sending, self._routes
        for r in rows:
            rid = r[3]
            if rid in sending:
                self.read_sending.add(rid)
                taken += 1
                continue
            if rid in unclaimed or rid in held or rid in changed:
                taken += 1
                continue
            old = queued.get(rid)
            if old is None:
                if len(queued) + len(sending) >= self.size:
                    break
                new.append(rid)
            elif old.priority == (r[0] or 0) and old.time_next == (r[1] or 0):
                values = tuple(r[3:end])
                # a filter's verdict on the old values may not hold for new ones: re-keyed
                if routes is None or values == old.values:
                    old.epoch, old.values = r[2], values
                    taken += 1
                    continue
            if old is not None and routes is not None:
                routes.left((rid,))
            row = CachedRow(r[0], r[1], r[2], tuple(r[3:end]), r[-1] if created else 0)
            queued[rid] = row
            if now_ns is not None and row.time_next > now_ns:
                heapq.heappush(self._scheduled, (row.time_next, next(self._seq), row))
            else:
                entry = (row.priority, row.time_next or FRESH, next(self._seq), row)
                heapq.heappush(self._heap, entry)
                if routes is not None:
                    routes.push(entry)
            taken += 1
        self._compact()
        return new, taken

    def reschedule(self, row: CachedRow, epoch: int, time_next: int) -> bool:
        """``row``, just postponed to ``time_next`` (epoch as written), falls due before the
        next poll would read it: wait for it here, if there is room and it is not here
        already. Its send checks it as any other."""
        rid = row.id
        if rid in self._queued or rid in self.sending:
            return False
        if len(self._queued) + len(self.sending) >= self.size:
            return False
        again = CachedRow(row.priority, time_next, epoch, row.values, row.created)
        self._queued[rid] = again
        heapq.heappush(self._scheduled, (time_next, next(self._seq), again))
        return True

    # -- sending -------------------------------------------------------------------------
    def pop(self, n: int, now_ns: int | None = None) -> list[CachedRow]:
        """Take up to n rows due at ``now_ns`` (None: all queued), best first, and mark them
        as sending (until :meth:`finish`)."""
        self._release(now_ns)
        batch: list[CachedRow] = []
        heap, queued = self._heap, self._queued
        while heap and len(batch) < n:
            row = heapq.heappop(heap)[3]
            if queued.get(row.id) is row:
                del queued[row.id]
                self.sending.add(row.id)
                batch.append(row)
        if self._routes is not None:
            self._routes.left(r.id for r in batch)
        return batch

    def pop_for(
        self, accepts: Callable[[Values], bool], n: int, now_ns: int | None = None
    ) -> list[CachedRow]:
        """As :meth:`pop`, of the rows the filter ``accepts`` passes only: its stream's
        (connected with :meth:`connect`)."""
        self._release(now_ns)
        if self._routes is None:
            return []
        batch = self._routes.pop(accepts, n)
        self.sending.update(r.id for r in batch)
        return batch

    # -- streams with a filter (msgtable.engine.routes) -------------------------------------------
    def connect(self, accepts: Callable[[Values], bool]) -> None:
        """A stream with a filter subscribed: the due rows it passes are kept for it."""
        if self._routes is None:
            self._routes = Routes(self._queued)
        self._routes.connect(accepts, self._heap)

    def disconnect(self, accepts: Callable[[Values], bool]) -> None:
        """A stream with a filter left."""
        if self._routes is not None:
            self._routes.disconnect(accepts)
            if not self._routes.active:
                self._routes = None

    @property
    def stranded(self) -> int:
        """Queued rows no connected stream's filter passes (0 when no stream filters)."""
        return 0 if self._routes is None else self._routes.stranded

    def put_back(self, rows: Iterable[CachedRow]) -> None:
        """Rows popped that no subscriber took (their filters refused them): queued again as
        they were, best first."""
        # ahead of the rows of the same key still queued (they were popped first), in order
        for row in reversed(list(rows)):
            self.sending.discard(row.id)
            self.read_sending.discard(row.id)
            if row.id not in self._queued:
                self._queued[row.id] = row
                entry = (row.priority, row.time_next or FRESH, next(self._back), row)
                heapq.heappush(self._heap, entry)
                if self._routes is not None:
                    self._routes.push(entry)

    def finish(self, batch: Iterable[CachedRow]) -> bool:
        """The batch's send is over (whether or not its rows were sent). True when a poll
        read one of them meanwhile and it is not in flight now: that poll skipped it and
        went on past it, so a new pass must read it again."""
        read, flying = self.read_sending, self._flying
        again = False
        for row in batch:
            rid = row.id
            self.sending.discard(rid)
            if read and rid in read:
                read.discard(rid)
                again = again or (flying is not None and not flying(rid))
        return again

    def due(self, now_ns: int) -> bool:
        """Whether a queued row is due at ``now_ns``."""
        self._release(now_ns)
        return bool(self._heap)

    def next_due_ns(self) -> int | None:
        """When the first queued row that is not due yet falls due (None: there is none)."""
        scheduled, queued = self._scheduled, self._queued
        while scheduled and queued.get(scheduled[0][2].id) is not scheduled[0][2]:
            heapq.heappop(scheduled)  # stale: sent, acked or re-keyed meanwhile
        return scheduled[0][0] if scheduled else None

    def _release(self, now_ns: int | None) -> None:
        """Move the scheduled rows due at ``now_ns`` (None: all) to the due heap."""
        scheduled, queued, routes = self._scheduled, self._queued, self._routes
        while scheduled and (now_ns is None or scheduled[0][0] <= now_ns):
            row = heapq.heappop(scheduled)[2]
            if queued.get(row.id) is row:
                entry = (row.priority, row.time_next or FRESH, next(self._seq), row)
                heapq.heappush(self._heap, entry)
                if routes is not None:
                    routes.push(entry)

    # -- leaving -------------------------------------------------------------------------
    def forget(self, ids: Iterable[Hashable]) -> None:
        """Acked or deleted ids: never send them from here (their heap entries go stale)."""
        queued = self._queued
        if self._routes is not None:
            ids = list(ids)
            self._routes.left(ids)
        for rid in ids:
            queued.pop(rid, None)
        self._compact()

    def clear(self) -> list[Hashable]:
        """Drop everything queued (the last subscriber left); returns their ids. Sending rows
        finish normally."""
        dropped = list(self._queued)
        self._queued.clear()
        self._heap.clear()
        self._scheduled.clear()
        self.pending = False
        if self._routes is not None:
            self._routes.clear()
        return dropped

    # -- counts --------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        return len(self._queued)

    def room(self) -> int:
        return max(0, self.size - len(self._queued) - len(self.sending))

    def wants_refill(self) -> bool:
        """More due rows wait in the table and the cache is half empty: read them now."""
        return self.pending and len(self._queued) <= self.size // 2

    def _compact(self) -> None:
        queued = self._queued
        if len(self._heap) > 2 * len(queued) + 64:
            self._heap = [e for e in self._heap if queued.get(e[3].id) is e[3]]
            heapq.heapify(self._heap)
        routes = self._routes
        if routes is not None and routes.entries() > 2 * len(queued) + 64:
            routes.compact()
        if len(self._scheduled) > 2 * len(queued) + 64:
            self._scheduled = [e for e in self._scheduled if queued.get(e[2].id) is e[2]]
            heapq.heapify(self._scheduled)


def lookahead_ns(cfg: TableConfig) -> int:
    """How far ahead a poll reads: rows due before the next poll wait in the cache."""
    return round(cfg.poller_interval_s * 1e9)
