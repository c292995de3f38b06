"""The bounded per-table cache: what is due (msgtable.engine.due) and what is sent
(msgtable.engine.inflight),
and the three protocols through which the table's manager moves rows between them.

A row goes: read by a poll -> queued (or scheduled) -> sending -> sent (in flight, and
unclaimed until its postpone or ack is written) -> gone. Each step that spans a database call
is one object here that cannot be used out of order:

* :meth:`MessageCache.poll`: a poll's read. Rows sent, acked or postponed from the moment
  the read begins until its rows are added are skipped by :meth:`Poll.add`: the read may have
  seen them before the change. ``add`` is the only way in, and once only.
* :meth:`MessageCache.sending`: a send. Rows popped through it are sending until the block
  ends, whatever happens; :meth:`Sending.sent` moves those handed over to a subscriber into
  flight (before the hand-over, so an ack, however quick, finds them there).
* :meth:`MessageCache.holding_acks` / :meth:`MessageCache.holding_postpones`: an ack or
  postpone statement for unclaimed rows. They are held while it runs (a poll skips them) and,
  when the block ends, settled if written, unclaimed again at the front if not.

The cache is not thread-safe: the manager guards it with one lock (``lock``), never held
across a database call. Its other methods are called with that lock held; the three context
managers are entered outside it, and take it themselves where they must.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from types import TracebackType

from msgtable.core.rows import CachedRow, PolledRow, Values
from msgtable.core.window import Window
from msgtable.engine.due import DueRows
from msgtable.engine.inflight import InFlight, Sent
from msgtable.engine.ordered import OrderedDue

# How long a settlement verb waits for another statement holding the count of its rows' sends
# (a postpone or another verb: milliseconds, unless the database hangs) before it goes on.
HOLD_WAIT_S = 10.0
_SENT_EPOCH = operator.itemgetter(0)  # a Sent's epoch, as its send read it


class Poll:
    """One poll's read (see :meth:`MessageCache.poll`): a context manager entered before the
    read begins; :meth:`add` queues what it returned."""

    def __init__(self, cache: MessageCache) -> None:
        self._cache = cache
        self.changed: set[Hashable] = set()  # sent, acked or postponed since the read began
        self.added = False

    def __enter__(self) -> Poll:
        with self._cache.lock:
            self._cache.polls.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.added:
            with self._cache.lock:
                self._cache.polls.remove(self)

    def add(
        self,
        rows: Sequence[PolledRow],
        now_ns: int | None = None,
        created: bool = False,
        over: int = 0,
    ) -> tuple[int, int]:
        """Queue the rows the read returned (under the lock; ``created``: each ends with its
        time_created; ``over``: new rows may fill the cache that many past its size, as a
        redelivery poll's do while fresh rows fill it). Returns how many are new, and how
        many of ``rows`` were taken in (all, unless the cache filled up first)."""
        if self.added:
            raise RuntimeError("a poll's rows are added once")
        self.added = True
        cache = self._cache
        cache.polls.remove(self)
        inflight = cache.inflight
        due = cache.due
        due.size += over
        try:
            new, taken = due.add(
                rows, now_ns, inflight.unclaimed_ids, inflight.held, self.changed, created
            )
        finally:
            due.size -= over
        if now_ns is None or not new:
            inflight.land_all(new)  # the database says they are due again
        else:  # those due only later (scheduled here) stay in flight until then: renewed
            later = {r[3] for r in rows if r[1] is not None and r[1] > now_ns}
            inflight.land_all([i for i in new if i not in later])
        return len(new), taken


class Sending:
    """One send at ``now_ns`` (see :meth:`MessageCache.sending`): a context manager; the rows
    popped through it are sending until it exits, whatever happens."""

    def __init__(self, cache: MessageCache, now_ns: int) -> None:
        self._cache = cache
        self.now_ns = now_ns
        self.rows: list[CachedRow] = []  # every row popped, sent or not

    def __enter__(self) -> Sending:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.rows:
            cache = self._cache
            with cache.lock:
                again = cache.due.finish(self.rows)
                if again and cache.on_reread is not None:
                    cache.on_reread()
                # ack waits over leave, so the set stays bounded by rate x ack wait
                cache.inflight.count(self.now_ns)

    def pop(self, n: int) -> list[CachedRow]:
        """Up to ``n`` rows due now, best first (under the lock)."""
        batch = self._cache.due.pop(n, self.now_ns)
        self.rows.extend(batch)
        return batch

    def pop_for(self, accepts: Callable[[Values], bool], n: int) -> list[CachedRow]:
        """Up to ``n`` rows due now that a stream's filter passes, best first (under the
        lock; an unordered table's, msgtable.engine.routes)."""
        due = self._cache.due
        assert isinstance(due, DueRows)
        batch = due.pop_for(accepts, n, self.now_ns)
        self.rows.extend(batch)
        return batch

    def put_back(self, rows: Sequence[CachedRow]) -> None:
        """Rows popped here that no subscriber took: queued again (under the lock)."""
        if rows:
            taken = {id(r) for r in rows}
            self.rows = [r for r in self.rows if id(r) not in taken]
            self._cache.due.put_back(rows)

    def sent(
        self,
        rows: Sequence[CachedRow],
        ack_wait_ns: int,
        unclaimed: bool,
        window: Window | None,
        sent_ns: int | None = None,
    ) -> None:
        """``rows`` (popped here) are about to go to the subscriber of ``window`` (under the
        lock): in flight for ack_wait from ``sent_ns`` (the hand-over; the send's start when
        None), and ``unclaimed`` if the send did not postpone them (claimed ones are no
        longer due in the table: a running poll's copy is stale)."""
        cache = self._cache
        if not unclaimed:
            cache.note(row.id for row in rows)
        at = self.now_ns if sent_ns is None else sent_ns
        cache.inflight.add(rows, at, ack_wait_ns, unclaimed, window)


class Hold:
    """Unclaimed rows held while their ack or postpone is written (see the holding_
    methods): a context manager that takes them on entry and, on exit, settles those
    written (all of them, when the block ended without an error) and puts the others back."""

    def __init__(
        self,
        cache: MessageCache,
        take: Callable[[InFlight], dict[Hashable, Sent]],
        wait_for: Collection[Hashable] = (),
    ) -> None:
        self._cache = cache
        self._take = take
        self._wait_for = wait_for
        self.rows: dict[Hashable, Sent] = {}
        # ids left out: sent again since the delivery a settlement answers (holding_acks)
        self.skipped: set[Hashable] = set()
        self._written: list[Hashable] = []

    def __enter__(self) -> Hold:
        cache = self._cache
        with cache.lock:
            if self._wait_for:
                # Another statement holds the count of some of these sends (a postpone, or
                # another verb, running): wait for it to end, so that this one either counts
                # the send itself or sees the row with the send counted, never neither.
                held = cache.inflight.held
                cache.released.wait_for(lambda: held.isdisjoint(self._wait_for), HOLD_WAIT_S)
                # and no send hands them over while this one is written (its count would
                # be missed): a send in between keeps them (msgtable.engine.manager)
                for rid in self._wait_for:
                    cache.settling[rid] = cache.settling.get(rid, 0) + 1
            self.rows = self._take(cache.inflight)
        return self

    def _unsettle(self) -> None:
        settling = self._cache.settling
        for rid in self._wait_for:
            left = settling.get(rid, 0) - 1
            if left > 0:
                settling[rid] = left
            else:
                settling.pop(rid, None)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        cache = self._cache
        if kind is None:
            if self.rows or self._wait_for:
                with cache.lock:
                    self._unsettle()
                    cache.settle(self.rows)
                    cache.released.notify_all()
            return
        done = set(self._written)
        with cache.lock:
            self._unsettle()
            cache.settle(done)
            cache.inflight.unhold({r: s for r, s in self.rows.items() if r not in done})
            cache.released.notify_all()

    def written(self, ids: Iterable[Hashable]) -> None:
        """Some of the rows are written, whatever becomes of the others."""
        self._written.extend(ids)

    def first(self) -> dict[Hashable, int | None]:
        """The rows as a verb's ``first`` (msgtable.store.protocol.Uncounted): each one's
        epoch as its send read it. (No comprehension: the cost guard counts Python calls.)"""
        return dict(zip(self.rows, map(_SENT_EPOCH, self.rows.values()), strict=True))


class MessageCache:
    """Due and sent rows of one table (see the module docstring)."""

    def __init__(
        self,
        size: int,
        lock: threading.Lock,
        ordered: bool = False,
        lookahead_ns: int | None = None,
    ) -> None:
        self.inflight = InFlight()
        self.due: DueRows | OrderedDue
        # an ordered table's runs by key (msgtable.engine.ordered), else msgtable.engine.due's rows
        self.ordered: OrderedDue | None = None
        if ordered:
            self.due = self.ordered = OrderedDue(size, self.inflight.flying, lookahead_ns)
            self.inflight.on_land = self.ordered.landed
        else:
            self.due = DueRows(size, self.inflight.flying)
        self.polls: list[Poll] = []  # polls whose read is running
        self.lock = lock
        self.released = threading.Condition(lock)  # held rows were let go (Hold)
        self.settling: dict[Hashable, int] = {}  # ids a settlement verb is writing now
        # called (under the lock) when a send's end finds a row a poll skipped while it was
        # sent and is not in flight now: the manager begins a new pass (DueRows.finish)
        self.on_reread: Callable[[], None] | None = None

    # -- the protocols -----------------------------------------------------------------------
    def poll(self) -> Poll:
        """A poll's read: enter before the read begins, ``add`` its rows under the lock."""
        return Poll(self)

    def sending(self, now_ns: int) -> Sending:
        """A send at ``now_ns``: pop rows through it; they are sending until the block ends."""
        return Sending(self, now_ns)

    def holding_acks(
        self, ids: Iterable[Hashable], wait: bool = False, attempts: Sequence[int] | None = None
    ) -> Hold:
        """Those of ``ids`` sent and not postponed yet, held while their ack is written (it
        counts their send). ``wait``: first wait (up to HOLD_WAIT_S) until no other
        statement holds any of them: a settlement verb whose count must be exact.
        ``attempts``: the delivery of each id a release or renew answers; the ids in flight
        from a later send are left out (``Hold.skipped``), their send neither held nor
        changed (with ``wait``, no send hands them over while the statement runs)."""
        ids = list(ids)

        def take(inflight: InFlight) -> dict[Hashable, Sent]:
            if attempts is None:
                return inflight.take_unclaimed(ids)
            hold.skipped = skipped = inflight.sent_again(ids, attempts)
            return inflight.take_unclaimed([i for i in ids if i not in skipped])

        hold = Hold(self, take, ids if wait else ())
        return hold

    def holding_postpones(self, sent_before_ns: int, limit: int) -> Hold:
        """Up to ``limit`` unclaimed rows sent at or before the time, oldest first, held while
        their postpones are written (mark each with :meth:`Hold.written`)."""
        return Hold(self, lambda inflight: inflight.due_postpones(sent_before_ns, limit))

    # -- under the lock ----------------------------------------------------------------------
    def note(self, ids: Iterable[Hashable]) -> None:
        """These rows changed in the table: a running poll's copy of them is stale."""
        polls = self.polls
        if polls:
            ids = list(ids)
            for poll in polls:
                poll.changed.update(ids)

    def settle(self, ids: Collection[Hashable]) -> None:
        """Their ack or postpone is written: the database has them now."""
        self.inflight.settle(ids)
        self.note(ids)

    def forget(self, ids: Collection[Hashable]) -> None:
        """Acked or deleted ids: never sent from the cache again, and no longer in flight."""
        self.note(ids)
        self.due.forget(ids)
        self.inflight.land_all(ids)

    def reschedule(self, row: CachedRow, epoch: int, time_next: int) -> bool:
        """``row``, which this server has just postponed to ``time_next`` (epoch as
        written), falls due before the next poll would read it: wait for it here, if there
        is room and the row is not here already."""
        if self.inflight.hides(row.id):
            return False
        return self.due.reschedule(row, epoch, time_next)

    def connect(self, accepts: Callable[[Values], bool]) -> None:
        """A stream with a filter subscribed: an unordered table keeps the due rows it passes
        for it (msgtable.engine.routes; an ordered table's sender looks for them by key)."""
        if isinstance(self.due, DueRows):
            self.due.connect(accepts)

    def disconnect(self, accepts: Callable[[Values], bool]) -> None:
        """A stream with a filter left."""
        if isinstance(self.due, DueRows):
            self.due.disconnect(accepts)

    @property
    def stranded(self) -> int:
        """Queued rows no connected stream's filter passes (msgtable.engine.routes; 0 without)."""
        return self.due.stranded if isinstance(self.due, DueRows) else 0

    @property
    def cached(self) -> int:
        """Rows in memory waiting to be sent (queued or being sent)."""
        return self.due.queued + len(self.due.sending)
