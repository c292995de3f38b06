"""The pipeline's SQL, all of it but a subscription's view (msgtable.spark.subview, which
reuses these over a join): partitioned reads, bulk enqueue and the archive's delete of a
message table (msgtable.spark). Like msgtable.store.statements for the engine's statements, every
statement is written here once per table from its loaded config: table and column names come
from information_schema and are quoted, values are bound parameters.

The states a read takes (:class:`RowState`) split a message table's rows: each row is acked,
or (unacked) dead, due, scheduled or in flight. A dead row (msgtable.core.deadletters) is one no
poll sends again: dead in place, ``time_next = DEAD_TIME_NEXT``, which is in the future of
every "now", so the states that compare ``time_next`` with now say "and not dead". A
dead-letter table (it has every one of DEAD_LETTER_COLUMNS) holds nothing but dead messages:
every unacked row of it is dead, and due as well, for whoever streams it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from msgtable.core.deadletters import holds_dead_letters
from msgtable.core.sql import MARK, placeholders, quote
from msgtable.core.tables import DEAD_TIME_NEXT, Layout, TableConfig
from msgtable.errors import InvalidArgument
from msgtable.store.statements import BY_ID


class RowState(enum.Enum):
    """Which rows of a message table a read takes, as the database has them now."""

    ALL = "all"
    UNACKED = "unacked"  # not acked: due, scheduled, in flight or dead
    DUE = "due"  # unacked and time_next is now or past: the next poll may send it
    SCHEDULED = "scheduled"  # unacked, never sent (epoch 0), time_next in the future, not dead
    IN_FLIGHT = "in_flight"  # unacked, sent (epoch > 0), its backoff not over, not dead
    DEAD = "dead"  # never sent again: dead in place, or any unacked row of a dead-letter table
    ACKED = "acked"

    @classmethod
    def parse(cls, text: str) -> RowState:
        try:
            return cls(text.strip().lower())
        except ValueError:
            names = ", ".join(s.value for s in cls)
            raise InvalidArgument(f"state must be one of {names}, not {text!r}") from None


class BulkStatements:
    """The bulk SQL of one table. ``where`` arguments come from :meth:`state`."""

    def __init__(self, cfg: TableConfig) -> None:
        self.config = cfg
        self.table = quote(cfg.name)
        self.columns = cfg.column_names
        self._select = f"SELECT {', '.join(quote(c) for c in self.columns)} FROM {self.table}"
        self._id = quote(cfg.id_column.name)

    def state(self, state: RowState, now_ns: int) -> tuple[str, list[Any]]:
        """The condition (and its parameters) of the rows in ``state`` at ``now_ns``."""
        acked, due = quote("time_acked"), quote("time_next")
        epoch = quote("epoch")
        if state is RowState.ALL:
            return "TRUE", []
        if state is RowState.ACKED:
            return f"{acked} IS NOT NULL", []
        if state is RowState.UNACKED or (
            state is RowState.DEAD and holds_dead_letters(self.columns)
        ):
            return f"{acked} IS NULL", []
        if state is RowState.DEAD:
            return f"{acked} IS NULL AND {due} = %s", [DEAD_TIME_NEXT]
        if state is RowState.DUE:
            return f"{acked} IS NULL AND ({due} IS NULL OR {due} <= %s)", [now_ns]
        sent = ">" if state is RowState.IN_FLIGHT else "="
        return (
            f"{acked} IS NULL AND {due} > %s AND {due} < %s AND COALESCE({epoch}, 0) {sent} 0",
            [now_ns, DEAD_TIME_NEXT],
        )

    def id_bounds(self, where: str) -> str:
        """The smallest and largest id, and the count, of the rows ``where`` holds."""
        return f"SELECT MIN({self._id}), MAX({self._id}), COUNT(*) FROM {self.table} WHERE {where}"

    def count(self, where: str) -> str:
        return f"SELECT COUNT(*) FROM {self.table} WHERE {where}"

    def select_range(self, where: str) -> str:
        """Rows with lo <= id <= hi (the first two parameters) among ``where``'s, by id."""
        return (
            f"{self._select} WHERE {self._id} BETWEEN %s AND %s AND ({where}) ORDER BY {self._id}"
        )

    def select_hashed(self, where: str) -> str:
        """Rows whose id hashes to one of n buckets (parameters n, bucket): any id type."""
        return f"{self._select} WHERE MOD(CRC32({self._id}), %s) = %s AND ({where})"

    def select(self, where: str) -> str:
        return f"{self._select} WHERE {where}"

    def insert(self, columns: Sequence[str], rows: int, skip_duplicates: bool) -> str:
        """A multi-row INSERT of ``rows`` rows of ``columns`` (each a table column). With
        ``skip_duplicates`` a row whose id is taken is left as it is (and not counted by
        the affected-rows count), where another error still fails the statement."""
        unknown = [c for c in columns if c not in self.columns]
        if unknown:
            raise InvalidArgument(f"table {self.config.name} has no column {unknown[0]!r}")
        names = ", ".join(quote(c) for c in columns)
        values = ", ".join([f"({placeholders(len(columns))})"] * rows)
        sql = f"INSERT INTO {self.table} ({names}) VALUES {values}"
        if skip_duplicates:
            sql += f" ON DUPLICATE KEY UPDATE {self._id} = {self._id}"
        return sql

    def archived(self, cutoff_ns: int) -> tuple[str, list[Any]]:
        """The condition of the rows an archive takes: acked before the cutoff."""
        acked = quote("time_acked")
        return f"{acked} IS NOT NULL AND {acked} < %s", [cutoff_ns]

    def archived_query(self, cutoff_ns: int) -> str:
        """The archive's SELECT with its cutoff written in (for Spark's JDBC reader, which
        binds no parameters; the cutoff is an int, so nothing but digits goes in)."""
        acked = quote("time_acked").replace("%%", "%")
        select = self._select.replace("%%", "%")
        return f"{select} WHERE {acked} IS NOT NULL AND {acked} < {int(cutoff_ns)}"

    def delete_acked(self, ids: int) -> str:
        """Delete acked rows by id (the archive's rows, exactly: an id that is not acked, or
        no longer there, is left alone)."""
        return (
            f"{MARK}DELETE {self.table} FROM {self.table} {BY_ID} "
            f"WHERE {self._id} IN ({placeholders(ids)}) "
            f"AND {quote('time_acked')} IS NOT NULL"
        )

    def check_enqueue_columns(self, fields: Sequence[str]) -> None:
        """A frame to enqueue must bring the id and only columns the table has."""
        cfg = self.config
        if cfg.id_column.name not in fields:
            raise InvalidArgument(
                f"the frame needs the id column {cfg.id_column.name!r} to enqueue"
            )
        unknown = [f for f in fields if f not in self.columns]
        if unknown:
            raise InvalidArgument(
                f"table {cfg.name} has no column {unknown[0]!r} (its columns: "
                f"{', '.join(self.columns)})"
            )

    def engine_defaults(self, now_ns: int) -> dict[str, Any]:
        """Values of the engine's columns for a new message: due now, never sent."""
        out: dict[str, Any] = {"epoch": 0, "time_next": now_ns, "time_acked": None}
        if self.config.layout is Layout.CURRENT:
            out["priority"] = 0
        else:
            out["time_scheduled"] = now_ns
        if "time_created" in self.columns:
            out["time_created"] = now_ns
        return {k: v for k, v in out.items() if k in self.columns}
