"""Every SQL statement of schedules (what they are: msgtable.core.schedules): the table
msgtable_schedules (created on demand, as the placement's table is), and a tick: the locking
read of the schedule's next_tick, the INSERT of its message and the UPDATE of next_tick
conditional on the value read, in one transaction (ScheduleSQL.tick).

The same statements, to run by hand (docs/how-to/schedules.md):

    INSERT INTO msgtable_schedules (name, table_name, cron, timezone, message_values, missed,
      next_tick, time_created) VALUES ('nightly', 'jobs', '0 3 * * *', 'Europe/Paris',
      '{"message": "rebuild"}', 'skip', 0, 0);    -- next_tick 0: the ticker sets it
    DELETE FROM msgtable_schedules WHERE name = 'nightly';
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from msgtable.core.schedules import NAME_COLUMN, SCHEDULES_TABLE, TICK_COLUMN, Missed, Schedule
from msgtable.core.sql import MARK, placeholders, quote
from msgtable.core.tables import Layout, TableConfig
from msgtable.errors import InvalidArgument
from msgtable.store.mysql import DUPLICATE_KEY, error_code, server_text

T = quote(SCHEDULES_TABLE)
SCHEDULES_DDL = f"""CREATE TABLE IF NOT EXISTS {T} (
  name VARCHAR(64) NOT NULL,
  table_name VARCHAR(64) NOT NULL,
  cron VARCHAR(255) NOT NULL,
  timezone VARCHAR(64) NOT NULL DEFAULT 'UTC',
  message_values TEXT NOT NULL,
  missed VARCHAR(8) NOT NULL DEFAULT 'skip',
  next_tick BIGINT NOT NULL DEFAULT 0,
  last_tick BIGINT NULL,
  last_enqueued BIGINT NULL,
  ticks BIGINT NOT NULL DEFAULT 0,
  time_created BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (name)
) ENGINE=InnoDB COMMENT 'msgtable: recurring messages (msgtable schedule)'"""
_FIELDS = (
    "name, table_name, cron, timezone, message_values, missed, next_tick, last_tick, "
    "last_enqueued, ticks"
)
EXISTS = (
    "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
)
SELECT_ALL = f"SELECT {_FIELDS} FROM {T} ORDER BY name"
INSERT = (
    f"INSERT INTO {T} (name, table_name, cron, timezone, message_values, missed, next_tick, "
    "time_created) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)
DELETE = f"DELETE FROM {T} WHERE name = %s"
LOCK = f"SELECT next_tick FROM {T} WHERE name = %s FOR UPDATE"
# A schedule whose next_tick is 0 (made by hand) starts at its first tick after now.
START = f"UPDATE {T} SET next_tick = %s WHERE name = %s AND next_tick = 0"
MOVE = (
    f"UPDATE {T} SET next_tick = %s, last_tick = COALESCE(%s, last_tick), "
    "last_enqueued = IF(%s IS NULL, last_enqueued, %s), ticks = ticks + %s "
    "WHERE name = %s AND next_tick = %s"
)


class _Pools(Protocol):
    database: str

    def _errors(
        self, table: str | None = None, kind: str = "other"
    ) -> AbstractContextManager[None]: ...

    def _auto_cursor(self) -> AbstractContextManager[Any]: ...

    def _tx_connection(self) -> AbstractContextManager[Any]: ...


class ScheduleStore(Protocol):
    """What the schedules feature asks of a database (MySQL: ScheduleSQL; in memory:
    msgtable.testing.schedules.InMemorySchedules)."""

    def schedules(self) -> list[Schedule]: ...

    def create(self, s: Schedule, now_ns: int) -> None: ...

    def drop(self, name: str) -> bool: ...

    def start(self, name: str, next_ns: int) -> bool: ...

    def tick(
        self, s: Schedule, cfg: TableConfig, enqueue: int | None, next_ns: int, now_ns: int
    ) -> bool: ...


def message_row(s: Schedule, cfg: TableConfig, tick_ns: int, now_ns: int) -> dict[str, Any]:
    """The columns of the message of one tick: its values, the id of the tick, the schedule's
    name and the tick where the table has those columns, and the 2018 layout's due times."""
    from msgtable.core.schedules import tick_id

    idc = cfg.id_column
    kind = "integer" if idc.is_integer else "binary" if idc.is_binary else "text"
    row: dict[str, Any] = dict(s.values)
    row[idc.name] = tick_id(s.name, tick_ns, kind)
    if cfg.has_column(TICK_COLUMN):
        row[TICK_COLUMN] = tick_ns
    if cfg.has_column(NAME_COLUMN):
        row[NAME_COLUMN] = s.name
    if cfg.layout is Layout.V2018:
        row.setdefault("time_scheduled", now_ns)
        row.setdefault("time_next", now_ns)
    if "time_created" in cfg.column_names and cfg.layout is Layout.V2018:
        row.setdefault("time_created", now_ns)
    return row


def insert_sql(cfg: TableConfig, names: list[str]) -> str:
    cols = ", ".join(quote(n) for n in names)
    return f"{MARK}INSERT INTO {quote(cfg.name)} ({cols}) VALUES ({placeholders(len(names))})"


def check_columns(cfg: TableConfig, values: Mapping[str, Any]) -> None:
    """A schedule's values must name application columns of its table (not the id)."""
    from msgtable.core.tables import ENGINE_COLUMNS

    engine = set(ENGINE_COLUMNS[cfg.layout]) | {cfg.id_column.name, TICK_COLUMN, NAME_COLUMN}
    for name in values:
        if name in engine:
            raise InvalidArgument(
                f"values: column {name!r} is set by the schedule or the engine, not by values"
            )
        if not cfg.has_column(name):
            raise InvalidArgument(f"values: table {cfg.name} has no column {name!r}")


class ScheduleSQL:
    """Schedules' SQL, run on a MySQL store's pools (msgtable.store.mysqlstore)."""

    def __init__(self, pools: _Pools) -> None:
        self._pools = pools

    @contextmanager
    def _cursor(self, kind: str) -> Iterator[Any]:
        with self._pools._errors(SCHEDULES_TABLE, kind=kind), self._pools._auto_cursor() as cur:
            yield cur

    def _exists(self, cur: Any) -> bool:
        cur.execute(EXISTS, [self._pools.database, SCHEDULES_TABLE])
        return bool(cur.fetchone()[0])

    def schedules(self) -> list[Schedule]:
        with self._cursor("schedules") as cur:
            if not self._exists(cur):
                return []
            cur.execute(SELECT_ALL)
            return [_schedule(r) for r in cur.fetchall()]

    def create(self, s: Schedule, now_ns: int) -> None:
        with self._cursor("schedule_create") as cur:
            if not self._exists(cur):
                cur.execute(SCHEDULES_DDL)
            values = json.dumps(dict(s.values), separators=(",", ":"))
            row = (s.name, s.table, s.cron, s.timezone, values, s.missed.value, s.next_tick_ns)
            try:
                cur.execute(INSERT, [*row, now_ns])
            except Exception as exc:
                if error_code(exc) == DUPLICATE_KEY:
                    raise InvalidArgument(f"schedule {s.name!r} exists") from None
                raise

    def drop(self, name: str) -> bool:
        with self._cursor("schedule_drop") as cur:
            if not self._exists(cur):
                return False
            return bool(cur.execute(DELETE, [name]))

    def start(self, name: str, next_ns: int) -> bool:
        with self._cursor("schedule_start") as cur:
            return bool(cur.execute(START, [next_ns, name]))

    def tick(
        self, s: Schedule, cfg: TableConfig, enqueue: int | None, next_ns: int, now_ns: int
    ) -> bool:
        """Enqueue the tick ``enqueue`` (None: none) of ``s`` and move its next_tick from
        the one it was read with to ``next_ns``, in one transaction; False (nothing done)
        when another server moved it first."""
        with (
            self._pools._errors(cfg.name, kind="schedule_tick"),
            self._pools._tx_connection() as conn,
        ):
            try:
                with conn.cursor() as cur:
                    cur.execute(LOCK, [s.name])
                    got = cur.fetchone()
                    if got is None or int(got[0]) != s.next_tick_ns:
                        conn.rollback()
                        return False
                    n = 0
                    if enqueue is not None:
                        row = message_row(s, cfg, enqueue, now_ns)
                        names = list(row)
                        try:
                            n = cur.execute(insert_sql(cfg, names), [row[k] for k in names])
                        except Exception as exc:
                            # a duplicate (the tick's id, a vt_dedup key) is enqueued already
                            if error_code(exc) != DUPLICATE_KEY:
                                raise
                    done = now_ns if enqueue is not None else None
                    moved = cur.execute(
                        MOVE, [next_ns, enqueue, done, done, n, s.name, s.next_tick_ns]
                    )
                    if moved != 1:
                        conn.rollback()
                        return False
                conn.commit()
                return True
            except BaseException:
                conn.rollback()
                raise


def _schedule(r: Any) -> Schedule:
    name, table, cron, tz, values, missed, next_tick, last_tick, last_enqueued, ticks = r
    try:
        parsed = json.loads(server_text(values))
    except ValueError:
        parsed = {}
    return Schedule(
        name=server_text(name),
        table=server_text(table),
        cron=server_text(cron),
        timezone=server_text(tz),
        values=parsed if isinstance(parsed, dict) else {},
        missed=Missed.ONCE if server_text(missed) == "once" else Missed.SKIP,
        next_tick_ns=int(next_tick),
        last_tick_ns=None if last_tick is None else int(last_tick),
        last_enqueued_ns=None if last_enqueued is None else int(last_enqueued),
        ticks=int(ticks),
    )
