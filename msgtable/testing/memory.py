"""An in-memory Store with MySQL's semantics, for unit tests (and users' own tests).

It mirrors MySQLStore statement by statement: the poll's due condition and order, the
claim's compare-and-set on (unacked, due, epoch), the send's check of the same, the deferred
postpone, the ack (counting a send not postponed yet) and the bounded purge; the same cases
run on both (tests/integration/test_store_contract.py), so the two cannot drift. It is no
substitute for the integration tests against a real server, which cover the SQL itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any

from msgtable.errors import DatabaseUnavailable, TableNotFound
from msgtable.retry import Outage
from msgtable.rows import CachedRow, PolledRow, PollKey, group_by_epoch
from msgtable.store import Deliver, TableDefinition
from msgtable.tables import (
    DEMO_COMMENT,
    Column,
    Layout,
    TableConfig,
    detect_layout,
    is_message_comment,
)

CURRENT_COLUMNS = (
    Column("id", "bigint", "bigint"),
    Column("priority", "bigint", "bigint"),
    Column("time_next", "bigint", "bigint"),
    Column("epoch", "bigint", "bigint"),
    Column("time_acked", "bigint", "bigint"),
    Column("time_created", "bigint", "bigint"),
    Column("message", "varchar", "varchar(128)"),
)


class InMemoryStore:
    """Tables as dicts of rows; ``down`` makes every call raise DatabaseUnavailable."""

    def __init__(self, database: str = "memdb") -> None:
        self.database = database
        self.outage = Outage(f"the in-memory database {database}", logging.getLogger(__name__))
        self.definitions: dict[str, TableDefinition] = {}
        self.rows: dict[str, dict[Hashable, dict[str, Any]]] = {}
        self.down = False
        self.polls = 0
        self.rows_read = 0
        self.lock = threading.Lock()

    # -- test helpers --------------------------------------------------------------------
    def create_table(
        self,
        name: str,
        comment: str = DEMO_COMMENT,
        columns: tuple[Column, ...] = CURRENT_COLUMNS,
        unique_indexes: tuple[tuple[str, ...], ...] = (("id",),),
    ) -> None:
        self.definitions[name] = TableDefinition(name, comment, columns, unique_indexes)
        self.rows.setdefault(name, {})

    def drop_table(self, name: str) -> None:
        self.definitions.pop(name, None)
        self.rows.pop(name, None)

    def insert(self, table: str, id: Hashable, **values: Any) -> None:
        """A row as an INSERT of ``values`` makes it in a table of the schema file of its
        layout: schema/current.sql's defaults (priority, time_next, epoch 0, time_created
        now), v2018.sql's (none: NULL); any other column NULL."""
        columns = self.definitions[table].columns
        row: dict[str, Any] = dict.fromkeys(c.name for c in columns)
        if detect_layout(columns) is Layout.CURRENT:
            row.update((k, 0) for k in ("priority", "time_next", "epoch") if k in row)
            if "time_created" in row:
                row["time_created"] = time.time_ns()
        row.update(values, id=id)
        self.rows[table][id] = row

    def update(self, table: str, id: Hashable, **values: Any) -> None:
        self.rows[table][id].update(values)

    def delete(self, table: str, id: Hashable) -> None:
        del self.rows[table][id]

    # -- Store ---------------------------------------------------------------------------
    def _table(self, name: str) -> dict[Hashable, dict[str, Any]]:
        if self.down:
            raise DatabaseUnavailable("database unavailable: (2003) test outage")
        if name not in self.rows:
            raise TableNotFound(f"message table {name!r} no longer exists")
        return self.rows[name]

    @staticmethod
    def _next(cfg: TableConfig, row: dict[str, Any]) -> int:
        if cfg.layout is Layout.V2018 and row["time_next"] is None:
            return int(row.get("time_scheduled") or 0)
        return int(row["time_next"] or 0)

    def _due(self, cfg: TableConfig, row: dict[str, Any], now_ns: int) -> bool:
        return row["time_acked"] is None and self._next(cfg, row) <= now_ns

    def discover(self) -> list[TableDefinition]:
        if self.down:
            raise DatabaseUnavailable("database unavailable: (2003) test outage")
        # MySQLStore's filter: COMMENT LIKE 'vitess%' (no leading blanks), then the marker
        return [
            d
            for n, d in sorted(self.definitions.items())
            if d.comment.startswith("vitess") and is_message_comment(d.comment)
        ]

    def _key(self, cfg: TableConfig, row: dict[str, Any]) -> PollKey:
        """(priority, time_next as SQL reads it, id)."""
        if cfg.layout is Layout.V2018:
            return (0, self._next(cfg, row), row["id"])
        return (row.get("priority") or 0, row["time_next"], row["id"])

    @staticmethod
    def _order(key: PollKey) -> tuple[Any, ...]:
        priority, time_next, rid = key
        return (priority, time_next is not None, time_next or 0, rid)  # NULL sorts first

    def poll(
        self, cfg: TableConfig, now_ns: int, limit: int, after: PollKey | None = None
    ) -> tuple[list[PolledRow], PollKey | None]:
        with self.lock:
            self.polls += 1
            due = [r for r in self._table(cfg.name).values() if self._due(cfg, r, now_ns)]
            due.sort(key=lambda r: self._order(self._key(cfg, r)))
            if after is not None:
                due = [r for r in due if self._order(self._key(cfg, r)) > self._order(after)]
            picked = due[:limit]
            self.rows_read += len(picked)
            rows: list[PolledRow] = [
                (
                    self._key(cfg, r)[0],
                    self._key(cfg, r)[1],
                    r["epoch"],
                    *(r[c.name] for c in cfg.message_columns),
                )
                for r in picked
            ]
            return rows, (self._key(cfg, picked[-1]) if picked else None)

    def claim(
        self,
        cfg: TableConfig,
        batch: Sequence[CachedRow],
        now_ns: int,
        next_ns: Callable[[int], int],
        deliver: Deliver,
    ) -> list[CachedRow]:
        with self.lock:
            table = self._table(cfg.name)
            claimed: list[CachedRow] = []
            undo: list[tuple[dict[str, Any], Any, Any]] = []  # the transaction's rollback
            for epoch, rows in group_by_epoch(batch).items():
                nxt = next_ns(epoch or 0)
                for r in rows:
                    row = table.get(r.id)
                    if row is not None and self._due(cfg, row, now_ns) and row["epoch"] == epoch:
                        undo.append((row, row["time_next"], row["epoch"]))
                        row["time_next"], row["epoch"] = nxt, (epoch or 0) + 1
                        claimed.append(r)
            if claimed:
                try:
                    deliver(claimed)
                except BaseException:
                    for row, old_next, old_epoch in undo:
                        row["time_next"], row["epoch"] = old_next, old_epoch
                    raise
            return claimed

    def send(
        self, cfg: TableConfig, batch: Sequence[CachedRow], now_ns: int, deliver: Deliver
    ) -> list[CachedRow]:
        with self.lock:
            table = self._table(cfg.name)
            sent = [
                r
                for r in batch
                if (row := table.get(r.id)) is not None
                and self._due(cfg, row, now_ns)
                and row["epoch"] == r.epoch
            ]
            if sent:
                deliver(sent)
            return sent

    def postpone(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        epoch: int | None,
        sent_ns: int,
        next_ns: int,
    ) -> int:
        with self.lock:
            table, n = self._table(cfg.name), 0
            for i in ids:
                row = table.get(i)
                if row is None or row["epoch"] != epoch:
                    continue
                acked = row["time_acked"] is not None
                if acked or self._next(cfg, row) <= sent_ns:
                    row["epoch"] = (row["epoch"] or 0) + 1
                    if not acked:
                        row["time_next"] = next_ns
                    n += 1
            return n

    def ack(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        now_ns: int,
        first: Collection[Hashable] = (),
    ) -> int:
        with self.lock:
            table, n = self._table(cfg.name), 0
            for i in ids:
                row = table.get(i)
                if row is not None and row["time_acked"] is None:
                    row["time_acked"], row["time_next"] = now_ns, None
                    if i in first:
                        row["epoch"] = (row["epoch"] or 0) + 1
                    n += 1
            return n

    def acked_ids(self, cfg: TableConfig, ids: Sequence[Hashable], now_ns: int) -> set[Hashable]:
        with self.lock:
            table = self._table(cfg.name)
            return {i for i in ids if i in table and table[i]["time_acked"] == now_ns}

    def unacked_ids(self, cfg: TableConfig, ids: Sequence[Hashable]) -> set[Hashable]:
        with self.lock:
            table = self._table(cfg.name)
            return {i for i in ids if i in table and table[i]["time_acked"] is None}

    def purge(self, cfg: TableConfig, cutoff_ns: int, limit: int) -> int:
        with self.lock:
            table = self._table(cfg.name)
            old = [
                i
                for i, r in table.items()
                if r["time_acked"] is not None and r["time_acked"] < cutoff_ns
            ][:limit]
            for i in old:
                del table[i]
            return len(old)

    def close(self) -> None:
        pass
