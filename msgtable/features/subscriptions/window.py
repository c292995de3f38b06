"""A subscription's window over its cursor (design.md next to this module, (c) and (d)): the
messages its sender handed out from the cursor's scan that the cursor has not passed yet.

A message enters the window when the scan reads it (into the cache) and is sent from there
(nothing is written: the send is in memory, as the default group's lazy postpone); one the
cache lets go of before a subscriber got it stays, unsent, and is read again. It leaves it
when the cursor passes it, which the cursor may only do over a prefix (in sequence order)
of messages that are each either **acked** (settled in the window: no write of its own) or
**held** (its state row was written: a postpone, a release, a reject, an ack by DML: from
then on the state table serves it). So the durable cursor never passes an unsettled message
without a state row, and a crash, which loses the window, loses no message: the next sender
scans above the durable cursor and sends the rest again (at least once). ``advance`` says
where the cursor can go, ``moved`` that it went there (one conditional UPDATE per flush,
msgtable.store: advance_cursor), ``lost`` that another sender moved it (the window is
dropped). While a message not settled holds the cursor (``held_at``), ``acked_only`` names
the acks behind it that live in the window alone, to write as acked state rows
(``written``: held from then on).

Pure bookkeeping, no clock and no I/O: the caller passes the times and writes what it says
(msgtable.features.subscriptions.lazy serves a lazy subscription through it).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Hashable, Iterable, Sequence
from itertools import islice

from msgtable.core.rows import PolledRow

# A message's state is kept in three dicts of plain values, not an object or a list per
# message: a batch costs no call each (the cost guard counts calls), and a window of thousands
# of messages adds no object for the garbage collector to traverse. ``_number``: every id in
# the window, its number in the table's fan-out sequence; ``_sent``: those handed to a
# subscriber, when first (absent: read by the scan, not sent yet: in the cache); ``_settled``:
# those settled (ACKED: acked here, nothing written; HELD: its state row written, or nothing
# to write; either way the cursor may pass it).
ACKED, HELD = 1, 2


class Window:
    """One subscription's window; ``cursor``: its durable cursor as read from the store.
    Each verb on one id has a batch form (``*_all``, ``*_of``) for the sender's batches."""

    def __init__(self, cursor: int) -> None:
        self.cursor = cursor
        self.scan_after = cursor  # the next scan reads the rows numbered above this
        self._number: dict[Hashable, int] = {}
        self._sent: dict[Hashable, int] = {}
        self._settled: dict[Hashable, int] = {}
        self._ids: dict[int, Hashable] = {}  # number -> id
        self._numbers: list[int] = []  # the keys of _ids, ascending (the cursor's way)
        self._again: set[Hashable] = set()  # let go of (unread): the next scan reads them again
        self.held_at: int | None = None  # the first unsettled number, as ``advance`` saw it

    def __len__(self) -> int:
        return len(self._number)

    def read(self, number: int, id: Hashable) -> bool:
        """The scan read it (into the cache): the cursor may not pass it until it is sent
        and settled. False: it is in the window already (read again, not let go of)."""
        return bool(self.read_all([(number, id)]))

    def read_all(self, rows: Iterable[tuple[int, Hashable]]) -> list[Hashable]:
        """``read`` of each (number, id); returns the ids new to the window."""
        numbered, ids, top, again = self._number, self._ids, self.scan_after, self._again
        new = []
        added = len(ids)
        for number, id in rows:
            if number > top:
                top = number
            if id not in numbered:
                numbered[id] = number
                ids[number] = id
                new.append(id)
            elif again and id in again:
                again.discard(id)
                new.append(id)
        self.scan_after = top
        self._numbered(len(ids) - added)
        return new

    def read_scan(
        self,
        scanned: Sequence[PolledRow],
        after: int | None = None,
        complete: bool = False,
        net: bool = False,
    ) -> list[PolledRow]:
        """A scan's rows (each as a poll reads it, its id fourth, then its number; in
        number order), ``read`` in one pass: returns those not stale (numbered at or below
        the cursor, or settled here since the scan began), for the cache (which keeps one
        of each), as a poll reads them (without the number). ``after``: where the scan
        began, and ``complete``: it read every row above that (fewer than its limit), so it
        covered the numbers up to its last row's, or all: a message of the window there that
        the cache does not hold (let go of; ``net``: a scan from the cursor, any not sent)
        and that the scan did not find was deleted, acked by the application's upsert, or
        changed so that the filter no longer passes it: settled (``gone``), or it would hold
        the cursor for good."""
        numbered, ids, top, again = self._number, self._ids, self.scan_after, self._again
        settled, cursor = self._settled, self.cursor
        missing = self._unsent() if net and after is not None else None
        added = len(ids)
        out = []
        for row in scanned:
            number = row[-1]
            if number <= cursor:
                continue
            id = row[3]
            if id not in numbered:
                numbered[id] = number
                ids[number] = id
            elif id in settled:
                continue
            elif again and id in again:
                again.discard(id)
            if missing:
                missing.discard(id)
            if number > top:
                top = number
            out.append(row[:-1])
        self.scan_after = top
        self._numbered(len(ids) - added)
        if after is not None and (again or missing):
            upto = None if complete or not scanned else scanned[-1][-1]
            self.gone({*again, *(missing or ())}, after, upto)
        return out

    def _numbered(self, k: int) -> None:
        """The last ``k`` numbers read into the window (the newest keys of ``_ids``, in the
        order read: a scan's, ascending), into the ascending list of its numbers."""
        if not k:
            return
        new = list(islice(reversed(self._ids), k))
        new.reverse()
        numbers = self._numbers
        numbers.extend(new)
        if (len(numbers) > k and new[0] < numbers[-k - 1]) or (k > 1 and new != sorted(new)):
            numbers.sort()  # (not read in order: a test's reads, a row read late)

    def _unsent(self) -> set[Hashable]:
        """The ids read and neither sent nor settled."""
        sent, settled = self._sent, self._settled
        return {i for i in self._number if i not in sent and i not in settled}

    def gone(self, ids: Iterable[Hashable], after: int, upto: int | None) -> list[Hashable]:
        """Those of ``ids`` unsent and unsettled numbered above ``after`` (and at most
        ``upto``) are no longer the window's to stand for (a scan of that range did not find
        them): settled as held, with nothing to write. Returns them."""
        numbered, sent, settled, out = self._number, self._sent, self._settled, []
        for id in ids:
            number = numbered.get(id)
            if number is None or id in settled or id in sent:
                continue
            if number > after and (upto is None or number <= upto):
                settled[id] = HELD
                self._again.discard(id)
                out.append(id)
        return out

    def unread(self, id: Hashable) -> None:
        """``unread_all`` of one."""
        self.unread_all([id])

    def unread_all(self, ids: Iterable[Hashable]) -> None:
        """The cache let them go before a subscriber got them (read and never sent, or
        handed over and given back): the next scan starts below the first again. Each stays
        in the window, unsettled and unsent, so the cursor may not pass it meanwhile;
        ``read`` says it is new again when the scan reads it."""
        numbered, sent, settled = self._number, self._sent, self._settled
        for id in ids:
            number = numbered.get(id)
            if number is None or id in settled:
                continue
            sent.pop(id, None)
            self._again.add(id)
            self.scan_after = min(self.scan_after, number - 1)

    def sent(self, id: Hashable, sent_ns: int) -> bool:
        """It was handed to a subscriber (the first time: a later send of it is the state
        table's, once held). False: not in the window."""
        return bool(self.sent_all([id], sent_ns))

    def sent_all(self, ids: Iterable[Hashable], sent_ns: int) -> list[Hashable]:
        """``sent`` of each; returns those in the window."""
        numbered, sent = self._number, self._sent
        out = []
        for id in ids:
            if id in numbered:
                if id not in sent:
                    sent[id] = sent_ns
                out.append(id)
        return out

    def acked(self, id: Hashable) -> bool:
        """Its ack came (gRPC): settled here, nothing written. False: not in the window, or
        not sent (its state row, if any, is the one to settle)."""
        return bool(self.settle_all([id], written=False))

    def held(self, id: Hashable) -> bool:
        """Its state row was written (postponed, released, rejected, dead, acked by DML):
        the state table has it now. False: not in the window, or not sent."""
        return bool(self.settle_all([id]))

    def settle_all(
        self, ids: Iterable[Hashable], unsent: bool = False, written: bool = True
    ) -> list[Hashable]:
        """``held`` (``written`` False: ``acked``) of each; returns those settled now.
        ``unsent``: those read and not sent too (``parked``)."""
        numbered, sent, settled = self._number, self._sent, self._settled
        out = []
        how = HELD if written else ACKED
        for id in ids:
            if id not in numbered or id in settled:
                continue
            if not unsent and id not in sent:
                continue
            settled[id] = how
            out.append(id)
        return out

    def parked(self, id: Hashable) -> bool:
        """Its state row was written before it was sent (due later than the poll reads):
        the state table serves it. False: not in the window, or sent already."""
        if id not in self._number or id in self._sent:
            return False
        return bool(self.settle_all([id], unsent=True))

    def open_of(self, ids: Iterable[Hashable]) -> set[Hashable]:
        """Those in the window and neither acked nor held: no state row, the window alone
        stands for them (read, or sent)."""
        numbered, settled = self._number, self._settled
        return {i for i in ids if i in numbered and i not in settled}

    def flying_of(self, ids: Iterable[Hashable]) -> set[Hashable]:
        """Those sent and neither acked nor held."""
        sent, settled = self._sent, self._settled
        return {i for i in ids if i in sent and i not in settled}

    def settled_of(self, ids: Iterable[Hashable]) -> set[Hashable]:
        """Those in the window, acked or held: the cursor may pass them (a scan that reads
        them again is stale)."""
        settled = self._settled
        return {i for i in ids if i in settled}

    def open(self, id: Hashable) -> bool:
        return bool(self.open_of([id]))

    def flying(self, id: Hashable) -> bool:
        return bool(self.flying_of([id]))

    def settled(self, id: Hashable) -> bool:
        return bool(self.settled_of([id]))

    def in_flight(self) -> list[Hashable]:
        """The ids sent and neither acked nor held, in sequence order."""
        ids, sent, settled = self._ids, self._sent, self._settled
        return [i for i in map(ids.__getitem__, self._numbers) if i in sent and i not in settled]

    def overdue(self, now_ns: int, postpone_after_ns: int) -> list[Hashable]:
        """The ids in flight sent ``postpone_after_ns`` or longer ago: their state rows are
        due (the postpone), after which they are held."""
        sent = self._sent
        return [i for i in self.in_flight() if now_ns - sent[i] >= postpone_after_ns]

    def advance(self) -> int | None:
        """Where the cursor can go now: past the longest settled prefix in sequence order
        (None: not past its place; nothing to write). ``held_at``: where that prefix ends
        (the first unsettled number; None: every one in the window is settled)."""
        ids, settled = self._ids, self._settled
        top = held = None
        for number in self._numbers:
            if ids[number] not in settled:
                held = number
                break
            top = number
        self.held_at = held
        return top if top is not None and top > self.cursor else None

    def acked_only(self, after: int = -1) -> list[Hashable]:
        """The ids acked here with nothing written (behind ``held_at``, once the cursor
        moved over the settled prefix), in sequence order: while the cursor is held, their
        acks live in this window alone. ``after``: only those numbered above it (beyond
        where another sender moved the cursor)."""
        ids, settled = self._ids, self._settled
        return [ids[n] for n in self._numbers if n > after and settled.get(ids[n]) == ACKED]

    def written(self, ids: Iterable[Hashable]) -> None:
        """Their acked state rows were written (``acked_only``): held from now on."""
        settled = self._settled
        for id in ids:
            if id in settled:
                settled[id] = HELD

    def moved(self, new: int) -> list[Hashable]:
        """The cursor was written at ``new``: what it passed leaves the window (returned)."""
        self.cursor = max(self.cursor, new)
        ids, numbers, again = self._ids, self._numbers, self._again
        numbered, sent, settled = self._number, self._sent, self._settled
        passed = bisect_right(numbers, self.cursor)
        gone = [ids.pop(n) for n in numbers[:passed]]
        del numbers[:passed]
        for id in gone:
            numbered.pop(id, None)
            sent.pop(id, None)
            settled.pop(id, None)
        if again:
            again.difference_update(gone)
        self.scan_after = max(self.scan_after, self.cursor)
        return gone

    def lost(self, cursor: int) -> None:
        """Another sender moved the cursor (to ``cursor``): the window was not this one's to
        flush; it starts again from there."""
        for d in (self._number, self._sent, self._settled, self._ids):
            d.clear()
        self._numbers.clear()
        self._again.clear()
        self.cursor = self.scan_after = cursor
        self.held_at = None

    def ids(self) -> Collection[Hashable]:
        """Every id in the window."""
        return self._number.keys()
