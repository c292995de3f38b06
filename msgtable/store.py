"""Every SQL statement msgtable runs, in one place.

``Store`` is what the engine needs from a database; ``MySQLStore`` implements it with
SQLAlchemy Core on MySQL 8 / MariaDB 10.6+. Statements are built once per TableConfig from
column names that came from information_schema, with every identifier quoted, and bound
with parameters. Database failures surface as :class:`~msgtable.errors.Unavailable` (retry
later) or :class:`~msgtable.errors.TableNotFound` (the table went away).

The claim is the heart of "never a send after an ack has committed": a postpone UPDATE that
only matches rows still unacked, still due and still at the epoch we read (the epoch is the
row's version), run in a transaction that stays open while the claimed rows are handed to
the subscriber. An ack by DML of the same row waits for that transaction, so it commits after
the send, never before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy import and_, bindparam, func, literal, or_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.types import NullType

from msgtable.cache import CachedRow
from msgtable.errors import InvalidArgument, MsgtableError, TableNotFound, Unavailable
from msgtable.tables import Column, Layout, TableConfig

log = logging.getLogger(__name__)

PURGE_BATCH_ROWS = 500
POOL_SIZE = 10
POOL_MAX_OVERFLOW = 40
CONNECT_TIMEOUT_S = 5
IO_TIMEOUT_S = 30

# MySQL / MariaDB error numbers that mean "try again later".
_RETRYABLE = frozenset(
    {
        1040,  # too many connections
        1053,  # server shutdown in progress
        1205,  # lock wait timeout
        1213,  # deadlock
        1927,  # MariaDB: connection killed
        2002,
        2003,
        2006,
        2013,
        2014,
        2055,  # client: cannot connect / server gone / lost
        4031,  # MySQL 8: disconnected by the server for inactivity
    }
)
_NO_SUCH_TABLE = 1146


@dataclass(frozen=True)
class TableDefinition:
    """Raw facts about one table whose COMMENT marks it as a message table."""

    name: str
    comment: str
    columns: tuple[Column, ...]
    unique_indexes: tuple[tuple[str, ...], ...]


Deliver = Callable[[list[CachedRow]], None]
# Where a poll stopped: (priority, time_next as read, possibly NULL, id) of its last row.
PollKey = tuple[int, int | None, Hashable]


class Store(Protocol):
    """What the engine asks of a database. Implementations: MySQLStore, InMemoryStore."""

    database: str

    def discover(self) -> list[TableDefinition]: ...

    def poll(
        self, cfg: TableConfig, now_ns: int, limit: int, after: PollKey | None = None
    ) -> tuple[list[CachedRow], PollKey | None]: ...

    def claim(
        self,
        cfg: TableConfig,
        batch: Sequence[CachedRow],
        now_ns: int,
        next_ns: Callable[[int], int],
        deliver: Deliver,
    ) -> list[CachedRow]: ...

    def ack(self, cfg: TableConfig, ids: Sequence[Hashable], now_ns: int) -> int: ...

    def purge(self, cfg: TableConfig, cutoff_ns: int, limit: int) -> int: ...

    def close(self) -> None: ...


def is_message_comment(comment: str) -> bool:
    return comment.split(",", 1)[0].strip() == "vitess_message"


def group_by_epoch(batch: Sequence[CachedRow]) -> dict[int | None, list[CachedRow]]:
    """Rows of one batch by the epoch they were read at (usually one group)."""
    groups: dict[int | None, list[CachedRow]] = {}
    for row in batch:
        groups.setdefault(row.epoch, []).append(row)
    return groups


# Discovery reads only the tables whose comment marks them as message tables.
_COLUMNS = sa.text(
    "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE, COLUMN_TYPE FROM information_schema.COLUMNS "
    "WHERE TABLE_SCHEMA = :db AND TABLE_NAME IN :names ORDER BY TABLE_NAME, ORDINAL_POSITION"
).bindparams(bindparam("names", expanding=True))
_UNIQUE_INDEXES = sa.text(
    "SELECT TABLE_NAME, INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS "
    "WHERE TABLE_SCHEMA = :db AND TABLE_NAME IN :names AND NON_UNIQUE = 0 "
    "ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX"
).bindparams(bindparam("names", expanding=True))


class _Statements:
    """The statements of one table, built once from its config."""

    def __init__(self, cfg: TableConfig, quote: Callable[[str], str]) -> None:
        md = sa.MetaData()
        t = sa.Table(
            cfg.name,
            md,
            *(sa.Column(c.name, NullType(), quote=True) for c in cfg.columns),
            quote=True,
        )
        c = t.c
        now: Any = bindparam("b_now")
        ids: Any = bindparam("b_ids", expanding=True)
        # Polls go in (priority, time_next, id) order; a continued poll starts after the
        # key of the last row read (keyset pagination: no row is read twice in a pass).
        kp: Any = bindparam("b_p")
        kt: Any = bindparam("b_t")
        ki: Any = bindparam("b_i")
        if cfg.layout is Layout.CURRENT:
            priority: Any = c.priority
            time_next: Any = c.time_next
            due: Any = or_(c.time_next.is_(None), c.time_next <= now)
            order: tuple[Any, ...] = (c.priority, c.time_next, c.id)
            # SQL sorts NULL first, so a NULL time_next needs its own continuation.
            after: Any = or_(
                c.priority > kp,
                and_(c.priority == kp, or_(c.time_next > kt, and_(c.time_next == kt, c.id > ki))),
            )
            after_null: Any = or_(
                c.priority > kp,
                and_(c.priority == kp, or_(c.time_next.is_not(None), c.id > ki)),
            )
        else:  # 2018 layout: no priority; time_scheduled stands in for a NULL time_next
            priority = literal(0)
            time_next = func.coalesce(c.time_next, c.time_scheduled, 0)
            due = time_next <= now
            order = (time_next, c.id)
            after = after_null = or_(time_next > kt, and_(time_next == kt, c.id > ki))
        values = [c[m.name] for m in cfg.message_columns]
        first = (
            select(priority, time_next, c.epoch, *values)
            .where(c.time_acked.is_(None), due)
            .order_by(*order)
            .limit(bindparam("b_limit"))
        )
        self.poll = first
        self.poll_after = first.where(after)
        self.poll_after_null = first.where(after_null)
        self.claim = (
            update(t)
            .where(
                c.id.in_(ids),
                c.epoch.is_not_distinct_from(bindparam("b_epoch")),
                c.time_acked.is_(None),
                due,
            )
            .values({c.time_next: bindparam("b_next"), c.epoch: func.coalesce(c.epoch, 0) + 1})
        )
        self.claimed = select(c.id).where(
            c.id.in_(ids), c.epoch == bindparam("b_new_epoch"), c.time_next == bindparam("b_next")
        )
        self.ack = (
            update(t)
            .where(c.id.in_(ids), c.time_acked.is_(None))
            .values({c.time_acked: now, c.time_next: None})
        )
        # DELETE ... LIMIT has no portable Core spelling across SQLAlchemy 2.0 / 2.1 and the
        # mysql / mariadb dialect names, so it is written out, identifiers quoted.
        self.purge = sa.text(
            f"DELETE FROM {quote(cfg.name)} WHERE {quote('time_acked')} < :b_cutoff LIMIT :b_limit"
        )


class MySQLStore:
    """The Store on a real MySQL-family server, one database (the keyspace)."""

    def __init__(self, engine: Engine, autocommit: Engine, database: str) -> None:
        self.engine = engine  # READ COMMITTED transactions: the claim
        self.autocommit = autocommit  # one statement, one round trip: polls, acks, purges
        self.database = database
        self._statements: dict[TableConfig, _Statements] = {}

    @classmethod
    def from_dsn(cls, dsn: str) -> MySQLStore:
        """Open a store on an SQLAlchemy URL such as mysql+pymysql://u:pw@host:3306/db."""
        try:
            url = sa.engine.make_url(dsn)
        except Exception as exc:
            raise InvalidArgument(f"not a valid database URL: {exc}") from None
        if not url.database:
            raise InvalidArgument(f"the database URL must name a database: {url!r}")
        if not url.drivername.startswith(("mysql", "mariadb")):
            raise InvalidArgument(f"msgtable needs a MySQL-family database, not {url.drivername}")
        if url.drivername in ("mysql", "mariadb"):
            url = url.set(drivername=f"{url.drivername}+pymysql")
        connect_args: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_S}
        if url.drivername.endswith("+pymysql"):
            connect_args.update(read_timeout=IO_TIMEOUT_S, write_timeout=IO_TIMEOUT_S)

        def engine(isolation_level: str) -> Engine:
            # Every use ends its own transaction (or runs in autocommit), so the pool's
            # ROLLBACK on check-in would only cost a round trip.
            return sa.create_engine(
                url,
                isolation_level=isolation_level,
                pool_size=POOL_SIZE,
                max_overflow=POOL_MAX_OVERFLOW,
                pool_recycle=3600,
                pool_timeout=CONNECT_TIMEOUT_S,
                pool_reset_on_return=None,
                connect_args=connect_args,
            )

        return cls(engine("READ COMMITTED"), engine("AUTOCOMMIT"), str(url.database))

    def close(self) -> None:
        self.engine.dispose()
        self.autocommit.dispose()

    def _stmts(self, cfg: TableConfig) -> _Statements:
        s = self._statements.get(cfg)
        if s is None:
            quote = self.engine.dialect.identifier_preparer.quote_identifier
            s = self._statements[cfg] = _Statements(cfg, quote)
        return s

    @contextmanager
    def _errors(self, table: str | None = None) -> Iterator[None]:
        try:
            yield
        except sa.exc.DBAPIError as exc:
            code = _error_code(exc)
            if code == _NO_SUCH_TABLE and table is not None:
                raise TableNotFound(f"message table {table!r} no longer exists") from exc
            if exc.connection_invalidated or code in _RETRYABLE or code is None:
                raise Unavailable(f"database unavailable: {_error_text(exc)}") from exc
            raise MsgtableError(f"database error: {_error_text(exc)}") from exc
        except sa.exc.TimeoutError as exc:  # pool exhausted
            raise Unavailable(f"database unavailable: {exc}") from exc

    # -- discovery -----------------------------------------------------------------------
    def discover(self) -> list[TableDefinition]:
        """Every table of this database whose comment marks it as a message table."""
        with self._errors(), self.autocommit.connect() as conn:
            tables = {
                name: comment
                for name, comment in conn.execute(
                    sa.text(
                        "SELECT TABLE_NAME, TABLE_COMMENT FROM information_schema.TABLES "
                        "WHERE TABLE_SCHEMA = :db AND TABLE_TYPE = 'BASE TABLE' "
                        "AND TABLE_COMMENT LIKE 'vitess%'"
                    ),
                    {"db": self.database},
                )
                if is_message_comment(comment or "")
            }
            if not tables:
                return []
            names = {"db": self.database, "names": list(tables)}
            columns: dict[str, list[Column]] = {n: [] for n in tables}
            for tname, cname, data_type, column_type in conn.execute(_COLUMNS, names):
                columns[tname].append(
                    Column(cname, str(data_type).lower(), str(column_type).lower())
                )
            indexes: dict[tuple[str, str], list[str]] = {}
            for tname, iname, cname in conn.execute(_UNIQUE_INDEXES, names):
                indexes.setdefault((tname, iname), []).append(cname)
        return [
            TableDefinition(
                name=n,
                comment=tables[n],
                columns=tuple(columns[n]),
                unique_indexes=tuple(tuple(cols) for (t, _), cols in indexes.items() if t == n),
            )
            for n in sorted(tables)
        ]

    # -- the message lifecycle -----------------------------------------------------------
    def poll(
        self, cfg: TableConfig, now_ns: int, limit: int, after: PollKey | None = None
    ) -> tuple[list[CachedRow], PollKey | None]:
        """Up to ``limit`` due, unacked rows, best first, after the key ``after`` if given;
        and the key of the last row read (None when there was none)."""
        s = self._stmts(cfg)
        params: dict[str, Any] = {"b_now": now_ns, "b_limit": limit}
        stmt: Any = s.poll
        if after is not None:
            stmt = s.poll_after if after[1] is not None else s.poll_after_null
            params.update(b_p=after[0], b_t=after[1], b_i=after[2])
        with self._errors(cfg.name), self.autocommit.connect() as conn:
            rows = conn.execute(stmt, params).fetchall()
        if not rows:
            return [], None
        last = rows[-1]
        return [CachedRow(r[0], r[1], r[2], tuple(r[3:])) for r in rows], (
            last[0],
            last[1],
            last[3],
        )

    def claim(
        self,
        cfg: TableConfig,
        batch: Sequence[CachedRow],
        now_ns: int,
        next_ns: Callable[[int], int],
        deliver: Deliver,
    ) -> list[CachedRow]:
        """Postpone the rows still unacked, due and unchanged; deliver them; commit.

        ``next_ns(epoch)`` gives the new time_next for rows read at that epoch. ``deliver``
        runs inside the transaction, so a concurrent ack by DML commits after it.
        Returns the rows delivered.
        """
        s = self._stmts(cfg)
        claimed: list[CachedRow] = []
        with self._errors(cfg.name), self.engine.begin() as conn:
            for epoch, rows in group_by_epoch(batch).items():
                ids = [r.id for r in rows]
                nxt = next_ns(epoch or 0)
                params = {"b_ids": ids, "b_epoch": epoch, "b_now": now_ns, "b_next": nxt}
                done = conn.execute(s.claim, params).rowcount
                if done == len(rows):
                    claimed.extend(rows)
                elif done > 0:
                    ours = set(
                        conn.scalars(
                            s.claimed,
                            {"b_ids": ids, "b_new_epoch": (epoch or 0) + 1, "b_next": nxt},
                        )
                    )
                    claimed.extend(r for r in rows if r.id in ours)
            if claimed:
                deliver(claimed)
        return claimed

    def ack(self, cfg: TableConfig, ids: Sequence[Hashable], now_ns: int) -> int:
        """Mark rows acked; returns how many were unacked before."""
        with self._errors(cfg.name), self.autocommit.connect() as conn:
            return int(
                conn.execute(self._stmts(cfg).ack, {"b_ids": list(ids), "b_now": now_ns}).rowcount
            )

    def purge(self, cfg: TableConfig, cutoff_ns: int, limit: int) -> int:
        """Delete up to ``limit`` rows acked before the cutoff; returns how many."""
        with self._errors(cfg.name), self.autocommit.connect() as conn:
            return int(
                conn.execute(
                    self._stmts(cfg).purge, {"b_cutoff": cutoff_ns, "b_limit": limit}
                ).rowcount
            )


def _error_code(exc: sa.exc.DBAPIError) -> int | None:
    args = getattr(exc.orig, "args", ())
    if args and isinstance(args[0], int) and args[0] != 0:
        return args[0]
    return None


def _error_text(exc: sa.exc.DBAPIError) -> str:
    args: tuple[Any, ...] = tuple(getattr(exc.orig, "args", ()))
    if len(args) >= 2:
        return f"({args[0]}) {args[1]}"
    return str(exc.orig) or type(exc.orig).__name__
