"""Subscriptions in memory: msgtable.store.protocol.SubscriptionStore over an InMemoryStore's
tables, for unit tests of the registry and the fan-out, with SubscriptionSQL's rules
(msgtable.store.subscriptions): a state table per subscription among the store's tables
(served by the store like any table), rows enqueued before a table's first subscription seen
by none, a fan-out that hands rows over by id and numbers them by the table's sequence at
once (msgtable.store.sequences: here a counter per table, started above every
time_fanout there; a row a state table has already is kept), lag and orphans counted
against the message rows still there.
tests/integration/test_subscription_store_contract.py runs the same cases on both.

What it does not mirror: the locks (an ordered table's rows skipped while another
transaction holds them; there are no other transactions here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from msgtable.core.filters import Filter
from msgtable.core.rows import PolledRow
from msgtable.core.subscriptions import (
    FANOUT_COLUMN,
    STATE_COMMENT,
    LoadedSubscription,
    StateRow,
    Subscription,
    SubscriptionState,
    order_columns,
)
from msgtable.core.tables import DEAD_TIME_NEXT, Column, TableConfig
from msgtable.errors import DatabaseUnavailable, InvalidArgument, TableNotFound

if TYPE_CHECKING:
    from msgtable.testing.memory import InMemoryStore

FANOUT = Column(FANOUT_COLUMN, "bigint", "bigint")
_BIGINT = Column("", "bigint", "bigint")


def state_columns(table: TableConfig) -> tuple[Column, ...]:
    """A state table's columns as msgtable.store.subscriptions.state_table_ddl makes them."""
    big = [dataclasses.replace(_BIGINT, name=n) for n in ("priority", "time_next", "epoch")]
    tail = [dataclasses.replace(_BIGINT, name=n) for n in ("time_acked", "time_created")]
    return (
        table.id_column,
        *big,
        *tail,
        Column("last_error", "varchar", "varchar(1000)"),
        dataclasses.replace(_BIGINT, name="time_dead"),
        *order_columns(table),
    )


class InMemorySubscriptions:
    """The subscriptions of one InMemoryStore (``down`` is the store's)."""

    def __init__(self, store: InMemoryStore) -> None:
        self.store = store
        self.definitions: dict[tuple[str, str], Subscription] = {}
        self.state_tables: set[str] = set()
        self.sequences: dict[str, int] = {}  # a table's fan-out sequence: its last number
        self.cursors: dict[tuple[str, str], int] = {}  # a subscription's (design.md (b))
        # a table's indexes, each one's columns (none unless a test says: the in-memory
        # scan reads every row, as one through fanout_idx alone would)
        self.indexes: dict[str, list[tuple[str, ...]]] = {}

    def settled_by_holders(self, cfg: TableConfig, id: Hashable, cutoff_ns: int) -> bool:
        """Whether each subscription that holds the table settled the row before the cutoff
        (or never got it): TableStatements' purge pick, for InMemoryStore.purge; the lock held."""
        for h in cfg.holders:
            state = self.store.rows.get(h, {}).get(id)
            if state is not None and (
                state["time_acked"] is None or state["time_acked"] >= cutoff_ns
            ):
                return False
        cursors = self.cursors  # a lazy one's: what it passed only
        if cfg.source:  # its state table: a settled row of a message it has not passed stays
            message = self.store.rows.get(cfg.source, {}).get(id)
            if message is None:
                return True
            number = message.get(FANOUT_COLUMN) or 0
            table = cfg.source
        else:
            number = self.store.rows[cfg.name][id].get(FANOUT_COLUMN) or 0
            table = cfg.name
        return all(number <= cursors.get((table, n), -1) for n in cfg.cursored)

    def _up(self) -> None:
        if self.store.down:
            raise DatabaseUnavailable("database unavailable: (2003) test outage")

    def subscriptions(self) -> tuple[list[Subscription], dict[str, tuple[Column, ...]]]:
        self._up()
        with self.store.lock:
            subs = [self.definitions[k] for k in sorted(self.definitions)]
            defs = self.store.definitions
            cols = {n: defs[n].columns for n in sorted(self.state_tables) if n in defs}
        return subs, cols

    def create_subscription(
        self, table: TableConfig, loaded: LoadedSubscription, from_start: bool, now_ns: int
    ) -> int:
        self._up()
        sub, store = loaded.sub, self.store
        rows = store._table(table.name)
        with store.lock:
            d = store.definitions[table.name]
            if not any(c.name == FANOUT_COLUMN for c in d.columns):
                store.definitions[table.name] = dataclasses.replace(d, columns=(*d.columns, FANOUT))
                for r in rows.values():
                    r[FANOUT_COLUMN] = None
            if not any(t == table.name for t, _ in self.definitions):
                for r in rows.values():  # seen by none, and to be seen by none
                    if r[FANOUT_COLUMN] is None:
                        self._mark(table, r, now_ns, now_ns)
            if sub.state_table in store.rows:
                raise InvalidArgument(
                    f"subscription {sub.label}: table {sub.state_table} exists already"
                )
            if (sub.table, sub.name) in self.definitions:
                raise InvalidArgument(f"subscription {sub.label} exists already")
            store.create_table(sub.state_table, STATE_COMMENT, state_columns(table))
            self.state_tables.add(sub.state_table)
            self.definitions[(sub.table, sub.name)] = sub
            # the sequence started above every time_fanout there; the cursor at its last
            last = self.sequences.setdefault(table.name, self._highest(rows))
            self.cursors[(sub.table, sub.name)] = last
            if not from_start:
                return 0
            retained = [
                r
                for _, r in sorted(rows.items())
                if r[FANOUT_COLUMN] is not None
                and (not table.default_group or r["time_acked"] is None)
                and (loaded.filter is None or loaded.filter.matches(r))
            ]
            return self._hand(table, sub.state_table, retained, now_ns)

    @staticmethod
    def _mark(table: TableConfig, row: dict[str, Any], now_ns: int, number: int) -> None:
        """Seen by the subscriptions (``number``: of the sequence, or the time of a row seen
        by none); without a default group, acked for it."""
        row[FANOUT_COLUMN] = number
        if not table.default_group and row["time_acked"] is None:
            row["time_acked"] = now_ns

    def _hand(
        self, table: TableConfig, state_table: str, rows: Sequence[dict[str, Any]], now_ns: int
    ) -> int:
        """Write ``rows`` into a state table as the fan-out's INSERT does (epoch 0; a row it
        has already is kept); returns how many it wrote."""
        state = self.store.rows[state_table]
        order = [c.name for c in order_columns(table)]
        n = 0
        for r in rows:
            if r["id"] in state:
                continue
            created = r.get("time_created")
            state[r["id"]] = {
                "id": r["id"],
                "priority": r["priority"],
                "time_next": r["time_next"] if (r["epoch"] or 0) == 0 else None,
                "epoch": 0,
                "time_acked": None,
                "time_created": now_ns if created is None else created,
                "last_error": None,
                "time_dead": None,
                **{c: r[c] for c in order},
            }
            n += 1
        return n

    def alter_subscription(self, sub: Subscription) -> None:
        self._up()
        with self.store.lock:
            old = self.definitions.get((sub.table, sub.name))
            if old is None:
                raise TableNotFound(f"subscription {sub.label} not found")
            self.definitions[(sub.table, sub.name)] = dataclasses.replace(
                sub, time_created_ns=old.time_created_ns, time_active_ns=old.time_active_ns
            )

    def drop_subscription(self, table: str, name: str, state_table: str) -> None:
        self._up()
        with self.store.lock:
            if self.definitions.pop((table, name), None) is None:
                raise TableNotFound(f"subscription {table}/{name} not found")
            self.state_tables.discard(state_table)
            self.cursors.pop((table, name), None)
        self.store.drop_table(state_table)

    def subscription_cursor(self, table: str, name: str) -> int | None:
        self._up()
        with self.store.lock:
            return self.cursors.get((table, name))

    def advance_cursor(self, table: str, name: str, old: int, new: int) -> bool:
        self._up()
        with self.store.lock:
            if self.cursors.get((table, name)) != old:
                return False
            self.cursors[(table, name)] = new
            return True

    def restart_cursor(self, table: str, name: str) -> None:
        self._up()
        with self.store.lock:
            if (table, name) in self.cursors and table in self.sequences:
                self.cursors[(table, name)] = self.sequences[table]

    def unsent(
        self, table: TableConfig, loaded: LoadedSubscription, after: int, limit: int
    ) -> list[tuple[Hashable, int]]:
        self._up()
        rows = self.store._table(table.name)
        flt = loaded.filter
        with self.store.lock:
            state = self.store.rows.get(loaded.sub.state_table, {})
            found = sorted(
                (r[FANOUT_COLUMN], i)
                for i, r in rows.items()
                if (r.get(FANOUT_COLUMN) or 0) > after
                and i not in state
                and (flt is None or flt.matches(r))
            )
        return [(i, n) for n, i in found[:limit]]

    def unsent_rows(
        self, table: TableConfig, cfg: TableConfig, flt: Filter | None, after: int, limit: int
    ) -> Sequence[PolledRow]:
        self._up()
        rows = self.store._table(table.name)
        with self.store.lock:
            state = self.store.rows.get(cfg.name, {})
            found = sorted(
                (r[FANOUT_COLUMN], i)
                for i, r in rows.items()
                if (r.get(FANOUT_COLUMN) or 0) > after
                and i not in state
                and (flt is None or flt.matches(r))
            )[:limit]
            out = []
            for number, i in found:
                r = rows[i]
                nxt = r["time_next"] if table.default_group and (r["epoch"] or 0) == 0 else None
                values = tuple(r.get(c.name) for c in cfg.message_columns)
                out.append((r["priority"], nxt, 0, *values, r.get("time_created"), number))
        return out

    def table_indexes(self, table: str) -> list[tuple[str, ...]]:
        self._up()
        return list(self.indexes.get(table, []))

    def unsent_lag(
        self, table: TableConfig, loaded: LoadedSubscription, cap: int
    ) -> tuple[int, int | None]:
        self._up()
        after = self.cursors.get((table.name, loaded.sub.name))
        if after is None:
            return 0, None
        rows = self.store._table(table.name)
        flt = loaded.filter
        with self.store.lock:
            state = self.store.rows.get(loaded.sub.state_table, {})
            created = [
                r.get("time_created")
                for i, r in sorted(rows.items(), key=lambda kv: kv[1].get(FANOUT_COLUMN) or 0)
                if (r.get(FANOUT_COLUMN) or 0) > after
                and i not in state
                and (flt is None or flt.matches(r))
            ][:cap]
        known = [c for c in created if c is not None]
        return len(created), min(known) if known else None

    def write_state_rows(
        self, cfg: TableConfig, rows: Sequence[StateRow], acked_ns: int | None = None
    ) -> int:
        self._up()
        with self.store.lock:
            state = self.store.rows.get(cfg.name)
            if state is None:
                raise TableNotFound(f"message table {cfg.name!r} no longer exists")
            for rid, priority, time_next, epoch, created in rows:
                row = state.get(rid)
                if row is None:
                    state[rid] = {
                        "id": rid,
                        "priority": priority,
                        "time_next": time_next,
                        "epoch": epoch,
                        "time_acked": acked_ns,
                        "time_created": created,
                        "last_error": None,
                        "time_dead": None,
                    }
                elif acked_ns is not None and row["time_next"] != DEAD_TIME_NEXT:
                    row["time_acked"] = row["time_acked"] or acked_ns
                    row["time_next"] = None
        return len(rows)

    def written_of(self, cfg: TableConfig, ids: Sequence[Hashable]) -> set[Hashable]:
        self._up()
        with self.store.lock:
            state = self.store.rows.get(cfg.name)
            if state is None:
                raise TableNotFound(f"message table {cfg.name!r} no longer exists")
            return {i for i in ids if i in state}

    @staticmethod
    def _highest(rows: Mapping[Hashable, dict[str, Any]]) -> int:
        """The highest time_fanout of a table's rows (0: none): where its sequence starts."""
        return max((r.get(FANOUT_COLUMN) or 0 for r in rows.values()), default=0)

    def set_subscription_state(
        self, sub: Subscription, state: SubscriptionState, now_ns: int
    ) -> None:
        self._up()
        with self.store.lock:
            old = self.definitions.get((sub.table, sub.name))
            if old is not None:
                self.definitions[(sub.table, sub.name)] = dataclasses.replace(
                    old, state=state, time_active_ns=now_ns
                )

    def touch_subscriptions(self, subs: Sequence[Subscription], now_ns: int) -> None:
        if not subs:
            return
        self._up()
        with self.store.lock:
            for sub in subs:
                old = self.definitions.get((sub.table, sub.name))
                if old is not None:
                    self.definitions[(sub.table, sub.name)] = dataclasses.replace(
                        old, time_active_ns=now_ns
                    )

    def subscription_lag(
        self, state_tables: Mapping[str, str], cap: int
    ) -> dict[str, tuple[int, int | None]]:
        self._up()
        out: dict[str, tuple[int, int | None]] = {}
        with self.store.lock:
            for name, source in state_tables.items():
                state, rows = self.store.rows.get(name), self.store.rows.get(source)
                if state is None or rows is None:
                    continue
                lag = [
                    s["time_created"]
                    for i, s in sorted(state.items())
                    if s["time_acked"] is None and s["time_next"] != DEAD_TIME_NEXT and i in rows
                ][:cap]
                created = [c for c in lag if c is not None]
                out[name] = (len(lag), min(created) if created else None)
        return out

    def delete_orphans(
        self, state_table: str, source: str, after: Hashable | None, limit: int
    ) -> tuple[int, Hashable | None]:
        self._up()
        with self.store.lock:
            state, rows = self.store.rows.get(state_table), self.store.rows.get(source)
            if state is None or rows is None:
                return 0, None
            ids: list[Any] = sorted(i for i, s in state.items() if s["time_acked"] is None)
            if after is not None:
                ids = [i for i in ids if i > after]
            step = ids[:limit]
            orphans = [i for i in step if i not in rows]
            for i in orphans:
                del state[i]
        return len(orphans), (step[-1] if len(step) == limit else None)

    def pending_fanout(self, table: str, cap: int) -> int:
        self._up()
        rows = self.store._table(table)
        with self.store.lock:
            return min(cap, sum(1 for r in rows.values() if r.get(FANOUT_COLUMN) is None))

    def fanout(
        self,
        table: TableConfig,
        loaded: Mapping[str, LoadedSubscription],
        now_ns: int,
        limit: int,
    ) -> tuple[dict[str, int], set[str]]:
        self._up()
        rows = self.store._table(table.name)
        with self.store.lock:
            unseen = sorted((i, r) for i, r in rows.items() if r.get(FANOUT_COLUMN) is None)
            picked = [r for _, r in unseen[:limit]]
            if not picked:
                return {"": 0}, set()
            active = sorted(
                n
                for (t, n), sub in self.definitions.items()
                if t == table.name and sub.state is SubscriptionState.ACTIVE
            )
            unknown = {n for n in active if n not in loaded}
            if unknown:
                return {"": 0}, unknown
            gone = [n for n in active if loaded[n].sub.state_table not in self.store.rows]
            if gone:  # the transaction rolls back whole
                state = loaded[gone[0]].sub.state_table
                raise TableNotFound(f"message table {state!r} no longer exists")
            got: dict[str, int] = {}
            for name in active:
                flt = loaded[name].filter
                passed = [r for r in picked if flt is None or flt.matches(r)]
                if passed and loaded[name].sub.lazy:  # read by its cursor's scan
                    got[name] = len(passed)
                elif passed:
                    state = loaded[name].sub.state_table
                    got[name] = self._hand(table, state, passed, now_ns)
            last = self.sequences.get(table.name)
            if last is None:  # started above every number (or time) there
                last = self._highest(rows)
            for r in picked:
                last += 1
                self._mark(table, r, now_ns, last)
            self.sequences[table.name] = last
        got[""] = len(picked)
        return got, set()
