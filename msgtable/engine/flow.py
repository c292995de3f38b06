"""Flow control at the sender: what a group's limits (msgtable.core.flow) let go now.

A table (or subscription) with limits has a :class:`Limiter` beside its cache; one without
has none, and its sender pays nothing. The sender asks the limiter at each send, under the
table's lock:

* :meth:`Limiter.begin` gives the send's **budget**: the group's rate tokens (vt_rate) and
  its room under vt_max_in_flight (what is in flight: msgtable.engine.inflight). Batches are
  cut to it (msgtable.engine.dispatch);
* each row taken is **charged** (a place under its key's cap, and its tokens are reserved
  for this send); the tokens are spent when the rows are handed over
  (:meth:`Limiter.delivered`, at the hand-over's instant: what goes at each instant is what
  the bucket allows then, however long the send's check took). A row the check drops, a
  filter refuses or that is out of attempts is not handed over: it spends nothing and gets
  its place back at :meth:`Limiter.finish`. A key's place under vt_key_concurrency is given
  back when its row leaves flight (acked, released, rejected, dead, its ack wait over, or
  handed back unsent): :meth:`Limiter.landed`.

A table with limits per key (vt_key_rate, vt_key_concurrency) or a fairness key keeps its due
rows by key (:class:`KeyedDue`), so a send skips a key at its limit without looking at its
rows, and the rows of the others go out. A held-back row is not touched: it stays queued in
its place (not an attempt, its epoch unchanged). With vt_fair_key the keys take turns, one
row each (work-conserving: a key alone gets every turn), and no key holds more than its
share of the cache (the poll leaves the rest of it in the table, read by a later pass), so
the others' rows find room. Without it the best row of a key free to send goes first, by
(priority, time_next), as in any table.

Across servers: a table has one sender at a time (msgtable.engine.placement), and these
counts are that sender's. A new sender starts with empty token buckets (so a rate holds
across a hand-over: the old sender's sends and the new one's together stay within one
bucket's bound, ``burst + rate * T`` in any T seconds), and a table with a cap holds its
sends after a takeover until every message the old sender may have in flight is settled or
past its ack wait (msgtable.engine.tenure), so caps hold across a hand-over too.

Not thread-safe: the table's manager guards it with its lock.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any

from msgtable.core.flow import REASONS, FlowControl, TokenBucket
from msgtable.core.rows import CachedRow, PolledRow
from msgtable.core.tables import TableConfig
from msgtable.engine.cache import MessageCache
from msgtable.engine.due import DueRows
from msgtable.engine.inflight import InFlight

NO_BUDGET = 2**62
Entry = tuple[int, int, int, CachedRow]  # msgtable.engine.due's heap entries


class Limiter:
    """One group's limits at its sender (see the module docstring). ``key_index``: where
    the vt_limit_key column is in a row's values (None: no limit per key); ``wake`` wakes
    the sender (a key or the group left its cap)."""

    def __init__(
        self,
        flow: FlowControl,
        key_index: int | None,
        start_ns: int,
        wake: Callable[[], object] = lambda: None,
    ) -> None:
        self.flow = flow
        self._key_index = key_index if flow.per_key else None
        self._start_ns = start_ns
        self._group = (
            TokenBucket(flow.rate_per_s, flow.burst, start_ns) if flow.rate_per_s else None
        )
        self._buckets: dict[Hashable, TokenBucket] = {}
        self._prune_at = 1024
        self._cap = flow.key_concurrency
        self._in_flight: dict[Hashable, int] = {}  # key -> its rows sending or in flight
        self._key_of: dict[Hashable, Hashable] = {}  # id counted under a key's cap -> key
        self._charged: dict[Hashable, tuple[Hashable, bool]] = {}  # this send's: id -> key
        self._delivered: set[Hashable] = set()  # of those, handed over
        self._reserved: dict[Hashable, int] = {}  # this send's tokens per key (key rates)
        self._wake = wake
        self._now = start_ns
        self.left = NO_BUDGET  # this send's budget left
        self._limited_by = ""  # the group limit that set the budget ("": none)
        self._waiting = False  # the group or a key is at its cap: wake the sender on a landing
        self._began = False  # a send began (begin) and has not finished
        self._held: set[str] = set()  # the reasons that held rows back in this send
        self._next_ns: int | None = None  # when a rate that held rows back lets one go
        self.throttled = dict.fromkeys(REASONS, 0)  # sends a limit held rows back in

    @property
    def keyed(self) -> bool:
        """Whether the due rows are kept by key (:class:`KeyedDue`)."""
        return bool(self.flow.keyed_column)

    @property
    def counts_rows(self) -> bool:
        """Whether a limit counts each row (a rate, a cap, a limit per key): a table with a
        fairness key only has nothing to count."""
        f = self.flow
        return bool(f.rate_per_s or f.max_in_flight or f.per_key)

    @property
    def counts_landings(self) -> bool:
        """Whether the limiter must hear of each row leaving flight (a cap is set)."""
        return self.flow.capped

    def carry(self, old: Limiter) -> None:
        """Take over what ``old`` (the same table's, before new settings) counts in flight."""
        if old.flow.key_column == self.flow.key_column and self._cap and old._cap:
            self._in_flight, self._key_of = old._in_flight, old._key_of

    def restart(self, now_ns: int) -> None:
        """A takeover: the rates' windows start empty now (the old sender's sends count)."""
        self._start_ns = now_ns
        if self._group is not None:
            self._group = TokenBucket(self.flow.rate_per_s, self.flow.burst, now_ns)
        self._buckets.clear()

    # -- one send ------------------------------------------------------------------------
    def begin(self, now_ns: int, in_flight: int) -> int:
        """A send at ``now_ns`` with ``in_flight`` of the group's messages in flight: its
        budget (how many rows it may take in all)."""
        self._now = now_ns
        self._began = True
        self._held.clear()
        self._reserved.clear()
        self._next_ns = None
        left, why = NO_BUDGET, ""
        if self._group is not None:
            left, why = self._group.available(now_ns), "rate"
        cap = self.flow.max_in_flight
        if cap and cap - in_flight < left:
            left, why = max(0, cap - in_flight), "in_flight"
        self.left, self._limited_by = left, why
        if len(self._buckets) >= self._prune_at:
            self._prune(now_ns)
        return left

    def admit(self, row: CachedRow) -> bool:
        """Whether ``row`` may go in this send, under its key's limits (charged if so)."""
        if self.left <= 0:
            if self._limited_by:
                self._hold(self._limited_by)
            return False
        key = row.values[self._key_index] if self._key_index is not None else None
        if key is not None:
            rid = row.id
            if self._cap and self._in_flight.get(key, 0) >= self._cap and rid not in self._key_of:
                self._hold("key_cap")
                self._waiting = True
                return False
            if self.flow.key_rate_per_s:
                bucket = self._bucket(key)
                reserved = self._reserved.get(key, 0)
                if bucket.available(self._now) - reserved < 1:
                    self._hold("key_rate", bucket.next_ns(reserved + 1))
                    return False
        self._charge(row.id, key)
        return True

    def charge_all(self, rows: Sequence[CachedRow]) -> None:
        """Rows taken by a send of a table whose limits are the group's only."""
        for row in rows:
            self._charge(row.id, None)

    def delivered(self, rows: Sequence[CachedRow], at_ns: int) -> None:
        """These charged rows are handed over at ``at_ns`` (under the lock, just before):
        their tokens are spent then."""
        if not self._charged:
            return  # nothing was counted (a fairness key only)
        self._delivered.update(r.id for r in rows)
        if self._group is not None:
            self._group.spend(len(rows), at_ns)
        if self.flow.key_rate_per_s:
            charged = self._charged
            for r in rows:
                key = charged[r.id][0]
                if key is not None:
                    self._bucket(key).spend(1, at_ns)

    def end_plan(self, more_due: bool) -> None:
        """The send's plan is made; ``more_due``: rows it did not take are due now."""
        if more_due and self.left <= 0 and self._limited_by:
            self._hold(self._limited_by)
            if self._limited_by == "in_flight":
                self._waiting = True

    def finish(self, flying: Callable[[Hashable], bool]) -> None:
        """The send is over: what it took and did not hand over, and what it handed over
        that already left flight, gets its place under the key's cap back."""
        if not self._began:  # the send ended before it began (nothing due, a takeover's hold)
            self._next_ns = None  # what the last send was held back for is gone
            return
        self._began = False
        group = self._group
        for rid, (_, counted) in self._charged.items():
            if counted and (rid not in self._delivered or not flying(rid)):
                self._uncount(rid)
        self._charged.clear()
        self._delivered.clear()
        for reason in self._held:
            self.throttled[reason] += 1
        if "rate" in self._held and group is not None:
            self._soonest(group.next_ns())

    def landed(self, rid: Hashable) -> None:
        """``rid`` left flight (msgtable.engine.inflight's on_land)."""
        if rid in self._charged:
            return  # the send that took it settles it (finish)
        if rid in self._key_of:
            self._uncount(rid)
        if self._waiting:
            self._waiting = False
            self._wake()

    def wake_times(self, inflight: InFlight) -> list[int]:
        """When the sender should look again, besides what wakes it: a rate that held rows
        back lets the next one go; a cap that did frees as the first ack wait ends."""
        out = [] if self._next_ns is None else [self._next_ns]
        if self._waiting:
            deadline = inflight.next_deadline_ns()
            if deadline is not None:
                out.append(deadline)
        return out

    def status(self) -> dict[str, Any]:
        """The limits and what they held back, as msgtable.core.status.TableStatus has them."""
        return {
            "limits": self.flow.describe(),
            "throttled": tuple(self.throttled.items()),
            "keys_at_cap": self.keys_at_cap,
        }

    @property
    def keys_at_cap(self) -> int:
        """How many keys have vt_key_concurrency messages in flight now."""
        cap = self._cap
        return sum(1 for n in self._in_flight.values() if n >= cap) if cap else 0

    # -- inside ----------------------------------------------------------------------------
    def _charge(self, rid: Hashable, key: Hashable) -> None:
        self.left -= 1
        counted = False
        if key is not None:
            if self._cap and rid not in self._key_of:
                self._in_flight[key] = self._in_flight.get(key, 0) + 1
                self._key_of[rid] = key
                counted = True
            if self.flow.key_rate_per_s:
                self._reserved[key] = self._reserved.get(key, 0) + 1
        self._charged[rid] = (key, counted)

    def _uncount(self, rid: Hashable) -> None:
        key = self._key_of.pop(rid, None)
        if key is None:
            return
        n = self._in_flight.get(key, 0) - 1
        if n > 0:
            self._in_flight[key] = n
        else:
            self._in_flight.pop(key, None)

    def _bucket(self, key: Hashable) -> TokenBucket:
        """A key's bucket; a new one as if it had started empty when this sender did."""
        bucket = self._buckets.get(key)
        if bucket is None:
            flow = self.flow
            bucket = TokenBucket(flow.key_rate_per_s, flow.key_burst, self._start_ns)
            self._buckets[key] = bucket
        return bucket

    def _hold(self, reason: str, next_ns: int | None = None) -> None:
        self._held.add(reason)
        if next_ns is not None:
            self._soonest(next_ns)

    def _soonest(self, at_ns: int) -> None:
        if self._next_ns is None or at_ns < self._next_ns:
            self._next_ns = at_ns

    def _prune(self, now_ns: int) -> None:
        """Drop the keys' buckets that are full again (a new one would be the same)."""
        for key, bucket in list(self._buckets.items()):
            if bucket.full_at_ns() <= now_ns:
                del self._buckets[key]
        self._prune_at = 2 * len(self._buckets) + 1024


def attach(
    cfg: TableConfig,
    cache: MessageCache,
    now_ns: int,
    wake: Callable[[], object],
    old: Limiter | None = None,
) -> Limiter | None:
    """The limiter of a table's limits (None: it has none), its cache made ready for it:
    the due rows kept by key where a limit holds per key or shares fairly, and the rows
    leaving flight told to it where a cap counts them. ``old``: the limiter of the table's
    settings before (what it counts in flight carries over; a new config never changes the
    column the rows are kept by: msgtable.engine.engine's _same_shape)."""
    limits = cfg.flow
    limiter = None
    if limits is not None:
        names = [c.name for c in cfg.message_columns]
        key_index = names.index(limits.key_column) if limits.per_key else None
        limiter = Limiter(limits, key_index, now_ns, wake)
        if old is not None:
            limiter.carry(old)
        if limits.keyed_column:
            if isinstance(cache.due, KeyedDue):
                cache.due.limiter = limiter
            else:
                index = names.index(limits.keyed_column)
                cache.due = KeyedDue(cfg.cache_size, index, bool(limits.fair_key), limiter)
    hooks = [cache.ordered.landed] if cache.ordered is not None else []
    if limiter is not None and limiter.counts_landings:
        hooks.append(limiter.landed)
    cache.inflight.on_land = hooks[0] if len(hooks) == 1 else _both(*hooks) if hooks else None
    return limiter


def skip_keys(due: object) -> tuple[Hashable, ...]:
    """The keys a fair table's next poll leaves in the table (KeyedDue.skip_keys); none for
    another table."""
    return due.skip_keys() if isinstance(due, KeyedDue) and due.fair else ()


def follows_tail(due: object) -> bool:
    """Whether a table's next poll reads on from where its pass ended (an INSERT the binlog
    showed), the new rows only, not the sent rows at the table's head again: a table with a
    fairness key whose pass left nothing behind. A new pass begins from the head as for any
    table (the poll interval, a release)."""
    return isinstance(due, KeyedDue) and due.fair and not due.left_behind


def _share(size: int) -> int:
    """A fair table's key's share of its cache: half (the others always find room)."""
    return max(1, size // 2)


def _both(
    first: Callable[[Hashable], None], then: Callable[[Hashable], None]
) -> Callable[[Hashable], None]:
    def landed(rid: Hashable) -> None:
        first(rid)
        then(rid)

    return landed


class KeyCounts(dict[Hashable, CachedRow]):
    """A fair table's queued rows by id, counted per key as they come and go, and the keys
    that hold their ``share`` of the cache (``full``): the poll skips those."""

    def __init__(self, key_index: int, share: int) -> None:
        super().__init__()
        self._at = key_index
        self.share = share
        self.per_key: dict[Hashable, int] = {}
        self.full: set[Hashable] = set()

    def __setitem__(self, rid: Hashable, row: CachedRow) -> None:
        old = dict.get(self, rid)
        key = row.values[self._at]
        if old is not None:
            if old.values[self._at] == key:  # refreshed under its key: counted already
                dict.__setitem__(self, rid, row)
                return
            self.less(old.values[self._at], 1)
        dict.__setitem__(self, rid, row)
        n = self.per_key.get(key, 0) + 1
        self.per_key[key] = n
        if n >= self.share:
            self.full.add(key)

    def __delitem__(self, rid: Hashable) -> None:
        self.less(dict.pop(self, rid).values[self._at], 1)

    def pop(self, rid: Hashable, default: Any = None) -> Any:
        row = dict.pop(self, rid, None)
        if row is None:
            return default
        self.less(row.values[self._at], 1)
        return row

    def clear(self) -> None:
        dict.clear(self)
        self.per_key.clear()
        self.full.clear()

    def reshare(self, share: int) -> None:
        """The cache's size changed (a new comment): so did a key's share of it."""
        if share != self.share:
            self.share = share
            self.full = {k for k, n in self.per_key.items() if n >= share}

    def less(self, key: Hashable, gone: int) -> None:
        """``gone`` rows of ``key`` were taken out: count them (a fair send's turn takes a
        key's rows in a run by dict.__delitem__, uncounted, and counts them once)."""
        n = self.per_key[key] - gone
        if n:
            self.per_key[key] = n
        else:
            del self.per_key[key]
        if n < self.share:
            self.full.discard(key)


class KeyedDue(DueRows):
    """Due rows kept by the value of one column (see the module docstring): a heap per key.
    ``key_index``: the column's place in a row's values; ``fair``: the keys take turns
    (vt_fair_key), else the best row of a free key goes first."""

    def __init__(self, size: int, key_index: int, fair: bool, limiter: Limiter) -> None:
        self._left_behind = False  # a pass left rows in the table past a key's share
        super().__init__(size)
        self._key_index = key_index
        self._fair = fair
        if fair:  # counted per key: a key holds at most its share (half) of the cache
            self._queued = self._counts = KeyCounts(key_index, _share(size))
        self._behind: set[Hashable] = set()  # the keys whose rows the pass left behind
        self._skipping: tuple[Hashable, ...] = ()  # the keys the running poll skips
        self.limiter = limiter
        self._heaps: dict[Hashable, list[Entry]] = {}
        self._turns: deque[Hashable] = deque()  # fair: the keys with rows, in turn
        self._heads: list[tuple[int, int, int, Hashable]] = []  # else: keys by their best row

    @property
    def fair(self) -> bool:
        return self._fair

    @property
    def left_behind(self) -> bool:
        """Whether the current pass left rows of a key past its share in the table."""
        return self._left_behind

    @property
    def pending(self) -> bool:
        """More due rows may wait in the table: the last poll filled its page, or a pass left
        rows of a key past its share there (read them when the cache has room again)."""
        return self._pending or self._left_behind

    @pending.setter
    def pending(self, value: bool) -> None:
        self._pending = value

    def skip_keys(self) -> tuple[Hashable, ...]:
        """The keys holding their share of the cache: the next poll leaves their rows in the
        table and reads the others' (a quiet key's rows are found past a noisy key's
        backlog at once, not when the pass has read through it). Under the lock, before the
        poll's read; its :meth:`add` notes them as left behind. A key already left behind
        is skipped until it has sent half its share (wants_refill), not read a row at a
        time past its backlog."""
        counts = self._counts
        half = counts.share // 2
        more = [k for k in self._behind if k not in counts.full and counts.per_key.get(k, 0) > half]
        self._skipping = (*counts.full, *more)
        return self._skipping

    def wants_refill(self) -> bool:
        """As DueRows': the last page was full; or a key whose rows a pass left behind has
        sent half its share (not at each send: a poll that skips it would read nothing)."""
        if len(self._queued) > self.size // 2 or not self._fair:
            return super().wants_refill()
        if self._pending:
            return True
        if not self._left_behind:
            return False
        per_key, half = self._counts.per_key, self._counts.share // 2
        return any(per_key.get(k, 0) <= half for k in self._behind)

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
        """As DueRows.add; with fair share, a key's new rows past its share of the cache are
        left in the table (taken: the pass goes on past them, a later one reads them)."""
        if not self._fair:
            return super().add(rows, now_ns, unclaimed, held, changed, created)
        at = 3 + self._key_index
        if not self._pending:  # the pass before ended: this poll begins a new one
            self._left_behind = False
            self._behind.clear()
        if self._skipping:  # the poll read past these keys' rows
            self._left_behind = True
            self._behind.update(self._skipping)
            self._skipping = ()
        share = _share(self.size)
        self._counts.reshare(share)
        per_key = self._counts.per_key
        counts: dict[Hashable, int] = {}
        kept: list[PolledRow] = []
        where: list[int] = []  # the place in ``rows`` of each kept row
        queued, sending = self._queued, self.sending
        for i, r in enumerate(rows):
            key, rid = r[at], r[3]
            out = rid in sending or rid in unclaimed or rid in held or rid in changed
            if not out and rid not in queued:  # a new row (the others are skipped or refreshed)
                n = counts.get(key)
                if n is None:
                    n = per_key.get(key, 0)
                if n >= share:
                    self._left_behind = True
                    self._behind.add(key)
                    continue
                counts[key] = n + 1
            kept.append(r)
            where.append(i)
        new, taken = super().add(kept, now_ns, unclaimed, held, changed, created)
        return new, (len(rows) if taken == len(kept) else where[taken])

    def connect(self, accepts: Callable[..., bool]) -> None:
        """Streams with a filter look for their rows among the keys' (dispatch._take)."""

    # -- sending -------------------------------------------------------------------------
    def pop(self, n: int, now_ns: int | None = None) -> list[CachedRow]:
        """Up to ``n`` due rows of keys their limits let go (each charged to the limiter),
        by turns of the keys or best first; marked as sending."""
        self._release(now_ns)
        self._drain()
        batch: list[CachedRow] = []
        if self._fair:
            self._pop_turns(n, batch)
        else:
            self._pop_best(n, batch)
        self.sending.update(r.id for r in batch)
        return batch

    def _pop_turns(self, n: int, batch: list[CachedRow]) -> None:
        turns, heaps, counts = self._turns, self._heaps, self._counts
        admit = self.limiter.admit if self.limiter.counts_rows else None
        blocked: list[Hashable] = []
        get, remove = counts.get, dict.__delitem__  # the key's count drops once per turn
        while turns and len(batch) < n:
            key = turns.popleft()
            heap = heaps[key]
            # one row a turn; a key alone takes all it may in one (work-conserving)
            take = want = n - len(batch) if not turns else 1
            while take and heap:
                row = heap[0][3]
                if get(row.id) is not row:
                    heapq.heappop(heap)  # stale: sent, acked or re-keyed meanwhile
                    continue
                if admit is not None and not admit(row):
                    blocked.append(key)
                    break
                heapq.heappop(heap)
                remove(counts, row.id)
                batch.append(row)
                take -= 1
            if take < want:
                counts.less(key, want - take)
            if not heap:
                del heaps[key]
            elif not blocked or blocked[-1] is not key:
                turns.append(key)
        turns.extendleft(reversed(blocked))  # they keep their turn

    def _pop_best(self, n: int, batch: list[CachedRow]) -> None:
        heads, heaps, queued = self._heads, self._heaps, self._queued
        admit = self.limiter.admit if self.limiter.counts_rows else None
        blocked: list[tuple[int, int, int, Hashable]] = []
        while heads and len(batch) < n:
            head = heads[0]
            key = head[3]
            heap = heaps.get(key)
            while heap and queued.get(heap[0][3].id) is not heap[0][3]:
                heapq.heappop(heap)
            if not heap:
                heapq.heappop(heads)
                heaps.pop(key, None)
                continue
            top = heap[0]
            if top[2] != head[2]:  # the key's best row is another now
                heapq.heapreplace(heads, (top[0], top[1], top[2], key))
                continue
            row = top[3]
            if admit is not None and not admit(row):
                blocked.append(heapq.heappop(heads))
                continue
            heapq.heappop(heap)
            del queued[row.id]
            batch.append(row)
            if heap:
                nxt = heap[0]
                heapq.heapreplace(heads, (nxt[0], nxt[1], nxt[2], key))
            else:
                heapq.heappop(heads)
                del heaps[key]
        for head in blocked:
            heapq.heappush(heads, head)

    def _drain(self) -> None:
        """Move the rows come due (in DueRows' heap) to their keys' heaps: grouped by key,
        a few pushed into a big heap, many extended and heapified once."""
        inbox, queued, heaps, at = self._heap, self._queued, self._heaps, self._key_index
        if not inbox:
            return
        self._heap = []
        grouped: dict[Hashable, list[Entry]] = {}
        for entry in inbox:
            row = entry[3]
            if queued.get(row.id) is row:
                key = row.values[at]
                group = grouped.get(key)
                if group is None:
                    grouped[key] = [entry]
                else:
                    group.append(entry)
        for key, entries in grouped.items():
            mine = heaps.get(key)
            top = mine[0] if mine else None
            if mine is None:
                heaps[key] = mine = entries
                heapq.heapify(mine)
                if self._fair:
                    self._turns.append(key)
            elif len(entries) * 16 < len(mine):  # a few into a big heap: push them
                for entry in entries:
                    heapq.heappush(mine, entry)
            else:
                mine.extend(entries)
                heapq.heapify(mine)
            if not self._fair and mine[0] is not top:  # the key's best row is a new one
                best = mine[0]
                heapq.heappush(self._heads, (best[0], best[1], best[2], key))

    def due(self, now_ns: int) -> bool:
        self._release(now_ns)
        self._drain()
        return bool(self._heaps)

    # -- leaving -------------------------------------------------------------------------
    def clear(self) -> list[Hashable]:
        dropped = super().clear()
        self._heaps.clear()
        self._turns.clear()
        self._heads.clear()
        return dropped

    def _compact(self) -> None:
        super()._compact()
        queued = self._queued
        heaps = getattr(self, "_heaps", None)  # DueRows.__init__ runs before ours
        if not heaps or sum(map(len, heaps.values())) <= 2 * len(queued) + 64:
            return
        for key, heap in list(heaps.items()):
            live = [e for e in heap if queued.get(e[3].id) is e[3]]
            if live:
                heapq.heapify(live)
                heaps[key] = live
            else:
                del heaps[key]
        if self._fair:
            self._turns = deque(k for k in self._turns if k in heaps)
        else:
            self._heads = [(h[0][0], h[0][1], h[0][2], k) for k, h in heaps.items()]
            heapq.heapify(self._heads)
