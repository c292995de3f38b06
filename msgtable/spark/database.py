"""How the Spark driver and its executors reach the database: a message table's config (read as
the engine reads it, its dead-letter table's, and a subscription's view of it), PyMySQL
connections (executors need no C driver), the id-bounds query that plans a partitioned read,
and the JDBC URL of Spark's own reader and writer.

A batch read or write reaches one database (the ``dsn`` option's) or every shard of a
keyspace (msgtable.core.keyspace): each is a :class:`Target`, whose failures name its shard.
``on_each`` asks all of them at once; ``agreed`` checks they hold the same table.

The statements themselves are msgtable.store.bulk's (and msgtable.spark.subview's); this module
only runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from msgtable.core.deadletters import check_dead_letter
from msgtable.core.keyspace import Keyspace
from msgtable.core.subscriptions import STATE_COLUMNS, state_table_name
from msgtable.core.tables import Column, TableConfig, load_table
from msgtable.errors import MsgtableError, TableLoadError, TableNotFound
from msgtable.spark.subview import SubscriptionView, subscription_view
from msgtable.store.mysql import open_connection, parse_url, pymysql_args, sorted_error
from msgtable.store.mysqlstore import MySQLStore

# Executors may run far from the database, and a batch job would rather wait for a connection
# than fail: twice the server's msgtable.store.mysql.CONNECT_TIMEOUT_S.
CONNECT_TIMEOUT_S = 10
MAX_THREADS = 16  # shards the driver asks at once (each thread only waits on its database)

T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    """A database a batch read or write reaches: the ``dsn`` option's (``keyspace`` ""), or
    shard ``shard`` of keyspace ``keyspace``."""

    dsn: str = field(repr=False)  # it may hold a password
    shard: str = ""
    keyspace: str = ""

    @property
    def where(self) -> str:
        """How errors name this database: "shard 80- of keyspace 'app'" ("" for the dsn's)."""
        return f"shard {self.shard} of keyspace {self.keyspace!r}" if self.keyspace else ""

    @contextmanager
    def errors(self) -> Iterator[None]:
        """A failure inside the block as the MsgtableError it means (msgtable.store.mysql's
        sorting), its message naming this shard; the dsn's database's pass as they are."""
        try:
            yield
        except Exception as exc:
            meant = sorted_error(exc)
            if not self.keyspace or not isinstance(meant, MsgtableError):
                raise
            raise restated(meant, f"{self.where}: {meant}") from exc


def shard_targets(keyspace: Keyspace) -> tuple[Target, ...]:
    """The targets of a keyspace's shards, in key-range order."""
    return tuple(Target(s.dsn, s.name, keyspace.name) for s in keyspace.shards)


def restated(exc: MsgtableError, message: str) -> MsgtableError:
    """An error of ``exc``'s class saying ``message``."""
    try:
        return type(exc)(message)
    except TypeError:
        return MsgtableError(message)


def on_each(targets: Sequence[Target], work: Callable[[Target], T]) -> list[T]:
    """``work(target)`` for every target at once (a thread each), in target order; the first
    failure in target order is raised, naming its shard."""

    def run(target: Target) -> T:
        with target.errors():
            return work(target)

    if len(targets) == 1:
        return [run(targets[0])]
    with ThreadPoolExecutor(min(len(targets), MAX_THREADS)) as pool:
        futures = [pool.submit(run, t) for t in targets]
        return [f.result() for f in futures]


def agreed(
    targets: Sequence[Target],
    load: Callable[[str], T],
    columns: Callable[[T], tuple[Column, ...]],
    what: str,
) -> T:
    """``load(dsn)`` of the first target, once every target's has the same columns (by name
    and type: reads select them by name): TableLoadError naming the shard that differs."""
    found = on_each(targets, lambda t: load(t.dsn))
    first = {c.name: c.column_type for c in columns(found[0])}
    for target, other in zip(targets[1:], found[1:], strict=True):
        have = {c.name: c.column_type for c in columns(other)}
        if have != first:
            raise TableLoadError(
                f"{target.where}: {what} is not as on shard {targets[0].shard}: it "
                f"{_difference(first, have)}"
            )
    return found[0]


def _difference(want: dict[str, str], have: dict[str, str]) -> str:
    """How columns ``have`` differ from ``want`` (name: type), the first difference."""
    for name, type_ in want.items():
        if name not in have:
            return f"lacks column {name}"
        if have[name] != type_:
            return f"has {name} {have[name]}, not {type_}"
    extra = next(name for name in have if name not in want)
    return f"has column {extra} too"


def describe(dsn: str, table: str) -> TableConfig:
    """The loaded config of message table ``table`` (TableNotFound, TableLoadError)."""
    store = MySQLStore.from_dsn(dsn)
    try:
        definitions = {d.name: d for d in store.discover()}
    finally:
        store.close()
    d = definitions.get(table)
    if d is None:
        raise TableNotFound(f"no message table {table!r} in {store.database}")
    try:
        return load_table(d.name, d.comment, d.columns, d.unique_indexes, d.indexes)
    except TableLoadError:
        raise
    except Exception as exc:  # pragma: no cover - load_table raises TableLoadError
        raise TableLoadError(f"table {table}: {exc}") from None


def dead_letter_table(dsn: str, cfg: TableConfig) -> TableConfig:
    """The loaded config of ``cfg``'s vt_dead_letter table, where its dead messages are
    (TableLoadError naming the field when it is missing, fails to load, or cannot take them,
    as the engine says it: msgtable.core.deadletters.check_dead_letter)."""
    dead: TableConfig | None = None
    error: str | None = None
    try:
        dead = describe(dsn, cfg.dead_letter)
    except TableNotFound:
        pass
    except TableLoadError as exc:
        error = str(exc)
    problem = check_dead_letter(cfg, dead, error)
    if problem or dead is None:
        raise TableLoadError(f"table {cfg.name}: {problem}")
    return dead


def subscription(dsn: str, cfg: TableConfig, name: str) -> SubscriptionView:
    """Subscription ``name`` of ``cfg``'s view (msgtable.spark.subview), from its state table
    as information_schema has it: TableNotFound when the table has no such subscription (no
    state table of that name), TableLoadError when its state table is missing or lacks an
    engine column."""
    state_table = state_table_name(cfg.name, name)  # InvalidArgument for a bad name
    store = MySQLStore.from_dsn(dsn)
    try:
        subs, state_columns = store.subscription_store.subscriptions()
    finally:
        store.close()
    columns = state_columns.get(state_table)
    label = f"{cfg.name}/{name}"
    if columns is None:
        if any(s.table == cfg.name and s.name == name for s in subs):
            raise TableLoadError(f"subscription {label}: its state table {state_table} is missing")
        raise TableNotFound(
            f"message table {cfg.name} has no subscription {name!r} "
            f"(no state table {state_table} in {store.database})"
        )
    have = {c.name for c in columns}
    missing = [c for c in STATE_COLUMNS if c not in have]
    if missing:
        raise TableLoadError(
            f"subscription {label}: state table {state_table} lacks column {', '.join(missing)}"
        )
    return subscription_view(cfg, name, columns)


def connect_args(dsn: str) -> dict[str, Any]:
    """pymysql.connect() arguments for a SQLAlchemy URL (InvalidArgument if it is not one of a
    MySQL-family database)."""
    url = parse_url(dsn)
    args = pymysql_args(url)
    args.update(database=url.database, charset="utf8mb4", connect_timeout=CONNECT_TIMEOUT_S)
    return args


@contextmanager
def connection(dsn: str, **options: Any) -> Iterator[Any]:
    """A PyMySQL connection to the database of ``dsn`` (``options`` go to pymysql.connect:
    autocommit, cursorclass), closed when the block ends."""
    import pymysql

    conn = open_connection(pymysql.connect, **connect_args(dsn), **options)
    try:
        yield conn
    finally:
        conn.close()


def id_bounds(dsn: str, sql: str, params: list[Any]) -> tuple[Any, Any, int]:
    """The (smallest id, largest id, count) a msgtable.store.bulk id_bounds query answers."""
    with connection(dsn) as conn, conn.cursor() as cur:
        cur.execute(sql, params)
        lo, hi, count = cur.fetchone()
    return lo, hi, int(count or 0)


def jdbc_url(dsn: str) -> tuple[str, dict[str, str]]:
    """A JDBC URL and connection properties for MariaDB Connector/J. The URL must say
    jdbc:mysql:// with org.mariadb.jdbc.Driver: a jdbc:mariadb:// URL gets Spark's no-op
    dialect, which quotes names wrongly and returns wrong results."""
    a = connect_args(dsn)
    url = f"jdbc:mysql://{a['host']}:{a['port']}/{a['database']}"
    props = {
        "driver": "org.mariadb.jdbc.Driver",
        "user": a["user"],
        "password": a["password"],
        "rewriteBatchedStatements": "true",
        "useServerPrepStmts": "false",
    }
    return url, props
