"""Every SQL statement of the engine, in one place (the lease's are in msgtable.engine.lease, the
binlog follower's one in msgtable.engine.binlog, the pipeline's in msgtable.store.bulk, the demo
table's
DDL in msgtable.core.tables, and the throwaway server's own set-up in msgtable.testing.devdb), with
two
parts of it in modules of their own: subscriptions' (msgtable.store.subscriptions) and ordering per
key's (msgtable.store.ordering).

``Store`` is what the engine needs from a database; ``MySQLStore`` implements it on MySQL 8
and MariaDB 10.6+. The statements of a table are written out once per TableConfig
(:class:`TableStatements`) from names that came from information_schema, every identifier
quoted, and are bound with parameters; they run on plain DBAPI connections
(msgtable.store.dbpool). Database failures surface as :class:`~msgtable.errors.Unavailable`
(retry later) or :class:`~msgtable.errors.TableNotFound` (the table went away).

The send is the heart of "never a send after an ack has committed": a locking read (or, with
vt_postpone_after=0, the postpone UPDATE itself) that only matches rows still unacked, still
due and still at the epoch we read (the epoch is the row's version), in a transaction that
stays open while those rows are handed to the subscriber. An ack by DML of the same row waits
for that transaction, so it commits after the send, never before. The postpone of a sent row
(time_next by backoff, epoch + 1) is written vt_postpone_after later, only if no ack came
first; an ack that comes first counts the send (epoch + 1) in its own UPDATE.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, cast

import sqlalchemy as sa

from msgtable.core.deadletters import DeadLetter, RedriveBatch
from msgtable.core.latency import STATEMENT_BUCKETS_S, LatencyHistogram, LatencySnapshot
from msgtable.core.retry import Outage
from msgtable.core.rows import CachedRow, PolledRow, PollKey, group_by_epoch, poll_key
from msgtable.core.sql import MARK, in_list, placeholders, quote
from msgtable.core.tables import (
    DEAD_TIME_NEXT,
    LAST_ERROR_COLUMN,
    Column,
    Layout,
    TableConfig,
    is_message_comment,
    text_limit,
)
from msgtable.errors import DatabaseUnavailable, InvalidArgument, MsgtableError
from msgtable.store.backlog import AGE_BOUNDS_S, STATEMENT_TIMEOUT_S, BacklogCounts
from msgtable.store.dbpool import ConnectionPool
from msgtable.store.deadletters import DeadStatements, RedriveStatements, delivery_expr, first_expr
from msgtable.store.mysql import (
    CONNECT_TIMEOUT_S,
    IO_TIMEOUT_S,
    NO_SUCH_TABLE,
    SESSION_SETUP,
    STATEMENT_TIMED_OUT,
    address,
    database_error,
    error_code,
    parse_url,
    server_text,
    with_driver,
)
from msgtable.store.ordering import OrderSQL, OrderStatements
from msgtable.store.subscriptions import SubscriptionSQL

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 50
MAX_IDLE_CONNECTIONS = 10

_FIND_TABLES = (
    "SELECT TABLE_NAME, TABLE_COMMENT FROM information_schema.TABLES "
    "WHERE TABLE_SCHEMA = %s AND TABLE_TYPE = 'BASE TABLE' AND TABLE_COMMENT LIKE 'vitess%%'"
)
_COLUMNS = (
    "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE, COLUMN_TYPE FROM information_schema.COLUMNS "
    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME IN ({names}) ORDER BY TABLE_NAME, ORDINAL_POSITION"
)
_INDEXES = (
    "SELECT TABLE_NAME, INDEX_NAME, COLUMN_NAME, NON_UNIQUE FROM information_schema.STATISTICS "
    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME IN ({names}) "
    "ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX"
)


@dataclass(frozen=True)
class TableDefinition:
    """Raw facts about one table whose COMMENT marks it as a message table."""

    name: str
    comment: str
    columns: tuple[Column, ...]
    unique_indexes: tuple[tuple[str, ...], ...]
    # every index, by name, with its columns (an ordered table's poll needs one:
    # msgtable.engine.ordered)
    indexes: tuple[tuple[str, tuple[str, ...]], ...] = ()


def read_definitions(cur: Any, database: str, only: str | None = None) -> list[TableDefinition]:
    """Every message table of ``database`` (or only the one named ``only``) as
    information_schema describes it, read with a DBAPI cursor (the engine's discovery, and
    msgtable.enqueue inside the application's own transaction)."""
    cur.execute(_FIND_TABLES, [database])
    tables = {n: c for n, c in cur.fetchall() if is_message_comment(c or "") and only in (None, n)}
    if not tables:
        return []
    names = list(tables)
    in_names = placeholders(len(names))
    columns: dict[str, list[Column]] = {n: [] for n in tables}
    cur.execute(_COLUMNS.format(names=in_names), [database, *names])
    for tname, cname, data_type, column_type in cur.fetchall():
        columns[tname].append(
            Column(cname, server_text(data_type).lower(), server_text(column_type).lower())
        )
    indexes: dict[tuple[str, str], list[str]] = {}
    unique: set[tuple[str, str]] = set()
    cur.execute(_INDEXES.format(names=in_names), [database, *names])
    for tname, iname, cname, non_unique in cur.fetchall():
        indexes.setdefault((tname, iname), []).append(cname)
        if not int(non_unique):
            unique.add((tname, iname))
    return [
        TableDefinition(
            name=n,
            comment=tables[n],
            columns=tuple(columns[n]),
            unique_indexes=tuple(
                tuple(cols) for (t, i), cols in indexes.items() if t == n and (t, i) in unique
            ),
            indexes=tuple((i, tuple(cols)) for (t, i), cols in indexes.items() if t == n),
        )
        for n in sorted(tables)
    ]


Deliver = Callable[[list[CachedRow]], None]
# Which of a send's rows may go, given the ids the database found due and unchanged (an
# ordered table's: only whole keys, msgtable.engine.ordered.whole_keys); None: all of those.
Keep = Callable[[Sequence[CachedRow], Collection[Hashable]], list[CachedRow]]


class Store(Protocol):
    """What the engine asks of a database. Implementations: MySQLStore, InMemoryStore."""

    database: str
    outage: Outage  # whether the database answers (msgtable.core.retry)

    def discover(self) -> list[TableDefinition]: ...

    def poll(
        self,
        cfg: TableConfig,
        now_ns: int,
        limit: int,
        after: PollKey | None = None,
        created: bool = False,
        floor_ns: int | None = None,
    ) -> tuple[list[PolledRow], PollKey | None]: ...

    def claim(
        self,
        cfg: TableConfig,
        batch: Sequence[CachedRow],
        now_ns: int,
        next_ns: Callable[[int], int],
        deliver: Deliver,
        keep: Keep | None = None,
    ) -> list[CachedRow]: ...

    def send(
        self,
        cfg: TableConfig,
        batch: Sequence[CachedRow],
        now_ns: int,
        deliver: Deliver,
        keep: Keep | None = None,
    ) -> list[CachedRow]: ...

    def postpone(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        epoch: int | None,
        sent_ns: int,
        next_ns: int,
    ) -> int: ...

    def ack(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        now_ns: int,
        first: Collection[Hashable] = (),
    ) -> int: ...

    def acked_ids(
        self, cfg: TableConfig, ids: Sequence[Hashable], now_ns: int
    ) -> set[Hashable]: ...

    def unacked_ids(self, cfg: TableConfig, ids: Sequence[Hashable]) -> set[Hashable]: ...

    def purge(self, cfg: TableConfig, cutoff_ns: int, limit: int) -> int: ...

    def release(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        next_ns: int,
        reason: str | None,
        first: Collection[Hashable] = (),
        attempts: Sequence[int] | None = None,
    ) -> int: ...

    def renew(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        now_ns: int,
        until_ns: int,
        reason: str | None,
        first: Collection[Hashable] = (),
        attempts: Sequence[int] | None = None,
    ) -> int: ...

    def bury(
        self,
        cfg: TableConfig,
        dead: TableConfig | None,
        ids: Sequence[Hashable],
        now_ns: int,
        reason: str | None,
        first: Collection[Hashable] = (),
        due_at_epoch: tuple[int | None] | None = None,
    ) -> list[Hashable]: ...

    def dead_letters(
        self, cfg: TableConfig, dead: TableConfig | None, after: Hashable | None, limit: int
    ) -> list[DeadLetter]: ...

    def count_dead(
        self, tables: Sequence[tuple[TableConfig, TableConfig | None]]
    ) -> dict[str, int]: ...

    def redrive(
        self,
        dead: TableConfig,
        target: TableConfig,
        ids: Sequence[Hashable] | None,
        after: Hashable | None,
        limit: int,
        now_ns: int,
    ) -> RedriveBatch: ...

    def order_keys(
        self, cfg: TableConfig, after: object | None, limit: int
    ) -> list[tuple[object, Hashable]]: ...

    def runs(self, cfg: TableConfig, keys: Sequence[object], per_key: int) -> list[PolledRow]: ...

    def unkeyed(
        self, cfg: TableConfig, now_ns: int, after: Hashable | None, limit: int
    ) -> list[PolledRow]: ...

    def backlog(self, cfgs: Sequence[TableConfig], now_ns: int) -> dict[str, BacklogCounts]: ...

    def close(self) -> None: ...


class TableStatements:
    """The SQL of one table, written once from its config. ``{ids}`` stands for an IN list.

    Polls go in (priority, time_next, id) order; a continued poll starts after the key of
    the last row read (keyset pagination: no row is read twice in one pass). SQL sorts a
    NULL time_next first, so continuing after one needs its own condition.
    """

    def __init__(self, cfg: TableConfig) -> None:
        t = quote(cfg.name)
        # in the statements with an {ids} template, a brace of the name must survive format()
        tf = t.replace("{", "{{").replace("}", "}}")
        rid, epoch, acked = quote("id"), quote("epoch"), quote("time_acked")
        values = ", ".join(quote(c.name) for c in cfg.message_columns)
        # A subscription's poll reads its state table (s) and the message table's columns
        # (m) for the values; every other statement touches the state table alone.
        s = "s." if cfg.source else ""
        if cfg.source:
            values = ", ".join("m." + quote(c.name) for c in cfg.message_columns)
        p_rid, p_acked = s + rid, s + acked
        if cfg.layout is Layout.CURRENT:
            priority, time_next = s + quote("priority"), s + quote("time_next")
            p_due = f"({time_next} IS NULL OR {time_next} <= %s)"
            order = f"{priority}, {time_next}, {p_rid}"
            after = (
                f" AND ({priority} > %s OR ({priority} = %s AND ({time_next} > %s"
                f" OR ({time_next} = %s AND {p_rid} > %s))))"
            )
            after_null = (
                f" AND ({priority} > %s OR ({priority} = %s AND ({time_next} IS NOT NULL"
                f" OR {p_rid} > %s)))"
            )
            raw = quote("time_next")
            due = f"({raw} IS NULL OR {raw} <= %s)"
        else:  # 2018 layout: no priority; time_scheduled stands in for a NULL time_next
            priority = "0"
            time_next = f"COALESCE({quote('time_next')}, {quote('time_scheduled')}, 0)"
            due = p_due = f"{time_next} <= %s"
            order = f"{time_next}, {rid}"
            after = after_null = f" AND ({time_next} > %s OR ({time_next} = %s AND {rid} > %s))"
        # A state table is often small or mostly unsettled, where the optimizer would scan
        # and sort it whole each poll; its index is in (priority, time_next, id) order.
        source = (
            f"{t} s FORCE INDEX (`poller_idx`) JOIN {quote(cfg.source)} m ON m.{rid} = s.{rid}"
            if cfg.source
            else t
        )
        head = f"SELECT {priority}, {time_next}, {s}{epoch}, {values}"
        body = f" FROM {source} WHERE {p_acked} IS NULL AND {p_due}"
        select = head + body
        tail = f" ORDER BY {order} LIMIT %s"
        self.layout = cfg.layout
        self.poll = select + tail
        self.poll_after = select + after + tail
        self.poll_after_null = select + after_null + tail
        # The same polls with each row's time_created last (the created -> sent delay,
        # msgtable.core.latency); NULL for a table without the column.
        created = s + quote("time_created") if cfg.has_column("time_created") else "NULL"
        with_created = f"{head}, {created}{body}"
        self.polls_created = (
            with_created + tail,
            with_created + after + tail,
            with_created + after_null + tail,
        )
        # After an unclean takeover, until the hold ends (msgtable.engine.engine): only the rows the
        # old holder cannot have sent, due or there after the floor (one %s each).
        floor = f" AND ({time_next} > %s" + (f" OR {created} > %s)" if created != "NULL" else ")")
        self.floor_params = 1 if created == "NULL" else 2
        plain = (self.poll, self.poll_after, self.poll_after_null)
        self.polls_floor = cast(
            "tuple[str, str, str]", tuple(q.replace(body, body + floor, 1) for q in plain)
        )
        self.polls_created_floor = cast(
            "tuple[str, str, str]",
            tuple(q.replace(body, body + floor, 1) for q in self.polls_created),
        )
        self.claim = (
            f"{MARK}UPDATE {tf} SET {quote('time_next')} = %s, {epoch} = COALESCE({epoch}, 0) + 1 "
            f"WHERE {rid} IN ({{ids}}) AND {epoch} <=> %s AND {acked} IS NULL AND {due}"
        )
        # The claim's slow path: the rows it may claim, locked before its UPDATE (which then
        # matches exactly these), when an UPDATE alone matched only some of its rows.
        self.claimable = (
            f"SELECT {rid} FROM {tf} WHERE {rid} IN ({{ids}}) AND {epoch} <=> %s "
            f"AND {acked} IS NULL AND {due} FOR UPDATE"
        )
        # The send's locking read: rows a concurrent ack by DML has not reached (it waits).
        self.lock = (
            f"SELECT {rid} FROM {tf} WHERE {rid} IN ({{ids}}) AND {epoch} <=> %s "
            f"AND {acked} IS NULL AND {due} LOCK IN SHARE MODE"
        )
        # The postpone of rows sent (at epoch, at time) and not acked through us: it counts
        # the send even where an ack by DML came first, and moves time_next only where no
        # ack did; a row rescheduled or re-versioned by DML since the send keeps its values.
        self.postpone = (
            f"{MARK}UPDATE {tf} SET {epoch} = COALESCE({epoch}, 0) + 1, "
            f"{quote('time_next')} = IF({acked} IS NULL, %s, {quote('time_next')}) "
            f"WHERE {rid} IN ({{ids}}) AND {epoch} <=> %s AND ({acked} IS NOT NULL OR {due})"
        )
        set_acked = f"{MARK}UPDATE {tf} SET {acked} = %s, {quote('time_next')} = NULL"
        # not acked, and not dead in place: a late ack leaves a dead letter dead, as it finds
        # no row of one moved to a dead-letter table
        where_unacked = (
            f" WHERE {rid} IN ({{ids}}) AND {acked} IS NULL "
            f"AND NOT ({quote('time_next')} <=> {DEAD_TIME_NEXT})"
        )
        self.ack = set_acked + where_unacked
        # An ack of rows whose send was not postponed yet counts that send: epoch + 1.
        self.ack_first = set_acked + f", {epoch} = COALESCE({epoch}, 0) + 1" + where_unacked
        self.ack_mixed = (
            set_acked + f", {epoch} = COALESCE({epoch}, 0) + ({rid} IN ({{first}}))" + where_unacked
        )
        self.acked = f"SELECT {rid} FROM {tf} WHERE {rid} IN ({{ids}}) AND {acked} = %s"
        self.unacked = f"SELECT {rid} FROM {tf} WHERE {rid} IN ({{ids}}) AND {acked} IS NULL"
        # With subscriptions: only rows handed to them, and settled by each that holds the
        # table, that long ago (msgtable.core.subscriptions).
        holds = "".join(
            f" AND NOT EXISTS (SELECT 1 FROM {quote(h)} h WHERE h.{rid} = {t}.{rid} "
            f"AND (h.{acked} IS NULL OR h.{acked} >= %s))"
            for h in cfg.holders
        )
        fanned = f" AND {quote('time_fanout')} IS NOT NULL" if cfg.fanout else ""
        self.purge = f"{MARK}DELETE FROM {t} WHERE {acked} < %s{fanned}{holds} LIMIT %s"
        self.purge_holders = len(cfg.holders)

        # Settlement (msgtable.core.settlement). ``{first}`` stands for an expression true for the
        # rows sent and not postponed yet, whose send the statement counts (epoch + 1).
        raw_next = quote("time_next")
        self.alive = f"{acked} IS NULL AND NOT ({raw_next} <=> {DEAD_TIME_NEXT})"
        count_first = f"{epoch} = COALESCE({epoch}, 0) + ({{first}})"
        error = self.set_error(cfg)
        # release: sent at least once (or now), not acked, not dead: due at the given time.
        # ``{bound}``: the deliveries the call answers (deadstore.delivery_expr)
        self.release = (
            f"{MARK}UPDATE {tf} SET {count_first}, {raw_next} = %s{error} "
            f"WHERE {rid} IN ({{ids}}) AND {{bound}} AND {self.alive} "
            f"AND (COALESCE({epoch}, 0) > 0 OR {{first}})"
        )
        # renew: sent and not due again yet (so not sent since): due no sooner than ``until``
        self.renew = (
            f"{MARK}UPDATE {tf} SET {count_first}, "
            f"{raw_next} = IF({{first}}, %s, GREATEST(COALESCE({raw_next}, 0), %s)){error} "
            f"WHERE {rid} IN ({{ids}}) AND {{bound}} AND {self.alive} "
            f"AND ({{first}} OR (COALESCE({epoch}, 0) > 0 AND {raw_next} > %s))"
        )
        # an ordered table's reads (msgtable.store.ordering)
        self.order = OrderStatements(cfg, values, epoch) if cfg.ordered else None
        # the backlog (msgtable.store.backlog), on MariaDB (True) and on MySQL (False)
        self.backlog = {m: backlog_sql(cfg, m) for m in (True, False)}

    @staticmethod
    def set_error(cfg: TableConfig) -> str:
        """``, last_error = ...`` keeping the old one when the reason (a parameter) is NULL;
        "" for a table without the column."""
        if not cfg.keeps_errors:
            return ""
        le = quote(LAST_ERROR_COLUMN)
        limit = text_limit(next(c for c in cfg.columns if c.name == LAST_ERROR_COLUMN))
        return f", {le} = COALESCE(LEFT(%s, {limit}), {le})"

    def poll_query(
        self,
        now_ns: int,
        limit: int,
        after: PollKey | None,
        created: bool = False,
        floor_ns: int | None = None,
    ) -> tuple[str, list[Any]]:
        if floor_ns is None:
            plain = (self.poll, self.poll_after, self.poll_after_null)
            polls = self.polls_created if created else plain
            due: list[Any] = [now_ns]
        else:
            polls = self.polls_created_floor if created else self.polls_floor
            due = [now_ns] + [floor_ns] * self.floor_params
        poll, poll_after, poll_after_null = polls
        if after is None:
            return poll, [*due, limit]
        p, t, i = after
        if self.layout is Layout.V2018:
            return poll_after, [*due, t, t, i, limit]
        if t is None:
            return poll_after_null, [*due, p, p, i, limit]
        return poll_after, [*due, p, p, t, t, i, limit]


def backlog_sql(cfg: TableConfig, mariadb: bool) -> str:
    """One table's (or state table's) backlog in one aggregate: its unacked messages that are
    not dead, how many are due (time_next <= the first %s), the oldest time_created and how
    many were created at or after each further %s (now minus each finite bound of
    msgtable.store.backlog.AGE_BOUNDS_S); without a time_created column the counts alone.

    Indexes: a current-layout table (and every state table) reads ``poller_idx (time_acked,
    priority, time_next)``: the unacked rows are one range of it (time_acked IS NULL) and the
    due and dead tests read its time_next, so without time_created the read is index-only;
    time_created costs a primary-key lookup per unacked row. A 2018-layout table has no index
    on time_acked (``next_idx (time_next, epoch)`` orders by time_next): it is scanned. Either
    way it is bounded by a statement time-out (STATEMENT_TIMEOUT_S): MariaDB's ``SET STATEMENT
    max_statement_time=... FOR`` prefix, MySQL 8's ``MAX_EXECUTION_TIME`` optimizer hint
    (milliseconds; MySQL runs the hint on SELECT only, which this is)."""
    t, acked, raw_next = quote(cfg.name), quote("time_acked"), quote("time_next")
    if cfg.layout is Layout.CURRENT:
        due = f"({raw_next} IS NULL OR {raw_next} <= %s)"
    else:
        due = f"COALESCE({raw_next}, {quote('time_scheduled')}, 0) <= %s"
    columns = f"COUNT(*), COALESCE(SUM({due}), 0)"
    if cfg.has_column("time_created"):
        created = quote("time_created")
        columns += f", MIN({created})" + "".join(
            f", COALESCE(SUM({created} >= %s), 0)" for _ in AGE_BOUNDS_S[:-1]
        )
    where = f"{acked} IS NULL AND NOT ({raw_next} <=> {DEAD_TIME_NEXT})"
    if mariadb:
        return (
            f"SET STATEMENT max_statement_time={STATEMENT_TIMEOUT_S:g} FOR "
            f"SELECT {columns} FROM {t} WHERE {where}"
        )
    hint = f"/*+ MAX_EXECUTION_TIME({round(STATEMENT_TIMEOUT_S * 1000)}) */ "
    return f"SELECT {hint}{columns} FROM {t} WHERE {where}"


class MySQLStore(SubscriptionSQL, OrderSQL):
    """The Store on a real MySQL-family server, one database (the keyspace)."""

    def __init__(self, url: sa.URL, database: str) -> None:
        self.database = database
        self.outage = Outage(f"the database at {address(url)}", log)
        # statements that failed, and how long each kind took (msgtable.observe.metrics)
        self.database_errors = 0
        self.statement_latency: dict[str, LatencyHistogram] = {}  # by kind: poll, ack, ...
        self._counts_lock = threading.Lock()
        self._mariadb: bool | None = None  # the flavour, once asked (the backlog's time-out)
        connect_args: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_S}
        if url.get_driver_name() in ("pymysql", "mysqldb"):
            connect_args.update(read_timeout=IO_TIMEOUT_S, write_timeout=IO_TIMEOUT_S)
        self.driver = url.get_driver_name()

        def pool(autocommit: bool) -> ConnectionPool:
            return ConnectionPool(
                url,
                connect_args,
                autocommit=autocommit,
                init_command=SESSION_SETUP,
                max_idle=MAX_IDLE_CONNECTIONS,
                max_connections=MAX_CONNECTIONS,
                wait_s=CONNECT_TIMEOUT_S,
            )

        self.url = url
        self._tx = pool(autocommit=False)  # the claim's transactions
        self._auto = pool(autocommit=True)  # one statement, one round trip: all the rest
        # By identity: hashing a TableConfig (all its columns) on every statement costs more
        # than the statement's own round trip.
        self._statements: dict[int, tuple[TableConfig, TableStatements]] = {}
        self._dead_statements: dict[
            tuple[int, int], tuple[TableConfig, TableConfig | None, DeadStatements]
        ] = {}

    @classmethod
    def from_dsn(cls, dsn: str) -> MySQLStore:
        """Open a store on an SQLAlchemy URL such as mysql://u:pw@host:3306/db.

        A URL without a driver (``mysql://``, ``mariadb://``) gets the fastest one installed:
        mysqlclient (C, ``pip install 'msgtable[fast]'``) when it imports, else PyMySQL. A URL
        that names one (``mysql+pymysql://``, ``mysql+mysqldb://``) gets that one.
        """
        url = with_driver(parse_url(dsn))
        try:
            return cls(url, str(url.database))
        except ImportError as exc:
            raise InvalidArgument(
                f"the database driver of {url.drivername} is missing: {exc}"
            ) from None

    def close(self) -> None:
        self._tx.close()
        self._auto.close()

    def statements(self, cfg: TableConfig) -> TableStatements:
        entry = self._statements.get(id(cfg))
        if entry is None or entry[0] is not cfg:
            entry = self._statements[id(cfg)] = (cfg, TableStatements(cfg))
        return entry[1]

    @contextmanager
    def _auto_cursor(self) -> Iterator[Any]:
        with self._auto.connection() as conn, conn.cursor() as cur:
            yield cur

    def _tx_connection(self) -> Any:
        return self._tx.connection()

    @contextmanager
    def _errors(self, table: str | None = None, kind: str = "other") -> Iterator[None]:
        """Database errors as msgtable's (msgtable.store.mysql.database_error), counted, and the
        statement's time in ``statement_latency[kind]`` (msgtable.observe.metrics)."""
        began = time.perf_counter_ns()
        try:
            yield
        except MsgtableError:
            self._took(kind, began)
            raise
        except (self._auto.dbapi.Error, OSError) as exc:
            error = database_error(exc, table)
            self._took(kind, began, failed=True)
            if isinstance(error, DatabaseUnavailable):
                self.outage.down(error)
            raise error from exc
        self._took(kind, began)
        self.outage.up()

    @contextmanager
    def timed(self, kind: str) -> Iterator[None]:
        """A statement run on another connection than the store's (the lease's, the
        capture follower's), timed as ``kind`` and counted as a database error if it
        raises; its errors are left as they are (msgtable.core.latency.Timed)."""
        began = time.perf_counter_ns()
        try:
            yield
        except BaseException:
            self._took(kind, began, failed=True)
            raise
        self._took(kind, began)

    def statement_latency_snapshot(self) -> dict[str, LatencySnapshot]:
        """Each kind of statement's latencies so far (msgtable.observe.metrics)."""
        with self._counts_lock:
            return {kind: h.snapshot() for kind, h in self.statement_latency.items()}

    def _took(self, kind: str, began_ns: int, failed: bool = False) -> None:
        now = time.perf_counter_ns()
        with self._counts_lock:
            h = self.statement_latency.get(kind)
            if h is None:
                h = self.statement_latency[kind] = LatencyHistogram(STATEMENT_BUCKETS_S)
            h.observe_since(now, (began_ns,))
            self.database_errors += failed

    # -- the backlog (msgtable.store.backlog) ----------------------------------------------------
    def backlog(self, cfgs: Sequence[TableConfig], now_ns: int) -> dict[str, BacklogCounts]:
        """Each table's (or state table's) backlog, by name, on one connection; a table
        dropped meanwhile, or whose statement hit its time-out, is left out."""
        out: dict[str, BacklogCounts] = {}
        params = [now_ns, *(now_ns - round(b * 1e9) for b in AGE_BOUNDS_S[:-1])]
        with self._errors(kind="backlog"), self._auto_cursor() as cur:
            mariadb = self._is_mariadb(cur)
            for cfg in cfgs:
                aged = cfg.has_column("time_created")
                try:
                    cur.execute(self.statements(cfg).backlog[mariadb], params if aged else [now_ns])
                except Exception as exc:
                    if error_code(exc) in (NO_SUCH_TABLE, *STATEMENT_TIMED_OUT):
                        log.debug("backlog of %s not read: %s", cfg.label, exc)
                        continue
                    raise
                total, due, *rest = cur.fetchone()
                total, due = int(total), int(due)
                out[cfg.name] = BacklogCounts(
                    due=due,
                    scheduled=total - due,
                    oldest_created_ns=None if not rest or rest[0] is None else int(rest[0]),
                    within=tuple(int(n) for n in rest[1:]),
                )
        return out

    def _is_mariadb(self, cur: Any) -> bool:
        """Whether the database is MariaDB (else MySQL): asked once."""
        if self._mariadb is None:
            cur.execute("SELECT VERSION()")
            self._mariadb = "mariadb" in server_text(cur.fetchone()[0]).lower()
        return self._mariadb

    # -- discovery -----------------------------------------------------------------------
    def discover(self) -> list[TableDefinition]:
        """Every table of this database whose comment marks it as a message table."""
        with self._errors(kind="discover"), self._auto.connection() as conn, conn.cursor() as cur:
            return read_definitions(cur, self.database)

    # -- the message lifecycle -----------------------------------------------------------
    def poll(
        self,
        cfg: TableConfig,
        now_ns: int,
        limit: int,
        after: PollKey | None = None,
        created: bool = False,
        floor_ns: int | None = None,
    ) -> tuple[list[PolledRow], PollKey | None]:
        """Up to ``limit`` due, unacked rows, best first, after the key ``after`` if given,
        as read: (priority, time_next, epoch, id, other message columns...); and the key
        of the last row read (None when there was none). ``created``: each row ends with its
        time_created (None for a table without the column). ``floor_ns``: only rows whose
        time_next or time_created (where the table has it) is after it."""
        sql, params = self.statements(cfg).poll_query(now_ns, limit, after, created, floor_ns)
        with self._errors(cfg.name, "poll"), self._auto.connection() as conn, conn.cursor() as cur:
            cur.execute(sql, params)
            rows = list(cur.fetchall())
        if not rows:
            return [], None
        return rows, poll_key(rows[-1])

    def claim(
        self,
        cfg: TableConfig,
        batch: Sequence[CachedRow],
        now_ns: int,
        next_ns: Callable[[int], int],
        deliver: Deliver,
        keep: Keep | None = None,
    ) -> list[CachedRow]:
        """Postpone the rows still unacked, due and unchanged (with ``keep``: those of them
        it keeps); deliver them; commit.

        ``next_ns(epoch)`` gives the new time_next for rows read at that epoch. ``deliver``
        runs inside the transaction, so a concurrent ack by DML commits after it.
        Returns the rows delivered.
        """
        s = self.statements(cfg)
        # On any error the pool closes the connection, which rolls the transaction back.
        with self._errors(cfg.name, "claim"), self._tx.connection() as conn:
            groups = [(e, rows, next_ns(e or 0)) for e, rows in group_by_epoch(batch).items()]
            with conn.cursor() as cur:
                claimed = _claim_rows(cur, s, groups, now_ns, lock_first=False)
                if claimed is not None and keep is not None and len(claimed) < len(batch):
                    claimed = None  # which to keep is known only before the UPDATEs
                if claimed is None:
                    conn.rollback()
                    claimed = _claim_rows(cur, s, groups, now_ns, lock_first=True, keep=keep)
                assert claimed is not None
            if claimed:
                deliver(claimed)
            conn.commit()
        return claimed

    def send(
        self,
        cfg: TableConfig,
        batch: Sequence[CachedRow],
        now_ns: int,
        deliver: Deliver,
        keep: Keep | None = None,
    ) -> list[CachedRow]:
        """Lock the rows still unacked, due and unchanged (with ``keep``: deliver those of
        them it keeps); deliver them; commit.

        The locking read costs a third of the postpone UPDATE and writes nothing; ``deliver``
        runs inside the transaction, so a concurrent ack by DML commits after it. Returns the
        rows delivered; their postpone is the caller's to write (:meth:`postpone`) unless an
        ack comes first.
        """
        s = self.statements(cfg)
        sent: list[CachedRow] = []
        with self._errors(cfg.name, "send"), self._tx.connection() as conn:
            with conn.cursor() as cur:
                for epoch, rows in group_by_epoch(batch).items():
                    in_ids, id_params = in_list([r.id for r in rows])
                    cur.execute(s.lock.format(ids=in_ids), [*id_params, epoch, now_ns])
                    found = cur.fetchall()
                    if len(found) == len(rows):
                        sent.extend(rows)
                    elif found:
                        ours = {r[0] for r in found}
                        sent.extend(r for r in rows if r.id in ours)
            if keep is not None and len(sent) < len(batch):
                sent = keep(batch, {r.id for r in sent})
            if sent:
                deliver(sent)
            conn.commit()
        return sent

    def postpone(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        epoch: int | None,
        sent_ns: int,
        next_ns: int,
    ) -> int:
        """Postpone rows sent at ``epoch`` at ``sent_ns`` to ``next_ns`` (see
        TableStatements.postpone); returns how many rows matched."""
        in_ids, id_params = in_list(ids)
        sql = self.statements(cfg).postpone.format(ids=in_ids)
        with (
            self._errors(cfg.name, "postpone"),
            self._auto.connection() as conn,
            conn.cursor() as cur,
        ):
            return int(cur.execute(sql, [next_ns, *id_params, epoch, sent_ns]))

    def ack(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        now_ns: int,
        first: Collection[Hashable] = (),
    ) -> int:
        """Mark rows acked; returns how many were unacked before. ``first`` (a subset of
        ``ids``): rows sent but not postponed yet, whose send this ack counts (epoch + 1)."""
        s = self.statements(cfg)
        in_ids, id_params = in_list(ids)
        if not first:
            sql, params = s.ack.format(ids=in_ids), [now_ns, *id_params]
        elif len(first) == len(ids):
            sql, params = s.ack_first.format(ids=in_ids), [now_ns, *id_params]
        else:
            in_first, first_params = in_list(list(first))
            sql = s.ack_mixed.format(first=in_first, ids=in_ids)
            params = [now_ns, *first_params, *id_params]
        with self._errors(cfg.name, "ack"), self._auto.connection() as conn, conn.cursor() as cur:
            return int(cur.execute(sql, params))

    def acked_ids(self, cfg: TableConfig, ids: Sequence[Hashable], now_ns: int) -> set[Hashable]:
        """Which of ``ids`` an ack with exactly this timestamp acked."""
        in_ids, id_params = in_list(ids)
        sql = self.statements(cfg).acked.format(ids=in_ids)
        with (
            self._errors(cfg.name, "acked_ids"),
            self._auto.connection() as conn,
            conn.cursor() as cur,
        ):
            cur.execute(sql, [*id_params, now_ns])
            return {r[0] for r in cur.fetchall()}

    def unacked_ids(self, cfg: TableConfig, ids: Sequence[Hashable]) -> set[Hashable]:
        """Which of ``ids`` are in the table and not acked."""
        in_ids, id_params = in_list(ids)
        sql = self.statements(cfg).unacked.format(ids=in_ids)
        with (
            self._errors(cfg.name, "unacked_ids"),
            self._auto.connection() as conn,
            conn.cursor() as cur,
        ):
            cur.execute(sql, id_params)
            return {r[0] for r in cur.fetchall()}

    def purge(self, cfg: TableConfig, cutoff_ns: int, limit: int) -> int:
        """Delete up to ``limit`` rows acked before the cutoff; returns how many."""
        sql = self.statements(cfg).purge
        with self._errors(cfg.name, "purge"), self._auto.connection() as conn, conn.cursor() as cur:
            holders = [cutoff_ns] * self.statements(cfg).purge_holders
            return int(cur.execute(sql, [cutoff_ns, *holders, limit]))

    # -- settlement (msgtable.core.settlement) and dead letters (msgtable.core.deadletters)
    # -----------
    def release(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        next_ns: int,
        reason: str | None,
        first: Collection[Hashable] = (),
        attempts: Sequence[int] | None = None,
    ) -> int:
        """Make sent, unacked, live rows due at ``next_ns`` (``first``: their send is
        counted here; ``attempts``: the delivery of each id it answers, None: any); returns
        how many."""
        s = self.statements(cfg)
        in_ids, id_params = in_list(ids)
        first_sql, first_params = first_expr(first)
        bound_sql, bound_params = delivery_expr(ids, attempts, first_sql, first_params)
        params: list[Any] = [*first_params, next_ns]
        if cfg.keeps_errors:
            params.append(reason)
        sql = s.release.format(ids=in_ids, first=first_sql, bound=bound_sql)
        with (
            self._errors(cfg.name, "release"),
            self._auto.connection() as conn,
            conn.cursor() as cur,
        ):
            return int(cur.execute(sql, [*params, *id_params, *bound_params, *first_params]))

    def renew(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        now_ns: int,
        until_ns: int,
        reason: str | None,
        first: Collection[Hashable] = (),
        attempts: Sequence[int] | None = None,
    ) -> int:
        """Keep sent, unacked rows that are not due again yet from falling due before
        ``until_ns`` (``attempts`` as release's); returns how many."""
        s = self.statements(cfg)
        in_ids, id_params = in_list(ids)
        first_sql, first_params = first_expr(first)
        bound_sql, bound_params = delivery_expr(ids, attempts, first_sql, first_params)
        params: list[Any] = [*first_params, *first_params, until_ns, until_ns]
        if cfg.keeps_errors:
            params.append(reason)
        params += [*id_params, *bound_params, *first_params, now_ns]
        sql = s.renew.format(ids=in_ids, first=first_sql, bound=bound_sql)
        with self._errors(cfg.name, "renew"), self._auto.connection() as conn, conn.cursor() as cur:
            return int(cur.execute(sql, params))

    def _dead(self, cfg: TableConfig, dead: TableConfig | None) -> DeadStatements:
        key = (id(cfg), id(dead))
        entry = self._dead_statements.get(key)
        if entry is None or entry[0] is not cfg or entry[1] is not dead:
            entry = self._dead_statements[key] = (cfg, dead, DeadStatements(cfg, dead))
        return entry[2]

    def bury(
        self,
        cfg: TableConfig,
        dead: TableConfig | None,
        ids: Sequence[Hashable],
        now_ns: int,
        reason: str | None,
        first: Collection[Hashable] = (),
        due_at_epoch: tuple[int | None] | None = None,
    ) -> list[Hashable]:
        """Bury those of ``ids`` alive (with ``due_at_epoch``: also at that epoch and due) in
        one transaction: moved to ``dead``, or dead in place. Returns the ids buried."""
        statements = self._dead(cfg, dead)
        with self._errors(cfg.name, "bury"), self._tx.connection() as conn:
            with conn.cursor() as cur:
                buried = statements.bury(cur, ids, now_ns, reason, first, due_at_epoch)
            conn.commit()
        return buried

    def dead_letters(
        self, cfg: TableConfig, dead: TableConfig | None, after: Hashable | None, limit: int
    ) -> list[DeadLetter]:
        """Up to ``limit`` dead messages of ``cfg`` by id, after ``after``."""
        statements = self._dead(cfg, dead)
        with (
            self._errors(cfg.name, "dead_letters"),
            self._auto.connection() as conn,
            conn.cursor() as cur,
        ):
            return statements.list(cur, after, limit)

    def count_dead(
        self, tables: Sequence[tuple[TableConfig, TableConfig | None]]
    ) -> dict[str, int]:
        """How many dead messages each table has (at most deadstore.COUNT_DEAD_CAP), in one
        round trip."""
        if not tables:
            return {}
        parts = [self._dead(cfg, dead).count for cfg, dead in tables]
        sql = " UNION ALL ".join(f"({p})" for p in parts)
        with self._errors(kind="count_dead"), self._auto.connection() as conn, conn.cursor() as cur:
            cur.execute(sql)
            counts = [int(r[0]) for r in cur.fetchall()]
        return {cfg.name: n for (cfg, _), n in zip(tables, counts, strict=True)}

    def redrive(
        self,
        dead: TableConfig,
        target: TableConfig,
        ids: Sequence[Hashable] | None,
        after: Hashable | None,
        limit: int,
        now_ns: int,
    ) -> RedriveBatch:
        """One batch of a redrive, one transaction
        (msgtable.store.deadletters.RedriveStatements)."""
        statements = RedriveStatements(dead, target)
        with self._errors(dead.name, "redrive"), self._tx.connection() as conn:
            with conn.cursor() as cur:
                batch = statements.batch(cur, ids, after, limit, now_ns)
            conn.commit()
        return batch


def _claim_rows(
    cur: Any,
    s: TableStatements,
    groups: Sequence[tuple[int | None, list[CachedRow], int]],
    now_ns: int,
    lock_first: bool,
    keep: Keep | None = None,
) -> list[CachedRow] | None:
    """The claim's UPDATEs, one per (epoch, rows read at it, their new time_next); returns
    the rows claimed.

    An UPDATE's count says how many rows it changed, not which: when it changed some of its
    rows but not all, the rows it changed cannot be told from a row that had the new values
    already, so this returns None, and the caller rolls back and claims again with
    ``lock_first``: locking reads pick the rows first (``keep`` chooses among them), and the
    UPDATEs take exactly those."""
    if lock_first:
        ours: set[Hashable] = set()
        for epoch, rows, _ in groups:
            in_ids, id_params = in_list([r.id for r in rows])
            cur.execute(s.claimable.format(ids=in_ids), [*id_params, epoch, now_ns])
            ours.update(r[0] for r in cur.fetchall())
        if keep is not None:
            ours = {r.id for r in keep([r for _, rows, _ in groups for r in rows], ours)}
        groups = [(e, [r for r in rows if r.id in ours], nxt) for e, rows, nxt in groups]
    claimed: list[CachedRow] = []
    for epoch, rows, nxt in groups:
        if not rows:
            continue
        in_ids, id_params = in_list([r.id for r in rows])
        done = cur.execute(s.claim.format(ids=in_ids), [nxt, *id_params, epoch, now_ns])
        if done == len(rows):
            claimed.extend(rows)
        elif done and not lock_first:
            return None
    return claimed
