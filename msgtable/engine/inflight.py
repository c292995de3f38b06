"""What one table's server has sent and not seen settled: in flight, unclaimed, held.

* **in flight**: sent by this server, its ack wait not over, not acked through us, with the
  :class:`~msgtable.core.window.Window` of the subscriber it went to (which gets the message's
  credit
  back when it leaves: acked, deleted, due again or its ack wait over). The database, not this
  set, decides what is due again;
* **unclaimed**: sent, but not postponed in the database yet (vt_postpone_after), so still due
  there: a poll must not queue it again. It leaves when its ack or its postpone is written;
* **held**: unclaimed rows whose ack or postpone statement is running (msgtable.engine.cache's
  holds): a poll meanwhile skips them too.

Not thread-safe: the table's manager guards it with its lock (msgtable.engine.cache says how).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence

from msgtable.core.rows import CachedRow
from msgtable.core.window import Window

# An unclaimed row: the epoch it was sent at (as read), when it was sent, and the row.
Sent = tuple[int | None, int, CachedRow]


class InFlight:
    """Sent rows by id (see the module docstring)."""

    def __init__(self) -> None:
        # id -> (ack wait deadline, window, when sent, which attempt the send was)
        self._flight: OrderedDict[Hashable, tuple[int, Window | None, int, int]] = OrderedDict()
        self._unclaimed: OrderedDict[Hashable, Sent] = OrderedDict()  # by send time
        self.held: set[Hashable] = set()
        # told of each id that leaves flight (an ordered table's keys: msgtable.engine.ordered)
        self.on_land: Callable[[Hashable], None] | None = None

    # -- sending -------------------------------------------------------------------------
    def add(
        self,
        sent: Sequence[CachedRow],
        now_ns: int,
        ack_wait_ns: int,
        unclaimed: bool,
        window: Window | None,
    ) -> None:
        """Rows about to be handed to a subscriber (whose ``window`` they count against): in
        flight for ack_wait, and ``unclaimed`` when the send does not postpone them."""
        deadline = now_ns + ack_wait_ns
        flight = self._flight
        for row in sent:
            if row.id in flight:  # sent again before its ack wait ended (a short backoff)
                self.land(row.id, again=True)
            flight[row.id] = (deadline, window, now_ns, (row.epoch or 0) + 1)
            if unclaimed:
                self._unclaimed[row.id] = (row.epoch, now_ns, row)
        if window is not None:
            window.take(len(sent))

    def count(self, now_ns: int) -> int:
        """Ids sent whose ack wait is not over (the others leave here, oldest first)."""
        flight = self._flight
        while flight:
            rid, (deadline, *_) = next(iter(flight.items()))
            if deadline > now_ns:
                break
            self.land(rid)
        return len(flight)

    def land(self, rid: Hashable, again: bool = False) -> None:
        """``rid`` is no longer in flight: its window gets the credit back (``again``: it is
        being sent again at once, so it does not leave flight for ``on_land``)."""
        entry = self._flight.pop(rid, None)
        if entry is None:
            return
        if entry[1] is not None:
            entry[1].give_back()
        if self.on_land is not None and not again:
            self.on_land(rid)

    def sent_ns(self, ids: Iterable[Hashable]) -> list[int]:
        """When those of ``ids`` in flight were sent (for msgtable.core.latency)."""
        flight = self._flight
        return [e[2] for e in map(flight.get, ids) if e is not None]

    def flying(self, rid: Hashable) -> bool:
        return rid in self._flight

    def sent_again(self, ids: Sequence[Hashable], attempts: Sequence[int]) -> set[Hashable]:
        """Those of ``ids`` sent by this server since the attempt given for each (0: any): a
        late settlement of an earlier delivery, which must leave the later one alone. That
        send is in flight, or its ack wait is over and its postpone not written yet: still
        unclaimed, its count is this server's to write (taken for a statement that cannot
        match the row, it would be let go uncounted)."""
        flight, unclaimed = self._flight, self._unclaimed
        out: set[Hashable] = set()
        for rid, attempt in zip(ids, attempts, strict=True):
            if not attempt:
                continue
            entry = flight.get(rid)
            if entry is not None:
                if entry[3] != attempt:
                    out.add(rid)
            elif (sent := unclaimed.get(rid)) is not None and (sent[0] or 0) + 1 != attempt:
                out.add(rid)
        return out

    def land_all(self, ids: Iterable[Hashable]) -> None:
        """:meth:`land` of each of ``ids``, each window's credit back in one step: an ack's
        and a poll's ids, so no call per message (the cost guard counts them)."""
        flight = self._flight
        if not flight:
            return
        pop, on_land = flight.pop, self.on_land
        windows: dict[Window, int] = {}
        for rid in ids:
            entry = pop(rid, None)
            if entry is None:
                continue
            window = entry[1]
            if window is not None:
                windows[window] = windows.get(window, 0) + 1
            if on_land is not None:
                on_land(rid)
        for window, n in windows.items():
            window.give_back(n)

    def extend(self, ids: Iterable[Hashable], until_ns: int, exact: bool = False) -> None:
        """Renewed: those of ``ids`` in flight stay so (their window's credit kept) until
        ``until_ns`` at least (``exact``: until then, sooner or later). They move to the end
        (the set stays roughly by deadline)."""
        flight = self._flight
        for rid in ids:
            entry = flight.pop(rid, None)
            if entry is not None:
                deadline = until_ns if exact else max(entry[0], until_ns)
                flight[rid] = (deadline, entry[1], entry[2], entry[3])

    def ids_of(self, window: Window) -> list[Hashable]:
        """The ids in flight to ``window``'s subscriber."""
        return [rid for rid, (_, w, *_) in self._flight.items() if w is window]

    def land_gone(self, window: Window, ids: Iterable[Hashable]) -> int:
        """Those of ``ids`` still in flight to ``window`` left it by other means than this
        server saw (acked or deleted by DML): their credit back. Returns how many."""
        flight, n = self._flight, 0
        for rid in ids:
            entry = flight.get(rid)
            if entry is not None and entry[1] is window:
                self.land(rid)
                n += 1
        return n

    # -- sent rows not postponed yet -----------------------------------------------------
    def hides(self, rid: Hashable) -> bool:
        """Whether the table still has ``rid`` due only because its postpone is not written
        yet (unclaimed or held): a poll's or a reschedule's copy must not be queued."""
        return rid in self._unclaimed or rid in self.held

    @property
    def unclaimed_ids(self) -> Collection[Hashable]:
        return self._unclaimed.keys()

    def take_unclaimed(self, ids: Iterable[Hashable]) -> dict[Hashable, Sent]:
        """Those of ``ids`` sent and not postponed (an ack about to be written for them
        counts their send); held until :meth:`settle` or :meth:`unhold`."""
        taken: dict[Hashable, Sent] = {}
        unclaimed = self._unclaimed
        if not unclaimed:
            return taken
        for rid in ids:
            sent = unclaimed.pop(rid, None)
            if sent is not None:
                taken[rid] = sent
        self.held.update(taken)
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
        self.held.update(taken)
        return taken

    def settle(self, ids: Collection[Hashable]) -> None:
        """Their ack or postpone is written: the database has them now."""
        self.held.difference_update(ids)

    def unhold(self, taken: dict[Hashable, Sent]) -> None:
        """Writing them failed: unclaimed again, at the front (they are the oldest)."""
        for rid, sent in reversed(taken.items()):
            self._unclaimed[rid] = sent
            self._unclaimed.move_to_end(rid, last=False)
        self.held.difference_update(taken)

    def unsend(self, ids: Iterable[Hashable]) -> int:
        """Rows handed to a subscriber that left before they went out (or changed by another
        client since): the database still has them due (their postpone was not written), so
        they may be read and sent again at once. Returns how many were taken back."""
        n = 0
        for rid in ids:
            if self._unclaimed.pop(rid, None) is not None:
                self.land(rid)
                n += 1
        return n

    def next_deadline_ns(self) -> int | None:
        """About when the first ack wait ends (the set is roughly by deadline; None: empty)."""
        if not self._flight:
            return None
        return next(iter(self._flight.values()))[0]

    def next_postpone_sent_ns(self) -> int | None:
        """When the oldest unclaimed row was sent (None: there is none)."""
        if not self._unclaimed:
            return None
        return next(iter(self._unclaimed.values()))[1]

    @property
    def unclaimed(self) -> int:
        """Sent rows whose postpone is still to be written (held ones included)."""
        return len(self._unclaimed) + len(self.held)
