"""Ordering per key: the due rows of an ordered table (vt_order_key), one batch per key at a time.

The messages of one key go out in order (vt_order_by, id by default), one batch at a time: a
key's next batch leaves only after every message of the one before it left flight (acked,
released, rejected, dead, its ack wait over, or handed back unsent). A batch may carry several
consecutive messages of a key (its **run**), to one subscriber, in order. Different keys go in
parallel, to every subscriber. Rows with a NULL key are unordered: each is a key of its own.

Where things are:

* **the database decides what is next.** A key's head is its first unsettled message (not
  acked, not dead) in order. Polls read, through the order index (key, time_acked, order
  column), each key's run: its first vt_batch_size unsettled messages. A pass pages through
  the keys (one index dive per key, whatever its backlog); a key that became free is read
  again first (**wanted**), so a busy key is not one message per pass.
* **runs**: at most one cached run per free key (the cache holds heads, not backlogs). Keys
  whose head is due wait in a heap by (the head's priority, arrival): round-robin among the
  keys of one priority, as a key that just sent comes back at the end. Priority orders keys,
  never the messages of one key. A key whose head falls due before the next poll waits in a
  heap by that time; its later messages wait with it.
* **busy keys**: a key with rows being sent or in flight. A poll's run of a busy key is not
  taken in, and a run is popped only for a free key; what a pop does not take of a run (the
  batch was full, a row not due yet) is dropped and read again when the key is wanted.
* a run read while a row of it changed (sent, acked, postponed: msgtable.engine.cache's Poll), or
  holding a row sent and not postponed yet, is cut before that row: the rest waits.

A new lease holder sends nothing for the old one's ack waits (msgtable.engine.lease): by then what
it sent is settled or due again, and the database's heads are right. What is out past that
(renewed, or postponed by a server that handed the lease over cleanly) shows in the table as
a sent row not due yet: a run holding one waits until it is due (key_due_ns), and a send's
check that finds a key's row no longer due sends none of the key (whole_keys). Not thread-safe: the
table's manager guards it with its lock, like msgtable.engine.due.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import threading
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from msgtable.core.rows import CachedRow, PolledRow, Values, order_of

if TYPE_CHECKING:
    from msgtable.core.tables import TableConfig
    from msgtable.store.protocol import Store


class Unkeyed(tuple[Hashable]):
    """The key of a row whose order key is NULL: its own, ``Unkeyed((id,))``."""

    __slots__ = ()


def run_key(row: PolledRow) -> Hashable:
    """The key of a row as an ordered poll reads it: its last column, the key's identity (of
    a text key, its collation's weight string: the values the database holds equal are one
    key); the column before is a value of the key, the one before that its order value, and
    before that its time_created (msgtable.store.ordering)."""
    key = row[-1]
    return Unkeyed((row[3],)) if key is None else key


class OrderedDue:
    """Runs of free keys, ready or scheduled, and the busy keys (see the module docstring).
    Offers msgtable.engine.due.DueRows's interface, so the cache and the sender use either."""

    def __init__(
        self, size: int, flying: Callable[[Hashable], bool], lookahead_ns: int | None = None
    ) -> None:
        self.size = size
        # a run is taken in only if its head falls due within this of the poll (the table's
        # vt_poller_interval; None: whenever); the others wait for a later pass
        self.lookahead_ns = lookahead_ns
        self.pending = False  # the current pass of polls has keys left to read
        self.sending: set[Hashable] = set()
        self._flying = flying  # whether a row is in flight (msgtable.engine.inflight)
        self._runs: dict[Hashable, list[CachedRow]] = {}
        self._run_of: dict[Hashable, Hashable] = {}  # id of a cached row -> its key
        self._queued = 0
        self._ready: list[tuple[int, int, Hashable, list[CachedRow]]] = []  # (priority, seq)
        self._scheduled: list[tuple[int, int, Hashable, list[CachedRow]]] = []  # (time, seq)
        self._seq = itertools.count()
        self._back = itertools.count(-1, -1)  # put_back's: before every _seq
        self._busy: dict[Hashable, int] = {}  # key -> rows of it sending or in flight
        self._key_of: dict[Hashable, Hashable] = {}  # id sending or in flight -> its key
        self._wanted: dict[Hashable, None] = {}  # free keys to read again, first come first
        self._later: dict[Hashable, None] = {}  # wanted, but the last read was stale
        self._value_of: dict[Hashable, object] = {}  # a key's identity -> a value of it

    # -- filling -------------------------------------------------------------------------
    def add(
        self,
        rows: Sequence[PolledRow],
        now_ns: int | None,
        unclaimed: Collection[Hashable],
        held: Collection[Hashable],
        changed: Collection[Hashable],
        created: bool = False,  # an ordered read always has time_created (orderstore)
    ) -> tuple[list[Hashable], int]:
        """Take in the runs a poll read (rows of ``run_key``, each key's in order). A run of a
        busy key is skipped; one already cached is replaced; a run is cut before a row being
        sent, sent and not postponed yet (``unclaimed``, ``held``) or changed since the read
        began, or left out whole when its head falls due after ``lookahead_ns``. Returns the
        ids new here and how many rows were taken (all, unless the cache filled up first)."""
        new: list[Hashable] = []
        taken = 0
        ahead = self.lookahead_ns
        horizon = None if now_ns is None or ahead is None else now_ns + ahead
        for key, run in _by_key(rows):
            at = key_due_ns(run, now_ns)
            if horizon is not None and at is not None and at > horizon:
                taken += len(run)  # due after the next poll: a later pass reads it again
                continue
            if not isinstance(key, Unkeyed):
                self._value_of[key] = run[0][-2]
            if key in self._busy:
                taken += len(run)
                continue
            cut: list[CachedRow] = []
            for r in run:
                rid = r[3]
                if rid in self.sending or rid in unclaimed or rid in held or rid in changed:
                    break
                cut.append(CachedRow(r[0], r[1], r[2], tuple(r[3:-4]), r[-4]))
            old = self._runs.get(key)
            if len(cut) > len(old or ()) + self.room():
                break  # full: the rest is read again
            taken += len(run)
            if old is not None:
                self._drop(key)
            if not cut:
                if not isinstance(key, Unkeyed):
                    self._later[key] = None
                continue
            self._wanted.pop(key, None)
            self._later.pop(key, None)
            for row in cut:
                self._run_of[row.id] = key
            old_ids = {r.id for r in old} if old is not None else ()
            new.extend(row.id for row in cut if row.id not in old_ids)
            self._runs[key] = cut
            self._queued += len(cut)
            head = cut[0]
            if now_ns is not None and at is not None and at > now_ns:
                heapq.heappush(self._scheduled, (at, next(self._seq), key, cut))
            else:
                heapq.heappush(self._ready, (head.priority, next(self._seq), key, cut))
        return new, taken

    def reschedule(self, row: CachedRow, epoch: int, time_next: int) -> bool:
        """An ordered key's postponed row comes back through its key's next read."""
        return False

    # -- sending -------------------------------------------------------------------------
    def pop(self, n: int, now_ns: int | None = None) -> list[CachedRow]:
        """Up to ``n`` rows: the due runs of ready keys in turn, each from its head, cut at a
        row not due at ``now_ns`` (None: all are); their keys are busy until every row
        popped leaves flight or is handed back."""
        self._release(now_ns)
        batch: list[CachedRow] = []
        while self._ready and len(batch) < n:
            _, _, key, run = heapq.heappop(self._ready)
            if self._runs.get(key) is not run:
                continue  # stale: dropped or read again since
            self._drop(key)
            took = 0
            for row in run:
                if len(batch) >= n or (now_ns is not None and row.time_next > now_ns):
                    break
                self.sending.add(row.id)
                self._key_of[row.id] = key
                batch.append(row)
                took += 1
            self._busy[key] = self._busy.get(key, 0) + took
        return batch

    def put_back(self, rows: Iterable[CachedRow]) -> None:
        """Rows popped that no subscriber took (their filters refused them): their key's run
        again, at the front, if nothing else of the key was taken; else dropped (read again
        when the key is free)."""
        runs: dict[Hashable, list[CachedRow]] = {}
        for row in rows:
            self.sending.discard(row.id)
            key = self._key_of.get(row.id)
            if key is not None:
                runs.setdefault(key, []).append(row)
                self._free(row.id, want=False)
        for key, run in reversed(list(runs.items())):  # the first key ends up first
            if key in self._busy or key in self._runs:
                self._want(key)
                continue
            for row in run:
                self._run_of[row.id] = key
            self._runs[key] = run
            self._queued += len(run)
            heapq.heappush(self._ready, (run[0].priority, next(self._back), key, run))

    def finish(self, batch: Iterable[CachedRow]) -> bool:
        """The send is over: rows of it not in flight (not handed over) free their key.
        False: a pass reads a free key's rows anew (DueRows.finish's new pass is not needed)."""
        for row in batch:
            self.sending.discard(row.id)
            if not self._flying(row.id):
                self._free(row.id)
        return False

    def landed(self, rid: Hashable) -> None:
        """``rid`` left flight (msgtable.engine.inflight): its key is free once all its rows did."""
        if rid not in self.sending:
            self._free(rid)

    def key_of(self, rid: Hashable) -> Hashable:
        """The key of a row popped here."""
        return self._key_of.get(rid)

    def due(self, now_ns: int) -> bool:
        self._release(now_ns)
        while self._ready and self._runs.get(self._ready[0][2]) is not self._ready[0][3]:
            heapq.heappop(self._ready)
        return bool(self._ready)

    def next_due_ns(self) -> int | None:
        """When the first scheduled head falls due (None: none is)."""
        scheduled = self._scheduled
        while scheduled and self._runs.get(scheduled[0][2]) is not scheduled[0][3]:
            heapq.heappop(scheduled)
        return scheduled[0][0] if scheduled else None

    def _release(self, now_ns: int | None) -> None:
        scheduled = self._scheduled
        while scheduled and (now_ns is None or scheduled[0][0] <= now_ns):
            _, _, key, run = heapq.heappop(scheduled)
            if self._runs.get(key) is run:
                heapq.heappush(self._ready, (run[0].priority, next(self._seq), key, run))

    # -- keys ----------------------------------------------------------------------------
    def _free(self, rid: Hashable, want: bool = True) -> None:
        key = self._key_of.pop(rid, None)
        if key is None:
            return
        left = self._busy.get(key, 0) - 1
        if left > 0:
            self._busy[key] = left
            return
        self._busy.pop(key, None)
        if want:
            self._want(key)

    def _want(self, key: Hashable) -> None:
        if not isinstance(key, Unkeyed):
            self._wanted[key] = None

    def _drop(self, key: Hashable) -> None:
        run = self._runs.pop(key, None)
        if run is not None:
            self._queued -= len(run)
            for row in run:
                self._run_of.pop(row.id, None)

    def take_wanted(self, limit: int) -> list[object]:
        """Up to ``limit`` free keys to read again first (freed since their last read), as
        values to read them by."""
        keys: list[object] = []
        wanted = self._wanted
        while wanted and len(keys) < limit:
            key = next(iter(wanted))
            del wanted[key]
            if key in self._busy:
                continue  # wanted again once free
            value = self._value_of.pop(key, None)  # a read that finds rows records it again
            if value is not None:
                keys.append(value)
        return keys

    def free(self, key: Hashable) -> bool:
        """Whether a pass should read ``key``: not busy, no run cached, not wanted."""
        return key not in self._busy and key not in self._runs and key not in self._wanted

    def new_pass(self) -> None:
        """A pass begins: keys whose last read was stale are wanted again."""
        self._wanted.update(self._later)
        self._later.clear()

    @property
    def keys_in_flight(self) -> int:
        return len(self._busy)

    @property
    def keys_waiting(self) -> int:
        return len(self._runs)

    # -- leaving -------------------------------------------------------------------------
    def forget(self, ids: Iterable[Hashable]) -> None:
        """Acked or deleted ids: a cached run holding one is dropped, its key read again."""
        for rid in ids:
            key = self._run_of.get(rid)
            if key is not None:
                self._drop(key)
                self._want(key)

    def clear(self) -> list[Hashable]:
        """Drop every run (the last subscriber left); busy keys stay busy until their rows
        leave flight. Returns [] (an ordered table has no lazy subscription to tell)."""
        self._runs.clear()
        self._run_of.clear()
        self._queued = 0
        self._ready.clear()
        self._scheduled.clear()
        self._wanted.clear()
        self._later.clear()
        self._value_of = {k: v for k, v in self._value_of.items() if k in self._busy}
        self.pending = False
        return []

    # -- counts --------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        return self._queued

    def room(self) -> int:
        return max(0, self.size - self._queued - len(self.sending))

    def wants_refill(self) -> bool:
        """Keys were freed (read them now), or the pass has keys left and room is half free."""
        return bool(self._wanted) or (self.pending and self._queued <= self.size // 2)


def key_due_ns(run: Sequence[PolledRow], now_ns: int | None) -> int | None:
    """When a key read as ``run`` (its first rows, in order) may send: when its head falls
    due, and not before every row of it that was sent (epoch > 0) and is not due at
    ``now_ns`` is: such a row is out (in flight from this server or another, renewed, or
    released with a delay), and a key never has two batches out. Rows never sent (a delayed
    enqueue) hold only the rows after them. None: due now (or no time to compare with)."""
    at: int | None = run[0][1]
    if now_ns is None:
        return at
    for r in run[1:]:
        t: int | None = r[1]
        if t is not None and t > now_ns and r[2] and (at is None or t > at):
            at = t
    return at


def _by_key(rows: Sequence[PolledRow]) -> list[tuple[Hashable, list[PolledRow]]]:
    """An ordered poll's rows by key, each key's in order (order column, then id: the last
    two columns but one)."""
    runs: dict[Hashable, list[PolledRow]] = {}
    seen: set[Hashable] = set()
    for r in rows:
        if r[3] not in seen:  # a key read twice in one poll (wanted, and by its pass)
            seen.add(r[3])
            runs.setdefault(run_key(r), []).append(r)
    for run in runs.values():
        if len(run) > 1:
            run.sort(key=lambda r: order_of(r[-3], r[3]))
    return list(runs.items())


# A pass reads at most this many keys per poll.
MAX_KEYS_PER_PAGE = 1000
# An ordered table's new pass after an INSERT the binlog showed: not sooner than this after
# the last began, nor than PASS_SHARE times the last one took (passes cost at most a tenth of
# the time, whatever the number of keys)
MIN_PASS_GAP_NS = 100_000_000
PASS_SHARE = 10


def pass_gap_ns(last_pass_cost_ns: int) -> int:
    """How long after the last pass began an INSERT's pass may begin (see above)."""
    return max(MIN_PASS_GAP_NS, PASS_SHARE * last_pass_cost_ns)


@dataclass(frozen=True)
class KeyPass:
    """Where an ordered table's pass of polls got to: the last key read, then, once the keys
    are done, the last id of the due rows of no key; ``done``: the pass is over."""

    key: object | None = None
    unkeyed: Hashable | None = None
    unkeyed_phase: bool = False
    done: bool = False

    @classmethod
    def begin(cls, ordered: OrderedDue) -> KeyPass:
        """A new pass (under the table's lock): keys whose last read was stale are wanted
        again."""
        ordered.new_pass()
        ordered.pending = True
        return cls()

    @staticmethod
    def read(
        store: Store,
        cfg: TableConfig,
        ordered: OrderedDue,
        lock: threading.Lock,
        wanted: Sequence[object],
        at: KeyPass | None,
        room: int,
        horizon_ns: int,
    ) -> tuple[list[PolledRow], KeyPass | None]:
        """One poll's reads (outside ``lock``, which it takes to ask which keys are free):
        the runs of ``wanted`` keys, then, with ``at`` (a pass under way), the next page of
        the pass: up to a run of room for each key, the runs of the free keys among them, or
        the rows of no key due by ``horizon_ns``. Returns the rows (OrderedDue.add leaves
        out the runs whose head falls due later) and where the pass gets to once they are
        taken (None: no pass read)."""
        per_key = cfg.batch_size
        rows = store.runs(cfg, wanted, per_key) if wanted else []
        left = room - len(rows)
        then = None
        if at is not None and left > 0:
            limit = max(1, min(MAX_KEYS_PER_PAGE, left // per_key))
            if not at.unkeyed_phase:
                page = store.order_keys(cfg, at.key, limit)
                taking = set(wanted)
                with lock:
                    fresh = [v for v, key in page if ordered.free(key) and v not in taking]
                if fresh:
                    rows += store.runs(cfg, fresh, per_key)
                then = dataclasses.replace(
                    at, key=page[-1][0] if page else at.key, unkeyed_phase=len(page) < limit
                )
            else:
                loose = store.unkeyed(cfg, horizon_ns, at.unkeyed, left)
                rows += loose
                then = dataclasses.replace(
                    at, unkeyed=loose[-1][3] if loose else at.unkeyed, done=len(loose) < left
                )
        return rows, then


class KeyOwners:
    """Within one send of an ordered table: which subscriber took rows of which key, and
    which keys a subscriber's filter refused a row of (their later rows stay back)."""

    def __init__(self, ordered: OrderedDue) -> None:
        self._ordered = ordered
        self._owner: dict[Hashable, int] = {}
        self._me = -1
        self._refused: set[Hashable] = set()

    def start(self, me: int) -> None:
        self._me = me
        self._refused = set()

    def admits(self, accepts: Callable[[Values], bool] | None) -> Callable[[Values], bool]:
        def admit(values: Values) -> bool:
            key = self._ordered.key_of(values[0])
            if key in self._refused or self._owner.get(key, self._me) != self._me:
                self._refused.add(key)
                return False
            if accepts is None or accepts(values):
                self._owner[key] = self._me
                return True
            self._refused.add(key)
            return False

        return admit


def whole_keys(
    batch: Sequence[CachedRow], kept: Collection[Hashable], key_of: Callable[[Hashable], Hashable]
) -> list[CachedRow]:
    """The rows of ``batch`` whose key has every row of the batch among the ids ``kept``
    (a send's check found them due and unchanged): a key that lost a row sends nothing
    this time, not even its rows before that one. The lost row may be out from another
    server (renewed there since this one read the key), and a key never has two batches
    out; the key is read again once its rows here are freed."""
    lost = {key_of(r.id) for r in batch if r.id not in kept}
    return [r for r in batch if r.id in kept and key_of(r.id) not in lost]


def cut_at_gaps(
    batch: list[CachedRow], kept: list[CachedRow], ordered: OrderedDue
) -> list[CachedRow]:
    """``kept`` (a subset of ``batch``) without any row of a key after one of its rows that
    is not kept: a key's messages never go out past a gap."""
    ids = {r.id for r in kept}
    gaps: set[Hashable] = set()
    out = []
    for r in batch:
        key = ordered.key_of(r.id)
        if key in gaps:
            continue
        if r.id in ids:
            out.append(r)
        else:
            gaps.add(key)
    return out
