"""The bounded per-table cache: what is due (msgtable.due) and what is sent (msgtable.inflight),
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

import threading
from collections.abc import Collection, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager

from msgtable.due import DueRows
from msgtable.inflight import InFlight, Sent
from msgtable.rows import CachedRow, PolledRow
from msgtable.window import Window


class Poll:
    """One poll's read (see :meth:`MessageCache.poll`)."""

    def __init__(self, cache: MessageCache) -> None:
        self._cache = cache
        self.changed: set[Hashable] = set()  # sent, acked or postponed since the read began
        self.added = False

    def add(self, rows: Sequence[PolledRow], now_ns: int | None = None) -> tuple[int, int]:
        """Queue the rows the read returned (under the lock). Returns how many are new, and
        how many of ``rows`` were taken in (all, unless the cache filled up first)."""
        if self.added:
            raise RuntimeError("a poll's rows are added once")
        self.added = True
        cache = self._cache
        cache.polls.remove(self)
        inflight = cache.inflight
        new, taken = cache.due.add(
            rows, now_ns, inflight.unclaimed_ids, inflight.held, self.changed
        )
        inflight.land_all(new)  # the database says they are due again
        return len(new), taken


class Sending:
    """One send (see :meth:`MessageCache.sending`)."""

    def __init__(self, cache: MessageCache, now_ns: int) -> None:
        self._cache = cache
        self.now_ns = now_ns
        self.rows: list[CachedRow] = []  # every row popped, sent or not

    def pop(self, n: int) -> list[CachedRow]:
        """Up to ``n`` rows due now, best first (under the lock)."""
        batch = self._cache.due.pop(n, self.now_ns)
        self.rows.extend(batch)
        return batch

    def sent(
        self, rows: Sequence[CachedRow], ack_wait_ns: int, unclaimed: bool, window: Window | None
    ) -> None:
        """``rows`` (popped here) are about to go to the subscriber of ``window`` (under the
        lock): in flight for ack_wait, and ``unclaimed`` if the send did not postpone them
        (claimed ones are no longer due in the table: a running poll's copy is stale)."""
        cache = self._cache
        if not unclaimed:
            cache.note(row.id for row in rows)
        cache.inflight.add(rows, self.now_ns, ack_wait_ns, unclaimed, window)


class Hold:
    """Unclaimed rows held while their ack or postpone is written (see the holding_ methods)."""

    def __init__(self, rows: dict[Hashable, Sent]) -> None:
        self.rows = rows
        self._written: list[Hashable] = []

    def written(self, ids: Iterable[Hashable]) -> None:
        """Some of the rows are written, whatever becomes of the others."""
        self._written.extend(ids)


class MessageCache:
    """Due and sent rows of one table (see the module docstring)."""

    def __init__(self, size: int, lock: threading.Lock) -> None:
        self.due = DueRows(size)
        self.inflight = InFlight()
        self.polls: list[Poll] = []  # polls whose read is running
        self._lock = lock

    # -- the protocols -----------------------------------------------------------------------
    @contextmanager
    def poll(self) -> Iterator[Poll]:
        """A poll's read: enter before the read begins, ``add`` its rows under the lock."""
        poll = Poll(self)
        with self._lock:
            self.polls.append(poll)
        try:
            yield poll
        finally:
            if not poll.added:
                with self._lock:
                    self.polls.remove(poll)

    @contextmanager
    def sending(self, now_ns: int) -> Iterator[Sending]:
        """A send at ``now_ns``: pop rows through it; they are sending until the block ends."""
        sending = Sending(self, now_ns)
        try:
            yield sending
        finally:
            if sending.rows:
                with self._lock:
                    self.due.finish(sending.rows)
                    # ack waits over leave, so the set stays bounded by rate x ack wait
                    self.inflight.count(now_ns)

    @contextmanager
    def holding_acks(self, ids: Iterable[Hashable]) -> Iterator[Hold]:
        """Those of ``ids`` sent and not postponed yet, held while their ack is written (it
        counts their send)."""
        with self._lock:
            hold = Hold(self.inflight.take_unclaimed(ids))
        with self._settled(hold):
            yield hold

    @contextmanager
    def holding_postpones(self, sent_before_ns: int, limit: int) -> Iterator[Hold]:
        """Up to ``limit`` unclaimed rows sent at or before the time, oldest first, held while
        their postpones are written (mark each with :meth:`Hold.written`)."""
        with self._lock:
            hold = Hold(self.inflight.due_postpones(sent_before_ns, limit))
        with self._settled(hold):
            yield hold

    @contextmanager
    def _settled(self, hold: Hold) -> Iterator[None]:
        try:
            yield
        except BaseException:
            done = set(hold._written)
            with self._lock:
                self.settle(done)
                self.inflight.unhold({r: s for r, s in hold.rows.items() if r not in done})
            raise
        if hold.rows:
            with self._lock:
                self.settle(hold.rows)

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

    @property
    def cached(self) -> int:
        """Rows in memory waiting to be sent (queued or being sent)."""
        return self.due.queued + len(self.due.sending)
