"""The bounded per-table cache of due rows.

Rows move through three places, keyed by id:

* **queued**: rows read by the poller, ordered by (priority, time_next) in a heap once due;
  until then (a poll reads the rows due before the next poll too) in a second heap by
  time_next, so that each goes out at its time, not at the next poll;
* **sending**: popped by the sender, being claimed in the database and handed to a subscriber;
  the poller must not queue them again meanwhile;
* **in flight**: sent by this server, lease (ack wait) not over, not acked through us, with
  the subscriber it went to (its :class:`Window` gets the message's credit back when the
  message leaves: acked, deleted, due again or lease over). The database, not this set,
  decides what is due again;
* **unclaimed**: sent, but not postponed in the database yet (vt_postpone_after), so still due
  there. The poller must not queue them again; they leave when their ack or their postpone
  is written (**held** while that statement runs, so a poll meanwhile skips them too).

Capacity (``size``) bounds queued + sending. The cache is not thread-safe: its owner (the
manager) guards it with one lock and never holds that lock across a database call.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Collection, Hashable, Iterable, Sequence
from typing import Any, Protocol

# An unclaimed row: the epoch it was sent at (as read), when it was sent, and the row.
Sent = tuple[int | None, int, "CachedRow"]
# A row as a poll reads it: priority, time_next, epoch, then the message columns (id first).
PolledRow = tuple[Any, ...]


class Window(Protocol):
    """What a subscriber has in flight: messages sent to it whose ack has not come (a
    subscriber is sent a batch only while this is below its window). ``stalled_ns``: since
    when it has been full, with no credit back (None: not full, or credit came since)."""

    outstanding: int
    stalled_ns: int | None


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
        self._heap: list[tuple[int, int, int, CachedRow]] = []  # due: (priority, time_next)
        self._scheduled: list[tuple[int, int, CachedRow]] = []  # not due yet: (time_next, seq)
        self._seq = itertools.count()
        self._sending: set[Hashable] = set()
        self._in_flight: OrderedDict[Hashable, tuple[int, Window | None]] = OrderedDict()
        self._unclaimed: OrderedDict[Hashable, Sent] = OrderedDict()  # by send time
        self._held: set[Hashable] = set()
        self.credited = False  # a subscriber got credit back (its owner clears this)
        # Ids sent, acked or postponed since the running poll began (None: no poll runs).
        self._changed: set[Hashable] | None = None

    # -- filling -------------------------------------------------------------------------
    def begin_poll(self) -> None:
        """A poll's read is about to start. Rows sent, acked or postponed from now until
        its :meth:`add` are skipped there: the poll may have read them before the change."""
        self._changed = set()

    def _note(self, ids: Iterable[Hashable]) -> None:
        if self._changed is not None:
            self._changed.update(ids)

    def add(self, rows: Sequence[PolledRow], now_ns: int | None = None) -> tuple[int, int]:
        """Queue rows as a poll read them (in the poll's order); refresh rows already
        queued. A row whose time_next is after ``now_ns`` waits for it (None: every row is
        due). Returns how many rows are new, and how many of ``rows`` were taken in: all,
        unless the cache filled up first (the rest must be read again).

        A row object is made only for a new or re-keyed row: most of a busy poll's rows are
        already here (queued, being sent or in flight). Rows changed since
        :meth:`begin_poll` are skipped (the poll's copy may predate the change)."""
        added = taken = 0
        queued, sending, unclaimed, held = self._queued, self._sending, self._unclaimed, self._held
        changed, self._changed = self._changed or (), None
        for r in rows:
            rid = r[3]
            if rid in sending or rid in unclaimed or rid in held or rid in changed:
                taken += 1
                continue
            old = queued.get(rid)
            if old is None:
                if len(queued) + len(sending) >= self.size:
                    break
                self._land(rid)  # the database says it is due again
                added += 1
            elif old.priority == (r[0] or 0) and old.time_next == (r[1] or 0):
                old.epoch, old.values = r[2], tuple(r[3:])
                taken += 1
                continue
            row = CachedRow(r[0], r[1], r[2], tuple(r[3:]))
            queued[rid] = row
            if now_ns is not None and row.time_next > now_ns:
                heapq.heappush(self._scheduled, (row.time_next, next(self._seq), row))
            else:
                heapq.heappush(self._heap, (row.priority, row.time_next, next(self._seq), row))
            taken += 1
        self._compact()
        return added, taken

    # -- sending -------------------------------------------------------------------------
    def pop(self, n: int, now_ns: int | None = None) -> list[CachedRow]:
        """Take up to n rows due at ``now_ns`` (None: all queued), best first, and mark them
        as sending."""
        self._release(now_ns)
        batch: list[CachedRow] = []
        heap, queued = self._heap, self._queued
        while heap and len(batch) < n:
            row = heapq.heappop(heap)[3]
            if queued.get(row.id) is row:
                del queued[row.id]
                self._sending.add(row.id)
                batch.append(row)
        return batch

    def _release(self, now_ns: int | None) -> None:
        """Move the scheduled rows due at ``now_ns`` (None: all) to the due heap."""
        scheduled, queued = self._scheduled, self._queued
        while scheduled and (now_ns is None or scheduled[0][0] <= now_ns):
            row = heapq.heappop(scheduled)[2]
            if queued.get(row.id) is row:
                heapq.heappush(self._heap, (row.priority, row.time_next, next(self._seq), row))

    def next_due_ns(self) -> int | None:
        """When the first queued row that is not due yet falls due (None: there is none)."""
        scheduled, queued = self._scheduled, self._queued
        while scheduled and queued.get(scheduled[0][2].id) is not scheduled[0][2]:
            heapq.heappop(scheduled)  # stale: sent, acked or re-keyed meanwhile
        return scheduled[0][0] if scheduled else None

    def due(self, now_ns: int) -> bool:
        """Whether a queued row is due at ``now_ns``."""
        self._release(now_ns)
        return bool(self._heap)

    def mark_sent(
        self,
        sent: Sequence[CachedRow],
        now_ns: int,
        ack_wait_ns: int,
        unclaimed: bool,
        owner: Window | None = None,
    ) -> None:
        """Rows about to be handed to a subscriber (``owner``, whose outstanding count they
        join): in flight for ack_wait, and ``unclaimed`` (not postponed in the database yet)
        when the send does not postpone them. Called before the hand-over, so that an ack,
        however quick, finds them here."""
        entry = (now_ns + ack_wait_ns, owner)
        flight = self._in_flight
        if not unclaimed:  # claimed: no longer due in the database
            self._note(row.id for row in sent)
        for row in sent:
            if row.id in flight:  # sent again before its lease ended (a short backoff)
                self._land(row.id)
            flight[row.id] = entry
            if unclaimed:
                self._unclaimed[row.id] = (row.epoch, now_ns, row)
        if owner is not None:
            owner.outstanding += len(sent)

    def finish(self, batch: Sequence[CachedRow], now_ns: int) -> None:
        """The batch's send is over (whether or not its rows were sent)."""
        for row in batch:
            self._sending.discard(row.id)
        self.in_flight(now_ns)  # expire old leases so the set stays bounded by rate x ack wait

    # -- sent rows not postponed yet -----------------------------------------------------
    def take_unclaimed(self, ids: Iterable[Hashable]) -> dict[Hashable, Sent]:
        """Those of ``ids`` sent and not postponed: an ack about to be written for them
        (which counts their send). Held until :meth:`settle` or :meth:`unhold`."""
        taken: dict[Hashable, Sent] = {}
        unclaimed = self._unclaimed
        if not unclaimed:
            return taken
        for rid in ids:
            sent = unclaimed.pop(rid, None)
            if sent is not None:
                taken[rid] = sent
        self._held.update(taken)
        return taken

    def due_postpones(self, sent_before_ns: int, limit: int) -> dict[Hashable, Sent]:
        """Up to ``limit`` unclaimed rows sent at or before the time, oldest first; held."""
        taken: dict[Hashable, Sent] = {}
        unclaimed = self._unclaimed
        while unclaimed and len(taken) < limit:
            rid, sent = next(iter(unclaimed.items()))
            if sent[1] > sent_before_ns:
                break
            del unclaimed[rid]
            taken[rid] = sent
        self._held.update(taken)
        return taken

    def unsend(self, ids: Iterable[Hashable]) -> int:
        """Rows handed to a subscriber that left before they went out: the database still
        has them due and unchanged (their postpone was not written), so they may be read and
        sent again at once. Returns how many were taken back."""
        n = 0
        for rid in ids:
            if self._unclaimed.pop(rid, None) is not None:
                self._land(rid)
                n += 1
        return n

    def reschedule(self, row: CachedRow, epoch: int, time_next: int) -> bool:
        """``row``, which this server has just postponed to ``time_next`` (epoch as
        written), falls due before the next poll would read it: wait for it here, if there
        is room and the row is not here already. Its send checks it as any other."""
        rid = row.id
        if rid in self._queued or rid in self._sending or rid in self._unclaimed:
            return False
        if rid in self._held or len(self._queued) + len(self._sending) >= self.size:
            return False
        again = CachedRow(row.priority, time_next, epoch, row.values)
        self._queued[rid] = again
        heapq.heappush(self._scheduled, (time_next, next(self._seq), again))
        return True

    def settle(self, ids: Collection[Hashable]) -> None:
        """Their ack or postpone is written: the database has them now."""
        self._held.difference_update(ids)
        self._note(ids)

    def unhold(self, taken: dict[Hashable, Sent]) -> None:
        """Writing them failed: unclaimed again, at the front (they are the oldest)."""
        for rid, sent in reversed(taken.items()):
            self._unclaimed[rid] = sent
            self._unclaimed.move_to_end(rid, last=False)
        self._held.difference_update(taken)

    def next_postpone_sent_ns(self) -> int | None:
        """When the oldest unclaimed row was sent (None: there is none)."""
        if not self._unclaimed:
            return None
        return next(iter(self._unclaimed.values()))[1]

    @property
    def unclaimed(self) -> int:
        return len(self._unclaimed) + len(self._held)

    # -- acks and resets -----------------------------------------------------------------
    def forget(self, ids: Collection[Hashable]) -> None:
        """Acked ids: never send them from the cache, and no longer in flight."""
        self._note(ids)
        for rid in ids:
            self._queued.pop(rid, None)  # its heap entry goes stale and is skipped
            self._land(rid)
        self._compact()

    def clear(self) -> None:
        """Drop everything queued (the last subscriber left). Sending rows finish normally;
        rows sent stay in flight until their lease ends, and unclaimed until their postpone
        is written."""
        self._queued.clear()
        self._heap.clear()
        self._scheduled.clear()
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
            rid, (deadline, _) = next(iter(flight.items()))
            if deadline > now_ns:
                break
            self._land(rid)
        return len(flight)

    def _land(self, rid: Hashable) -> None:
        """``rid`` is no longer in flight: its subscriber gets the credit back."""
        entry = self._in_flight.pop(rid, None)
        if entry is not None and entry[1] is not None:
            owner = entry[1]
            owner.outstanding -= 1
            owner.stalled_ns = None
            self.credited = True

    def in_flight_of(self, owner: Window) -> list[Hashable]:
        """The ids in flight to ``owner``."""
        return [rid for rid, (_, o) in self._in_flight.items() if o is owner]

    def land(self, owner: Window, ids: Iterable[Hashable]) -> None:
        """Those of ``ids`` still in flight to ``owner`` left it by other means than this
        server saw (acked or deleted by DML): its credit back."""
        flight = self._in_flight
        for rid in ids:
            entry = flight.get(rid)
            if entry is not None and entry[1] is owner:
                self._land(rid)

    def _compact(self) -> None:
        queued = self._queued
        if len(self._heap) > 2 * len(queued) + 64:
            self._heap = [e for e in self._heap if queued.get(e[3].id) is e[3]]
            heapq.heapify(self._heap)
        if len(self._scheduled) > 2 * len(queued) + 64:
            self._scheduled = [e for e in self._scheduled if queued.get(e[2].id) is e[2]]
            heapq.heapify(self._scheduled)
