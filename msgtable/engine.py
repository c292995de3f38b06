"""All message tables of one database: discovery, one MessageManager per table, lookups.

The engine discovers message tables in information_schema at open and then every
``discovery_interval_s`` (and at once when a request names a table it does not know):
a new table gets a manager, a changed COMMENT is applied live, a table whose definition
became invalid or that was dropped is closed and its subscribers are ended with the reason.
While the database cannot be reached the engine keeps running and retries with backoff;
requests get Unavailable until it answers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

from msgtable import tracing
from msgtable.backlog import DEFAULT_MAX_AGE_S, Backlog, BacklogReader
from msgtable.binlog import BinlogFollower
from msgtable.capture import CaptureFollower, CaptureTarget
from msgtable.clock import Clock, SystemClock
from msgtable.deadletters import DeadLetter, RedriveBatch, check_dead_letter, redrive_problem
from msgtable.errors import (
    DatabaseUnavailable,
    InvalidArgument,
    MsgtableError,
    NotLeader,
    TableLoadError,
    TableNotFound,
    Unavailable,
)
from msgtable.fanout import Fanout
from msgtable.ids import coerce_ids
from msgtable.keyspace import KeyRange
from msgtable.latency import LatencySnapshot
from msgtable.lease import Takeover, connector
from msgtable.limits import MAX_DEAD_LETTERS_LISTED, MAX_REDRIVE_BATCH
from msgtable.manager import MessageManager
from msgtable.mysql import pymysql_args
from msgtable.placement import CAPTURE, Placement
from msgtable.push.allow import AllowList
from msgtable.push.pushers import Endpoints
from msgtable.registry import Subscriptions, stream_filter
from msgtable.retry import Backoff, Retry
from msgtable.rows import RowChange
from msgtable.status import TableStatus
from msgtable.store import MySQLStore, Store, TableDefinition
from msgtable.subscriber import Subscriber
from msgtable.subscriptions import (
    LoadedSubscription,
    state_table_name,
)
from msgtable.tables import DEFAULT_DISCOVERY_INTERVAL_S, TableConfig, load_table

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

log = logging.getLogger(__name__)

DISCOVERY_RETRY_MIN_S = 1.0
DISCOVERY_RETRY_MAX_S = 30.0
# After an unclean takeover: how far the old holder's clock may have been ahead of this
# server's (time_next and time_created are unix ns; see _hold_floor_ns)
TAKEOVER_CLOCK_MARGIN_S = 1.0
SHARDS = ("", "0", "-")  # ways to name the one shard of an unsharded keyspace
# A stream (or a release, reject, renew) of a table being placed or handed over waits this
# many lease periods at most for this server to send it or for a live sender to be known
# (a takeover after a crash comes within two), then answers NotLeader
PLACING_WAIT_PERIODS = 2


class MessageEngine(Subscriptions, Endpoints):
    """Serves every message table of one database (the keyspace)."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        discovery_interval_s: float = DEFAULT_DISCOVERY_INTERVAL_S,
        run_loops: bool = True,
        follow_binlog: bool = False,
        lease_period_s: float | None = None,
        push_allow: AllowList | None = None,
        push_ca_file: str | None = None,
        capture: bool = True,
        tracer_provider: TracerProvider | None = None,
        keyspace: str | None = None,
        shard: KeyRange | None = None,
    ) -> None:
        """``lease_period_s``: share the database with other msgtable servers; this one
        sends only while it holds the lease (msgtable.lease), from ``campaign()`` on. None:
        this server is the only one and sends from ``open()`` on. ``push_allow``: the URLs
        push endpoints may have (msgtable.push.allow; None: none), ``push_ca_file`` the CAs
        their certificates are checked against (None: the system's). ``capture``: write table
        events into capture tables (msgtable.capture) while this server sends.
        ``tracer_provider``: where the tables' poll / send / ack spans go (msgtable.tracing;
        None: the global provider, if one was configured when a table's manager is made).
        ``keyspace`` and ``shard``: this database is that shard of that keyspace
        (msgtable.keyspace; None: an unsharded keyspace named after the database)."""
        self.store = store
        store.outage.tell = True  # a server says when its database goes and comes back
        self.run_loops = run_loops  # False: unit tests drive each manager's steps themselves
        self.keyspace = keyspace or store.database
        self.shard = shard
        self.clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.discovery_interval_s = discovery_interval_s
        self._tracer_provider = tracer_provider
        self._lock = threading.Lock()
        self._managers: dict[str, MessageManager] = {}
        self._load_errors: dict[str, str] = {}
        # subscriptions (msgtable.subscriptions): loaded ones by state table, the ones that
        # failed to load by label (table/name), the fan-out loops by table, lags by state table
        self._subs: dict[str, LoadedSubscription] = {}
        self._sub_errors: dict[str, str] = {}
        self._fanouts: dict[str, Fanout] = {}
        self._lag: dict[str, tuple[int, int | None]] = {}
        self._not_holding: dict[str, str] = {}
        self._orphan_pass: dict[str, Hashable | None] = {}
        self._discovered = False
        self._last_refresh = 0.0
        self._refresh_lock = threading.RLock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.fatal = threading.Event()
        self.fatal_reason = ""
        self.lease_period_s = lease_period_s
        self._lease: Placement | None = None
        self._campaigned = threading.Event()  # campaign() made the placement (or never will)
        # the tables (and CAPTURE) this server sends, with a lease to share (msgtable.placement)
        self._sending: set[str] = set()
        # by unit: when this server gained its lease, and what it learnt of the one before
        self._takeovers: dict[str, tuple[float, Takeover]] = {}
        self._clean_demotion: dict[str, bool] = {}  # by unit: its last loss wrote every postpone
        self.lease_gains = 0  # times this server gained a table's lease (msgtable.metrics)
        # a sequence count around each loss or hand-over of a table: odd while one replaces
        # the table's managers (their counters start again at 0), so that msgtable.metrics
        # reads counters and the table_sender gauge of one tenure (a seqlock)
        self.lease_losses = 0
        self._sender_hints: dict[str, str] = {}  # by unit: the sender named when it was lost
        # sent rows whose postpones a demotion noticed too late did not write (metrics)
        self.postpones_skipped = 0
        self._init_push(push_allow, push_ca_file)
        self._backlog = BacklogReader(
            store, self._loaded_configs, self.clock.now_ns, away=lambda: store.outage.away
        )
        self.binlog: BinlogFollower | None = None
        self._binlog_columns: dict[str, Sequence[str]] = {}
        if follow_binlog and isinstance(store, MySQLStore):
            self.binlog = BinlogFollower(
                pymysql_args(store.url), store.database, self, outage=store.outage
            )
        # Table events (msgtable.capture): followed by the server that sends, while some
        # capture table is loaded. Read by the follower for every event: replaced whole.
        self.capture: CaptureFollower | None = None
        self._capture_targets: tuple[CaptureTarget, ...] = ()
        self._message_tables: frozenset[str] = frozenset()
        if capture and isinstance(store, MySQLStore):
            self.capture = CaptureFollower(
                pymysql_args(store.url),
                store.database,
                lambda: self._capture_targets,
                exclude=lambda t: t in self._message_tables,
                written=self._captured,
                outage=store.outage,
                timed=store.timed,
            )

    @classmethod
    def from_dsn(cls, dsn: str, **kwargs: Any) -> MessageEngine:
        return cls(MySQLStore.from_dsn(dsn), **kwargs)

    # -- lifecycle -----------------------------------------------------------------------
    def open(self) -> None:
        """Discover tables (without failing if the database is down) and start serving."""
        if self._thread is not None:
            return
        # A database that does not answer yet: the store's outage says so once; discovery
        # retries in the background and requests get UNAVAILABLE until it answers.
        with contextlib.suppress(Unavailable):
            self.refresh()
        self._thread = threading.Thread(
            target=self._discovery_loop, daemon=True, name="msgtable-discovery"
        )
        self._thread.start()
        if self.binlog is not None:
            self.binlog.open()

    def campaign(self, address: str) -> None:
        """Start sharing the database's tables with the other servers on it, as the server
        clients reach at ``address`` (msgtable.placement).

        Creates the placement table if it is missing (raises MsgtableError if it cannot; if
        the database is down, the placement's thread does it once it answers). A server
        without a lease period sends every table already: nothing to do."""
        if self.lease_period_s is None or self._lease is not None:
            return
        if not isinstance(self.store, MySQLStore):
            raise InvalidArgument("a lease needs a MySQL-family database")
        lease = Placement(
            connector(self.store.url, self.store.database),
            address,
            self.lease_period_s,
            units=self._units,
            on_gain=self._gain,
            on_loss=self._lose,
            on_unknown=lambda _tables: self._wake.set(),  # discover them now
            outage=self.store.outage,
            timed=self.store.timed,
        )
        try:
            lease.prepare()
        except Unavailable as exc:  # the placement's thread prepares it once the database answers
            self.store.outage.down(exc)
        self._lease = lease
        self._campaigned.set()
        lease.start()

    def _units(self) -> set[str]:
        """What this server can send (msgtable.placement): its tables (a subscription goes
        with its table), and CAPTURE while a capture table is loaded."""
        with self._lock:
            units = {_unit_of(m.config) for m in self._managers.values()}
            if self._capture_targets:
                units.add(CAPTURE)
        return units

    @property
    def leading(self) -> bool:
        """Whether this server sends any table now (it holds a table's lease, or has no
        lease to share)."""
        return self.lease_period_s is None or bool(self._sending)

    def sends(self, table: str) -> bool:
        """Whether this server sends ``table`` (and its subscriptions) now."""
        return self.lease_period_s is None or self._unit(table) in self._sending

    def sender(self, table: str) -> str:
        """The address of the server that sends ``table`` as this one last read the
        placement ("": unknown, or no server sends it now); "this server" when it has no
        lease to share."""
        lease = self._lease
        if lease is None:
            return "" if self.lease_period_s is not None else "this server"
        return lease.last_sender(self._unit(table))

    def _unit(self, table: str) -> str:
        """The placement's unit of ``table`` (a table, a subscription's state table, or
        CAPTURE): the table itself when it is not loaded here."""
        m = self._managers.get(table)
        return _unit_of(m.config) if m is not None else table

    @property
    def lease_holder(self) -> str:
        """The servers that send this database's tables as this one last read the
        placement, comma-separated ("": none); "this server" when it has no lease to share."""
        lease = self._lease
        if lease is None:
            return "" if self.lease_period_s is not None else "this server"
        senders = {lease.last_sender(u) for u in self._units()} - {""}
        return ",".join(sorted(senders))

    def close(self) -> None:
        """End every subscription (Unavailable), stop all loops, give the leases back,
        close connections. Pushers first: the POSTs they have in progress get settled."""
        self._close_pushers()
        self._stop.set()
        self._wake.set()
        if self.binlog is not None:
            self.binlog.close()
        if self.capture is not None:
            self.capture.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(DISCOVERY_RETRY_MAX_S)
        with self._lock:
            managers, self._managers = list(self._managers.values()), {}
            fanouts, self._fanouts = list(self._fanouts.values()), {}
        for f in fanouts:
            f.close()
        clean: dict[str, bool] = {}
        for m in managers:
            unit = _unit_of(m.config)
            clean[unit] = m.close(Unavailable("server shutting down")) and clean.get(unit, True)
        if self._lease is not None:
            self._lease.close(released=lambda unit: clean.get(unit, True))
        self.store.close()

    # -- the placement (msgtable.placement) ----------------------------------------------------
    @property
    def lease_late_renewals(self) -> int:
        """Renewals of the leases that came back after the validity they gave
        (msgtable.placement: sends paused until the next one; a loaded machine, or a period
        too short for it)."""
        lease = self._lease
        return lease.late_renewals if lease is not None else 0

    def _may_send(self, unit: str) -> bool:
        lease = self._lease
        return lease.valid(unit) if lease is not None else self.sends(unit)

    def _may_postpone(self, unit: str, ack_wait_s: float) -> bool:
        """Whether a sent row's postpone (its count, its ack wait) may still be written:
        while the table's lease is valid, and until half an ack wait after it ended. The
        next sender holds back what this one may have sent until a whole ack wait after the
        lease ended on the database's clock (no earlier than here); a postpone written later
        could land after the next sender sent the row again, match the epoch that send has
        not counted yet, and make the row due at once while it is in flight. Not written,
        the count is lost, and the row is sent again after the next sender's hold."""
        lease = self._lease
        if lease is None:
            return True
        return time.monotonic() < lease.held_until_s(unit) + ack_wait_s / 2

    def _gain(self, unit: str, takeover: Takeover) -> None:
        """This server now sends ``unit``: serve its tables, holding back the sends the old
        sender may have messages in flight for."""
        with self._lock:
            if self._stop.is_set():
                return
            self._takeovers[unit] = (time.monotonic(), takeover)
            self._sending.add(unit)
            self.lease_gains += 1  # a new tenure: its tables' counters start at 0
            managers = [m for m in self._managers.values() if _unit_of(m.config) == unit]
            fanouts = [f for t, f in self._fanouts.items() if t == unit]
        for m in managers:
            self._start(m)
        for f in fanouts:
            f.trigger()
        self._wake_pushers()
        self._follow_capture()

    def _follow_capture(self) -> None:
        """Capture table events while this server sends them and some capture table is
        loaded."""
        if (
            self.capture is not None
            and self.run_loops
            and self.sends(CAPTURE)
            and self._capture_targets
            and not self._stop.is_set()
        ):
            self.capture.open()

    def _captured(self, tables: Sequence[str]) -> None:
        for t in tables:
            self.binlog_insert(t)

    def _hold_s(self, cfg: TableConfig) -> float:
        """How long a table's sends wait after a takeover: until vt_ack_wait after the
        old sender's lease ended, when that sender may have sent messages whose postpone
        (their ack wait in the table) it never wrote. Nothing to wait for when it gave the
        lease back cleanly, when there was none, or with vt_postpone_after=0 (the postpone
        is written before the send), unless the table is ordered: then a head the old sender
        sent may fall due again (a backoff shorter than the ack wait) while its subscriber
        still holds the key's batch, which only the old sender knew (msgtable.ordered)."""
        unit = _unit_of(cfg)
        taken = self._takeovers.get(unit)
        if taken is None or (cfg.postpone_after_ns == 0 and not cfg.ordered):
            return 0.0
        at, t = taken
        if not t.previous or t.released or (t.by_me and self._clean_demotion.get(unit, True)):
            return 0.0
        return max(0.0, cfg.ack_wait_s - t.ended_s_ago - (time.monotonic() - at))

    def _hold_floor_ns(self, cfg: TableConfig) -> int | None:
        """During a hold, what the old sender cannot have sent goes out at once: a row it
        sent was due (time_next) and there (time_created) by its clock when it sent, before
        its lease ended. The floor is that end on this server's clock, plus
        TAKEOVER_CLOCK_MARGIN_S for the servers' clocks' disagreement. None (hold every
        send) for an ordered table: a key's newer rows must not pass its held head."""
        taken = self._takeovers.get(_unit_of(cfg))
        if taken is None or cfg.ordered:
            return None
        at, t = taken
        ended_ns = self.clock.now_ns() - round((t.ended_s_ago + time.monotonic() - at) * 1e9)
        return ended_ns + round(TAKEOVER_CLOCK_MARGIN_S * 1e9)

    def _start(self, m: MessageManager) -> None:
        hold = self._hold_s(m.config)
        if hold > 0:
            floor = self._hold_floor_ns(m.config)
            m.hold(hold, floor)
            log.info(
                "table %s: %s in %.1fs, once what the last server sent had its ack wait",
                m.config.name,
                "sending" if floor is None else "sending what it may have sent",
                hold,
            )
        if self.run_loops:
            m.open()

    def _lose(self, unit: str, sender: str) -> bool:
        """This server no longer sends ``unit`` (it lost the lease, or hands the table to
        another server): end its subscriptions with NotLeader (clients go to ``sender``),
        stop sending it, keep answering acks and ListTables. Returns whether every postpone
        was written."""
        error = self._not_leader(unit, sender)
        with self._lock:
            self.lease_losses += 1  # odd: a scrape now reads again
            self._sending.discard(unit)
            self._sender_hints[unit] = sender
            old = [m for m in self._managers.values() if _unit_of(m.config) == unit]
            for m in old:
                self._managers[m.config.name] = self._new_manager(m.config)
            self.lease_losses += 1
        if unit == CAPTURE and self.capture is not None:
            self.capture.close()
        clean = _close_all(old, error)
        self._clean_demotion[unit] = clean
        self.postpones_skipped += sum(m.postpones_skipped for m in old)
        self._wake_pushers()
        return clean

    def _await_sending(self, unit: str) -> None:
        """Return once this server sends ``unit``, or raise NotLeader naming the live server
        that does. A unit being placed or handed over (on its way here, or nobody's for a
        moment: just discovered, its holder gone or giving it back) is waited for, at most
        PLACING_WAIT_PERIODS lease periods, step by step of the placement: a client without
        retries is served, not sent away by a transition of the servers' own (DESIGN.md,
        principle 10). Past that, NotLeader says why (or DatabaseUnavailable, if the database
        kept the placement from stepping)."""
        period_s = self.lease_period_s or 0.0
        deadline = time.monotonic() + PLACING_WAIT_PERIODS * period_s
        wake = True  # the first step at once (one step more per request, no more)
        while not self.sends(unit):
            lease = self._lease
            if lease is not None:
                sender = lease.sender(unit)
                if sender and sender != lease.address and not lease.coming(unit):
                    raise self._not_leader(unit, sender)
            left = deadline - time.monotonic()
            if left <= 0 or self._stop.is_set():
                break
            if lease is not None:
                lease.await_step(left, wake)
                wake = False
            elif self._campaigned.is_set() or self._thread is None:
                break  # no placement (closed; or an engine driven by hand, never opened)
            else:  # serving already, the placement not made yet (msgtable serve's start)
                self._campaigned.wait(left)
        if self.sends(unit):
            return
        if self._stop.is_set():
            raise Unavailable("server shutting down")
        if self.store.outage.away:
            raise self._unreached()
        raise self._not_leader(unit)

    def _not_leader(self, unit: str, sender: str | None = None) -> NotLeader:
        lease = self._lease
        if sender is None:
            sender = lease.sender(unit) if lease is not None else self._sender_hints.get(unit, "")
        if lease is not None and sender == lease.address:
            sender = ""  # never this server itself: it does not send the unit now
        what = "the table events" if unit == CAPTURE else f"table {unit}"
        where = (
            f"the leader is at {sender}"
            if sender
            else "no server holds its lease now (it is being placed or handed over); retry"
        )
        return NotLeader(
            f"this server does not send {what} of keyspace {self.keyspace!r}: {where}",
            leader=sender,
        )

    def _new_manager(self, cfg: TableConfig) -> MessageManager:
        unit = _unit_of(cfg)
        return MessageManager(
            self.store,
            cfg,
            self.clock,
            self.rng,
            self._on_fatal,
            may_send=lambda: self._may_send(unit),
            may_postpone=lambda ack_wait_s: self._may_postpone(unit, ack_wait_s),
            outage=self.store.outage,
            dead_letter=self._dead_letter_config,
            buried=self.binlog_insert,
            tracing=tracing.server(cfg.name, self._tracer_provider),
        )

    def _dead_letter_config(self, cfg: TableConfig) -> TableConfig | None:
        """The loaded config of ``cfg``'s vt_dead_letter table (None: not loaded)."""
        m = self._managers.get(cfg.dead_letter)
        return m.config if m is not None else None

    # -- msgtable.binlog.BinlogSink -------------------------------------------------------
    def binlog_tables(self) -> dict[str, Sequence[str]]:
        return self._binlog_columns

    def binlog_insert(self, table: str, rows: int = 0) -> None:
        m = self._managers.get(table)
        if m is not None:
            m.binlog_insert(rows)
        f = self._fanouts.get(table)
        if f is not None:
            f.trigger()

    def binlog_changes(self, table: str, changes: list[RowChange]) -> None:
        m = self._managers.get(table)
        if m is not None:
            m.binlog_changes(changes)

    def binlog_resync(self) -> None:
        with self._lock:
            managers = list(self._managers.values())
        for m in managers:
            m.resync()

    def _on_fatal(self, reason: str) -> None:
        self.fatal_reason = reason
        self.fatal.set()

    # -- discovery -----------------------------------------------------------------------
    def refresh(self) -> None:
        """Read the message tables now and open, reconfigure or close managers to match."""
        with self._refresh_lock:
            self._last_refresh = time.monotonic()
            defs = self.store.discover()
            self._apply(defs)
            self._discovered = True
        # outside the refresh lock: a pusher closing waits for its POSTs, whose settlement
        # may itself want a discovery (msgtable.push.pushers)
        self._sync_pushers()

    def _apply(self, defs: list[TableDefinition]) -> None:
        configs: dict[str, TableConfig] = {}
        errors: dict[str, str] = {}
        for d in defs:
            try:
                configs[d.name] = load_table(
                    d.name, d.comment, d.columns, d.unique_indexes, d.indexes
                )
            except TableLoadError as exc:
                errors[d.name] = str(exc)
        _check_dead_letters(configs, errors)
        subs, sub_errors = self._load_subscriptions(configs)
        wanted = dict(configs)
        wanted.update((ls.config.name, ls.config) for ls in subs.values())
        to_close: list[tuple[MessageManager, MsgtableError]] = []
        to_open: list[MessageManager] = []
        with self._lock:
            old_subs = self._subs
            for name, m in list(self._managers.items()):
                cfg = wanted.get(name)
                if cfg is None:
                    del self._managers[name]
                    err: MsgtableError
                    if name in errors:
                        err = TableLoadError(errors[name])
                    elif name in old_subs:
                        label = old_subs[name].sub.label
                        err = (
                            TableLoadError(sub_errors[label])
                            if label in sub_errors
                            else TableNotFound(f"subscription {label} was dropped")
                        )
                    else:
                        err = TableNotFound(f"message table {name!r} was dropped")
                    to_close.append((m, err))
                elif cfg != m.config:
                    if _same_shape(cfg, m.config):
                        m.reconfigure(cfg)
                        log.info("%s: new settings applied", _what(cfg))
                    else:
                        del self._managers[name]
                        to_close.append(
                            (
                                m,
                                Unavailable(
                                    f"{_what(cfg)} changed its columns or ordering; subscribe again"
                                ),
                            )
                        )
            for name, cfg in wanted.items():
                if name not in self._managers:
                    m = self._new_manager(cfg)
                    self._managers[name] = m
                    if self.sends(_unit_of(cfg)):
                        to_open.append(m)
            for name in errors.keys() - self._load_errors.keys():
                log.error("%s (not served until it is fixed)", errors[name])
            for label in sub_errors.keys() - self._sub_errors.keys():
                log.error("%s (not served until it is fixed)", sub_errors[label])
            self._load_errors = errors
            self._subs = subs
            self._sub_errors = sub_errors
            # read by the binlog follower for every event: replaced whole, never changed (a
            # subscription's state table too: an ack by DML there leaves its cache at once)
            self._binlog_columns = {n: m.config.column_names for n, m in self._managers.items()}
            self._capture_targets = tuple(
                CaptureTarget(c.name, c.capture) for c in configs.values() if c.capture
            )
            self._message_tables = frozenset({d.name for d in defs} | self._managers.keys())
            fan_tables = {cfg.name for cfg in configs.values() if cfg.fanout}
            gone = [f for t, f in self._fanouts.items() if t not in fan_tables]
            self._fanouts = {t: f for t, f in self._fanouts.items() if t in fan_tables}
            new_fanouts = [self._new_fanout(t) for t in fan_tables - self._fanouts.keys()]
        for f in gone:
            f.close()
        for m, e in to_close:
            log.info("%s: closing (%s)", _what(m.config), e)
            m.close(e)
        for m in to_open:
            log.info("%s: serving", _what(m.config))
            self._start(m)
        for f in new_fanouts:
            if self.run_loops:
                f.open()
        self._follow_capture()
        if self._lease is not None:
            self._lease.wake()  # a table it can send now, or no longer

    def _discovery_loop(self) -> None:
        retry = Retry(
            "discovery of message tables",
            log,
            Backoff(DISCOVERY_RETRY_MIN_S, DISCOVERY_RETRY_MAX_S),
            outage=self.store.outage,
        )
        delay = self.discovery_interval_s
        while not self._stop.is_set():
            self._wake.wait(delay)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.refresh()
                self._upkeep()
                retry.succeeded()
                delay = self.discovery_interval_s
            except Exception as exc:
                delay = retry.failed(exc)

    # -- lookups -------------------------------------------------------------------------
    def _manager(
        self,
        name: str,
        keyspace: str,
        shard: str = "",
        key_range: tuple[bytes, bytes] = (b"", b""),
        subscription: str = "",
    ) -> MessageManager:
        """The one place that says which database (and manager) serves a table, or one of
        its subscriptions."""
        if not name:
            raise InvalidArgument("a table name is required")
        self._check_shard(shard, key_range)
        if subscription:
            return self._subscription_manager(name, keyspace, subscription)
        if keyspace not in ("", self.keyspace):
            raise TableNotFound(
                f"keyspace {keyspace!r} not found: this server serves {self.keyspace!r}"
            )
        m = self._find(name, lambda: self._load_errors.get(name))
        if m is not None:
            return m
        if not self._discovered:
            raise self._unreached()
        raise TableNotFound(f"message table {name!r} not found in keyspace {self.keyspace!r}")

    def _check_shard(self, shard: str, key_range: tuple[bytes, bytes]) -> None:
        """InvalidArgument unless a stream of ``shard`` / ``key_range`` is one this server
        sends: its own shard (or, unsharded, the keyspace's one shard)."""
        if self.shard is None:
            if shard not in SHARDS:
                raise InvalidArgument(
                    f"shard {shard!r} not found: keyspace {self.keyspace!r} is unsharded "
                    "(use '', '0' or '-')"
                )
            if tuple(key_range) != (b"", b""):
                raise InvalidArgument(
                    f"keyspace {self.keyspace!r} is unsharded: key_range must be empty"
                )
            return
        if shard and KeyRange.parse(shard) != self.shard:
            raise InvalidArgument(
                f"shard {shard!r}: this server sends shard {self.shard} of keyspace "
                f"{self.keyspace!r}"
            )
        asked = KeyRange(*(bound.rstrip(b"\0") for bound in key_range))
        if not asked.holds(self.shard):
            raise InvalidArgument(
                f"key range {asked} does not hold shard {self.shard} of keyspace "
                f"{self.keyspace!r}, the one this server sends"
            )

    def _subscription_manager(self, name: str, keyspace: str, subscription: str) -> MessageManager:
        table = self._manager(name, keyspace)  # the table's own errors first
        label = f"{name}/{subscription}"
        m = self._find(
            state_table_name(table.config.name, subscription),
            lambda: self._sub_errors.get(label),
        )
        if m is None:
            raise TableNotFound(f"subscription {label} not found in keyspace {self.keyspace!r}")
        return m

    def _find(self, key: str, error: Callable[[], str | None]) -> MessageManager | None:
        """The manager of ``key`` (a table or a state table), after one discovery if it is
        not known yet; TableLoadError with ``error()`` if it failed to load."""
        asked_at = time.monotonic()
        for attempt in range(2):
            with self._lock:
                m = self._managers.get(key)
                failed = error()
            if m is not None:
                return m
            if failed is not None:
                raise TableLoadError(failed)
            if attempt == 0:
                self._refresh_on_demand(asked_at)
        return None

    def _default_group(self, m: MessageManager) -> MessageManager:
        """A table's own manager, for its default group: refused with vt_default_group=off."""
        if not m.config.default_group and not m.config.source:
            raise TableLoadError(
                f"table {m.config.name} has no default group (vt_default_group=off): "
                "name one of its subscriptions"
            )
        return m

    def _refresh_on_demand(self, asked_at: float) -> None:
        """Rediscover for a name we do not know, unless a discovery began after the ask.

        Concurrent asks for unknown names share one discovery instead of one each.
        """
        with self._refresh_lock:
            if self._last_refresh >= asked_at:
                return
            with contextlib.suppress(Unavailable):
                self.refresh()

    def subscribe(
        self,
        name: str,
        keyspace: str = "",
        shard: str = "",
        key_range: tuple[bytes, bytes] = (b"", b""),
        max_in_flight: int = 0,
        subscription: str = "",
        filter: str = "",
        max_messages: int = 0,
    ) -> Subscriber:
        """A subscriber of a table's default group or of one of its subscriptions; with a
        ``filter`` (over the message columns), of the messages it matches only; with
        ``max_messages``, sent no more than that many in all (msgtable.window)."""
        if self._stop.is_set():
            raise Unavailable("server shutting down")
        m = self._default_group(self._manager(name, keyspace, shard, key_range, subscription))
        accepts = stream_filter(m.config, filter) if filter else None
        if not self.sends(_unit_of(m.config)):
            self._await_sending(_unit_of(m.config))
            # the manager the gain started (a loss before it replaced the one found above)
            m = self._default_group(self._manager(name, keyspace, shard, key_range, subscription))
        if subscription:
            self._revive(m)
        return m.subscribe(max_in_flight, accepts, max_messages)

    def ack(self, name: str, keyspace: str, ids: Sequence[object], subscription: str = "") -> int:
        if self._stop.is_set():
            raise Unavailable("server shutting down")
        return self._default_group(self._manager(name, keyspace, subscription=subscription)).ack(
            ids
        )

    # -- settlement and dead letters (msgtable.settlement, msgtable.deadletters) ----------------
    def release(
        self,
        name: str,
        keyspace: str,
        ids: Sequence[object],
        delay_s: float,
        reason: str | None,
        subscription: str = "",
        attempts: Sequence[int] = (),
    ) -> int:
        return self._verb(name, keyspace, subscription).release(ids, delay_s, reason, attempts)

    def reject(
        self,
        name: str,
        keyspace: str,
        ids: Sequence[object],
        reason: str | None,
        subscription: str = "",
    ) -> int:
        return self._verb(name, keyspace, subscription).reject(ids, reason)

    def renew(
        self,
        name: str,
        keyspace: str,
        ids: Sequence[object],
        extend_s: float,
        reason: str | None,
        subscription: str = "",
        attempts: Sequence[int] = (),
    ) -> int:
        return self._verb(name, keyspace, subscription).renew(ids, extend_s, reason, attempts)

    def _settling(self, name: str, keyspace: str, subscription: str = "") -> MessageManager:
        if self._stop.is_set():
            raise Unavailable("server shutting down")
        m = self._manager(name, keyspace, subscription=subscription)
        return m if subscription else self._default_group(m)

    def _verb(self, name: str, keyspace: str, subscription: str) -> MessageManager:
        """The manager that answers a release, reject or renew: only the leader's. It alone
        knows which of its sends are not counted yet (vt_postpone_after); another server
        would write one attempt too few (NotLeader: the client goes to the leader)."""
        m = self._settling(name, keyspace, subscription)
        if not self.sends(_unit_of(m.config)):
            self._await_sending(_unit_of(m.config))
            m = self._settling(name, keyspace, subscription)
        return m

    def dead_letters(
        self, name: str, keyspace: str, after: object | None, limit: int, subscription: str = ""
    ) -> tuple[list[DeadLetter], int]:
        """Up to ``limit`` dead messages of table ``name`` (a table, or a dead-letter table)
        by id after ``after``, and how many there are (at most deadstore.COUNT_DEAD_CAP)."""
        if not 0 < limit <= MAX_DEAD_LETTERS_LISTED:
            raise InvalidArgument(f"limit must be 1 to {MAX_DEAD_LETTERS_LISTED:,}, not {limit}")
        if self._stop.is_set():
            raise Unavailable("server shutting down")
        cfg, dead = self._dead_of(self._manager(name, keyspace, subscription=subscription).config)
        if after is not None:
            (after,) = coerce_ids(name, cfg.id_column, [after], "list after")
        rows = self.store.dead_letters(cfg, dead, after, limit)
        return rows, self.store.count_dead([(cfg, dead)])[cfg.name]

    def _dead_of(self, cfg: TableConfig) -> tuple[TableConfig, TableConfig | None]:
        """Where the dead messages of ``cfg`` are: (the table, its dead-letter table or None
        for in place). A table that is some table's dead-letter table holds dead letters
        itself: (that table, it)."""
        if cfg.dead_letter:
            dead = self._dead_letter_config(cfg)
            if dead is None:
                raise TableLoadError(
                    f"table {cfg.name}: vt_dead_letter={cfg.dead_letter}: that table is not loaded"
                )
            return cfg, dead
        sources = self._sources_of(cfg.name)
        if sources:
            return sources[0], cfg
        return cfg, None

    def _sources_of(self, dead_name: str) -> list[TableConfig]:
        with self._lock:
            configs = [m.config for m in self._managers.values()]
        return sorted((c for c in configs if c.dead_letter == dead_name), key=lambda c: c.name)

    def redrive(
        self,
        name: str,
        keyspace: str,
        to: str,
        ids: Sequence[object] | None,
        after: object | None,
        limit: int,
        subscription: str = "",
    ) -> RedriveBatch:
        """One batch (one transaction) of moving dead messages back as fresh ones.

        ``name`` is a dead-letter table (its dead letters go to ``to``, or to the one table
        whose vt_dead_letter it is), or a table with vt_dead_letter (its dead letters come
        back to it), or a table with messages dead in place (they live again); with
        ``subscription``, that subscription's dead messages of table ``name`` (dead in its
        state table) live again, for it alone."""
        if not 0 < limit <= MAX_REDRIVE_BATCH:
            raise InvalidArgument(f"limit must be 1 to {MAX_REDRIVE_BATCH:,}, not {limit}")
        if subscription and to:
            raise InvalidArgument(
                f"a subscription's dead messages live again in it: no --to with subscription "
                f"{name}/{subscription}"
            )
        m = self._settling(name, keyspace, subscription)
        cfg = m.config
        if cfg.dead_letter and not to and not subscription:
            source, dead = self._dead_of(cfg)
            assert dead is not None
        else:
            dead, source = cfg, cfg
            if to and to != name:
                source = self._settling(to, keyspace).config
            elif not to and not subscription:
                sources = self._sources_of(name)
                if len(sources) > 1:
                    names = ", ".join(s.name for s in sources)
                    raise InvalidArgument(
                        f"the dead letters of {name} come from {names}: say which with --to"
                    )
                if sources:
                    source = sources[0]
        problem = redrive_problem(dead, source)
        if problem:
            raise InvalidArgument(f"cannot redrive {dead.name} to {source.name}: {problem}")
        clean = coerce_ids(dead.name, dead.id_column, ids, "redrive") if ids else None
        if after is not None:
            (after,) = coerce_ids(dead.name, dead.id_column, [after], "redrive after")
        batch = self.store.redrive(dead, source, clean, after, limit, self.clock.now_ns())
        if batch.moved:
            target = self._managers.get(source.name)
            if target is not None:
                target.resync()
        return batch

    def _unreached(self) -> DatabaseUnavailable:
        reason = self.store.outage.reason or "not reached yet"
        return DatabaseUnavailable(f"database unavailable: {reason}")

    def database_error(self) -> str:
        """Why the database is away now, and since when ("" while it answers)."""
        if not self._discovered and not self.store.outage.away:
            return "the database has not answered yet"
        return self.store.outage.describe()

    def _loaded_configs(self) -> list[TableConfig]:
        with self._lock:
            return [m.config for m in self._managers.values()]

    def backlog(
        self, max_age_s: float = DEFAULT_MAX_AGE_S, wait_s: float | None = None
    ) -> list[Backlog]:
        """The backlog of every loaded table (its default group) and subscription, read at
        most once per ``max_age_s`` (msgtable.backlog); on a server that does not hold the
        lease too. Never raises: a table whose read fails keeps its last read. ``wait_s``:
        wait at most that long for a read, then answer the last (msgtable.backlog)."""
        return self._backlog.backlog(max_age_s, wait_s)

    def live_statuses(self) -> list[tuple[TableStatus, LatencySnapshot]]:
        """Every loaded table and subscription as its manager counts it now, with its send
        -> ack latencies: no discovery, no statement (what msgtable.metrics reads at scrape
        time). A subscription's entry has its table's name and ``subscription`` set."""
        with self._lock:
            managers = list(self._managers.values())
        out = []
        for m in managers:
            s, latency = m.status(self.keyspace), m.ack_latency_snapshot()
            if m.config.source:
                s = dataclasses.replace(s, name=m.config.source, subscription=m.config.subscription)
            out.append((s, latency))
        return out

    def delivery_delays(self) -> dict[tuple[str, str], LatencySnapshot]:
        """Each loaded table's and subscription's time_created -> first send delays, by
        (table, subscription): no statement (msgtable.metrics)."""
        with self._lock:
            managers = list(self._managers.values())
        return {
            (m.config.source or m.config.name, m.config.subscription): m.delivery_delay_snapshot()
            for m in managers
        }

    def list_tables(self) -> list[TableStatus]:
        """Every message table: loaded ones with live counts, failed ones with their error.

        Discovers first (a table created a moment ago shows), unless the database is away:
        then the tables as last seen, at once (``database_error()`` says why)."""
        if not self.store.outage.away:
            self._refresh_on_demand(time.monotonic())
        with self._lock:
            managers = list(self._managers.values())
            errors = dict(self._load_errors)
        subs = [m for m in managers if m.config.source]
        managers = [m for m in managers if not m.config.source]
        out = [m.status(self.keyspace) for m in managers]
        pairs = []
        for m in managers + subs:  # a subscription's: in its state table, by its name
            with contextlib.suppress(TableLoadError):  # its dead-letter table just went
                pairs.append(self._dead_of(m.config))
        try:
            dead = self.store.count_dead(pairs)
        except MsgtableError:  # counts are extras: the list answers without them
            dead = {}
        out = [dataclasses.replace(s, dead=dead.get(s.name)) for s in out]
        sub_dead = {(m.config.source, m.config.subscription): dead.get(m.config.name) for m in subs}
        out = [self._with_unseen(s) for s in out]
        out = [self._with_capture(s) for s in out]
        out += [
            TableStatus(name=n, keyspace=self.keyspace, config=None, load_error=e)
            for n, e in errors.items()
        ]
        out += [
            dataclasses.replace(s, dead=sub_dead.get((s.name, s.subscription)))
            for s in self._subscription_statuses(subs)
        ]
        out = [dataclasses.replace(s, push=self.push_status(s.name, s.subscription)) for s in out]
        backlog = {(b.table, b.subscription): b for b in self.backlog()}
        out = [_with_backlog(s, backlog.get((s.name, s.subscription))) for s in out]
        shard = "" if self.shard is None else str(self.shard)
        out = [dataclasses.replace(s, sender=self.sender(s.name), shard=shard) for s in out]
        return sorted(out, key=lambda s: (s.name, s.subscription))

    def _with_capture(self, s: TableStatus) -> TableStatus:
        """A capture table's status with its follower's (msgtable.capture)."""
        if s.config is None or s.config.capture is None:
            return s
        f = self.capture
        if f is None:
            return dataclasses.replace(s, capture_problem="table events need a MySQL database")
        if f.disabled_because:
            return dataclasses.replace(s, capture_problem=f.disabled_because)
        if not self.sends(CAPTURE):
            sender = self.sender(CAPTURE)
            return dataclasses.replace(
                s,
                capture_problem="this server does not capture the table events: "
                + (f"the server at {sender} does" if sender else "no server does now"),
            )
        return dataclasses.replace(
            s,
            capture_position=f.position,
            capture_lag_s=f.lag_s if f.following.is_set() else None,
            capture_events=f.events,
            capture_problem="" if f.following.is_set() else "not following the binlog now",
        )


def _with_backlog(s: TableStatus, b: Backlog | None) -> TableStatus:
    if b is None:
        return s
    return dataclasses.replace(
        s, due=b.due, scheduled=b.scheduled, oldest_unacked_age_s=b.oldest_unacked_age_s
    )


def _check_dead_letters(configs: dict[str, TableConfig], errors: dict[str, str]) -> None:
    """Move tables whose vt_dead_letter table cannot take their dead messages from
    ``configs`` to ``errors`` (until none is left: a dead-letter table may fail for its own
    dead-letter table in turn)."""
    changed = True
    while changed:
        changed = False
        for name, cfg in list(configs.items()):
            if not cfg.dead_letter:
                continue
            dead = configs.get(cfg.dead_letter)
            problem = check_dead_letter(cfg, dead, errors.get(cfg.dead_letter))
            if problem:
                errors[name] = f"table {name}: {problem}"
                del configs[name]
                changed = True


def _same_shape(new: TableConfig, old: TableConfig) -> bool:
    """Whether a manager can take ``new`` live: the same columns streamed and the same
    ordering (msgtable.ordered keeps other state than an unordered table's cache)."""
    return new.message_columns == old.message_columns and (new.order_key, new.order_by) == (
        old.order_key,
        old.order_by,
    )


def _what(cfg: TableConfig) -> str:
    """A table or subscription as the log names it."""
    return f"subscription {cfg.label}" if cfg.source else f"table {cfg.name}"


def _unit_of(cfg: TableConfig) -> str:
    """The unit of the placement a table's manager goes with: a subscription's state table
    with its source table (msgtable.placement)."""
    return cfg.source or cfg.name


def _close_all(managers: Sequence[MessageManager], error: MsgtableError) -> bool:
    """Close managers side by side (each may wait for its loops and write its postpones; one
    after another, a table's subscribers would wait for every table before it); returns
    whether every postpone was written."""
    results: list[bool] = []
    threads = [
        threading.Thread(
            target=lambda m=m: results.append(m.close(error)),
            name=f"msgtable-close-{m.config.name}",
            daemon=True,
        )
        for m in managers
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(results) == len(managers) and all(results)
