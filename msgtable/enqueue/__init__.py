"""The SQL of enqueueing from an application's own SQLAlchemy transaction (msgtable.enqueue),
built once per table from what information_schema says of it: names quoted with
msgtable.core.sql.quote, every value a bound parameter.

    with engine.begin() as conn:            # or an ORM Session, inside its transaction
        conn.execute(orders.insert(), {...})
        enqueue(conn, "order_events", {"id": 7, "message": "paid"},
                delay_s=30, priority=1, order_key="customer-42")

The rows are the application's: they are written (or not) with its transaction, so a
rolled-back transaction enqueues nothing. The table is the one in the connection's database,
read once per connection and kept with it (:func:`_database`): a call after the first runs
its INSERT alone. ``delay_s`` sets ``time_next`` to the database's
now plus the delay in unix ns (its clock is the one the server polls by); ``priority`` the
current layout's priority (lower goes first); ``order_key`` the table's vt_order_key column;
``traceparent`` (W3C trace context) the ``traceparent`` column when the table has one, and is
left out when it has not; ``traceparent=msgtable.core.tracing.CURRENT`` takes the current trace
context (and its tracestate, into a ``tracestate`` column if the table has one). With a tracer
provider configured, each call is a PRODUCER span "send TABLE" (msgtable.core.tracing), whose
context is the one CURRENT stores.

A table with vt_dedup (msgtable.core.dedup) takes each message's key in its values (under the
column's name): a message whose key the table holds (enqueued within the window) is **left
out**, not an error: ``enqueue`` returns 0 for it (1 when inserted), ``enqueue_many`` counts
only the rows inserted, and the rest of the call and the transaction go on. A duplicate id is
still an error (sqlalchemy's IntegrityError), as on any table.

Modules:
    sharded  Enqueueing into a keyspace of shards
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import orm

from msgtable.core import tracing
from msgtable.core.dedup import is_duplicate_of
from msgtable.core.sql import quote
from msgtable.core.tables import Layout, TableConfig, load_table
from msgtable.errors import InvalidArgument, TableNotFound
from msgtable.limits import MAX_ENQUEUE_DELAY_S
from msgtable.store.discovery import read_definitions

TRACEPARENT_COLUMN = tracing.TRACEPARENT_COLUMN
TRACESTATE_COLUMN = tracing.TRACESTATE_COLUMN
MAX_TRACESTATE = 512  # the README's tracestate varchar(512)
# How long what information_schema says of a table is kept before it is read again (a
# changed comment shows within this long; a column added shows at once, as an unknown column
# reads it again); reading it costs three queries.
PLAN_TTL_S = 30.0
# The database's clock in unix ns: the server's polls compare time_next with it.
_NOW_NS = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000000 AS SIGNED)"
# W3C trace context's traceparent header: version-trace id-parent id-flags, lower-case hex.
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
# MySQL's ER_DUP_ENTRY: an INSERT met a key a unique index holds
DUPLICATE_ENTRY = 1062
# MySQL's ER_BAD_FIELD_ERROR and ER_NO_SUCH_TABLE: an INSERT named a column or table the
# connection's database has not (the table changed, or the application ran USE)
_UNKNOWN = (1054, 1146)
# Where a connection keeps its database (Connection.info, the DBAPI connection's)
_DATABASE = "msgtable.enqueue.database"
# Columns the engine owns: set through the arguments, never in ``values``.
_ENGINE_COLUMNS = ("epoch", "time_acked", "time_next", "time_scheduled", "priority")


@dataclass(frozen=True)
class _Plan:
    """What an enqueue needs of one table."""

    config: TableConfig
    columns: frozenset[str]
    read_at: float


_plans: dict[tuple[str, str, str], _Plan] = {}
_lock = threading.Lock()


def enqueue(
    conn: sa.Connection | orm.Session,
    table: str,
    values: Mapping[str, Any],
    *,
    delay_s: float = 0.0,
    priority: int = 0,
    order_key: object | None = None,
    traceparent: str | tracing.Current | None = None,
) -> int:
    """Insert one message into ``table`` in ``conn``'s transaction (see the module
    docstring); returns how many rows were inserted: 1, or 0 for a duplicate of a vt_dedup
    table's key within its window, which is left out (the transaction goes on)."""
    return enqueue_many(
        conn,
        table,
        [values],
        delay_s=delay_s,
        priority=priority,
        order_key=order_key,
        traceparent=traceparent,
    )


def enqueue_many(
    conn: sa.Connection | orm.Session,
    table: str,
    rows: Sequence[Mapping[str, Any]],
    *,
    delay_s: float = 0.0,
    priority: int = 0,
    order_key: object | None = None,
    traceparent: str | tracing.Current | None = None,
) -> int:
    """Insert ``rows`` (each with the same columns) into ``table`` in one multi-row INSERT
    in ``conn``'s transaction, all with the same delay, priority, order key and
    traceparent; returns how many rows were inserted (a vt_dedup table's duplicates are
    left out and not counted)."""
    if not rows:
        return 0
    # a PRODUCER span "send TABLE" when a tracer provider is configured (msgtable.core.tracing)
    with tracing.producer_span(table, len(rows)):
        tracestate = None
        if isinstance(traceparent, tracing.Current):  # the context of the span just begun
            headers = tracing.trace_headers()
            traceparent = headers.get(TRACEPARENT_COLUMN)
            tracestate = headers.get(TRACESTATE_COLUMN)
        options = _Options(delay_s, priority, order_key, traceparent, tracestate)
        return _insert(conn, table, rows, options)


@dataclass(frozen=True)
class _Options:
    """What a call sets beside the rows' values (enqueue_many's arguments)."""

    delay_s: float
    priority: int
    order_key: object | None
    traceparent: str | None
    tracestate: str | None


def _insert(
    conn: sa.Connection | orm.Session,
    table: str,
    rows: Sequence[Mapping[str, Any]],
    options: _Options,
) -> int:
    _check_delay_and_priority(options.delay_s, options.priority)
    names = list(rows[0])
    for i, row in enumerate(rows):
        if list(row) != names:
            raise InvalidArgument(f"rows[{i}] has other columns than rows[0]")
    connection = conn.connection() if isinstance(conn, orm.Session) else conn
    plan = _plan(connection, table)
    fresh = not set(names) <= plan.columns  # a column added since the plan was read?
    if fresh:
        plan = _plan(connection, table, fresh=True)
    try:
        return _insert_planned(plan, connection, table, rows, names, options)
    except sa.exc.DBAPIError as exc:
        if fresh or _errno(exc) not in _UNKNOWN:
            raise
    # the table lost a column the plan has, or the connection is in another database now
    # (USE): nothing was written (the statement failed whole), read both again
    plan = _plan(connection, table, fresh=True)
    return _insert_planned(plan, connection, table, rows, names, options)


def _insert_planned(
    plan: _Plan,
    connection: sa.Connection,
    table: str,
    rows: Sequence[Mapping[str, Any]],
    names: list[str],
    o: _Options,
) -> int:
    for name in names:
        if name not in plan.columns:
            raise InvalidArgument(f"table {table} has no column {_shown(name)}")
        if name in _ENGINE_COLUMNS:
            raise InvalidArgument(
                f"column {name!r} is the engine's: use delay_s and priority to set it"
            )
    if plan.config.dedup in names:
        _check_dedup_keys(plan.config, rows)
    extra = _due_columns(plan, table, names, o.delay_s, o.priority)
    extra += _order_key_column(plan.config, table, names, o.order_key)
    extra += _trace_columns(plan, names, o.traceparent, o.tracestate)
    return _execute(connection, plan.config, rows, names, extra)


# A column the engine's own INSERT sets beside the application's values: (column, its SQL,
# that SQL's parameters)
Extra = tuple[str, str, list[Any]]


def _check_dedup_keys(cfg: TableConfig, rows: Sequence[Mapping[str, Any]]) -> None:
    """A vt_dedup key is text, bytes, an integer or None (no key): anything else the driver
    would refuse in its own words, or write as its repr."""
    for row in rows:
        key = row[cfg.dedup]
        if key is not None and (isinstance(key, bool) or not isinstance(key, str | bytes | int)):
            raise InvalidArgument(
                f"table {cfg.name}: a vt_dedup key ({cfg.dedup}) is text, bytes, an integer or "
                f"None, not {_shown(key)}"
            )


def _check_delay_and_priority(delay_s: float, priority: int) -> None:
    if not (
        isinstance(delay_s, int | float)
        and math.isfinite(delay_s)
        and 0 <= delay_s <= MAX_ENQUEUE_DELAY_S
    ):
        raise InvalidArgument(
            f"delay_s must be zero or more seconds, at most {MAX_ENQUEUE_DELAY_S:.0f} "
            f"(about 100 years), not {_shown(delay_s)}"
        )
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidArgument(f"priority must be an integer, not {_shown(priority)}")
    if not -(2**63) <= priority < 2**63:
        raise InvalidArgument(f"priority {priority} does not fit the priority column (a bigint)")


def _due_columns(
    plan: _Plan, table: str, names: list[str], delay_s: float, priority: int
) -> list[Extra]:
    """The priority and when the rows fall due (and, on the 2018 layout, their time_created)."""
    extra: list[Extra] = []
    due_sql, due_params = (f"{_NOW_NS} + %s", [round(delay_s * 1e9)]) if delay_s else ("", [])
    if plan.config.layout is Layout.CURRENT:
        extra.append(("priority", "%s", [priority]))
        if due_sql:
            extra.append(("time_next", due_sql, due_params))
    else:
        if priority:
            raise InvalidArgument(f"table {table} has no priority column (the 2018 layout)")
        due_sql, due_params = due_sql or _NOW_NS, due_params
        extra += [("time_scheduled", due_sql, due_params), ("time_next", due_sql, due_params)]
        if "time_created" in plan.columns and "time_created" not in names:
            extra.append(("time_created", _NOW_NS, []))
    return extra


def _order_key_column(
    cfg: TableConfig, table: str, names: list[str], order_key: object | None
) -> list[Extra]:
    if order_key is None:
        return []
    if isinstance(order_key, bool) or not isinstance(order_key, str | bytes | int):
        # the driver would write any other object as its repr
        raise InvalidArgument(
            f"order_key must be text, bytes or an integer, not {_shown(order_key)}"
        )
    if not cfg.order_key:
        raise InvalidArgument(f"table {table} has no vt_order_key: it takes no order_key")
    if cfg.order_key in names:
        raise InvalidArgument("give the order key either as order_key or in values")
    return [(cfg.order_key, "%s", [order_key])]


def _trace_columns(
    plan: _Plan, names: list[str], traceparent: str | None, tracestate: str | None
) -> list[Extra]:
    if traceparent is not None and not (
        isinstance(traceparent, str) and _TRACEPARENT.fullmatch(traceparent)
    ):
        raise InvalidArgument(
            f"traceparent {_shown(traceparent)} is not W3C trace context "
            "(00-<32 hex>-<16 hex>-<2 hex>)"
        )
    extra: list[Extra] = []
    if traceparent is not None and TRACEPARENT_COLUMN in plan.columns:
        if TRACEPARENT_COLUMN in names:
            raise InvalidArgument("give the traceparent either as traceparent or in values")
        extra.append((TRACEPARENT_COLUMN, "%s", [traceparent]))
        if tracestate and TRACESTATE_COLUMN in plan.columns and TRACESTATE_COLUMN not in names:
            extra.append((TRACESTATE_COLUMN, "%s", [tracestate[:MAX_TRACESTATE]]))
    return extra


def _execute(
    connection: sa.Connection,
    cfg: TableConfig,
    rows: Sequence[Mapping[str, Any]],
    names: list[str],
    extra: list[Extra],
) -> int:
    """One multi-row INSERT of the rows' values and the extra columns; returns its count.
    On a vt_dedup table a key the table holds makes the statement fail as a whole: its rows
    then go in one at a time, each duplicate left out (msgtable.core.dedup)."""
    columns = ", ".join(quote(c) for c in [*names, *(c for c, _, _ in extra)])
    one_row = ", ".join([*(["%s"] * len(names)), *(sql for _, sql, _ in extra)])
    head = f"INSERT INTO {quote(cfg.name)} ({columns}) VALUES "
    tail = [p for _, _, params in extra for p in params]

    def insert(some: Sequence[Mapping[str, Any]]) -> int:
        statement = head + ", ".join([f"({one_row})"] * len(some))
        params = tuple(p for row in some for p in [*(row[n] for n in names), *tail])
        try:
            return int(connection.exec_driver_sql(statement, params).rowcount)
        except sa.exc.DataError as exc:
            # a value the table's column cannot take (too long, out of range, not a number):
            # only this statement failed, the application's transaction goes on
            raise InvalidArgument(f"table {cfg.name}: {_why(exc)}") from None

    if not cfg.dedup:
        return insert(rows)
    try:
        return insert(rows)
    except sa.exc.IntegrityError as exc:
        if not _duplicate_key(exc, cfg):
            raise
    if len(rows) == 1:
        return 0
    inserted = 0
    for row in rows:  # the statement failed whole (InnoDB undid it): each row on its own
        try:
            inserted += insert([row])
        except sa.exc.IntegrityError as exc:
            if not _duplicate_key(exc, cfg):
                raise
    return inserted


def _errno(exc: sa.exc.DBAPIError) -> object:
    """The MySQL error number of a driver's error (None if it has none)."""
    args: tuple[Any, ...] = getattr(exc.orig, "args", ())
    return args[0] if args else None


def _why(exc: sa.exc.DBAPIError) -> str:
    """The database's own words, on one line."""
    why = str(exc.orig.args[-1]) if exc.orig is not None and exc.orig.args else "a bad value"
    return " ".join(why.split())[:200]


def _duplicate_key(exc: sa.exc.IntegrityError, cfg: TableConfig) -> bool:
    """Whether the INSERT failed on a key the table's vt_dedup index holds (error 1062)."""
    args: tuple[Any, ...] = getattr(exc.orig, "args", ())
    return (
        len(args) >= 2
        and _errno(exc) == DUPLICATE_ENTRY
        and is_duplicate_of(str(args[1]), cfg.name, cfg.dedup_index)
    )


def order_key_column(conn: sa.Connection, table: str) -> str:
    """The table's vt_order_key column ("": not an ordered table), from its plan."""
    return _plan(conn, table).config.order_key or ""


def _shown(value: object, most: int = 60) -> str:
    """``value`` as an error message shows it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= most else text[: most - 3] + "..."


def _database(conn: sa.Connection, fresh: bool = False) -> str:
    """The connection's database: read (SELECT DATABASE()) once, or again when ``fresh``,
    and kept with its DBAPI connection (``Connection.info``), so that an enqueue costs the
    application's transaction its INSERT alone. A connection keeps its database unless the
    application runs ``USE`` on it: it is read again with the table's plan (:func:`_plan`),
    and at once when an INSERT finds no such table or column (:func:`_insert`)."""
    info = conn.info
    database = None if fresh else info.get(_DATABASE)
    if database is None:
        database = conn.exec_driver_sql("SELECT DATABASE()").scalar()
        if not database:
            raise InvalidArgument("the connection has no database selected")
        database = info[_DATABASE] = str(database)
    return database


def _plan(conn: sa.Connection, table: str, fresh: bool = False) -> _Plan:
    """The table's plan, read from information_schema when ``fresh``, unknown or older than
    PLAN_TTL_S, and the connection's database with it (a USE since it was read shows then)."""
    url = conn.engine.url.render_as_string(hide_password=True)
    now = time.monotonic()
    if not fresh:
        known = (url, _database(conn), table)
        with _lock:
            plan = _plans.get(known)
        if plan is not None and now - plan.read_at < PLAN_TTL_S:
            return plan
    database = _database(conn, fresh=True)
    key = (url, database, table)
    raw = conn.connection.dbapi_connection
    assert raw is not None
    cur = raw.cursor()
    try:
        found = read_definitions(cur, database, only=table)
    finally:
        cur.close()
    if not found:
        raise TableNotFound(f"no message table {_shown(table)} in {database}")
    d = found[0]
    cfg = load_table(d.name, d.comment, d.columns, d.unique_indexes, d.indexes)
    plan = _Plan(cfg, frozenset(c.name for c in d.columns), now)
    with _lock:
        _plans[key] = plan
    return plan
