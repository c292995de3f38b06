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
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from msgtable.core import tracing
from msgtable.core.clock import Clock, SystemClock
from msgtable.core.deadletters import DeadLetter, RedriveBatch
from msgtable.core.endpoints import Endpoint
from msgtable.core.filters import parse_filter
from msgtable.core.flow import fair_index_hint
from msgtable.core.keyspace import KeyRange
from msgtable.core.latency import LatencySnapshot
from msgtable.core.retry import Backoff, Retry
from msgtable.core.rows import RowChange, Values
from msgtable.core.status import PushStatus, TableStatus
from msgtable.core.subscriptions import Subscription, state_table_name
from msgtable.core.tables import DEFAULT_DISCOVERY_INTERVAL_S, TableConfig, load_table
from msgtable.engine.binlog import BinlogFollower
from msgtable.engine.components import (
    Component,
    Discovery,
    Features,
    Follower,
    Loaded,
    PushComponent,
    SchedulesComponent,
    SubscriptionsComponent,
)
from msgtable.engine.deadletters import DeadLetters
from msgtable.engine.deadletters import check_tables as check_dead_letters
from msgtable.engine.lease import Takeover, connector
from msgtable.engine.manager import MessageManager
from msgtable.engine.placement import Placement
from msgtable.engine.subscriber import Subscriber
from msgtable.engine.tail import InsertKeys
from msgtable.engine.tenure import Tenure, unit_of
from msgtable.errors import (
    DatabaseUnavailable,
    InvalidArgument,
    MsgtableError,
    TableLoadError,
    TableNotFound,
    Unavailable,
)
from msgtable.limits import MAX_DEAD_LETTERS_LISTED, MAX_REDRIVE_BATCH
from msgtable.store.backlog import DEFAULT_MAX_AGE_S, Backlog, BacklogReader
from msgtable.store.mysql import pymysql_args
from msgtable.store.mysqlstore import MySQLStore, Store, TableDefinition

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

log = logging.getLogger(__name__)

DISCOVERY_RETRY_MIN_S = 1.0
DISCOVERY_RETRY_MAX_S = 30.0
SHARDS = ("", "0", "-")  # ways to name the one shard of an unsharded keyspace


class MessageEngine:
    """Serves every message table of one database (the keyspace); its features
    (subscriptions, push, capture) are components it calls (msgtable.engine.components)."""

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
        tracer_provider: TracerProvider | None = None,
        keyspace: str | None = None,
        shard: KeyRange | None = None,
        features: Features | None = None,
    ) -> None:
        """``lease_period_s``: share the database with other msgtable servers; this one
        sends only while it holds the lease (msgtable.engine.lease), from ``campaign()`` on. None:
        this server is the only one and sends from ``open()`` on.
        ``tracer_provider``: where the tables' poll / send / ack spans go (msgtable.core.tracing;
        None: the global provider, if one was configured when a table's manager is made).
        ``keyspace`` and ``shard``: this database is that shard of that keyspace
        (msgtable.core.keyspace; None: an unsharded keyspace named after the database).
        ``features``: the components it serves (msgtable.features.assembly makes them all;
        None: none, the Vitess path alone)."""
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
        self._managers: dict[str, MessageManager] = {}  # by table, or subscription state table
        self._load_errors: dict[str, str] = {}  # by table
        self._sub_errors: dict[str, str] = {}  # subscriptions that failed to load, by label
        self._found = Discovery()  # the last discovery applied
        self._discovered = False
        self._last_refresh = 0.0
        self._refresh_lock = threading.RLock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.fatal = threading.Event()
        self.fatal_reason = ""
        self._init_placement(lease_period_s)
        self._dead = DeadLetters(store, self._loaded_configs, self.loaded, self.clock.now_ns)
        self._backlog = BacklogReader(
            store, self._loaded_configs, self.clock.now_ns, away=lambda: store.outage.away
        )
        self.binlog: BinlogFollower | None = None
        self._binlog_columns: dict[str, Sequence[str]] = {}
        db = store.connections() if follow_binlog else None
        if db is not None:  # the binlog of a MySQL-family server
            self.binlog = BinlogFollower(pymysql_args(db.url), db.database, self, outage=db.outage)
        self._init_features(features or Features())

    def _init_placement(self, lease_period_s: float | None) -> None:
        self.lease_period_s = lease_period_s
        self._tenure = Tenure(lease_period_s, self.keyspace, self.clock, self._stop)
        self.lease_gains = 0  # times this server gained a table's lease (msgtable.observe.metrics)
        # a sequence count around each loss or hand-over of a table: odd while one replaces
        # the table's managers (their counters start again at 0), so that msgtable.observe.metrics
        # reads counters and the table_sender gauge of one tenure (a seqlock)
        self.lease_losses = 0

    def _init_features(self, features: Features) -> None:
        """Make the components (msgtable.engine.components), in the order their hooks are
        called: a subscription's entry in ListTables gets its push status too."""
        subs = features.subscriptions(self) if features.subscriptions else None
        events = features.capture(self) if features.capture else None
        push = features.push(self) if features.push else None
        # schedules (msgtable.features.schedules; the servicer's schedule verbs are its own)
        self.schedules: SchedulesComponent | None = (
            features.schedules(self) if features.schedules else None
        )
        self._subscriptions: SubscriptionsComponent | None = subs
        self._push: PushComponent | None = push
        # the table-events follower (msgtable.features.capture; msgtable.observe.metrics)
        self.capture: Follower | None = events.follower if events is not None else None
        self._components: tuple[Component, ...] = tuple(
            c for c in (subs, events, push, self.schedules) if c is not None
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

    def campaign(self, address: str, services: Mapping[str, str] | None = None) -> None:
        """Start sharing the database's tables with the other servers on it, as the server
        clients reach at ``address`` (msgtable.engine.placement), telling them the address
        of each of its other ``services`` (name -> address: the SQS API's).

        Creates the placement table if it is missing (raises MsgtableError if it cannot; if
        the database is down, the placement's thread does it once it answers). A server
        without a lease period sends every table already: nothing to do."""
        if self.lease_period_s is None or self._tenure.lease is not None:
            return
        db = self.store.connections()
        if db is None:
            raise InvalidArgument("a lease needs a MySQL-family database")
        lease = Placement(
            connector(db.url, db.database),
            address,
            self.lease_period_s,
            units=self._units,
            on_gain=self._gain,
            on_loss=self._lose,
            on_unknown=lambda _tables: self._wake.set(),  # discover them now
            outage=db.outage,
            timed=db.timed,
            services=services,
        )
        db.fence_as(lease.holder)  # its writes on what it has in flight: see MySQLStore.fence_as
        self._tenure.fenced = db
        try:
            lease.prepare()
        except Unavailable as exc:  # the placement's thread prepares it once the database answers
            self.store.outage.down(exc)
        self._tenure.lease = lease
        self._tenure.campaigned.set()
        lease.start()

    def _units(self) -> set[str]:
        """What this server can send (msgtable.engine.placement): its tables (a subscription goes
        with its table), and CAPTURE while a capture table is loaded."""
        with self._lock:
            units = {unit_of(m.config) for m in self._managers.values()}
        for c in self._components:
            units |= c.units()
        return units

    @property
    def leading(self) -> bool:
        """Whether this server sends any table now (it holds a table's lease, or has no
        lease to share)."""
        return self._tenure.leading

    def sends(self, table: str) -> bool:
        """Whether this server sends ``table`` (and its subscriptions) now."""
        return self._tenure.sends(self._unit(table))

    def sender(self, table: str) -> str:
        """The address of the server that sends ``table`` as this one last read the
        placement ("": unknown, or no server sends it now); "this server" when it has no
        lease to share."""
        return self._tenure.sender(self._unit(table))

    def service_of_sender(self, table: str, service: str) -> str:
        """The address of service ``service`` (e.g. "sqs") of the other server that sends
        ``table`` now, as this one last read the placement ("": this server sends it, or no
        server does, or its sender does not serve it)."""
        lease = self._tenure.lease
        if lease is None or self.sends(table):
            return ""
        sender = lease.sender(self._unit(table))
        return lease.service(service, sender) if sender else ""

    def _unit(self, table: str) -> str:
        """The placement's unit of ``table`` (a table, a subscription's state table, or
        CAPTURE): the table itself when it is not loaded here."""
        m = self._managers.get(table)
        return unit_of(m.config) if m is not None else table

    @property
    def lease_holder(self) -> str:
        """The servers that send this database's tables as this one last read the
        placement, comma-separated ("": none); "this server" when it has no lease to share."""
        lease = self._tenure.lease
        if lease is None:
            return "" if self.lease_period_s is not None else "this server"
        senders = {lease.last_sender(u) for u in self._units()} - {""}
        return ",".join(sorted(senders))

    def close(self) -> None:
        """End every subscription (Unavailable), stop all loops, give the leases back,
        close connections. The components first, the last made first: the POSTs pushers
        have in progress get settled."""
        for c in reversed(self._components):
            c.close()
        self._stop.set()
        self._wake.set()
        if self.binlog is not None:
            self.binlog.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(DISCOVERY_RETRY_MAX_S)
        with self._lock:
            managers, self._managers = list(self._managers.values()), {}
        clean: dict[str, bool] = {}
        for m in managers:
            unit = unit_of(m.config)
            clean[unit] = m.close(Unavailable("server shutting down")) and clean.get(unit, True)
        if self._tenure.lease is not None:
            self._tenure.lease.close(released=lambda unit: clean.get(unit, True))
        self.store.close()

    # -- the placement (msgtable.engine.placement)
    # ----------------------------------------------------
    @property
    def postpones_skipped(self) -> dict[str, int]:
        """Sent rows whose postpone was not written, by message table (Tenure.skipped)."""
        return self._tenure.skipped()

    @property
    def lease_late_renewals(self) -> int:
        """Renewals of the leases that came back after the validity they gave
        (msgtable.engine.placement: sends paused until the next one; a loaded machine, or a period
        too short for it)."""
        lease = self._tenure.lease
        return lease.late_renewals if lease is not None else 0

    def may_send(self, unit: str) -> bool:
        """Whether this server may send ``unit`` at this instant (its lease is valid)."""
        return self._tenure.may_send(unit)

    def others_sent_before_ns(self, unit: str) -> int:
        """Rows of ``unit`` created after this were never another server's to send."""
        return self._tenure.others_sent_before_ns(unit)

    def _gain(self, unit: str, takeover: Takeover) -> None:
        """This server now sends ``unit``: serve its tables, holding back the sends the old
        sender may have messages in flight for."""
        with self._lock:
            if self._stop.is_set():
                return
            self._tenure.gained(unit, takeover)
            self.lease_gains += 1  # a new tenure: its tables' counters start at 0
            managers = [m for m in self._managers.values() if unit_of(m.config) == unit]
        for m in managers:
            self._start(m)
        for c in self._components:
            c.gained(unit)

    def _start(self, m: MessageManager) -> None:
        hold = self._tenure.hold_s(m.config)
        if hold > 0:
            floor = self._tenure.hold_floor_ns(m.config)
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
        error = self._tenure.not_leader(unit, sender)
        with self._lock:
            self.lease_losses += 1  # odd: a scrape now reads again
            self._tenure.lost(unit, sender)
            old = [m for m in self._managers.values() if unit_of(m.config) == unit]
            for m in old:
                self._managers[m.config.name] = self._new_manager(m.config)
            self.lease_losses += 1
        clean = _close_all(old, error)
        self._tenure.clean_demotion[unit] = clean
        self._tenure.skip(unit, sum(m.postpones_skipped for m in old))
        for c in self._components:
            c.lost(unit)
        return clean

    def _await_sending(self, unit: str) -> None:
        """Return once this server sends ``unit``, or raise NotLeader naming the live server
        that does (msgtable.engine.tenure), or DatabaseUnavailable if the database kept the
        placement from stepping."""
        if self._tenure.await_sending(unit, opened=self._thread is not None):
            return
        if self._stop.is_set():
            raise Unavailable("server shutting down")
        if self.store.outage.away:
            raise self._unreached()
        raise self._tenure.not_leader(unit)

    def _new_manager(self, cfg: TableConfig) -> MessageManager:
        unit = unit_of(cfg)
        subs = self._subscriptions if cfg.source else None
        return MessageManager(
            (subs.store_for(cfg) if subs is not None else None) or self.store,
            cfg,
            self.clock,
            self.rng,
            self._on_fatal,
            may_send=lambda: self.may_send(unit),
            may_postpone=lambda ack_wait_s: self._tenure.may_postpone(unit, ack_wait_s),
            outage=self.store.outage,
            dead_letter=self._dead.dead_letter_config,
            buried=self.binlog_insert,
            tracing=tracing.server(cfg.name, self._tracer_provider),
        )

    # -- msgtable.engine.binlog.BinlogSink -------------------------------------------------------
    def binlog_tables(self) -> dict[str, Sequence[str]]:
        return self._binlog_columns

    def binlog_insert(self, table: str, rows: int = 0, keys: InsertKeys | None = None) -> None:
        m = self._managers.get(table)
        if m is not None:
            m.binlog_insert(rows, keys)
        if self._subscriptions is not None:
            self._subscriptions.inserted(table)
            acked = self._subscriptions.state_acked(table, keys) if m is not None else []
            if m is not None and acked:  # a lazy subscription's upsert-acks: as an UPDATE's
                m.binlog_changes([RowChange(i, gone=True, moved=False, acked=True) for i in acked])

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
        """Read the message tables now and open, reconfigure or close managers to match;
        then the components reconcile to it."""
        with self._refresh_lock:
            self._last_refresh = time.monotonic()
            defs = self.store.discover()
            self._apply(defs)
            self._discovered = True
        # outside the refresh lock: a pusher closing waits for its POSTs, whose settlement
        # may itself want a discovery (msgtable.features.push.pushers)
        found = self._found  # the latest, should another discovery have come meanwhile
        for c in self._components:
            c.reconcile(found)
        if self._tenure.lease is not None:
            self._tenure.lease.wake()  # a table it can send now, or no longer

    def _apply(self, defs: list[TableDefinition]) -> None:
        configs, errors = _load_tables(defs)
        subs = self._subscriptions.load(configs) if self._subscriptions else Loaded()
        wanted = {**configs, **subs.configs}
        with self._lock:
            to_close, to_open = self._replace(wanted, errors, subs.errors)
            for name in errors.keys() - self._load_errors.keys():
                log.error("%s (not served until it is fixed)", errors[name])
            for label in subs.errors.keys() - self._sub_errors.keys():
                log.error("%s (not served until it is fixed)", subs.errors[label])
            self._load_errors = errors
            self._sub_errors = dict(subs.errors)
            # read by the binlog follower for every event: replaced whole, never changed (a
            # subscription's state table too: an ack by DML there leaves its cache at once)
            self._binlog_columns = {n: m.config.column_names for n, m in self._managers.items()}
            tables = frozenset({d.name for d in defs} | self._managers.keys())
            self._found = Discovery(configs, tables)
        for m, e in to_close:
            log.info("%s: closing (%s)", _what(m.config), e)
            m.close(e)
        for m in to_open:
            log.info("%s: serving", _what(m.config))
            if hint := fair_index_hint(m.config.name, m.config.flow):
                log.warning("%s: %s", _what(m.config), hint)
            self._start(m)

    def _replace(
        self, wanted: dict[str, TableConfig], errors: dict[str, str], sub_errors: Mapping[str, str]
    ) -> tuple[list[tuple[MessageManager, MsgtableError]], list[MessageManager]]:
        """Under the engine's lock: make the managers match ``wanted`` (a new config taken
        live when it can be). Returns the managers to close (with why) and to start."""
        to_close: list[tuple[MessageManager, MsgtableError]] = []
        to_open: list[MessageManager] = []
        for name, m in list(self._managers.items()):
            cfg = wanted.get(name)
            if cfg is None:
                del self._managers[name]
                to_close.append((m, _gone(m.config, errors, sub_errors)))
            elif cfg != m.config:
                if _same_shape(cfg, m.config):
                    m.reconfigure(cfg)
                    log.info("%s: new settings applied", _what(cfg))
                else:
                    del self._managers[name]
                    why = f"{_what(cfg)} changed its columns or ordering; subscribe again"
                    to_close.append((m, Unavailable(why)))
        for name, cfg in wanted.items():
            if name not in self._managers:
                m = self._new_manager(cfg)
                self._managers[name] = m
                if self.sends(unit_of(cfg)):
                    to_open.append(m)
        return to_close, to_open

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
                if self._subscriptions is not None:
                    self._subscriptions.upkeep()
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

    def find(self, name: str, subscription: str = "") -> MessageManager:
        """The manager of table ``name`` (or of its ``subscription``) in this keyspace, after
        a discovery if it is not known yet (msgtable.engine.components.Host)."""
        return self._manager(name, "", subscription=subscription)

    def loaded(self, key: str) -> MessageManager | None:
        """The manager of ``key`` (a table or a state table) as loaded now: no discovery."""
        return self._managers.get(key)

    def managers(self) -> list[MessageManager]:
        """Every manager, of tables and of subscriptions, as loaded now."""
        with self._lock:
            return list(self._managers.values())

    def default_group(self, m: MessageManager) -> MessageManager:
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
        ``max_messages``, sent no more than that many in all (msgtable.core.window)."""
        if self._stop.is_set():
            raise Unavailable("server shutting down")
        m = self.default_group(self._manager(name, keyspace, shard, key_range, subscription))
        accepts = stream_filter(m.config, filter) if filter else None
        if not self.sends(unit_of(m.config)):
            self._await_sending(unit_of(m.config))
            # the manager the gain started (a loss before it replaced the one found above)
            m = self.default_group(self._manager(name, keyspace, shard, key_range, subscription))
        if subscription and self._subscriptions is not None:
            self._subscriptions.subscribing(m.config.name)
        return m.subscribe(max_in_flight, accepts, max_messages)

    def ack(self, name: str, keyspace: str, ids: Sequence[object], subscription: str = "") -> int:
        if self._stop.is_set():
            raise Unavailable("server shutting down")
        return self.default_group(self._manager(name, keyspace, subscription=subscription)).ack(ids)

    # -- settlement and dead letters (msgtable.core.settlement, msgtable.core.deadletters)
    # ----------------
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
        exact: bool = False,
    ) -> int:
        m = self._verb(name, keyspace, subscription)
        return m.renew(ids, extend_s, reason, attempts, exact)

    def _settling(self, name: str, keyspace: str, subscription: str = "") -> MessageManager:
        if self._stop.is_set():
            raise Unavailable("server shutting down")
        m = self._manager(name, keyspace, subscription=subscription)
        return m if subscription else self.default_group(m)

    def _verb(self, name: str, keyspace: str, subscription: str) -> MessageManager:
        """The manager that answers a release, reject or renew: only the leader's. It alone
        knows which of its sends are not counted yet (vt_postpone_after); another server
        would write one attempt too few (NotLeader: the client goes to the leader)."""
        m = self._settling(name, keyspace, subscription)
        if not self.sends(unit_of(m.config)):
            self._await_sending(unit_of(m.config))
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
        cfg = self._manager(name, keyspace, subscription=subscription).config
        return self._dead.listed(cfg, name, after, limit)

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
        state table) live again, for it alone (msgtable.engine.deadletters)."""
        if not 0 < limit <= MAX_REDRIVE_BATCH:
            raise InvalidArgument(f"limit must be 1 to {MAX_REDRIVE_BATCH:,}, not {limit}")
        if subscription and to:
            raise InvalidArgument(
                f"a subscription's dead messages live again in it: no --to with subscription "
                f"{name}/{subscription}"
            )
        cfg = self._settling(name, keyspace, subscription).config
        target = self._settling(to, keyspace).config if to and to != name else None
        return self._dead.redrive(cfg, to, target, subscription, ids, after, limit)

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
        most once per ``max_age_s`` (msgtable.store.backlog); on a server that does not hold the
        lease too. Never raises: a table whose read fails keeps its last read. ``wait_s``:
        wait at most that long for a read, then answer the last (msgtable.store.backlog)."""
        return self._backlog.backlog(max_age_s, wait_s)

    def live_statuses(self) -> list[tuple[TableStatus, LatencySnapshot]]:
        """Every loaded table and subscription as its manager counts it now, with its send
        -> ack latencies: no discovery, no statement (what msgtable.observe.metrics reads at scrape
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

    def cursor_flushes(self) -> dict[tuple[str, str], int]:
        """Each lazy subscription's cursor writes here, by (table, subscription)."""
        subs = self._subscriptions
        return {} if subs is None else subs.cursor_flushes()

    def held_acks_written(self) -> dict[tuple[str, str], int]:
        """Each lazy subscription's acks written behind its held cursor here."""
        subs = self._subscriptions
        return {} if subs is None else subs.held_acks_written()

    def delivery_delays(self) -> dict[tuple[str, str], LatencySnapshot]:
        """Each loaded table's and subscription's time_created -> first send delays, by
        (table, subscription): no statement (msgtable.observe.metrics)."""
        with self._lock:
            managers = list(self._managers.values())
        return {
            (m.config.source or m.config.name, m.config.subscription): m.delivery_delay_snapshot()
            for m in managers
        }

    def list_tables(self) -> list[TableStatus]:
        """Every message table and subscription: loaded ones with live counts, failed ones
        with their error; each component adds its own (msgtable.engine.components).

        Discovers first (a table created a moment ago shows), unless the database is away:
        then the tables as last seen, at once (``database_error()`` says why)."""
        if not self.store.outage.away:
            self._refresh_on_demand(time.monotonic())
        with self._lock:
            managers = list(self._managers.values())
            errors = dict(self._load_errors)
            sub_errors = dict(self._sub_errors)
        dead = self._count_dead(managers)
        out = [
            dataclasses.replace(m.status(self.keyspace), dead=dead.get(m.config.name))
            for m in managers
            if not m.config.source
        ]
        out += [
            TableStatus(name=n, keyspace=self.keyspace, config=None, load_error=e)
            for n, e in errors.items()
        ]
        out += [
            TableStatus(
                name=label.partition("/")[0],
                keyspace=self.keyspace,
                config=None,
                load_error=e,
                subscription=label.partition("/")[2],
            )
            for label, e in sub_errors.items()
        ]
        for c in self._components:
            out = c.statuses(out)
        # a subscription's dead messages: in its state table, counted by its name
        sub_dead = {m.config.label: dead.get(m.config.name) for m in managers if m.config.source}
        out = [
            dataclasses.replace(s, dead=sub_dead.get(f"{s.name}/{s.subscription}"))
            if s.subscription
            else s
            for s in out
        ]
        backlog = {(b.table, b.subscription): b for b in self.backlog()}
        out = [_with_backlog(s, backlog.get((s.name, s.subscription))) for s in out]
        shard = "" if self.shard is None else str(self.shard)
        out = [dataclasses.replace(s, sender=self.sender(s.name), shard=shard) for s in out]
        return sorted(out, key=lambda s: (s.name, s.subscription))

    def _count_dead(self, managers: list[MessageManager]) -> dict[str, int]:
        """How many dead messages each table and subscription holds, by table or state
        table ({} if the database does not answer: the counts are extras)."""
        try:
            return self._dead.counted([m.config for m in managers])
        except MsgtableError:
            return {}

    # -- the components' verbs, for the servicer and the metrics (msgtable.engine.components)
    def create_subscription(self, sub: Subscription, from_start: bool = False) -> int:
        """Create a subscription of a loaded message table; with ``from_start`` it gets every
        retained unacked message too (returns how many; msgtable.features.subscriptions)."""
        return self._subscribed().create_subscription(sub, from_start)

    def alter_subscription(self, table: str, name: str, **changes: Any) -> Subscription:
        """Change a subscription's settings (None clears one), live at once."""
        return self._subscribed().alter_subscription(table, name, **changes)

    def drop_subscription(self, table: str, name: str) -> None:
        """Drop a subscription and its state table; its subscribers end (NOT_FOUND)."""
        self._subscribed().drop_subscription(table, name)

    def list_subscriptions(self, table: str = "") -> list[TableStatus]:
        """The subscriptions (of one table, or all) as ListTables shows them."""
        return [s for s in self.list_tables() if s.subscription and (not table or s.name == table)]

    def _subscribed(self) -> SubscriptionsComponent:
        if self._subscriptions is None:
            raise InvalidArgument("this server serves no subscriptions")
        return self._subscriptions

    def set_endpoint(self, endpoint: Endpoint) -> None:
        """Define (or replace) the push endpoint (msgtable.core.endpoints.Endpoint)
        of a table's default group or subscription."""
        self._pushing().set_endpoint(endpoint)

    def drop_endpoint(self, table: str, subscription: str = "") -> None:
        self._pushing().drop_endpoint(table, subscription)

    def push_status(self, table: str, subscription: str) -> PushStatus | None:
        return self._push.push_status(table, subscription) if self._push else None

    def _pushing(self) -> PushComponent:
        if self._push is None:
            raise InvalidArgument("this server serves no push endpoints")
        return self._push


def stream_filter(cfg: TableConfig, text: str) -> Callable[[Values], bool]:
    """One stream's filter as a test of a message's values (InvalidArgument if malformed)."""
    flt = parse_filter(text, cfg.message_columns, cfg.label)
    names = [c.name for c in cfg.message_columns]

    def accepts(values: Values) -> bool:
        return flt.matches(dict(zip(names, values, strict=False)))

    return accepts


def _with_backlog(s: TableStatus, b: Backlog | None) -> TableStatus:
    if b is None:
        return s
    return dataclasses.replace(
        s, due=b.due, scheduled=b.scheduled, oldest_unacked_age_s=b.oldest_unacked_age_s
    )


def _load_tables(defs: list[TableDefinition]) -> tuple[dict[str, TableConfig], dict[str, str]]:
    """The message tables' configs by name, and the errors of those that failed to load."""
    configs: dict[str, TableConfig] = {}
    errors: dict[str, str] = {}
    for d in defs:
        try:
            configs[d.name] = load_table(d.name, d.comment, d.columns, d.unique_indexes, d.indexes)
        except TableLoadError as exc:
            errors[d.name] = str(exc)
    check_dead_letters(configs, errors)
    return configs, errors


def _gone(cfg: TableConfig, errors: dict[str, str], sub_errors: Mapping[str, str]) -> MsgtableError:
    """Why the manager of ``cfg`` closes when a discovery no longer finds it."""
    if cfg.name in errors:
        return TableLoadError(errors[cfg.name])
    if cfg.source:  # a subscription's state table
        if cfg.label in sub_errors:
            return TableLoadError(sub_errors[cfg.label])
        return TableNotFound(f"subscription {cfg.label} was dropped")
    return TableNotFound(f"message table {cfg.name!r} was dropped")


def _same_shape(new: TableConfig, old: TableConfig) -> bool:
    """Whether a manager can take ``new`` live: the same columns streamed, the same
    ordering (msgtable.engine.ordered keeps other state than an unordered table's cache) and
    the same column the due rows are kept by (msgtable.engine.flow.KeyedDue)."""
    return new.message_columns == old.message_columns and (
        new.order_key,
        new.order_by,
        _keyed_by(new),
    ) == (old.order_key, old.order_by, _keyed_by(old))


def _keyed_by(cfg: TableConfig) -> str:
    return cfg.flow.keyed_column if cfg.flow is not None else ""


def _what(cfg: TableConfig) -> str:
    """A table or subscription as the log names it."""
    return f"subscription {cfg.label}" if cfg.source else f"table {cfg.name}"


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
