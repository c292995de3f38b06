"""One message table: its subscribers, its cache, and the poller, sender and purger loops.

State machine of a MessageManager::

    closed --open()--> idle     no subscriber: the purger runs, the poller sleeps, cache empty
    idle   --subscribe--> active  the poller reads due rows every vt_poller_interval (sooner
                                   when woken: a new subscriber, or the cache ran low while
                                   more rows were pending); the sender sends batches
    active --last subscriber leaves--> idle   (the cache is dropped: the database is the truth)
    idle/active --close(error)--> closed      subscribers end with the error; loops stop

And of one row: due in the database -> queued (poll) -> sending (popped by the sender) ->
checked under a share lock (still unacked, due, at the epoch read) and handed to one
subscriber inside that transaction -> in flight until its lease (ack wait) ends. A row the
check does not match (acked, deleted, rescheduled or re-versioned by DML since the poll) is
dropped from the cache unsent. A sent row stays due in the database ("unclaimed", never
queued again here) until either its ack through us is written (which counts the send:
epoch + 1) or, vt_postpone_after after the send, its postpone (time_next by backoff from the
send, epoch + 1). With vt_postpone_after=0 the postpone UPDATE is the check itself, before
the send, as in Vitess. Nothing here is the only copy of anything: a crash at any point
leaves every unacked row in the table, due again after its backoff, or at once if its
postpone was not written yet.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

from msgtable.acks import AckCombiner
from msgtable.backoff import draw_jitter, next_delivery_ns
from msgtable.binlog import RowChange
from msgtable.cache import CachedRow, MessageCache
from msgtable.clock import Clock
from msgtable.errors import (
    InvalidArgument,
    MsgtableError,
    NotLeader,
    TableNotFound,
    Unavailable,
)
from msgtable.status import TableStatus
from msgtable.store import poll_key
from msgtable.tables import Column, TableConfig

if TYPE_CHECKING:
    from msgtable.store import PollKey, Store

log = logging.getLogger(__name__)

SUBSCRIBER_BUFFER_BATCHES = 2  # batches claimed for a subscriber but not yet taken by it
# A subscriber's window (MessageStreamRequest.max_in_flight): it is sent a batch only while
# fewer of the messages sent to it are unacked. Without one, gRPC's stream buffers let a
# busy server push tens of thousands of messages to a subscriber ahead of its acks: each
# waits longer for its ack (so more postpones are written), and a stalled or crashed
# subscriber strands them all until their ack wait ends.
DEFAULT_MAX_IN_FLIGHT = 1_000
MAX_IN_FLIGHT = 1_000_000
# A full window that got no credit back for this long: its messages may have been acked or
# deleted by DML (unseen without the binlog); the database is asked.
WINDOW_RECHECK_S = 1.0
MAX_ACK_IDS = 10_000
MAX_POSTPONE_IDS = 10_000  # rows per pass of the deferred postpone
PURGE_BATCH_ROWS = 500
PURGE_MIN_INTERVAL_S = 1.0
# The share of wall time the purger may spend in its DELETEs: after a batch that took t
# seconds it rests t * (1 / duty - 1). Purging is housekeeping (acked rows sit outside the
# poll's index range), so while the table has subscribers it yields the database to them.
PURGE_DUTY_BUSY = 0.25
PURGE_DUTY_IDLE = 0.5
RETRY_MIN_S = 0.1
IDLE_WAIT_S = 1.0
CLOSE_TIMEOUT_S = 10.0

Row = tuple[object, ...]


class Subscriber:
    """One MessageStream: a small bounded queue of batches the sender fills."""

    def __init__(
        self,
        manager: MessageManager,
        fields: tuple[Column, ...],
        window: int = DEFAULT_MAX_IN_FLIGHT,
        max_batches: int = SUBSCRIBER_BUFFER_BATCHES,
    ) -> None:
        self.fields = fields
        self.window = window  # most unacked messages sent to it (a batch goes while fewer)
        self.outstanding = 0  # messages sent to it and in flight (the manager's lock)
        self.stalled_ns: int | None = None  # window full since, with no credit back
        self._manager = manager
        self._max = max_batches
        self._cond = threading.Condition()
        self._batches: deque[list[Row]] = deque()
        self._ended: MsgtableError | None = None
        self._closed = False

    def has_room(self) -> bool:
        return (
            self.outstanding < self.window
            and len(self._batches) < self._max
            and self._ended is None
            and not self._closed
        )

    def put(self, batch: list[Row]) -> None:
        """Queue a batch (never blocks; the sender checked has_room first)."""
        with self._cond:
            self._batches.append(batch)
            self._cond.notify()

    def next_batch(self, timeout_s: float | None = None) -> list[Row]:
        """The next batch; [] on timeout; raises the error that ended the subscription."""
        with self._cond:
            self._cond.wait_for(lambda: self._batches or self._ended or self._closed, timeout_s)
            if self._batches:
                batch = self._batches.popleft()
            elif self._ended is not None:
                raise self._ended
            elif self._closed:
                raise Unavailable("subscription closed")
            else:
                return []
        self._manager.wake_sender()  # room freed
        return batch

    def end(self, error: MsgtableError) -> None:
        """End the subscription; batches already queued are still handed out first."""
        with self._cond:
            if self._ended is None:
                self._ended = error
            self._cond.notify_all()

    def close(self) -> None:
        """The client went away. Idempotent. Its queued batches never went out: they are due
        again at once, or after their lease where their postpone was already written."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            unsent = list(self._batches)
            self._batches.clear()
            self._cond.notify_all()
        self._manager.unsubscribe(self, unsent)


def select_subscribers(subscribers: Sequence[Subscriber], start: int) -> list[int]:
    """Round-robin: the subscribers that have room, in turn from ``start`` on.

    The one place that decides who gets the next batches (filters and consumer groups
    will choose here too).
    """
    n = len(subscribers)
    return [i for i in ((start + k) % n for k in range(n)) if subscribers[i].has_room()]


def backoff_may_end_before_next_poll(cfg: TableConfig) -> bool:
    """Whether a row postponed at a send can fall due before the poll after it: a postpone
    is at least vt_ack_wait + vt_min_backoff away (the backoff formula's lower bound)."""
    return cfg.ack_wait_s + cfg.min_backoff_s <= cfg.poller_interval_s


# An integer id sent as text: ASCII digits only (str.isdigit also takes "²" and other
# Unicode digits that int() refuses; int() also takes "1_000").
_DECIMAL_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)


def coerce_ids(table: str, column: Column, ids: Sequence[object]) -> list[Hashable]:
    """Validate ack ids against the id column's type; deduplicate, keep order."""
    if not ids:
        raise InvalidArgument(f"table {table}: no ids to ack")
    if len(ids) > MAX_ACK_IDS:
        raise InvalidArgument(f"table {table}: {len(ids)} ids in one ack; at most {MAX_ACK_IDS}")
    if column.is_integer and all(type(i) is int for i in ids):  # the usual case, fast
        return list(dict.fromkeys(ids))
    out: dict[Hashable, None] = {}
    for raw in ids:
        out[_coerce_id(table, column, raw)] = None
    return list(out)


def _coerce_id(table: str, column: Column, raw: object) -> Hashable:
    bad = InvalidArgument(
        f"table {table}: malformed id {raw!r} for id column of type {column.column_type}"
    )
    if raw is None or isinstance(raw, bool):
        raise bad
    if column.is_integer:
        if isinstance(raw, int):
            return raw
        if isinstance(raw, float) and raw.is_integer():
            return int(raw)
        if isinstance(raw, str) and _DECIMAL_INTEGER.fullmatch(raw.strip()):
            return int(raw)
        raise bad
    binary = column.data_type in (
        "binary",
        "varbinary",
        "blob",
        "tinyblob",
        "mediumblob",
        "longblob",
    )
    if binary:
        if isinstance(raw, bytes):
            return raw
        if isinstance(raw, str):
            return raw.encode()
        raise bad
    if isinstance(raw, str | int):
        return str(raw) if isinstance(raw, int) else raw
    if isinstance(raw, bytes):
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise bad from None
    raise bad


class MessageManager:
    """Serves one message table (see the module docstring for its state machine)."""

    def __init__(
        self,
        store: Store,
        config: TableConfig,
        clock: Clock,
        rng: random.Random,
        on_fatal: Callable[[str], None] | None = None,
        may_send: Callable[[], bool] | None = None,
    ) -> None:
        self.store = store
        # Whether this server may hand messages over now (msgtable.lease: it holds the
        # lease); checked after each claim, before the hand-over.
        self._may_send = may_send or (lambda: True)
        self._hold_until_ns = 0  # after a takeover: no send before this (see hold())
        self.config = config
        self.clock = clock
        self.rng = rng
        self.cache = MessageCache(config.cache_size)
        self._on_fatal = on_fatal
        self._lock = threading.Lock()
        self._subscribers: list[Subscriber] = []
        self._next = 0
        self._acks = AckCombiner(
            self._write_acks,
            lambda ids, now: self.store.acked_ids(self.config, ids, now),
            clock.now_ns,
        )
        self._cursor: PollKey | None = None  # where the current pass of polls got to
        self._restart = True  # the next poll starts a new pass from the best due row
        self._stop = threading.Event()
        self._timer: Callable[[], float] = time.monotonic  # the purger's pacing (tests swap)
        self._rest: Callable[[float], object] = self._stop.wait
        self._poll_wake = threading.Event()
        self._send_wake = threading.Event()
        self._purge_wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._opened = False
        self.sent = 0
        self.acked = 0
        self.errors = 0

    # -- lifecycle -----------------------------------------------------------------------
    def open(self) -> None:
        with self._lock:
            if self._opened:
                return
            self._opened = True
        for name, loop in (
            ("poller", self._poll_loop),
            ("sender", self._send_loop),
            ("purger", self._purge_loop),
        ):
            t = threading.Thread(
                target=self._guard,
                args=(name, loop),
                daemon=True,
                name=f"msgtable-{self.config.name}-{name}",
            )
            self._threads.append(t)
            t.start()

    def hold(self, seconds: float) -> None:
        """Send nothing for ``seconds`` (a new lease holder waits out the leases of what the
        old one sent without writing them; msgtable.lease)."""
        with self._lock:
            self._hold_until_ns = self.clock.now_ns() + round(max(0.0, seconds) * 1e9)
        self._send_wake.set()

    def close(self, error: MsgtableError | None = None, timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
        """Stop the loops (letting a send in progress finish) and end every subscriber.
        Returns whether every message sent and not acked has its postpone written."""
        self._stop.set()
        for ev in (self._poll_wake, self._send_wake, self._purge_wake):
            ev.set()
        current = threading.current_thread()
        for t in self._threads:
            if t is not current:
                t.join(timeout_s)
        with self._lock:
            subs, self._subscribers = self._subscribers, []
            self.cache.clear()
        err = error or Unavailable("server shutting down")
        for s in subs:
            s.end(err)
        return self._postpone_all()

    def _postpone_all(self) -> bool:
        """On close: write the postpone of every row sent and not acked yet, so that a clean
        shutdown keeps their leases (a crash does not: they are due again at once)."""
        try:
            while self.postpone_once(everything=True):
                pass
            return True
        except TableNotFound:
            return True  # dropped: nothing left to postpone
        except Exception as exc:
            with self._lock:
                left = self.cache.unclaimed
            log.warning(
                "table %s: could not postpone %d sent, unacked messages on close (%s); "
                "they are due again at once",
                self.config.name,
                left,
                exc,
            )
            return False

    def reconfigure(self, config: TableConfig) -> None:
        """Take new comment settings live; subscribers stay connected."""
        with self._lock:
            self.config = config
            self.cache.size = config.cache_size
        for ev in (self._poll_wake, self._send_wake, self._purge_wake):
            ev.set()

    # -- subscribers ---------------------------------------------------------------------
    def subscribe(self, max_in_flight: int = 0) -> Subscriber:
        """A new subscriber, sent batches while fewer than ``max_in_flight`` of the messages
        sent to it are unacked (0: DEFAULT_MAX_IN_FLIGHT)."""
        if not 0 <= max_in_flight <= MAX_IN_FLIGHT:
            raise InvalidArgument(
                f"max_in_flight must be between 0 (the default, {DEFAULT_MAX_IN_FLIGHT}) and "
                f"{MAX_IN_FLIGHT}, not {max_in_flight}"
            )
        if self._stop.is_set():
            raise Unavailable("server shutting down")
        sub = Subscriber(self, self.config.message_columns, max_in_flight or DEFAULT_MAX_IN_FLIGHT)
        with self._lock:
            self._subscribers.append(sub)
            self._restart = True
        self._poll_wake.set()
        return sub

    def unsubscribe(self, sub: Subscriber, unsent: Sequence[list[Row]] = ()) -> None:
        """``sub`` left; ``unsent``: the batches it still had queued, which never went out.
        Those whose postpone is not written yet are due again at once (with
        vt_postpone_after=0 they were postponed before the send, and come back after their
        lease)."""
        with self._lock:
            if sub in self._subscribers:
                self._subscribers.remove(sub)
            back = self.cache.unsend(values[0] for batch in unsent for values in batch)
            if back:
                self.sent -= back
                self._restart = True  # they are at the head of the table: a new pass
            if not self._subscribers:
                self.cache.clear()
        if back:
            self._poll_wake.set()

    def wake_sender(self) -> None:
        self._send_wake.set()

    # -- acks ----------------------------------------------------------------------------
    def ack(self, ids: Sequence[object]) -> int:
        cfg = self.config
        clean = coerce_ids(cfg.name, cfg.id_column, ids)
        n = self._acks.ack(clean)
        with self._lock:
            self.cache.forget(clean)
            self.acked += n
            credited, self.cache.credited = self.cache.credited, False
        if credited:
            self._send_wake.set()
        return n

    def _write_acks(self, ids: list[Hashable], now_ns: int) -> int:
        """The ack UPDATE for merged ids; those sent and not postponed yet count their send."""
        with self._lock:
            first = self.cache.take_unclaimed(ids)
        try:
            n = self.store.ack(self.config, ids, now_ns, first)
        except BaseException:
            with self._lock:
                self.cache.unhold(first)
            raise
        with self._lock:
            self.cache.settle(first)
        return n

    # -- hints from the binlog (msgtable.binlog) -------------------------------------------
    def binlog_insert(self) -> None:
        """Another client inserted rows: a new pass now if the sender is about to run dry
        (at most one batch queued). Otherwise it has work, and the rows come with the refill
        when the cache is half empty or with the next poll: a pass from the head per INSERT
        would read the whole queued page again each time."""
        with self._lock:
            if not self._subscribers or self.cache.pending or self.cache.room() == 0:
                return
            if self.cache.queued > self.config.batch_size:
                return
            self._restart = True
        self._poll_wake.set()

    def binlog_changes(self, changes: Sequence[RowChange]) -> None:
        """Another client acked or deleted rows (they leave the cache), or moved them in time,
        epoch or priority (a new pass reads them as they are now; a row this server sent and
        has not postponed yet is no longer held back)."""
        gone = [c.id for c in changes if c.gone]
        moved = [c.id for c in changes if c.moved]
        with self._lock:
            if gone:
                self.cache.forget(gone)
            if moved:
                self.cache.unsend(moved)
                self._restart = True
            poll = bool(moved) and bool(self._subscribers)
            credited, self.cache.credited = self.cache.credited, False
        if poll:
            self._poll_wake.set()
        if credited:
            self._send_wake.set()

    def resync(self) -> None:
        """Something may have been missed: a new pass now."""
        with self._lock:
            self._restart = True
        self._poll_wake.set()

    def status(self, keyspace: str) -> TableStatus:
        with self._lock:
            return TableStatus(
                name=self.config.name,
                keyspace=keyspace,
                config=self.config,
                load_error=None,
                cached=self.cache.queued + self.cache.sending,
                in_flight=self.cache.in_flight(self.clock.now_ns()),
                subscribers=len(self._subscribers),
                sent=self.sent,
                acked=self.acked,
            )

    # -- one step of each loop (unit tests call these directly) --------------------------
    def poll_once(self, restart: bool = True) -> int:
        """Read the rows due now or before the next poll into the cache's free room; returns
        how many were new.

        A poll reads at most as many rows as the cache has room for. ``restart`` begins a
        new pass at the best due row (so new and re-prioritised rows are seen); otherwise
        the poll continues the pass after the last row read, so a backlog larger than the
        cache is read once, not again with every refill. Rows due within the next
        vt_poller_interval wait in the cache and go out at their time (future time_next,
        backoff redeliveries), not a poll late.
        """
        with self._lock:
            if not self._subscribers:
                return 0
            cfg = self.config
            room = self.cache.room()
            after = None if restart else self._cursor
            # Rows sent but not postponed yet are still due in the table, at its head: a
            # pass from the head reads past them, rather than fill its page with rows the
            # cache skips.
            limit = room + (min(self.cache.unclaimed, cfg.cache_size) if after is None else 0)
            if room:
                self.cache.begin_poll()
        if room == 0:
            return 0
        now = self.clock.now_ns()
        lookahead = round(cfg.poller_interval_s * 1e9)
        rows, last = self.store.poll(cfg, now + lookahead, limit, after)
        with self._lock:
            if not self._subscribers:  # the last one left during the poll
                return 0
            added, taken = self.cache.add(rows, now)
            if taken < len(rows):  # the cache filled up: continue after the last row taken
                full = True
                self._cursor = poll_key(rows[taken - 1]) if taken else after
            else:
                full = len(rows) >= limit
                self._cursor = last if full else None
            self.cache.pending = full
        if added:
            self._send_wake.set()
        return added

    def send_once(self) -> int:
        """Claim one batch for each subscriber with room, in turn, and hand them over.

        One check (a locking read per epoch in the rows, one commit; with
        vt_postpone_after=0 the postpone UPDATE) covers the batches of all the subscribers
        ready now. Returns the number of rows taken from the cache (0: nothing to do now).
        """
        now = self.clock.now_ns()
        with self._lock:
            if now < self._hold_until_ns or not self.cache.due(now):
                return 0
            cfg = self.config
            self.cache.in_flight(now)  # leases over: their subscribers' credit back
            chosen = select_subscribers(self._subscribers, self._next)
            plan: list[tuple[Subscriber, list[CachedRow]]] = []
            for i in chosen:
                batch = self.cache.pop(cfg.batch_size, now)
                if not batch:
                    break
                plan.append((self._subscribers[i], batch))
                self._next = i + 1
            if not plan:
                return 0
        rows = [r for _, batch in plan for r in batch]
        jitter = draw_jitter(self.rng)

        def next_ns(epoch: int) -> int:
            return next_delivery_ns(
                now, epoch, cfg.ack_wait_s, cfg.min_backoff_s, cfg.max_backoff_s, jitter
            )

        deferred = cfg.postpone_after_ns > 0
        ack_wait_ns = round(cfg.ack_wait_s * 1e9)

        def deliver(claimed: list[CachedRow]) -> None:
            if not self._may_send():  # the lease ended during the claim: roll it back
                raise NotLeader("this server no longer holds the lease")
            ours = {r.id for r in claimed} if len(claimed) < len(rows) else None
            out = []
            with self._lock:  # before the hand-over: an ack may come back at once
                for sub, batch in plan:
                    sent = batch if ours is None else [r for r in batch if r.id in ours]
                    if sent:
                        self.cache.mark_sent(sent, now, ack_wait_ns, deferred, sub)
                        out.append((sub, sent))
                self.sent += len(claimed)
            for sub, sent in out:
                sub.put([r.values for r in sent])

        postponed: list[tuple[CachedRow, int, int]] = []  # (row, epoch, time_next) written
        try:
            if deferred:
                self.store.send(cfg, rows, now, deliver)
            else:
                claimed = self.store.claim(cfg, rows, now, next_ns, deliver)
                if backoff_may_end_before_next_poll(cfg):
                    nxt = {e: next_ns(e or 0) for e in {r.epoch for r in claimed}}
                    postponed = [(r, (r.epoch or 0) + 1, nxt[r.epoch]) for r in claimed]
        except MsgtableError:
            with self._lock:
                self.cache.pending = True  # the rows are still due: read them again soon
                self._restart = True
            self._poll_wake.set()
            raise
        finally:
            with self._lock:
                self.cache.finish(rows, now)
                refill = self.cache.pending and self.cache.queued <= cfg.cache_size // 2
            if refill:
                self._poll_wake.set()
        if not deferred:
            self._reschedule(postponed, now)
        return len(rows)

    def recheck_windows(self) -> int:
        """Subscribers whose window has been full for WINDOW_RECHECK_S with no credit back:
        their messages may have been acked or deleted by another client's DML, which this
        server does not see without the binlog. Ask the database which are still unacked;
        the others' credit comes back. Returns how many came back."""
        now = self.clock.now_ns()
        recheck_ns = round(WINDOW_RECHECK_S * 1e9)
        asks: list[tuple[Subscriber, list[Hashable]]] = []
        with self._lock:
            self.cache.in_flight(now)
            for sub in self._subscribers:
                if sub.outstanding < sub.window:
                    continue
                if sub.stalled_ns is None:
                    sub.stalled_ns = now
                elif now - sub.stalled_ns >= recheck_ns:
                    sub.stalled_ns = now
                    asks.append((sub, self.cache.in_flight_of(sub)))
            cfg = self.config
        back = 0
        for sub, ids in asks:
            for i in range(0, len(ids), MAX_ACK_IDS):
                chunk = ids[i : i + MAX_ACK_IDS]
                still = self.store.unacked_ids(cfg, chunk)
                with self._lock:
                    before = sub.outstanding
                    self.cache.land(sub, [r for r in chunk if r not in still])
                    back += before - sub.outstanding
        if back:
            with self._lock:
                self.cache.credited = False
        return back

    def postpone_once(self, everything: bool = False) -> int:
        """Write the postpone of rows sent vt_postpone_after ago (``everything``: of all rows
        sent) whose ack has not come: time_next by backoff from their send, epoch + 1. One
        UPDATE per (epoch, send). Returns how many rows it took (0: none is due)."""
        now = self.clock.now_ns()
        with self._lock:
            cfg = self.config
            before = now if everything else now - cfg.postpone_after_ns
            taken = self.cache.due_postpones(before, MAX_POSTPONE_IDS)
        if not taken:
            return 0
        groups: dict[tuple[int | None, int], list[Hashable]] = {}
        for rid, (epoch, sent_ns, _) in taken.items():
            groups.setdefault((epoch, sent_ns), []).append(rid)
        jitter = draw_jitter(self.rng)
        written: list[Hashable] = []
        again: list[tuple[CachedRow, int, int]] = []
        try:
            for (epoch, sent_ns), ids in groups.items():
                nxt = next_delivery_ns(
                    sent_ns,
                    epoch or 0,
                    cfg.ack_wait_s,
                    cfg.min_backoff_s,
                    cfg.max_backoff_s,
                    jitter,
                )
                self.store.postpone(cfg, ids, epoch, sent_ns, nxt)
                written.extend(ids)
                again.extend((taken[i][2], (epoch or 0) + 1, nxt) for i in ids)
        except BaseException:
            done = set(written)
            with self._lock:
                self.cache.settle(done)
                self.cache.unhold({r: s for r, s in taken.items() if r not in done})
            raise
        with self._lock:
            self.cache.settle(written)
        self._reschedule(again, now)
        return len(taken)

    def _reschedule(self, rows: Sequence[tuple[CachedRow, int, int]], now_ns: int) -> None:
        """Rows just postponed (row, epoch written, time_next written) that fall due before
        the next poll would read them: the cache waits for them, so that a redelivery after
        a short backoff goes out at its time, not at the next poll."""
        if not rows:
            return
        with self._lock:
            if not self._subscribers:
                return
            horizon = now_ns + round(self.config.poller_interval_s * 1e9)
            woken = False
            for row, epoch, time_next in rows:
                if time_next <= horizon and self.cache.reschedule(row, epoch, time_next):
                    woken = True
        if woken:
            self._send_wake.set()

    def _idle_wait_s(self) -> float:
        """How long the sender may sleep: until the next queued row falls due or the next
        postpone is to be written, at most IDLE_WAIT_S."""
        with self._lock:
            times = [self.cache.next_due_ns()]
            if self._hold_until_ns > self.clock.now_ns():
                times = [self._hold_until_ns]
            sent = self.cache.next_postpone_sent_ns()
            if sent is not None:
                times.append(sent + self.config.postpone_after_ns)
        now = self.clock.now_ns()
        waits = [(t - now) / 1e9 for t in times if t is not None]
        return max(0.0, min([IDLE_WAIT_S, *waits]))

    def purge_once(self) -> int:
        """Delete acked rows older than vt_purge_after in bounded batches, until none remain.

        Paced: after each batch the purger rests so that its DELETEs take at most
        PURGE_DUTY_BUSY of the time while the table has subscribers (PURGE_DUTY_IDLE while it
        has none); a million old rows then leave over minutes instead of starving delivery.
        """
        total = 0
        while not self._stop.is_set():
            cfg = self.config
            cutoff = self.clock.now_ns() - round(cfg.purge_after_s * 1e9)
            began = self._timer()
            n = self.store.purge(cfg, cutoff, PURGE_BATCH_ROWS)
            took = self._timer() - began
            total += n
            if n < PURGE_BATCH_ROWS:
                break
            with self._lock:
                duty = PURGE_DUTY_BUSY if self._subscribers else PURGE_DUTY_IDLE
            self._rest(took * (1 / duty - 1))
        return total

    # -- loops ---------------------------------------------------------------------------
    def _guard(self, name: str, loop: Callable[[], None]) -> None:
        try:
            loop()
        except BaseException as exc:  # a loop must never die quietly
            msg = f"table {self.config.name}: {name} loop died: {exc!r}"
            log.critical(msg, exc_info=True)
            if self._on_fatal is not None:
                self._on_fatal(msg)

    def _failed(self, what: str, exc: Exception, failures: int) -> float:
        self.errors += 1
        level = logging.WARNING if failures == 1 else logging.DEBUG
        exc_info = not isinstance(exc, MsgtableError)
        log.log(
            level,
            "table %s: %s failed (%d in a row): %s",
            self.config.name,
            what,
            failures,
            exc,
            exc_info=exc_info,
        )
        return min(self.config.poller_interval_s, RETRY_MIN_S * 2.0 ** min(failures, 10))

    def _poll_loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            with self._lock:
                idle = not self._subscribers
            if idle:
                self._poll_wake.wait()
                self._poll_wake.clear()
                continue
            self._poll_wake.clear()
            with self._lock:
                restart, self._restart = self._restart, False
            try:
                self.poll_once(restart)
                if failures:
                    log.info("table %s: polling works again", self.config.name)
                failures, delay = 0, self.config.poller_interval_s
            except Exception as exc:
                failures += 1
                delay = self._failed("poll", exc, failures)
            if not self._poll_wake.wait(delay):  # the poll interval is over: a new pass
                with self._lock:
                    self._restart = True

    def _send_loop(self) -> None:
        """Sends, and writes the deferred postpones as they fall due."""
        failures = 0
        while not self._stop.is_set():
            self._send_wake.clear()
            what = "send"
            try:
                taken = self.send_once()
                what = "postpone"
                self.postpone_once()
                what = "window recheck"
                taken += self.recheck_windows()
                failures = 0
            except Exception as exc:
                failures += 1
                self._send_wake.wait(self._failed(what, exc, failures))
                continue
            if not taken:
                self._send_wake.wait(self._idle_wait_s())

    def _purge_loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            self._purge_wake.clear()
            try:
                self.purge_once()
                failures, delay = 0, max(self.config.poller_interval_s, PURGE_MIN_INTERVAL_S)
            except Exception as exc:
                failures += 1
                delay = self._failed("purge", exc, failures)
            self._purge_wake.wait(delay)
