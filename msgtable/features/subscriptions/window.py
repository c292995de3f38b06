"""A subscription's window over its cursor (design.md next to this module, (c) and (d)): the
messages its sender handed out from the cursor's scan that the cursor has not passed yet.

A message enters the window when the scan reads it (into the cache) and is sent from there
(nothing is written: the send is in memory, as the default group's lazy postpone); one the
cache lets go of unsent leaves it and is read again. It leaves it when the cursor passes it,
which the cursor may only do over a prefix (in sequence order) of messages that are each
either **acked** (settled in the window: no write of its own) or **held** (its state row
was written: a postpone, a release, a reject, an ack by DML: from then on the state table
serves it). So the durable cursor never passes an unsettled message without a state row,
and a crash, which loses the window, loses no message: the next sender scans above the
durable cursor and sends the rest again (at least once). ``advance`` says where the cursor
can go, ``moved`` that it went there (one conditional UPDATE per flush, msgtable.store:
advance_cursor), ``lost`` that another sender moved it (the window is dropped).

Pure bookkeeping, no clock and no I/O: the caller passes the times and writes what it says
(msgtable.features.subscriptions.lazy serves a lazy subscription through it).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass
class _Entry:
    number: int  # in the table's fan-out sequence
    sent_ns: int | None = None  # None: read by the scan, not sent yet (in the cache)
    settled: bool = False  # acked or held: the cursor may pass it


class Window:
    """One subscription's window; ``cursor``: its durable cursor as read from the store."""

    def __init__(self, cursor: int) -> None:
        self.cursor = cursor
        self.scan_after = cursor  # the next scan reads the rows numbered above this
        self._by_id: dict[Hashable, _Entry] = {}
        self._ids: dict[int, Hashable] = {}  # number -> id

    def __len__(self) -> int:
        return len(self._by_id)

    def read(self, number: int, id: Hashable) -> bool:
        """The scan read it (into the cache): the cursor may not pass it until it is sent
        and settled. False: it is in the window already (a scan again after unread)."""
        if id in self._by_id:
            self.scan_after = max(self.scan_after, number)
            return False
        self._by_id[id] = _Entry(number)
        self._ids[number] = id
        self.scan_after = max(self.scan_after, number)
        return True

    def unread(self, id: Hashable) -> None:
        """The cache let it go unsent: the next scan starts below it again."""
        entry = self._by_id.get(id)
        if entry is not None and entry.sent_ns is None:
            del self._by_id[id], self._ids[entry.number]
            self.scan_after = min(self.scan_after, entry.number - 1)

    def sent(self, id: Hashable, sent_ns: int) -> bool:
        """It was handed to a subscriber (the first time: a later send of it is the state
        table's, once held). False: not in the window."""
        entry = self._by_id.get(id)
        if entry is None:
            return False
        if entry.sent_ns is None:
            entry.sent_ns = sent_ns
        return True

    def acked(self, id: Hashable) -> bool:
        """Its ack came (gRPC): settled here, nothing written. False: not in the window, or
        not sent (its state row, if any, is the one to settle)."""
        return self._settle(id)

    def held(self, id: Hashable) -> bool:
        """Its state row was written (postponed, released, rejected, dead, acked by DML):
        the state table has it now. False: not in the window, or not sent."""
        return self._settle(id)

    def parked(self, id: Hashable) -> bool:
        """Its state row was written before it was sent (due later than the poll reads):
        the state table serves it. False: not in the window, or sent already."""
        entry = self._by_id.get(id)
        if entry is None or entry.settled or entry.sent_ns is not None:
            return False
        entry.settled = True
        return True

    def open(self, id: Hashable) -> bool:
        """In the window and neither acked nor held: it has no state row, the window
        alone stands for it (read, or sent)."""
        entry = self._by_id.get(id)
        return entry is not None and not entry.settled

    def flying(self, id: Hashable) -> bool:
        """Sent and neither acked nor held."""
        entry = self._by_id.get(id)
        return entry is not None and entry.sent_ns is not None and not entry.settled

    def settled(self, id: Hashable) -> bool:
        """In the window, acked or held: the cursor may pass it (a scan that reads it again
        is stale)."""
        entry = self._by_id.get(id)
        return entry is not None and entry.settled

    def _settle(self, id: Hashable) -> bool:
        entry = self._by_id.get(id)
        if entry is None or entry.settled or entry.sent_ns is None:
            return False
        entry.settled = True
        return True

    def in_flight(self) -> list[Hashable]:
        """The ids sent and neither acked nor held, in sequence order."""
        return [i for _, i in sorted(self._ids.items()) if self._flying(i)]

    def _flying(self, id: Hashable) -> bool:
        entry = self._by_id[id]
        return entry.sent_ns is not None and not entry.settled

    def overdue(self, now_ns: int, postpone_after_ns: int) -> list[Hashable]:
        """The ids in flight sent ``postpone_after_ns`` or longer ago: their state rows are
        due (the postpone), after which they are held."""
        return [
            i
            for i in self.in_flight()
            if now_ns - (self._by_id[i].sent_ns or 0) >= postpone_after_ns
        ]

    def advance(self) -> int | None:
        """Where the cursor can go now: past the longest settled prefix in sequence order
        (None: not past its place; nothing to write)."""
        top = None
        for number in sorted(self._ids):
            if not self._by_id[self._ids[number]].settled:
                break
            top = number
        return top if top is not None and top > self.cursor else None

    def moved(self, new: int) -> None:
        """The cursor was written at ``new``: what it passed leaves the window."""
        self.cursor = max(self.cursor, new)
        for number in [n for n in self._ids if n <= self.cursor]:
            self._by_id.pop(self._ids.pop(number), None)
        self.scan_after = max(self.scan_after, self.cursor)

    def lost(self, cursor: int) -> None:
        """Another sender moved the cursor (to ``cursor``): the window was not this one's to
        flush; it starts again from there."""
        self._by_id.clear()
        self._ids.clear()
        self.cursor = self.scan_after = cursor
