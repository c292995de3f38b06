"""The capture follower's SQL (msgtable.features.capture.follower): its position table, and the
multi-row INSERTs of events into capture tables, written with the position in one
transaction (msgtable.store.protocol.CaptureStore on MySQL).

The position row is updated only WHERE it still holds the position this follower started
from or last wrote: a second server that follows the binlog too (a lease moving, a clock
that lied) finds it changed, writes nothing, and starts again from the stored position.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from msgtable.core.events import EVENT_COLUMNS
from msgtable.core.latency import Timed, untimed
from msgtable.core.sql import quote
from msgtable.store.mysql import open_connection

POSITION_TABLE = "msgtable_capture"
POSITION_ROW = "binlog"  # one stream for every capture table of the database: one row
_CREATE = (
    f"CREATE TABLE IF NOT EXISTS {POSITION_TABLE} ("
    "table_name VARCHAR(64) NOT NULL PRIMARY KEY, "
    "position VARCHAR(2048) NOT NULL, "
    "time_updated BIGINT NOT NULL) ENGINE=InnoDB"
)
_READ = f"SELECT position FROM {POSITION_TABLE} WHERE table_name = %s"
_START = (
    f"INSERT IGNORE INTO {POSITION_TABLE} (table_name, position, time_updated) VALUES (%s, %s, %s)"
)
_MOVE = (
    f"UPDATE {POSITION_TABLE} SET position = %s, time_updated = %s "
    "WHERE table_name = %s AND position = %s"
)
_COMMENT = (
    "SELECT TABLE_COMMENT FROM information_schema.TABLES "
    "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s"
)
ENGINE_VALUES = ("priority", "time_next", "epoch", "time_created")


class PositionMoved(Exception):
    """The stored position is not the one this follower last wrote: another one writes."""


def insert_statement(table: str) -> str:
    """One event row's INSERT (the driver's executemany makes it one multi-row INSERT)."""
    columns = ",".join(quote(c) for c in (*ENGINE_VALUES, *EVENT_COLUMNS))
    values = ",".join(["%s"] * (len(ENGINE_VALUES) + len(EVENT_COLUMNS)))
    return f"INSERT INTO {quote(table)} ({columns}) VALUES ({values})"


class CaptureSQL:
    """The CaptureStore on one connection of the follower's own (pymysql ``settings``,
    ``database``)."""

    def __init__(self, settings: dict[str, Any], database: str, timed: Timed = untimed) -> None:
        self._settings = {**settings, "database": database, "autocommit": False}
        self._timed = timed  # each statement's time by kind (msgtable.core.latency.Timed)
        self._conn: Any = None
        self._inserts: dict[str, str] = {}

    def _connection(self) -> Any:
        if self._conn is None:
            import pymysql
            from pymysql.constants import CLIENT

            # FOUND_ROWS: an UPDATE's count is the rows it matched (the position check)
            self._conn = open_connection(
                pymysql.connect, client_flag=CLIENT.FOUND_ROWS, **self._settings
            )
        return self._conn

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # a broken connection may fail to close
                conn.close()

    def row_metadata(self) -> str:
        """@@binlog_row_metadata ("" where the server has no such setting)."""
        conn = self._connection()
        with self._timed("capture_setup"), conn.cursor() as cur:
            try:
                cur.execute("SELECT @@binlog_row_metadata")
                value = cur.fetchone()[0]
            except Exception:  # older servers: unknown variable
                conn.rollback()
                return ""
        conn.rollback()
        return value.decode() if isinstance(value, bytes) else str(value or "")

    def comment(self, table: str) -> str | None:
        """The table's COMMENT now (None: there is no such table now)."""
        conn = self._connection()
        with self._timed("capture_comment"), conn.cursor() as cur:
            cur.execute(_COMMENT, [table])
            row = cur.fetchone()
        conn.commit()
        return None if row is None else str(row[0] or "")

    def start(self, position: str, now_ns: int) -> str:
        """The stored position; ``position`` is stored first when there is none."""
        conn = self._connection()
        with self._timed("capture_setup"), conn.cursor() as cur:
            cur.execute(_CREATE)
            cur.execute(_START, [POSITION_ROW, position, now_ns])
            cur.execute(_READ, [POSITION_ROW])
            (stored,) = cur.fetchone()
        conn.commit()
        return str(stored)

    def stored(self) -> str | None:
        conn = self._connection()
        with self._timed("capture_position"), conn.cursor() as cur:
            cur.execute(_READ, [POSITION_ROW])
            row = cur.fetchone()
        conn.commit()
        return None if row is None else str(row[0])

    def write(
        self,
        events: Mapping[str, Sequence[tuple[Any, ...]]],
        old: str,
        new: str,
        now_ns: int,
    ) -> None:
        """Insert ``events`` (rows of EVENT_COLUMNS, by capture table) and move the position
        from ``old`` to ``new``, in one transaction; PositionMoved (nothing written) when the
        stored position is not ``old``."""
        conn = self._connection()
        try:
            with self._timed("capture_write"), conn.cursor() as cur:
                if cur.execute(_MOVE, [new, now_ns, POSITION_ROW, old]) != 1:
                    raise PositionMoved(f"the capture position is no longer {old}")
                head = (0, now_ns, 0, now_ns)
                for table, rows in events.items():
                    sql = self._inserts.get(table)
                    if sql is None:
                        sql = self._inserts[table] = insert_statement(table)
                    cur.executemany(sql, [head + row for row in rows])
            conn.commit()
        except BaseException:
            try:
                conn.rollback()
            except Exception:  # the connection broke: the server rolls back
                self.close()
            raise
