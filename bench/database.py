"""The bench's database: the MySQL-family server of a run, a scratch database per benchmark,
connections, message tables (their COMMENT and DDL), bulk rows and the lifecycle check.

Every benchmark sends the same message (PAYLOAD) and makes its tables with
:func:`create_table` and a COMMENT from :func:`message_comment`; the run's settings that go
into every COMMENT (``postpone_after_s``) are passed in by the caller, from ``bench.run``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pymysql
from sqlalchemy.engine import make_url

from bench.errors import BenchError
from msgtable.core.tables import current_layout_ddl
from msgtable.store.mysql import SESSION_SETUP, pymysql_args
from msgtable.testing import ExternalServer, ServerHandle
from msgtable.testing.devdb import LocalServer

# The message every benchmark sends: a small JSON document (66 bytes).
PAYLOAD = '{"order": 123456, "sku": "ABC-123", "qty": 2, "note": "ship fast"}'
DSN_ENV = "MSGTABLE_TEST_DSN"
ACK_WAIT_S = 30  # long enough that nothing is resent during a run
PURGE_AFTER_S = 86400
CACHE_SIZE = 10_000
BULK_CHUNK_ROWS = 100_000
NS = 1_000_000_000  # time_next and time_acked are in nanoseconds


@dataclass
class Database:
    """The MySQL-family server of this run and a line saying what it is."""

    handle: ServerHandle
    description: str
    version: str
    pid: int | None = None  # the server process when it runs here (for CPU accounting)
    # whether every commit is flushed to disk, the binlog's included (read from the server)
    durable: bool = False


@contextlib.contextmanager
def database_server(durable: bool = False) -> Iterator[Database]:
    """``MSGTABLE_TEST_DSN`` when set (its account may create databases; ``durable`` cannot
    change its settings, which the description reports), else a throwaway local
    mariadbd/mysqld (msgtable.testing.devdb.LocalServer), as the tests do: with ``durable``, with a
    production server's durability (innodb_flush_log_at_trx_commit=1, sync_binlog=1)."""
    dsn = os.environ.get(DSN_ENV)
    if dsn:
        handle: ServerHandle = ExternalServer(dsn)
        version = server_version(handle)
        flushed, settings = durability(handle)
        yield Database(handle, f"{version} from {DSN_ENV} ({settings})", version, durable=flushed)
        return
    local = LocalServer(durable=durable)
    local.start()
    try:
        version = server_version(local)
        flushed, settings = durability(local)
        yield Database(
            local,
            f"{version}, a throwaway local server (msgtable.testing.devdb; {settings})",
            version,
            local.pid,
            flushed,
        )
    finally:
        local.stop()


def durability(handle: ServerHandle) -> tuple[bool, str]:
    """Whether the server flushes every commit to disk, the binlog's included, and its two
    settings as a text."""
    with contextlib.closing(connect(handle.dsn())) as conn, conn.cursor() as cur:
        cur.execute("select @@innodb_flush_log_at_trx_commit, @@sync_binlog")
        flush, sync = (int(v) for v in cur.fetchone())
    durable = flush == 1 and sync == 1
    kind = "durable" if durable else "not durable"
    return durable, f"{kind}: innodb_flush_log_at_trx_commit={flush}, sync_binlog={sync}"


def server_version(handle: ServerHandle) -> str:
    with contextlib.closing(connect(handle.dsn())) as conn, conn.cursor() as cur:
        cur.execute("select version(), @@version_comment")
        version, comment = cur.fetchone()
    return f"{comment} {version}" if comment and "mariadb" not in version.lower() else version


@contextlib.contextmanager
def scratch_database(server: ServerHandle, name: str) -> Iterator[str]:
    """A fresh database; yields its DSN and drops it afterwards."""
    server.drop_database(name)
    server.create_database(name)
    try:
        yield server.dsn(name)
    finally:
        server.drop_database(name)


def connect(dsn: str) -> Any:
    """A PyMySQL connection (autocommit, READ COMMITTED like msgtable's store) for a DSN."""
    url = make_url(dsn)
    return pymysql.connect(
        **pymysql_args(url),
        database=url.database or None,
        autocommit=True,
        charset="utf8mb4",
        init_command=SESSION_SETUP,
    )


def execute(dsn: str, *statements: str) -> list[tuple[Any, ...]]:
    """Run statements on a fresh connection; returns the last one's rows."""
    rows: list[tuple[Any, ...]] = []
    with contextlib.closing(connect(dsn)) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
            rows = list(cur.fetchall())
    return rows


def message_comment(
    batch_size: int,
    poller_interval_s: float,
    *,
    postpone_after_s: float | None,
    cache_size: int = CACHE_SIZE,
    purge_after_s: float = PURGE_AFTER_S,
) -> str:
    """The COMMENT of a message table the bench makes. ``postpone_after_s`` is the run's
    (``python -m bench.run --postpone-after``); None leaves out vt_postpone_after, so the
    engine's default applies. It has no default here so that no caller forgets the run's."""
    postpone = "" if postpone_after_s is None else f",vt_postpone_after={postpone_after_s:g}"
    return (
        f"vitess_message,vt_ack_wait={ACK_WAIT_S},vt_purge_after={purge_after_s:g},"
        f"vt_batch_size={batch_size},vt_cache_size={cache_size},"
        f"vt_poller_interval={poller_interval_s:g}{postpone}"
    )


def create_table(dsn: str, table: str, comment: str) -> None:
    """The recommended message table (msgtable.core.tables.current_layout_ddl)."""
    execute(dsn, f"drop table if exists {table}", current_layout_ddl(table, comment))


def bulk_insert(
    dsn: str,
    table: str,
    count: int,
    *,
    first_id: int = 0,
    time_acked_ns: int | None = None,
) -> float:
    """Insert ``count`` rows (ids from ``first_id``) fast; returns the seconds it took.

    INSERT ... SELECT from a cross join of a ten-row digits table, 100,000 rows a statement:
    about a third faster than multi-row INSERTs of 5,000 rows on MariaDB 10.11, and plain SQL
    on MySQL 8 too. ``time_acked_ns`` inserts acked rows (epoch 1, time_next NULL).
    """
    digits = f"bench_digits_{os.getpid()}"
    acked = "NULL" if time_acked_ns is None else str(int(time_acked_ns))
    epoch, time_next = ("0", "0") if time_acked_ns is None else ("1", "NULL")
    began = time.monotonic()
    with contextlib.closing(connect(dsn)) as conn, conn.cursor() as cur:
        source = make_digits(cur, digits)
        for lo in range(0, count, BULK_CHUNK_ROWS):
            rows = min(BULK_CHUNK_ROWS, count - lo)
            cur.execute(
                f"insert into {table}(id, priority, time_next, epoch, time_acked, message) "
                f"select {first_id + lo} + s.n, 0, {time_next}, {epoch}, {acked}, %s "
                f"from ({source}) s where s.n < %s",
                (PAYLOAD, rows),
            )
        drop_digits(cur, digits)
    return time.monotonic() - began


DIGIT_TABLES = 5  # a cross join of five tables of the digits 0-9: the numbers 0 .. 99,999


def make_digits(cur: Any, name: str) -> str:
    """Temporary tables ``name_0`` .. ``name_4`` of the digits 0-9 on ``cur``'s connection
    (made, or emptied and filled again); returns a SELECT of ``n`` = 0 .. 99,999 from their
    cross join. Five tables, not one joined five times: MySQL cannot open one temporary table
    twice in a statement (error 1137, "Can't reopen table")."""
    values = ",".join(f"({d})" for d in range(10))
    for k in range(DIGIT_TABLES):
        cur.execute(f"create temporary table if not exists {name}_{k}(d int primary key)")
        cur.execute(f"delete from {name}_{k}")
        cur.execute(f"insert into {name}_{k} values {values}")
    n_expr = " + ".join(f"{10**k}*t{k}.d" for k in range(DIGIT_TABLES))
    tables = ", ".join(f"{name}_{k} t{k}" for k in range(DIGIT_TABLES))
    return f"select {n_expr} as n from {tables}"


def drop_digits(cur: Any, name: str) -> None:
    """Drop make_digits' tables."""
    tables = ", ".join(f"{name}_{k}" for k in range(DIGIT_TABLES))
    cur.execute(f"drop temporary table if exists {tables}")


def count_rows(dsn: str, table: str, where: str = "1=1") -> int:
    return int(execute(dsn, f"select count(*) from {table} where {where}")[0][0])


def check_lifecycle(dsn: str, table: str, n: int) -> None:
    """Every one of the ``n`` rows is acked and was claimed exactly once (epoch 1)."""
    rows = execute(
        dsn,
        f"select count(*), coalesce(sum(time_acked is null), 0), coalesce(sum(epoch <> 1), 0) "
        f"from {table}",
    )
    total, unacked, resent = (int(v) for v in rows[0])
    if (total, unacked, resent) != (n, 0, 0):
        raise BenchError(
            f"table {table}: {total} rows of {n} expected, {unacked} unacked, "
            f"{resent} claimed other than exactly once"
        )
