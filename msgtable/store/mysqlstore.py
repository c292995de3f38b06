"""The Store on MySQL 8 and MariaDB 10.6+: :class:`MySQLStore` runs the statements of each table
(msgtable.store.statements.TableStatements, written once per TableConfig) on plain DBAPI
connections (msgtable.store.dbpool), and composes each feature's SQL object, run on the same
pools: subscriptions' (msgtable.store.subscriptions.SubscriptionSQL), push endpoints'
(msgtable.store.endpoints.EndpointSQL) and ordering per key's (msgtable.store.ordering.OrderSQL);
the capture follower's runs on a connection of its own (msgtable.store.capture.CaptureSQL).
Database failures surface as :class:`~msgtable.errors.Unavailable` (retry later) or
:class:`~msgtable.errors.TableNotFound` (the table went away). The store's SQL is in the
store wing (msgtable.store's docstring lists its modules); the lease's is in
msgtable.engine.lease, the binlog follower's one in msgtable.engine.binlog, the demo table's
DDL in msgtable.core.tables, and the throwaway server's own set-up in msgtable.testing.devdb.

The send is the heart of "never a send after an ack has committed": a locking read (or, with
vt_postpone_after=0, the postpone UPDATE itself) that only matches rows still unacked, still
due and still at the epoch we read (the epoch is the row's version), in a transaction that
stays open while those rows are handed to the subscriber. An ack by DML of the same row waits
for that transaction, so it commits after the send, never before. The postpone of a sent row
(time_next by backoff, epoch + 1) is written vt_postpone_after later, only if no ack came
first; an ack that comes first counts the send (epoch + 1) in its own UPDATE.

With several servers (``fence_as``), the writes a sender makes on what it has in flight (the
postpone, release, renew, reject and burial) are fenced: each checks as it runs that the
table's placement row still names this server, so one held up in a slow network that lands
after another server took the table writes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from msgtable.core.deadletters import DeadLetter, RedriveBatch
from msgtable.core.latency import STATEMENT_BUCKETS_S, LatencyHistogram, LatencySnapshot
from msgtable.core.retry import Outage
from msgtable.core.rows import CachedRow, PolledRow, PollKey, group_by_epoch, poll_key
from msgtable.core.sql import in_list
from msgtable.core.tables import TableConfig
from msgtable.errors import DatabaseUnavailable, InvalidArgument, MsgtableError
from msgtable.store.backlog import AGE_BOUNDS_S, BacklogCounts
from msgtable.store.capture import CaptureSQL
from msgtable.store.dbpool import ConnectionPool
from msgtable.store.deadletters import DeadStatements, RedriveStatements, delivery_expr, first_expr
from msgtable.store.discovery import TableDefinition, read_definitions
from msgtable.store.endpoints import EndpointSQL
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
    pymysql_args,
    server_text,
    with_driver,
)
from msgtable.store.ordering import OrderSQL
from msgtable.store.protocol import NONE_UNCOUNTED, Deliver, Keep, Store, Uncounted
from msgtable.store.statements import FENCE, PLACEMENT_ROW, TableStatements, claim_rows
from msgtable.store.subscriptions import SubscriptionSQL

# msgtable.engine.engine and msgtable.features.subscriptions.registry still import these from
# here (their homes: msgtable.store.protocol and msgtable.store.discovery)
__all__ = ["MySQLStore", "Store", "TableDefinition"]

log = logging.getLogger(__name__)

# A fenced transaction's first statement (MySQLStore.fence_as): its table's placement row,
# locked for its transaction (that row alone, by its primary key), if it names this server.
FENCED_READ = f"{PLACEMENT_ROW} LOCK IN SHARE MODE"

# The redelivery poll reads the rows of this many priorities at most (the best): a table with
# more has its worse priorities' redeliveries read by the passes alone.
MAX_TIMED_PRIORITIES = 16

MAX_CONNECTIONS = 50
MAX_IDLE_CONNECTIONS = 10


class MySQLStore:
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
        # Each feature's SQL is an object of its own, run on these pools (composed, not
        # inherited): ordering's verbs below hand their calls to it; subscriptions' and
        # push endpoints' are the capabilities of msgtable.store.protocol.Store.
        self.subscription_store = SubscriptionSQL(self)
        self.endpoint_store = EndpointSQL(self)
        self.order_sql = OrderSQL(self)
        self.fence_holder: str | None = None  # see fence_as
        # sent rows whose postpone the fence kept out, by message table: their sends'
        # counts are lost (replaced, never changed: a scrape reads it without the lock)
        self.postpones_fenced: dict[str, int] = {}
        self._fence_lock = threading.Lock()

    def fence_as(self, holder: str) -> None:
        """From now on this store writes as the server ``holder`` of the placement
        (msgtable.engine.placement): a postpone, release, renew, reject or burial of a
        table's rows changes them only while the table's placement row names ``holder``
        as the statement runs. The sender decides what it may write before a statement
        goes out (its lease); a statement held up in a slow link could land after the next
        sender took the table, waited its hold and sent the rows again, and match that
        send, not counted yet: make the rows due at once while they are in flight, or count
        the wrong delivery. Fenced, it writes nothing (its effect, a count, is lost, as
        when a lost lease writes no postpone)."""
        self.fence_holder = holder

    def fence(self, cfg: TableConfig) -> tuple[str, list[Any]]:
        """What a fenced write adds to its WHERE, and its parameters (("", []): none)."""
        holder = self.fence_holder
        if holder is None:
            return "", []
        return FENCE, [cfg.source or cfg.name, holder]

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
        skip_keys: Sequence[Hashable] = (),
    ) -> tuple[list[PolledRow], PollKey | None]:
        """Up to ``limit`` due, unacked rows, best first, after the key ``after`` if given,
        as read: (priority, time_next, epoch, id, other message columns...); and the key
        of the last row read (None when there was none). ``created``: each row ends with its
        time_created (None for a table without the column). ``floor_ns``: only rows whose
        time_next or time_created (where the table has it) is after it. ``skip_keys``: not
        the rows of these values of the vt_fair_key column (msgtable.engine.flow)."""
        statements = self.statements(cfg)
        sql, params = statements.poll_query(now_ns, limit, after, created, floor_ns, skip_keys)
        with self._errors(cfg.name, "poll"), self._auto.connection() as conn, conn.cursor() as cur:
            cur.execute(sql, params)
            rows = list(cur.fetchall())
        if not rows:
            return [], None
        return rows, poll_key(rows[-1])

    def read_again(self, ids: Iterable[Hashable]) -> None:
        """See Store.read_again: still due in the table, a pass from the head reads them."""

    def poll_timed(self, cfg: TableConfig, now_ns: int, limit: int) -> list[PolledRow]:
        """See Store.poll_timed: the unacked priorities by a loose scan (one index dive
        each, the MAX_TIMED_PRIORITIES best), then one range of poller_idx each."""
        s = self.statements(cfg)
        if not s.poll_timed:
            return []
        with self._errors(cfg.name, "poll"), self._auto.connection() as conn, conn.cursor() as cur:
            priorities: list[int] = []
            cur.execute(s.first_priority)
            while len(priorities) < MAX_TIMED_PRIORITIES:
                (p,) = cur.fetchone()
                if p is None:
                    break
                priorities.append(int(p))
                cur.execute(s.next_priority, [p])
            if not priorities:
                return []
            sql = s.poll_timed.format(ps=",".join(["%s"] * len(priorities)))
            cur.execute(sql, [now_ns, *priorities, limit])
            return list(cur.fetchall())

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
                claimed = claim_rows(cur, s, groups, now_ns, lock_first=False)
                if claimed is not None and keep is not None and len(claimed) < len(batch):
                    claimed = None  # which to keep is known only before the UPDATEs
                if claimed is None:
                    conn.rollback()
                    claimed = claim_rows(cur, s, groups, now_ns, lock_first=True, keep=keep)
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
                in_ids, id_params = in_list([r.id for r in batch])
                cur.execute(s.lock.format(ids=in_ids), [*id_params, now_ns])
                at = dict(cur.fetchall())  # id -> epoch now: the row's, unless it changed
                sent = [r for r in batch if r.id in at and at[r.id] == r.epoch]
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
        fence_sql, fence_params = self.fence(cfg)
        sql = self.statements(cfg).postpone.format(ids=in_ids) + fence_sql
        with (
            self._errors(cfg.name, "postpone"),
            self._auto.connection() as conn,
            conn.cursor() as cur,
        ):
            n = int(cur.execute(sql, [next_ns, *id_params, epoch, sent_ns, *fence_params]))
            if n == 0 and fence_sql and not self.fence_holds(cur, fence_params):
                self.count_fenced_postpones(cfg, len(ids))
            return n

    @staticmethod
    def fence_holds(cur: Any, fence_params: Sequence[Any]) -> bool:
        """Whether the fence (``fence``'s parameters) holds now, its placement row read
        alone: asked when a fenced write matched nothing, to tell rows settled meanwhile
        from a fence that kept them out."""
        return bool(cur.execute(PLACEMENT_ROW, list(fence_params)))

    def count_fenced_postpones(self, cfg: TableConfig, n: int) -> None:
        """``n`` sent rows of ``cfg`` whose postpones the fence kept out: their sends are not
        counted (epoch), as when a lost lease writes no postpone (the engine reports them in
        msgtable_postpones_skipped_total, by message table)."""
        if n <= 0:
            return
        table = cfg.source or cfg.name
        with self._fence_lock:
            was = self.postpones_fenced
            self.postpones_fenced = {**was, table: was.get(table, 0) + n}

    def ack(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        now_ns: int,
        first: Uncounted = NONE_UNCOUNTED,
    ) -> int:
        """Mark rows acked; returns how many were unacked before. ``first`` (of ``ids``):
        rows sent but not postponed yet, whose send this ack counts (epoch + 1) where the row
        is still at the epoch the send read (msgtable.store.protocol.Uncounted)."""
        s = self.statements(cfg)
        in_ids, id_params = in_list(ids)
        epochs = set(first.values())
        if not first:
            sql, params = s.ack.format(ids=in_ids), [now_ns, *id_params]
        elif len(first) == len(ids) and len(epochs) == 1:  # a batch of one send: one IN list
            sql, params = s.ack_first.format(ids=in_ids), [now_ns, *epochs, *id_params]
        else:
            first_sql, first_params = first_expr(first)
            sql = s.ack_mixed.format(first=first_sql, ids=in_ids)
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
        """Delete up to ``limit`` rows acked before the cutoff; returns how many: the pick
        (a plain read, no lock), then the DELETE of the rows picked by primary key
        (TableStatements._write_acks says why it cannot deadlock)."""
        s = self.statements(cfg)
        with self._errors(cfg.name, "purge"), self._auto.connection() as conn, conn.cursor() as cur:
            holds = [cutoff_ns] * s.purge_holders
            cur.execute(s.purge_pick, [cutoff_ns, *holds, *s.purge_cursors, limit])
            ids = sorted(r[0] for r in cur.fetchall())
            if not ids:
                return 0
            in_ids, id_params = in_list(ids)
            return int(cur.execute(s.purge.format(ids=in_ids), [*id_params, cutoff_ns]))

    def expire_dedup(self, cfg: TableConfig, since_ns: int, cutoff_ns: int, limit: int) -> int:
        """Clear up to ``limit`` dedup keys of rows created in [since_ns, cutoff_ns)."""
        sql = self.statements(cfg).expire_dedup
        if not sql:
            return 0
        with (
            self._errors(cfg.name, "expire_dedup"),
            self._auto.connection() as conn,
            conn.cursor() as cur,
        ):
            return int(cur.execute(sql, [since_ns, cutoff_ns, limit]))

    # -- settlement (msgtable.core.settlement) and dead letters (msgtable.core.deadletters)
    # -----------
    def release(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        next_ns: int,
        reason: str | None,
        first: Uncounted = NONE_UNCOUNTED,
        attempts: Sequence[int] | None = None,
    ) -> int:
        """Make sent, unacked, live rows due at ``next_ns`` (``first``: their send is
        counted here; ``attempts``: the delivery of each id it answers, None: any); returns
        how many."""
        s = self.statements(cfg)
        in_ids, id_params = in_list(ids)
        first_sql, first_params = first_expr(first)
        bound_sql, bound_params = delivery_expr(ids, attempts, first_sql, first_params)
        params: list[Any] = [next_ns]
        if cfg.keeps_errors:
            params.append(reason)
        params += first_params  # (the epoch's count last: TableStatements._write_settlement)
        fence_sql, fence_params = self.fence(cfg)
        sql = s.release.format(ids=in_ids, first=first_sql, bound=bound_sql) + fence_sql
        params += [*id_params, *bound_params, *first_params, *fence_params]
        with (
            self._errors(cfg.name, "release"),
            self._auto.connection() as conn,
            conn.cursor() as cur,
        ):
            return int(cur.execute(sql, params))

    def renew(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        now_ns: int,
        until_ns: int,
        reason: str | None,
        first: Uncounted = NONE_UNCOUNTED,
        attempts: Sequence[int] | None = None,
        first_until_ns: int | None = None,
        exact: bool = False,
    ) -> int:
        """Keep sent, unacked rows that are not due again yet from falling due before
        ``until_ns`` (``exact``: due at it, sooner or later), the ``first`` ones due at
        ``first_until_ns`` (``attempts`` as release's); returns how many."""
        s = self.statements(cfg)
        in_ids, id_params = in_list(ids)
        first_sql, first_params = first_expr(first)
        bound_sql, bound_params = delivery_expr(ids, attempts, first_sql, first_params)
        first_until = until_ns if first_until_ns is None else first_until_ns
        params: list[Any] = [*first_params, first_until, until_ns]
        if cfg.keeps_errors:
            params.append(reason)
        # (the epoch's count last: TableStatements._write_settlement)
        fence_sql, fence_params = self.fence(cfg)
        params += [*first_params, *id_params, *bound_params, *first_params, now_ns, *fence_params]
        renew = s.renew_exact if exact else s.renew
        sql = renew.format(ids=in_ids, first=first_sql, bound=bound_sql) + fence_sql
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
        first: Uncounted = NONE_UNCOUNTED,
        due_at_epoch: tuple[int | None] | None = None,
    ) -> list[Hashable]:
        """Bury those of ``ids`` alive (with ``due_at_epoch``: also at that epoch and due) in
        one transaction: moved to ``dead``, or dead in place. Returns the ids buried."""
        statements = self._dead(cfg, dead)
        fence_sql, fence_params = self.fence(cfg)
        with self._errors(cfg.name, "bury"), self._tx.connection() as conn:
            with conn.cursor() as cur:
                # fenced: the placement row read locked (a take waits for this commit)
                if fence_sql and not cur.execute(FENCED_READ, fence_params):
                    conn.rollback()
                    return []
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

    # -- capabilities (msgtable.store.protocol.Store) --------------------------------------
    def connections(self) -> MySQLStore:
        """Itself: its URL, database, outage and timing (msgtable.store.protocol.Connections)."""
        return self

    def statement_stats(self) -> MySQLStore:
        return self

    def capture_store(self) -> CaptureSQL:
        """The capture follower's connection of its own (msgtable.store.capture)."""
        return CaptureSQL(pymysql_args(self.url), self.database, self.timed)

    # -- ordering per key (msgtable.store.ordering.OrderSQL) ---------------------------------
    def order_keys(
        self, cfg: TableConfig, after: object | None, limit: int
    ) -> list[tuple[object, Hashable]]:
        return self.order_sql.order_keys(cfg, after, limit)

    def runs(self, cfg: TableConfig, keys: Sequence[object], per_key: int) -> list[PolledRow]:
        return self.order_sql.runs(cfg, keys, per_key)

    def unkeyed(
        self, cfg: TableConfig, now_ns: int, after: Hashable | None, limit: int
    ) -> list[PolledRow]:
        return self.order_sql.unkeyed(cfg, now_ns, after, limit)
