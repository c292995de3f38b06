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
subscriber inside that transaction -> in flight until its ack wait ends. A row the check does
not match (acked, deleted, rescheduled or re-versioned by DML since the poll) is dropped from
the cache unsent. A sent row stays due in the database ("unclaimed", never queued again here)
until either its ack through us is written (which counts the send: epoch + 1) or,
vt_postpone_after after the send, its postpone (time_next by backoff from the send, epoch + 1).
With vt_postpone_after=0 the postpone UPDATE is the check itself, before the send, as in
Vitess. Nothing here is the only copy of anything: a crash at any point leaves every unacked
row in the table, due again after its backoff, or at once if its postpone was not written yet.

An ordered table (vt_order_key) keeps runs of free keys instead of due rows
(msgtable.engine.ordered): its poll reads first the keys freed since their last read, then
pages through the keys; a send pops whole runs (a key's rows go to one subscriber, never
past a gap its check or a filter left); a key is busy from its pop until every row popped
left flight.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import TYPE_CHECKING

from msgtable.core import settlement
from msgtable.core.backoff import draw_jitter
from msgtable.core.clock import Clock
from msgtable.core.ids import coerce_id_pairs, coerce_ids
from msgtable.core.latency import DELAY_BUCKETS_S, LatencyHistogram, LatencySnapshot
from msgtable.core.retry import Backoff, Outage, Retry
from msgtable.core.rows import (
    Batch,
    CachedRow,
    PollKey,
    RowChange,
    Values,
    group_by_epoch,
)
from msgtable.core.status import TableStatus
from msgtable.core.tables import TableConfig
from msgtable.core.window import Window, check_limit, window_size
from msgtable.engine import dispatch, flow, postpone, rechecks
from msgtable.engine.acks import AckCombiner
from msgtable.engine.cache import MessageCache, Sending
from msgtable.engine.due import lookahead_ns
from msgtable.engine.ordered import KeyPass, OrderedDue, pass_gap_ns, whole_keys
from msgtable.engine.purger import Purger
from msgtable.engine.redeliveries import Redeliveries
from msgtable.engine.subscriber import Subscriber
from msgtable.engine.tail import InsertKeys, Tail, cursor
from msgtable.errors import MsgtableError, NotLeader, TableLoadError, TableNotFound, Unavailable
from msgtable.limits import MAX_ACK_IDS, MAX_POSTPONE_IDS

if TYPE_CHECKING:
    from msgtable.core.tracing import ServerTracing
    from msgtable.store.protocol import Keep, Store

log = logging.getLogger(__name__)

RETRY_MIN_S = 0.2  # a loop's first wait after a failure; doubling up to the poll interval
RETRY_MAX_S = 100.0
IDLE_WAIT_S = 1.0
CLOSE_TIMEOUT_S = 10.0


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
        may_postpone: Callable[[float], bool] | None = None,
        outage: Outage | None = None,
        dead_letter: Callable[[TableConfig], TableConfig | None] | None = None,
        buried: Callable[[str], None] | None = None,
        tracing: ServerTracing | None = None,
    ) -> None:
        self.store = store
        self._tracing = tracing  # poll / send / ack spans (None: nothing records)
        # a vt_dead_letter table's config (None: not loaded); what to tell of moves there
        self._dead_letter = dead_letter or (lambda cfg: None)
        self._buried = buried or (lambda table: None)
        self._outage = outage  # the database's: it tells of an outage, not each loop
        # whether this server may hand messages over now (msgtable.engine.lease): per claim
        self._may_send = may_send or (lambda: True)
        # whether postpones may still be written (given the ack wait): msgtable.engine.engine
        self._may_postpone = may_postpone or (lambda _ack_wait_s: True)
        self.postpones_skipped = 0  # sent rows whose postpone a late close did not write
        self._hold_until_ns = 0  # after a takeover: no send before this (see hold())
        self._hold_floor_ns: int | None = None  # ... or the rows due and there after this
        self.config = config
        self.clock = clock
        self.rng = rng
        self._lock = threading.Lock()
        self.cache = MessageCache(
            config.cache_size, self._lock, config.ordered, lookahead_ns(config)
        )
        self._redeliveries = Redeliveries(store, self.cache, self._lock, self._timed_ok)
        self.cache.on_reread = self._reread
        self._on_fatal = on_fatal
        self._subscribers: list[Subscriber] = []
        self._next = 0
        self._acks = AckCombiner(
            self._write_acks,
            lambda ids, now: self.store.acked_ids(self.config, ids, now),
            clock.now_ns,
        )
        self._cursor: PollKey | None = None  # where the current pass of polls got to
        self._restart = True  # the next poll starts a new pass from the best due row
        self._rechecks = rechecks.Rechecks()  # a hinted pass that read nothing goes again soon
        self._tail = Tail()  # where a plain table's passes got to (a hinted poll reads on)
        self._pass = KeyPass()  # where an ordered table's pass got to (msgtable.engine.ordered)
        self._pass_began_ns = 0  # when it began (a pass begins at least every poll interval)
        self._pass_cost_ns = 0  # how long the last whole pass took
        self._pass_due_ns = 2**63  # the next pass begins by then (an INSERT the binlog showed)
        self._stop = threading.Event()
        self._poll_wake = threading.Event()
        self._send_wake = threading.Event()
        # a table's limits (msgtable.engine.flow); None without: the sender pays nothing
        self._limiter = flow.attach(config, self.cache, clock.now_ns(), self.wake_sender)
        self._backoff = Backoff(RETRY_MIN_S, min(config.poller_interval_s, RETRY_MAX_S))
        self.purger = Purger(
            store, lambda: self.config, clock, self._stop, self._busy, self._backoff, outage
        )
        self._threads: list[threading.Thread] = []
        self._opened = False
        self.sent = 0
        self.enqueued = 0  # rows other clients inserted, as the binlog counted them
        self.redelivered = 0  # sends of rows read with epoch > 0 (sent before)
        self.ack_latency = LatencyHistogram()  # send -> ack, of acks through us and DML
        self.delivery_delay = LatencyHistogram(DELAY_BUCKETS_S)  # made -> first send (epoch 0)
        self.acked = 0
        self.acked_dml = 0  # of those, acks by another client's DML (the binlog showed them)
        self.released = 0
        self.rejected = 0
        self.renewed = 0
        self.dead_lettered = 0  # rejected, or out of attempts (vt_max_attempts)

    # -- lifecycle -----------------------------------------------------------------------
    def open(self) -> None:
        """Start the loops (under the lock: a close from another thread joins them all)."""
        with self._lock:
            if self._opened or self._stop.is_set():
                return
            self._opened = True
            if self._limiter is not None:
                self._limiter.restart(self.clock.now_ns())  # a new sender: rates start empty
            for name, loop in (
                ("poller", self._poll_loop),
                ("sender", self._send_loop),
                ("purger", self.purger.run),
            ):
                label = f"msgtable-{self.config.name}-{name}"
                t = threading.Thread(target=self._guard, args=(name, loop), daemon=True, name=label)
                t.start()
                self._threads.append(t)

    def hold(self, seconds: float, floor_ns: int | None = None) -> None:
        """Send nothing for ``seconds`` (a new lease holder waits out the ack waits of what
        the old one sent without writing their postpones; msgtable.engine.lease).

        With ``floor_ns`` hold back only the rows the old holder may have sent: those due
        (time_next) and there (time_created, where the table has it) both at or before
        ``floor_ns``. Until the hold ends the polls read only the others, which go out at
        once; then a new pass reads the rest. Called before the loops start (open())."""
        with self._lock:
            self._hold_until_ns = self.clock.now_ns() + round(max(0.0, seconds) * 1e9)
            self._hold_floor_ns = floor_ns if seconds > 0 else None
            if self._limiter is not None:
                self._limiter.restart(self.clock.now_ns())
        self._send_wake.set()
        self._poll_wake.set()

    def _poll_floor(self, now_ns: int) -> tuple[int | None, bool]:
        """(The floor of this poll, or None; whether the hold just ended: a new pass reads
        what it held back.) Under the lock."""
        floor = self._hold_floor_ns
        if floor is None:
            return None, False
        if now_ns < self._hold_until_ns:
            return floor, False
        self._hold_floor_ns = None
        return None, True

    def _sending_held(self, now_ns: int) -> bool:
        """Whether no send may go now: a takeover's whole hold (no floor). Under the lock."""
        return now_ns < self._hold_until_ns and self._hold_floor_ns is None

    def close(self, error: MsgtableError | None = None, timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
        """Stop the loops (letting a send in progress finish) and end every subscriber.
        Returns whether every message sent and not acked has its postpone written."""
        self._stop.set()
        self._wake_all()
        # The subscribers first: they go elsewhere at once (a batch already queued for one
        # still reaches it), not after the loops' last statements.
        err = error or Unavailable("server shutting down")
        with self._lock:
            subs = list(self._subscribers)
        for s in subs:
            s.end(err)
        current = threading.current_thread()
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            if t is not current:
                t.join(timeout_s)
        with self._lock:
            subs, self._subscribers = self._subscribers, []
            self.cache.due.clear()
        for s in subs:
            s.end(err)
        return self._postpone_all()

    def _postpone_all(self) -> bool:
        """On close: write the postpone of every row sent and not acked yet, so that a clean
        shutdown keeps their ack waits (a crash does not: they are due again at once)."""
        try:
            while self.postpone_once(everything=True):
                pass
            with self._lock:
                left = self.cache.inflight.unclaimed
            if left:  # not written: this server's lease ended too long ago
                self.postpones_skipped += left
                log.warning(
                    "table %s: did not postpone %d sent, unacked messages on close: this "
                    "server's lease ended more than half an ack wait ago, and another server "
                    "may have sent them again since; they are due again after its hold",
                    self.config.name,
                    left,
                )
                return False
            return True
        except TableNotFound:
            return True  # dropped: nothing left to postpone
        except Exception as exc:
            with self._lock:
                left = self.cache.inflight.unclaimed
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
            self.cache.due.size = config.cache_size
            if self.cache.ordered is not None:
                self.cache.ordered.lookahead_ns = lookahead_ns(config)
            self._backoff.max_s = min(config.poller_interval_s, RETRY_MAX_S)
            self._limiter = flow.attach(
                config, self.cache, self.clock.now_ns(), self.wake_sender, self._limiter
            )
        self._wake_all()

    def _wake_all(self) -> None:
        for ev in (self._poll_wake, self._send_wake):
            ev.set()
        self.purger.wake()

    # -- subscribers ---------------------------------------------------------------------
    def subscribe(
        self,
        max_in_flight: int = 0,
        accepts: Callable[[Values], bool] | None = None,
        max_messages: int = 0,
    ) -> Subscriber:
        """A new subscriber, sent batches while fewer than ``max_in_flight`` of the messages
        sent to it are unacked (0: the default window, msgtable.core.window) and, with
        ``max_messages``, until it was sent that many in all; with ``accepts`` (a stream's
        filter), only the messages it accepts."""
        window = Window(window_size(max_in_flight), self.wake_sender, check_limit(max_messages))
        if self._stop.is_set():
            raise Unavailable("server shutting down")
        sub = Subscriber(
            self.config.message_columns,
            window,
            self._taken,
            self.unsubscribe,
            accepts=accepts,
            ack_wait_s=self.config.ack_wait_s,
        )
        with self._lock:
            # The first one: the cache is empty, a pass from the head fills it. Another one
            # (a reconnect storm after a restart brings every subscriber): the pass goes on
            # only if it stopped for room; a finished one would read the backlog again.
            first = not self._subscribers
            if first:
                self._restart = True
            self._subscribers.append(sub)
            if accepts is not None:
                self.cache.connect(accepts)  # the rows it passes, kept for it
            poll = first or self.cache.due.pending
        if poll:
            self._poll_wake.set()
        self._send_wake.set()
        return sub

    def unsubscribe(self, sub: Subscriber, unsent: Sequence[Batch] = ()) -> None:
        """``sub`` left; ``unsent``: the batches it still had queued, which never went out.
        Those whose postpone is not written yet are due again at once (with
        vt_postpone_after=0 they were postponed before the send, and come back after their
        backoff)."""
        with self._lock:
            if sub in self._subscribers:
                self._subscribers.remove(sub)
                if sub.accepts is not None:
                    self.cache.disconnect(sub.accepts)
            ids = [values[0] for batch in unsent for values in batch]
            back = self.cache.inflight.unsend(ids)
            if back:
                self._restart = True  # they are at the head of the table: a new pass
            if not self._subscribers:
                ids += self.cache.due.clear()
        if ids:
            self.store.read_again(ids)
        if back:
            self._poll_wake.set()
        self._poll_if_wanted()

    def wake_sender(self) -> None:
        self._send_wake.set()

    def _taken(self, batch: Batch) -> None:
        """A subscriber's stream took ``batch``: its messages went out (the counters count
        sends there, so a subscriber that leaves with batches queued takes nothing back), and
        it has room for another."""
        before = batch.sent_before
        with self._lock:
            self.sent += len(batch)
            if before is not None:
                self.redelivered += len(before) - before.count(0)
        self._send_wake.set()

    def _poll_if_wanted(self) -> None:
        """An ordered table whose keys were freed reads their next runs now."""
        ordered = self.cache.ordered
        if ordered is None:
            return
        with self._lock:
            wanted = ordered.wants_refill() and bool(self._subscribers)
        if wanted:
            self._poll_wake.set()

    @property
    def has_subscribers(self) -> bool:
        return bool(self._subscribers)

    def _busy(self) -> bool:
        with self._lock:
            return bool(self._subscribers)

    # -- acks ----------------------------------------------------------------------------
    def ack(self, ids: Sequence[object]) -> int:
        if self._tracing is None:
            return self._ack(ids)
        span = self._tracing.start("ack", len(ids))
        try:
            n = self._ack(ids)
            span.set_attribute("msgtable.acked", n)
            return n
        except MsgtableError as exc:
            self._tracing.failed(span, exc)
            raise
        finally:
            span.end()

    def _ack(self, ids: Sequence[object]) -> int:
        cfg = self.config
        clean = coerce_ids(cfg.name, cfg.id_column, ids)
        n = self._acks.ack(clean)
        now = self.clock.now_ns()
        with self._lock:
            self.ack_latency.observe_since(now, self.cache.inflight.sent_ns(clean))
            self.cache.forget(clean)
            self.acked += n
        self._poll_if_wanted()
        return n

    def _write_acks(self, ids: list[Hashable], now_ns: int) -> int:
        """The ack UPDATE for merged ids; those sent and not postponed yet count their send."""
        with self.cache.holding_acks(ids) as hold:
            return self.store.ack(self.config, ids, now_ns, hold.first())

    # -- settlement (msgtable.core.settlement)
    # ------------------------------------------------------
    def release(
        self,
        ids: Sequence[object],
        delay_s: float,
        reason: str | None,
        attempts: Sequence[int] = (),
    ) -> int:
        """Due again ``delay_s`` from now (a poll picks it up then, or now if sooner than
        the next); ``attempts``: the delivery of each id it answers (msgtable.core.settlement).
        Returns how many were released."""
        cfg = self.config
        delay_s = settlement.check_delay(cfg.name, "a release's delay", delay_s)
        reason = settlement.check_reason(cfg.name, reason)
        clean, bound = self._settled_ids(ids, attempts, "release")
        next_ns = self.clock.now_ns() + round(delay_s * 1e9)
        with self.cache.holding_acks(clean, wait=True, attempts=bound) as hold:
            ids, named = self._current(clean, bound, hold.skipped)
            n = self.store.release(cfg, ids, next_ns, reason, hold.first(), named) if ids else 0
        with self._lock:
            self.cache.forget(ids)
            self.released += n
            self._restart = True
        if n:
            self._poll_wake.set()
        self._poll_if_wanted()
        return n

    def renew(
        self,
        ids: Sequence[object],
        extend_s: float,
        reason: str | None,
        attempts: Sequence[int] = (),
        exact: bool = False,
    ) -> int:
        """Not due again before ``extend_s`` from now (0: vt_ack_wait; ``exact``: due then,
        sooner or later); ``attempts`` as release's. Returns how many were renewed."""
        cfg = self.config
        extend_s = settlement.check_delay(cfg.name, "a renew's extension", extend_s)
        reason = settlement.check_reason(cfg.name, reason)
        clean, bound = self._settled_ids(ids, attempts, "renew")
        now = self.clock.now_ns()
        until = now + round((extend_s or cfg.ack_wait_s) * 1e9)
        with self.cache.holding_acks(clean, wait=True, attempts=bound) as hold:
            ids, named = self._current(clean, bound, hold.skipped)
            jitter = draw_jitter(self.rng)
            rows = (ids, named, now, until, reason, hold.rows)
            n = postpone.renew(self.store, cfg, *rows, jitter, exact)
        with self._lock:
            self.cache.inflight.extend(ids, until, exact)
            self.renewed += n
        return n

    def _settled_ids(
        self, ids: Sequence[object], attempts: Sequence[int], verb: str
    ) -> tuple[list[Hashable], list[int] | None]:
        """A release's or renew's ids, checked and without repeats, and the attempt each
        names (None: none named)."""
        cfg = self.config
        bound = settlement.check_attempts(cfg.name, attempts, len(ids))
        if bound is None:
            return coerce_ids(cfg.name, cfg.id_column, ids, verb), None
        return coerce_id_pairs(cfg.name, cfg.id_column, ids, bound, verb)

    def _current(
        self, ids: list[Hashable], attempts: list[int] | None, skipped: set[Hashable]
    ) -> tuple[list[Hashable], list[int] | None]:
        """The ids (and their attempts) a release or renew naming their delivery changes.
        Not those this server sent again since the delivery named (the database cannot tell
        those: the later send may not be counted there yet). And during a takeover's hold
        (see hold()), only those this server sent since it took over: the old holder may
        have sent any other again with its count not written yet, and then the table cannot
        tell a late call about an earlier delivery from one about the current; such a call
        changes nothing (the message comes back after its ack wait at the latest). A call
        naming no delivery changes the ids whatever their delivery."""
        if attempts is None:
            return ids, attempts
        with self._lock:
            held = self.clock.now_ns() < self._hold_until_ns
            if not skipped and not held:
                return ids, attempts
            flying = self.cache.inflight.flying
            keep = [
                k for k, rid in enumerate(ids) if rid not in skipped and (not held or flying(rid))
            ]
        return [ids[k] for k in keep], [attempts[k] for k in keep]

    def reject(self, ids: Sequence[object], reason: str | None) -> int:
        """Dead now (msgtable.core.deadletters); returns how many were rejected."""
        cfg = self.config
        reason = settlement.check_reason(cfg.name, reason)
        clean = coerce_ids(cfg.name, cfg.id_column, ids, "reject")
        dead = self._dead_table(cfg)
        with self.cache.holding_acks(clean, wait=True) as hold:
            buried = self.store.bury(cfg, dead, clean, self.clock.now_ns(), reason, hold.first())
        with self._lock:
            self.cache.forget(clean)
            self.rejected += len(buried)
            self.dead_lettered += len(buried)
        if buried and dead is not None:
            self._buried(dead.name)
        self._poll_if_wanted()
        return len(buried)

    def _dead_table(self, cfg: TableConfig) -> TableConfig | None:
        """The config of the table's dead-letter table; None: dead in place."""
        if not cfg.dead_letter:
            return None
        dead = self._dead_letter(cfg)
        if dead is None:
            raise TableLoadError(
                f"table {cfg.name}: vt_dead_letter={cfg.dead_letter}: that table is not loaded"
            )
        return dead

    def _expire(self, cfg: TableConfig, rows: Sequence[CachedRow], now_ns: int) -> int:
        """Bury rows that fell due after their last attempt (vt_max_attempts), if they are
        still at the epoch read and due; returns how many died."""
        died: list[Hashable] = []
        dead = None
        try:
            dead = self._dead_table(cfg)
            for epoch, group in group_by_epoch(rows).items():
                ids = [r.id for r in group]
                died += self.store.bury(cfg, dead, ids, now_ns, None, {}, (epoch,))
        finally:
            with self._lock:
                self.cache.forget(died)
                self.dead_lettered += len(died)
                if len(died) < len(rows):  # the others may be due still: read them again
                    self.cache.due.pending = True
        if died and dead is not None:
            self._buried(dead.name)
        return len(died)

    # -- hints from the binlog (msgtable.engine.binlog) -------------------------------------------
    def binlog_insert(self, rows: int = 0, keys: InsertKeys | None = None) -> None:
        """Another client inserted rows (``keys``: theirs): a poll now if the sender is
        about to run dry, after the tail if they all sort after it (msgtable.engine.tail).
        Otherwise the refill or the next poll reads them. An ordered table's next pass
        begins as soon as one may (ordered.pass_gap_ns); a fair table reads on at once
        (flow.follows_tail)."""
        with self._lock:
            self.enqueued += rows  # rows the binlog showed, when it counts them
            due = self.cache.due
            if not self._subscribers:
                return
            if isinstance(due, flow.KeyedDue) and due.fair:
                self._rechecks.hint()  # a poll now, on from where the pass is (follows_tail)
            elif self.cache.ordered is not None:
                gap = pass_gap_ns(self._pass_cost_ns)
                due_ns = self._pass_began_ns + gap
                self._rechecks.hint(min(due_ns, self._next_pass_ns()))  # that pass's
                if due_ns >= self._pass_due_ns:
                    return  # a pass is due by then already
                self._pass_due_ns = due_ns
            elif (
                due.pending
                or due.room() == 0
                or due.queued - self.cache.stranded > self.config.batch_size  # none passes those
            ):
                self._tail.ignored(self.clock.now_ns())
                return
            else:
                self._restart = self._restart or not self._tail.hint(keys)  # (tail.py)
                self._rechecks.hint()
        self._poll_wake.set()

    def binlog_changes(self, changes: Sequence[RowChange]) -> None:
        """Another client acked or deleted rows (they leave the cache and flight; its acks
        count in ``acked``), or moved them in time, epoch or priority (a new pass reads them
        as they are now; a row sent here and not postponed yet is no longer held back)."""
        gone = [c.id for c in changes if c.gone]
        moved = [c.id for c in changes if c.moved]
        acked = [c.id for c in changes if c.acked]
        now = self.clock.now_ns() if acked else 0
        with self._lock:
            self.acked += len(acked)
            self.acked_dml += len(acked)
            if acked:
                self.ack_latency.observe_since(now, self.cache.inflight.sent_ns(acked))
            if gone:
                self.cache.forget(gone)
            if moved:
                self.cache.inflight.unsend(moved)
                self._restart = True
            poll = bool(moved) and bool(self._subscribers)
        if poll:
            self._poll_wake.set()
        self._poll_if_wanted()

    def _reread(self) -> None:  # (under the lock) DueRows.finish: a skipped row to read again
        self._restart = True
        self._poll_wake.set()

    def resync(self) -> None:
        """Something may have been missed: a new pass now."""
        with self._lock:
            self._reread()

    def ack_latency_snapshot(self) -> LatencySnapshot:
        with self._lock:
            return self.ack_latency.snapshot()

    def delivery_delay_snapshot(self) -> LatencySnapshot:
        with self._lock:
            return self.delivery_delay.snapshot()

    def status(self, keyspace: str) -> TableStatus:
        with self._lock:
            now = self.clock.now_ns()
            hold_s = max(0.0, (self._hold_until_ns - now) / 1e9)
            return TableStatus(
                name=self.config.name,
                keyspace=keyspace,
                config=self.config,
                load_error=None,
                cached=self.cache.cached,
                in_flight=self.cache.inflight.count(now),
                subscribers=len(self._subscribers),
                sent=self.sent,
                enqueued=self.enqueued,
                redelivered=self.redelivered,
                filter_reads=self._redeliveries.dry_reads,
                acked=self.acked,
                acked_dml=self.acked_dml,
                released=self.released,
                rejected=self.rejected,
                renewed=self.renewed,
                dead_lettered=self.dead_lettered,
                keys_in_flight=self.cache.ordered.keys_in_flight if self.cache.ordered else 0,
                keys_waiting=self.cache.ordered.keys_waiting if self.cache.ordered else 0,
                hold_s=hold_s,
                hold_whole=hold_s > 0 and self._hold_floor_ns is None,
                **(self._limiter.status() if self._limiter is not None else {}),
            )

    # -- one step of each loop (unit tests call these directly) --------------------------
    def poll_once(self, restart: bool = True) -> int:
        """Read the rows due by the next poll into the cache's free room (while the pass
        lags, the due redeliveries too: msgtable.engine.redeliveries); returns how many were
        new. ``restart`` begins a new pass at the best due row; else the pass goes on after
        the last row read (a backlog larger than the cache is read once)."""
        if self._tracing is None:
            return self._poll(restart)
        span = self._tracing.start("poll")
        try:
            added = self._poll(restart)
            span.set_attribute("msgtable.added", added)
            return added
        except MsgtableError as exc:
            self._tracing.failed(span, exc)
            raise
        finally:
            span.end()

    def _poll(self, restart: bool) -> int:
        if self.cache.ordered is not None:
            return self._poll_ordered(self.cache.ordered, restart)
        added = self._poll_pass(restart)  # (the cursor is this thread's: where it left it)
        added += self._redeliveries.poll(self.config, self.clock.now_ns, self._cursor)
        if added:
            self._send_wake.set()
        return added

    def _timed_ok(self) -> bool:  # whether the redelivery poll reads (under the lock)
        return bool(self._subscribers) and self._hold_floor_ns is None  # no takeover's floor

    def _poll_pass(self, restart: bool) -> int:
        now = self.clock.now_ns()
        with self._lock:
            if not self._subscribers:
                return 0
            cfg = self.config
            floor, lifted = self._poll_floor(now)
            room = self.cache.due.room()
            every = lookahead_ns(cfg)  # (the poll interval)
            after = None if restart or lifted else self._cursor or self._tail.after(now, every)
            # Rows sent and not postponed yet are still due in the table, at its head: a pass
            # from the head reads past them, rather than fill its page with rows the cache skips.
            unclaimed = self.cache.inflight.unclaimed
            limit = room + (min(unclaimed, cfg.cache_size) if after is None else 0)
            skip = flow.skip_keys(self.cache.due) if room else ()  # a fair table's full keys
        if room == 0:
            return 0
        added = taken = 0
        with self.cache.poll() as poll:
            ahead = now + lookahead_ns(cfg)
            rows, last = self.store.poll(cfg, ahead, limit, after, True, floor, skip_keys=skip)
            with self._lock:
                if self._subscribers:  # (else the last one left during the poll)
                    added, taken = poll.add(rows, now, created=True)
                    follows = flow.follows_tail(self.cache.due)
                    full, self._cursor = cursor(rows, taken, limit, last, after, follows)
                    self.cache.due.pending = full
                    if self._tail.read(rows, after, not full, now):  # a hinted row passed unseen
                        self._restart = True
                        self._poll_wake.set()
        if taken < len(rows):  # the cache filled up, or was dropped (ids only if asked)
            self.store.read_again(r[3] for r in rows[taken:])
        return added

    def _poll_ordered(self, ordered: OrderedDue, restart: bool) -> int:
        """An ordered table's poll (msgtable.engine.ordered.KeyPass): the runs of the keys freed
        since their last read first, then the next page of the pass. A pass runs to its end
        before ``restart`` begins another (a release or a leaving subscriber frees its keys,
        which are read first anyway)."""
        with self._lock:
            if not self._subscribers:
                return 0
            began = self.clock.now_ns()
            self.cache.inflight.count(began)  # ack waits over free their keys
            cfg = self.config
            # a new pass when asked, and at least every poll interval: acks that free keys
            # wake the poller all the time, and a new key is found by a pass only
            if not ordered.pending and (restart or began >= self._next_pass_ns()):
                self._pass = KeyPass.begin(ordered)
                self._pass_began_ns = began
                self._pass_due_ns = 2**63
            room = ordered.room()
            wanted = ordered.take_wanted(max(1, room // cfg.batch_size)) if room else []
            at = self._pass if ordered.pending else None
        if room == 0:
            return 0
        horizon = began + lookahead_ns(cfg)
        with self.cache.poll() as poll:
            rows, then = KeyPass.read(
                self.store, cfg, ordered, self._lock, wanted, at, room, horizon
            )
            with self._lock:
                if not self._subscribers:
                    return 0
                added, taken = poll.add(rows, began)
                if then is not None and taken == len(rows):  # the pass goes on from there
                    self._pass = then
                    ordered.pending = not then.done
                    if then.done:
                        self._pass_cost_ns = self.clock.now_ns() - self._pass_began_ns
        if added:
            self._send_wake.set()
        return added

    def _next_pass_ns(self) -> int:
        """When an ordered table's next pass begins, unless asked sooner: a poll interval
        after the last began, or sooner after an INSERT (binlog_insert)."""
        return min(self._pass_began_ns + lookahead_ns(self.config), self._pass_due_ns)

    def send_once(self) -> int:
        """Claim one batch for each subscriber with room, in turn, and hand them over. One
        check (a locking read per epoch in the rows, one commit; with vt_postpone_after=0 the
        postpone UPDATE) covers the batches of all the subscribers ready now. Returns the
        number of rows taken from the cache (0: nothing to do now)."""
        now = self.clock.now_ns()
        limiter = self._limiter  # a table's limits (msgtable.engine.flow), or None
        try:
            with self.cache.sending(now) as sending:
                with self._lock:
                    if self._sending_held(now) or not self.cache.due.due(now):
                        return 0
                    cfg = self.config
                    flying = self.cache.inflight.count(now)  # ack waits over: credit back
                    if limiter is not None:
                        limiter.begin(now, flying)
                    planned = dispatch.plan(
                        cfg, self._subscribers, self._next, sending, self.cache.ordered, limiter
                    )
                    if limiter is not None:
                        limiter.end_plan(self.cache.due.due(now))
                    self._next = planned.next
                    plan, expired = planned.batches, planned.expired
                    if planned.dry and self._redeliveries.starved(planned.dry, now):  # (lagging)
                        self._poll_wake.set()
                if not plan and not expired:
                    return 0
                rows = sending.rows
                postponed = self._send(cfg, plan, sending) if plan else []
                if expired:
                    self._expire(cfg, expired, now)
        finally:
            if limiter is not None:  # what was taken and not handed over: its charge back
                with self._lock:
                    limiter.finish(self.cache.inflight.flying)
        with self._lock:
            refill = self.cache.due.wants_refill()
        if refill:
            self._poll_wake.set()
        self._reschedule(postponed, now)
        return len(rows)

    def _send(
        self, cfg: TableConfig, plan: list[tuple[Subscriber, list[CachedRow]]], sending: Sending
    ) -> list[postpone.Postponed]:
        """The check and the hand-over of a send's batches; returns the rows it postponed
        that may fall due before the next poll."""
        now = sending.now_ns
        rows = [r for _, batch in plan for r in batch]
        next_ns = postpone.next_delivery(cfg, now, draw_jitter(self.rng))
        deferred = cfg.postpone_after_ns > 0
        ack_wait_ns = round(cfg.ack_wait_s * 1e9)
        ordered = self.cache.ordered
        limiter = self._limiter
        keep: Keep | None = None
        if ordered is not None:  # a key that lost a row sends none (msgtable.engine.ordered)

            def keep(batch: Sequence[CachedRow], kept: Collection[Hashable]) -> list[CachedRow]:
                with self._lock:  # only when the check lost rows: never per message
                    return whole_keys(batch, kept, ordered.key_of)

        def deliver(claimed: list[CachedRow]) -> None:
            if not self._may_send():  # the lease ended during the claim: roll it back
                raise NotLeader("this server no longer holds the lease")
            ours = {r.id for r in claimed} if len(claimed) < len(rows) else None
            out = []
            with self._lock:  # before the hand-over: an ack may come back at once
                # the ack wait counts from the hand-over, not from before the check: on a
                # slow database the check takes a while, and the subscriber gets the rows now
                handed = max(now, self.clock.now_ns())
                settling = self.cache.settling  # a verb being written: not sent meanwhile
                if settling:
                    free = {r.id for r in claimed if r.id not in settling}
                    ours = free if ours is None else ours & free
                for sub, batch in plan:
                    sent = batch if ours is None else [r for r in batch if r.id in ours]
                    if ordered is not None and len(sent) < len(batch):  # under the lock
                        sent = whole_keys(batch, {r.id for r in sent}, ordered.key_of)
                    if sent:
                        sending.sent(sent, ack_wait_ns, deferred, sub.window, handed)
                        out.append((sub, sent))
                        if limiter is not None:
                            limiter.delivered(sent, handed)
                firsts = [r.created for _, sent in out for r in sent if r.created and not r.epoch]
                if firsts:
                    self.delivery_delay.observe_since(now, firsts)
            for sub, sent in out:
                sub.put(Batch.of(sent, handed))

        tracing = self._tracing
        span = tracing.start("send", len(rows)) if tracing is not None else None
        try:
            if deferred:
                self.store.send(cfg, rows, now, deliver, keep)
                return []
            claimed = self.store.claim(cfg, rows, now, next_ns, deliver, keep)
        except MsgtableError as exc:
            with self._lock:
                self.cache.due.pending = True  # the rows are still due: read them again soon
                self._restart = True
            self._poll_wake.set()
            if tracing is not None and span is not None:
                tracing.failed(span, exc)
            raise
        finally:
            if span is not None:
                span.end()
        return postpone.claimed(cfg, claimed, next_ns)

    def recheck_windows(self) -> int:
        """Subscribers whose window has been full for a while with no credit back: their
        messages may have been acked or deleted by another client's DML, which this server
        does not see without the binlog. Ask the database which are still unacked; the
        others' credit comes back. Returns how many came back (msgtable.core.window)."""
        now = self.clock.now_ns()
        with self._lock:
            inflight = self.cache.inflight
            inflight.count(now)
            asks = [
                (s.window, inflight.ids_of(s.window))
                for s in self._subscribers
                if s.window.recheck_due(now)
            ]
            cfg = self.config
        back = 0
        for window, ids in asks:
            for i in range(0, len(ids), MAX_ACK_IDS):
                chunk = ids[i : i + MAX_ACK_IDS]
                still = self.store.unacked_ids(cfg, chunk)
                with self._lock:
                    back += inflight.land_gone(window, [r for r in chunk if r not in still])
        return back

    def postpone_once(self, everything: bool = False) -> int:
        """Write the postpone of rows sent vt_postpone_after ago (``everything``: of all rows
        sent) whose ack has not come: time_next by backoff from their send, epoch + 1. One
        UPDATE per (epoch, send). Returns how many rows it took (0: none is due)."""
        now = self.clock.now_ns()
        cfg = self.config
        if not self._may_postpone(cfg.ack_wait_s):
            return 0  # the lease ended too long ago (msgtable.engine.tenure): it could harm
        before = now if everything else now - cfg.postpone_after_ns
        with self.cache.holding_postpones(before, MAX_POSTPONE_IDS) as hold:
            if not hold.rows:
                return 0
            written = postpone.write(self.store, cfg, hold, draw_jitter(self.rng))
        self._reschedule(written, now)
        return len(hold.rows)

    def _reschedule(self, rows: Sequence[postpone.Postponed], now_ns: int) -> None:
        """Rows just postponed that fall due before the next poll would read them: the cache
        waits for them (msgtable.engine.postpone)."""
        if not rows:
            return
        with self._lock:
            if not self._subscribers:
                return
            horizon = now_ns + lookahead_ns(self.config)
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
            times = [self.cache.due.next_due_ns()]
            if self._sending_held(self.clock.now_ns()):
                times = [self._hold_until_ns]
            sent = self.cache.inflight.next_postpone_sent_ns()
            if sent is not None:
                times.append(sent + self.config.postpone_after_ns)
            if self._limiter is not None:  # a rate lets more go, a cap frees at an ack wait
                times += self._limiter.wake_times(self.cache.inflight)
        now = self.clock.now_ns()
        waits = [(t - now) / 1e9 for t in times if t is not None]
        return max(0.0, min([IDLE_WAIT_S, *waits]))

    # -- loops ---------------------------------------------------------------------------
    def _guard(self, name: str, loop: Callable[[], None]) -> None:
        try:
            loop()
        except BaseException as exc:  # a loop must never die quietly
            msg = f"table {self.config.name}: {name} loop died: {exc!r}"
            log.critical(msg, exc_info=True)
            if self._on_fatal is not None:
                self._on_fatal(msg)

    def _poll_loop(self) -> None:
        retry = Retry(f"table {self.config.name}: poll", log, self._backoff, outage=self._outage)
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
                hinted = self._rechecks.take(self.clock.now_ns())
            try:
                added = self.poll_once(restart)
                retry.succeeded()
                delay = self._rechecks.wait_s(hinted, added, self.config.poller_interval_s)
                # a plain table's recheck goes on where the last poll was (tail.py)
                recheck = delay < self.config.poller_interval_s and self.cache.ordered is None
            except Exception as exc:
                delay, recheck = retry.failed(exc), False
            if self.cache.ordered is not None:  # woken all the time: a pass begins on time
                with self._lock:
                    until = (self._next_pass_ns() - self.clock.now_ns()) / 1e9
                delay = max(0.0, min(delay, until))
            with self._lock:
                if self._hold_floor_ns is not None:  # the held rows are read when it ends
                    until = (self._hold_until_ns - self.clock.now_ns()) / 1e9
                    if until > 0:  # (past it: the next poll lifts it, at its own pace)
                        delay = min(delay, until)
            if not self._poll_wake.wait(delay) and not recheck:  # the interval is over
                with self._lock:
                    self._restart = True  # a new pass

    def _send_loop(self) -> None:
        """Sends, and writes the deferred postpones as they fall due."""
        retry = Retry(f"table {self.config.name}: send", log, self._backoff, outage=self._outage)
        while not self._stop.is_set():
            self._send_wake.clear()
            what = "send"
            try:
                taken = self.send_once()
                what = "postpone"
                self.postpone_once()
                what = "window recheck"
                taken += self.recheck_windows()
                self._poll_if_wanted()  # ack waits over free an ordered table's keys
                retry.succeeded()
            except Exception as exc:
                self._send_wake.wait(retry.failed(exc, what=f"table {self.config.name}: {what}"))
                continue
            if not taken:
                self._send_wake.wait(self._idle_wait_s())
