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
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from msgtable.core.deadletters import (
    ATTEMPTS_COLUMN,
    DeadLetter,
    Move,
    RedriveBatch,
    exhausted_reason,
)
from msgtable.core.retry import Outage
from msgtable.core.rows import CachedRow, PolledRow, PollKey, group_by_epoch
from msgtable.core.subscriptions import FANOUT_COLUMN
from msgtable.core.tables import (
    DEAD_TIME_NEXT,
    DEMO_COMMENT,
    LAST_ERROR_COLUMN,
    TIME_DEAD_COLUMN,
    Column,
    Layout,
    TableConfig,
    detect_layout,
    is_message_comment,
    text_limit,
)
from msgtable.errors import DatabaseUnavailable, TableNotFound
from msgtable.limits import COUNT_DEAD_CAP
from msgtable.store.backlog import AGE_BOUNDS_S, BacklogCounts
from msgtable.store.deadletters import REJECTED_REASON
from msgtable.store.discovery import TableDefinition
from msgtable.store.protocol import NONE_UNCOUNTED, Deliver, Keep, Uncounted
from msgtable.testing.endpoints import InMemoryEndpoints
from msgtable.testing.subscriptions import InMemorySubscriptions

Row = dict[str, Any]  # a row of a table, by column
CURRENT_COLUMNS = (
    Column("id", "bigint", "bigint"),
    Column("priority", "bigint", "bigint"),
    Column("time_next", "bigint", "bigint"),
    Column("epoch", "bigint", "bigint"),
    Column("time_acked", "bigint", "bigint"),
    Column("time_created", "bigint", "bigint"),
    Column("message", "varchar", "varchar(128)"),
)


class DuplicateEntry(Exception):
    """An INSERT's duplicate of a unique key other than the primary key (a vt_dedup key), as
    the driver raises MySQL's error 1062: ``args`` are (1062, "Duplicate entry ...")."""


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
        # each feature's store, composed (msgtable.store.protocol.Store's capabilities)
        self.subscription_store = InMemorySubscriptions(self)
        self.endpoint_store = InMemoryEndpoints(self)

    # -- test helpers --------------------------------------------------------------------
    def create_table(
        self,
        name: str,
        comment: str = DEMO_COMMENT,
        columns: tuple[Column, ...] = CURRENT_COLUMNS,
        unique_indexes: tuple[tuple[str, ...], ...] = (("id",),),
        indexes: tuple[tuple[str, tuple[str, ...]], ...] = (),
    ) -> None:
        self.definitions[name] = TableDefinition(name, comment, columns, unique_indexes, indexes)
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
        self._refuse_duplicate(table, id, row)
        self.rows[table][id] = row

    def _refuse_duplicate(self, table: str, id: Hashable, row: dict[str, Any]) -> None:
        """MySQL's unique indexes but the primary key (an insert of a taken id replaces
        its row here): a key another row holds is refused, NULL keys never collide."""
        d = self.definitions[table]
        names = {cols: name for name, cols in d.indexes}
        for cols in d.unique_indexes:
            key = tuple(row.get(c) for c in cols)
            if "id" in cols or any(v is None for v in key):
                continue
            for other_id, other in self.rows[table].items():
                if other_id != id and tuple(other.get(c) for c in cols) == key:
                    entry = "-".join(str(v) for v in key)
                    name = names.get(tuple(cols), "_".join(cols))
                    raise DuplicateEntry(1062, f"Duplicate entry '{entry}' for key '{name}'")

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
        self,
        cfg: TableConfig,
        now_ns: int,
        limit: int,
        after: PollKey | None = None,
        created: bool = False,
        floor_ns: int | None = None,
        skip_keys: Sequence[Hashable] = (),
    ) -> tuple[list[PolledRow], PollKey | None]:
        with self.lock:
            self.polls += 1
            due = [r for r in self._table(cfg.name).values() if self._due(cfg, r, now_ns)]
            values = self._joined(cfg, due)
            if skip_keys:  # MySQLStore's: not the rows of these vt_fair_key values
                fair = cfg.flow.fair_key if cfg.flow is not None else ""
                due = [r for r in due if values(r).get(fair) not in skip_keys]
            if floor_ns is not None:  # MySQLStore's: time_next or time_created after it
                due = [
                    r
                    for r in due
                    if self._next(cfg, r) > floor_ns or (r.get("time_created") or 0) > floor_ns
                ]
            due.sort(key=lambda r: self._order(self._key(cfg, r)))
            if after is not None:
                due = [r for r in due if self._order(self._key(cfg, r)) > self._order(after)]
            picked = due[:limit]
            rows = self._polled(cfg, picked, values, created)
            return rows, (self._key(cfg, picked[-1]) if picked else None)

    def read_again(self, ids: Iterable[Hashable]) -> None:
        """Store.read_again: still due here, the next pass from the head reads them."""

    def poll_timed(self, cfg: TableConfig, now_ns: int, limit: int) -> list[PolledRow]:
        if cfg.layout is not Layout.CURRENT:
            return []
        with self.lock:  # (not one of ``polls``: those count a pass's reads)
            table = self._table(cfg.name).values()
            due = [r for r in table if self._due(cfg, r, now_ns) and (r["time_next"] or 0) > 0]
            values = self._joined(cfg, due)
            due.sort(key=lambda r: self._order(self._key(cfg, r)))
            return self._polled(cfg, due[:limit], values, True)

    def _polled(
        self, cfg: TableConfig, picked: list[Row], values: Callable[[Row], Row], created: bool
    ) -> list[PolledRow]:
        """The rows a poll returns (``values``: where each row's message values are)."""
        self.rows_read += len(picked)
        names = [c.name for c in cfg.message_columns]
        return [
            (*self._key(cfg, r)[:2], r["epoch"], *(values(r)[c] for c in names))
            + ((r.get("time_created"),) if created else ())
            for r in picked
        ]

    def _joined(
        self, cfg: TableConfig, due: list[dict[str, Any]]
    ) -> Callable[[dict[str, Any]], dict[str, Any]]:
        """Where a polled row's values are: itself, or for a subscription's state row its
        message row (MySQLStore's JOIN: ``due`` loses state rows whose message row is gone)."""
        if not cfg.source:
            return lambda r: r
        messages = self._table(cfg.source)
        due[:] = [r for r in due if r["id"] in messages]
        return lambda r: messages[r["id"]]

    def claim(
        self,
        cfg: TableConfig,
        batch: Sequence[CachedRow],
        now_ns: int,
        next_ns: Callable[[int], int],
        deliver: Deliver,
        keep: Keep | None = None,
    ) -> list[CachedRow]:
        with self.lock:
            table = self._table(cfg.name)
            ours = {r.id for r in self._unchanged(cfg, table, batch, now_ns)}
            if keep is not None and len(ours) < len(batch):
                ours = {r.id for r in keep(batch, ours)}
            claimed: list[CachedRow] = []
            undo: list[tuple[dict[str, Any], Any, Any]] = []  # the transaction's rollback
            for epoch, rows in group_by_epoch(batch).items():
                nxt = next_ns(epoch or 0)
                for r in rows:
                    row = table.get(r.id)
                    if row is not None and r.id in ours:
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
        self,
        cfg: TableConfig,
        batch: Sequence[CachedRow],
        now_ns: int,
        deliver: Deliver,
        keep: Keep | None = None,
    ) -> list[CachedRow]:
        with self.lock:
            sent = self._unchanged(cfg, self._table(cfg.name), batch, now_ns)
            if keep is not None and len(sent) < len(batch):
                sent = keep(batch, {r.id for r in sent})
            if sent:
                deliver(sent)
            return sent

    def _unchanged(
        self,
        cfg: TableConfig,
        table: dict[Hashable, dict[str, Any]],
        batch: Sequence[CachedRow],
        now_ns: int,
    ) -> list[CachedRow]:
        """The rows of ``batch`` still unacked, due and at the epoch read (a send's check)."""
        return [
            r
            for r in batch
            if (row := table.get(r.id)) is not None
            and self._due(cfg, row, now_ns)
            and row["epoch"] == r.epoch
        ]

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
        first: Uncounted = NONE_UNCOUNTED,
    ) -> int:
        with self.lock:
            table, n = self._table(cfg.name), 0
            for i in ids:
                row = table.get(i)
                if row is not None and self._alive(row):  # a dead one stays dead
                    row["time_acked"], row["time_next"] = now_ns, None
                    row["epoch"] = (row["epoch"] or 0) + _uncounted(row, i, first)
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
                if r["time_acked"] is not None
                and r["time_acked"] < cutoff_ns
                and (not cfg.dedup or r.get(cfg.dedup) is None)
                and (not cfg.fanout or r.get(FANOUT_COLUMN) is not None)
                and self.subscription_store.settled_by_holders(cfg, i, cutoff_ns)
            ][:limit]
            for i in old:
                del table[i]
            return len(old)

    def expire_dedup(self, cfg: TableConfig, since_ns: int, cutoff_ns: int, limit: int) -> int:
        if not cfg.dedup:
            return 0
        with self.lock:
            keyed = [
                r
                for r in self._table(cfg.name).values()
                if r.get(cfg.dedup) is not None
                and since_ns <= (r.get("time_created") or 0) < cutoff_ns
            ][:limit]
            for r in keyed:
                r[cfg.dedup] = None
            return len(keyed)

    # -- settlement and dead letters (msgtable.core.settlement, msgtable.core.deadletters)
    # -------------
    @staticmethod
    def _alive(row: dict[str, Any]) -> bool:
        return row["time_acked"] is None and row["time_next"] != DEAD_TIME_NEXT

    @staticmethod
    def _current(
        row: dict[str, Any], rid: Hashable, first: Uncounted, attempts: Sequence[int] | None, k: int
    ) -> bool:
        """Whether the ``k``-th id's settlement answers the row's current delivery (its
        attempt 0, or no attempts: any)."""
        if attempts is None or not attempts[k]:
            return True
        return (row["epoch"] or 0) + _uncounted(row, rid, first) == attempts[k]

    @staticmethod
    def _set_error(cfg: TableConfig, row: dict[str, Any], reason: str | None) -> None:
        if reason is not None and cfg.keeps_errors:
            row[LAST_ERROR_COLUMN] = reason[: text_limit(_column(cfg, LAST_ERROR_COLUMN))]

    def release(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        next_ns: int,
        reason: str | None,
        first: Uncounted = NONE_UNCOUNTED,
        attempts: Sequence[int] | None = None,
    ) -> int:
        with self.lock:
            table, n = self._table(cfg.name), 0
            for k, i in enumerate(ids):
                row = table.get(i)
                if (
                    row is None
                    or not self._alive(row)
                    or not ((row["epoch"] or 0) > 0 or _uncounted(row, i, first))
                    or not self._current(row, i, first, attempts, k)
                ):
                    continue
                row["epoch"] = (row["epoch"] or 0) + _uncounted(row, i, first)
                row["time_next"] = next_ns
                self._set_error(cfg, row, reason)
                n += 1
            return n

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
        first_until = until_ns if first_until_ns is None else first_until_ns
        with self.lock:
            table, n = self._table(cfg.name), 0
            for k, i in enumerate(ids):
                row = table.get(i)
                if (
                    row is None
                    or not self._alive(row)
                    or not self._current(row, i, first, attempts, k)
                ):
                    continue
                sent = (row["epoch"] or 0) > 0 and (row["time_next"] or 0) > now_ns
                if _uncounted(row, i, first):
                    row["epoch"] = (row["epoch"] or 0) + 1
                    row["time_next"] = first_until
                elif sent:
                    row["time_next"] = until_ns if exact else max(row["time_next"] or 0, until_ns)
                else:
                    continue
                self._set_error(cfg, row, reason)
                n += 1
            return n

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
        with self.lock:
            table = self._table(cfg.name)
            target = self._table(dead.name) if dead is not None else None
            picked = [
                i
                for i in ids
                if (row := table.get(i)) is not None
                and self._alive(row)
                and (
                    due_at_epoch is None
                    or (row["epoch"] == due_at_epoch[0] and self._due(cfg, row, now_ns))
                )
            ]
            if due_at_epoch is None:
                default = REJECTED_REASON
            else:
                default = exhausted_reason(cfg.max_attempts or (due_at_epoch[0] or 0))
            for i in picked:
                row = table[i]
                attempts = (row["epoch"] or 0) + _uncounted(row, i, first)
                error = reason or row.get(LAST_ERROR_COLUMN) or default
                if dead is None or target is None:
                    row["epoch"], row["time_next"] = attempts, DEAD_TIME_NEXT
                    if cfg.keeps_errors:
                        row[LAST_ERROR_COLUMN] = error[
                            : text_limit(_column(cfg, LAST_ERROR_COLUMN))
                        ]
                    if TIME_DEAD_COLUMN in row:
                        row[TIME_DEAD_COLUMN] = now_ns
                    continue
                moved = {n: row.get(n) for n in Move.between(cfg, dead).values}
                error = error[: text_limit(_column(dead, LAST_ERROR_COLUMN))]
                moved.update(
                    {TIME_DEAD_COLUMN: now_ns, ATTEMPTS_COLUMN: attempts, LAST_ERROR_COLUMN: error}
                )
                moved.update(epoch=0, time_next=now_ns, time_acked=None)
                target[i] = {**dict.fromkeys(c.name for c in dead.columns), **moved}
                del table[i]
            return picked

    def _dead_rows(
        self, cfg: TableConfig, dead: TableConfig | None
    ) -> list[tuple[Hashable, int | None, int, str | None]]:
        if dead is None:
            rows = [
                r
                for r in self._table(cfg.name).values()
                if r["time_acked"] is None and r["time_next"] == DEAD_TIME_NEXT
            ]
            return sorted(
                (r["id"], r.get(TIME_DEAD_COLUMN), r["epoch"] or 0, r.get(LAST_ERROR_COLUMN))
                for r in rows
            )
        rows = [r for r in self._table(dead.name).values() if r["time_acked"] is None]
        return sorted(
            (r["id"], r[TIME_DEAD_COLUMN], r[ATTEMPTS_COLUMN] or 0, r[LAST_ERROR_COLUMN])
            for r in rows
        )

    def dead_letters(
        self, cfg: TableConfig, dead: TableConfig | None, after: Hashable | None, limit: int
    ) -> list[DeadLetter]:
        with self.lock:
            rows = self._dead_rows(cfg, dead)
        rows = [r for r in rows if after is None or r[0] > after][:limit]  # type: ignore[operator]
        return [DeadLetter(*r) for r in rows]

    def backlog(self, cfgs: Sequence[TableConfig], now_ns: int) -> dict[str, BacklogCounts]:
        """MySQLStore.backlog: unacked, not dead rows, due or not, aged by time_created."""
        out: dict[str, BacklogCounts] = {}
        with self.lock:
            if self.down:
                raise DatabaseUnavailable("database unavailable: (2003) test outage")
            for cfg in cfgs:
                if cfg.name not in self.rows:
                    continue
                rows = [
                    r
                    for r in self.rows[cfg.name].values()
                    if r["time_acked"] is None and r["time_next"] != DEAD_TIME_NEXT
                ]
                due = sum(1 for r in rows if self._next(cfg, r) <= now_ns)
                created = [r["time_created"] for r in rows if r.get("time_created") is not None]
                aged = cfg.has_column("time_created")
                out[cfg.name] = BacklogCounts(
                    due=due,
                    scheduled=len(rows) - due,
                    oldest_created_ns=min(created) if aged and created else None,
                    within=tuple(
                        sum(1 for c in created if c >= now_ns - round(b * 1e9))
                        for b in AGE_BOUNDS_S[:-1]
                    )
                    if aged
                    else (),
                )
        return out

    def count_dead(
        self, tables: Sequence[tuple[TableConfig, TableConfig | None]]
    ) -> dict[str, int]:
        with self.lock:
            return {
                cfg.name: min(len(self._dead_rows(cfg, dead)), COUNT_DEAD_CAP)
                for cfg, dead in tables
            }

    def redrive(
        self,
        dead: TableConfig,
        target: TableConfig,
        ids: Sequence[Hashable] | None,
        after: Hashable | None,
        limit: int,
        now_ns: int,
    ) -> RedriveBatch:
        with self.lock:
            source = self._table(dead.name)
            in_place = dead.name == target.name
            keys: list[Any] = list(source)  # ids of one table compare with each other
            picked: list[Any] = sorted(
                i
                for i in keys
                if (r := source[i])["time_acked"] is None
                and (not in_place or r["time_next"] == DEAD_TIME_NEXT)
                and (ids is None or i in ids)
                and (after is None or i > after)
            )[:limit]
            if not picked:
                return RedriveBatch(0, (), None)
            if in_place:
                for i in picked:
                    source[i].update(epoch=0, time_next=now_ns)
                    if TIME_DEAD_COLUMN in source[i]:
                        source[i][TIME_DEAD_COLUMN] = None
                return RedriveBatch(len(picked), (), picked[-1])
            into = self._table(target.name)
            skipped = tuple(i for i in picked if i in into)
            have = {c.name for c in target.columns}
            for i in picked:
                if i in into:
                    continue
                row = source.pop(i)
                fresh = dict.fromkeys(have)
                fresh.update({k: v for k, v in row.items() if k in have})
                fresh.update(epoch=0, time_next=now_ns, time_acked=None)
                for gone in (TIME_DEAD_COLUMN, ATTEMPTS_COLUMN):
                    if gone in fresh and gone not in {c.name for c in target.message_columns}:
                        fresh[gone] = None
                into[i] = fresh
            return RedriveBatch(len(picked) - len(skipped), skipped, picked[-1])

    # -- ordering per key ------------------------------------------------------------------
    def _unsettled(self, cfg: TableConfig) -> list[dict[str, Any]]:
        return [r for r in self._table(cfg.name).values() if self._alive(r)]

    def _ordered_row(self, cfg: TableConfig, r: dict[str, Any]) -> PolledRow:
        return (
            r.get("priority") or 0,
            r["time_next"],
            r["epoch"],
            *(r[c.name] for c in cfg.message_columns),
            r.get("time_created"),
            r[cfg.order_by],
            r[cfg.order_key],
            r[cfg.order_key],
        )

    def order_keys(
        self, cfg: TableConfig, after: object | None, limit: int
    ) -> list[tuple[object, Hashable]]:
        with self.lock:
            self.polls += 1
            # as SQL's: keys with unacked rows, dead ones too (their runs skip them)
            table = self._table(cfg.name).values()
            keys = {r[cfg.order_key] for r in table if r["time_acked"] is None} - {None}
            return [(k, k) for k in sorted(k for k in keys if after is None or k > after)][:limit]

    def runs(self, cfg: TableConfig, keys: Sequence[object], per_key: int) -> list[PolledRow]:
        with self.lock:
            rows: list[PolledRow] = []
            for key in keys:
                run = [r for r in self._unsettled(cfg) if r[cfg.order_key] == key]
                run.sort(key=lambda r: (r[cfg.order_by], r["id"]))
                rows += [self._ordered_row(cfg, r) for r in run[:per_key]]
            self.rows_read += len(rows)
            return rows

    def unkeyed(
        self, cfg: TableConfig, now_ns: int, after: Hashable | None, limit: int
    ) -> list[PolledRow]:
        with self.lock:
            due = [
                r
                for r in self._unsettled(cfg)
                if r[cfg.order_key] is None
                and self._due(cfg, r, now_ns)
                and (after is None or r["id"] > after)
            ]
            due.sort(key=lambda r: r["id"])
            return [self._ordered_row(cfg, r) for r in due[:limit]]

    # -- capabilities (msgtable.store.protocol.Store) --------------------------------------
    def connections(self) -> None:
        """None: no connections of its own, so no lease and no binlog."""
        return None

    def statement_stats(self) -> None:
        return None

    def close(self) -> None:
        pass


def _column(cfg: TableConfig, name: str) -> Column:
    return next(c for c in cfg.columns if c.name == name)


def _uncounted(row: dict[str, Any], rid: Hashable, first: Uncounted) -> bool:
    return rid in first and row["epoch"] == first[rid]  # at its send's epoch: first_expr
