"""The SQL of ordering per key (msgtable.engine.ordered): an ordered table's reads, all through its
order index, bound with parameters like every statement of msgtable.store.statements (whose
TableStatements holds one OrderStatements for an ordered table's config); MySQLStore runs them
(it holds an OrderSQL).

* the keys with unsettled rows, in key order from a cursor: a loose index scan (GROUP BY the
  index's first column), one index read per key, whatever its backlog;
* the runs of given keys: each key's first unsettled live rows in order, one index range
  each, in one UNION ALL for up to RUN_KEYS_PER_STATEMENT keys;
* the due rows of no key (NULL), by id from a cursor.

Each row is read as a poll reads it, with its time_created, its order value, a value of its
key and the key's identity at the end (msgtable.engine.ordered.run_key). A subscription's state
table carries the key and order columns too (copied by the fan-out): its reads join the
message table for the values, as its poll does.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from msgtable.core.rows import PolledRow
from msgtable.core.sql import quote
from msgtable.core.tables import DEAD_TIME_NEXT, TEXT_TYPES, TableConfig

# The runs of at most this many keys are read in one statement.
RUN_KEYS_PER_STATEMENT = 100


def key_identity(cfg: TableConfig, key: str) -> str:
    """The SQL of a key's identity (msgtable.engine.ordered.run_key), ``key`` being the key column
    as the statement names it.

    A text key's identity is its collation's weight string, so that the values the column's
    collation holds equal ('a' = 'A' in most) are one key. Trailing blanks follow the
    collation too: a PAD SPACE one (MariaDB's defaults) holds 'a ' equal to 'a', and the
    weight string of the value without them is the key's; a NO PAD one (MySQL's default,
    utf8mb4_0900_ai_ci) does not, and there a value with them, unequal to itself trimmed, is
    weighed whole, a key of its own, which ``key = value`` finds (one identity for both
    would hold 'a ' in a key whose runs, read by 'a', never return it)."""
    text = next(c for c in cfg.columns if c.name == cfg.order_key).data_type in TEXT_TYPES
    if not text:
        return key
    trimmed = f"TRIM(TRAILING ' ' FROM {key})"
    return f"IF({key} = {trimmed}, WEIGHT_STRING({trimmed}), WEIGHT_STRING({key}))"


class OrderStatements:
    """An ordered table's reads, written once from its config (see the module docstring)."""

    def __init__(self, cfg: TableConfig, values: str, epoch: str) -> None:
        """``values``: the message columns as the table's poll selects them; ``epoch``: the
        quoted epoch column."""
        p = "s." if cfg.source else ""
        t, idx = quote(cfg.name), quote(cfg.order_index)
        key, by, rid = p + quote(cfg.order_key), p + quote(cfg.order_by), p + quote("id")
        acked, raw_next = p + quote("time_acked"), p + quote("time_next")
        # A text key compares by its collation: its weight string (key_identity says how
        # trailing blanks count) is the key's identity in memory, and any of its values
        # finds its rows.
        same = key_identity(cfg, key)
        # time_created (NULL for a table without it): the created -> sent delay
        created = p + quote("time_created") if cfg.has_column("time_created") else "NULL"
        cols = (
            f"{p}{quote('priority')}, {raw_next}, {p}{epoch}, {values}, {created}, {by}, {key}, "
            f"{same}"
        )
        source = f"{t} FORCE INDEX ({idx})"
        if cfg.source:
            source = (
                f"{t} s FORCE INDEX ({idx}) JOIN {quote(cfg.source)} m ON m.{quote('id')} = {rid}"
            )
            keys_from = f"{t} s FORCE INDEX ({idx})"
        else:
            keys_from = source
        keys = (
            f"SELECT {key}, {same} FROM {keys_from} WHERE {{where}} AND {acked} IS NULL "
            f"GROUP BY {key}"
        )
        self.order_keys = keys.format(where=f"{key} IS NOT NULL") + f" ORDER BY {key} LIMIT %s"
        self.order_keys_after = keys.format(where=f"{key} > %s") + f" ORDER BY {key} LIMIT %s"
        order = rid if cfg.order_by == "id" else f"{by}, {rid}"
        self.run = (
            f"(SELECT {cols} FROM {source} WHERE {key} = %s AND {acked} IS NULL "
            f"AND NOT ({raw_next} <=> {DEAD_TIME_NEXT}) ORDER BY {order} LIMIT %s)"
        )
        unkeyed = (
            f"SELECT {cols} FROM {source} WHERE {key} IS NULL AND {acked} IS NULL "
            f"AND ({raw_next} IS NULL OR {raw_next} <= %s)"
        )
        self.unkeyed = unkeyed + f" ORDER BY {rid} LIMIT %s"
        self.unkeyed_after = unkeyed + f" AND {rid} > %s ORDER BY {rid} LIMIT %s"

    def runs_query(self, keys: Sequence[object], per_key: int) -> tuple[str, list[Any]]:
        """One statement reading the runs of ``keys`` (at most RUN_KEYS_PER_STATEMENT)."""
        params: list[Any] = []
        for k in keys:
            params += [k, per_key]
        return " UNION ALL ".join([self.run] * len(keys)), params


class _Statements(Protocol):
    order: OrderStatements | None


class _Store(Protocol):
    def statements(self, cfg: TableConfig) -> _Statements: ...

    def _errors(
        self, table: str | None = None, kind: str = "other"
    ) -> AbstractContextManager[None]: ...

    def _auto_cursor(self) -> AbstractContextManager[Any]: ...


def _order(store: _Store, cfg: TableConfig) -> OrderStatements:
    order = store.statements(cfg).order
    if order is None:
        raise ValueError(f"table {cfg.name} is not ordered")
    return order


class OrderSQL:
    """Ordering per key's reads, run on a store's pools: MySQLStore holds one and its
    order_keys, runs and unkeyed are this object's."""

    def __init__(self, pools: _Store) -> None:
        self._pools = pools

    @contextmanager
    def _cursor(self, table: str | None = None, *, kind: str) -> Iterator[Any]:
        """A cursor on the store's autocommit pool, its errors the store's (counted, timed
        as ``kind``)."""
        with self._pools._errors(table, kind=kind), self._pools._auto_cursor() as cur:
            yield cur

    def order_keys(
        self, cfg: TableConfig, after: object | None, limit: int
    ) -> list[tuple[object, Hashable]]:
        """Up to ``limit`` keys with unsettled rows, in key order, after ``after``: each as
        a value of it and its identity (msgtable.engine.ordered.run_key)."""
        s = _order(self._pools, cfg)
        sql, params = (
            (s.order_keys, [limit]) if after is None else (s.order_keys_after, [after, limit])
        )
        with self._cursor(cfg.name, kind="order_keys") as cur:
            cur.execute(sql, params)
            return [(r[0], r[1]) for r in cur.fetchall()]

    def runs(self, cfg: TableConfig, keys: Sequence[object], per_key: int) -> list[PolledRow]:
        """The first ``per_key`` unsettled, live rows of each key, in order, as a poll reads
        them with the order value and the key at the end."""
        s = _order(self._pools, cfg)
        rows: list[PolledRow] = []
        with self._cursor(cfg.name, kind="order_runs") as cur:
            for i in range(0, len(keys), RUN_KEYS_PER_STATEMENT):
                sql, params = s.runs_query(keys[i : i + RUN_KEYS_PER_STATEMENT], per_key)
                cur.execute(sql, params)
                rows += cur.fetchall()
        return rows

    def unkeyed(
        self, cfg: TableConfig, now_ns: int, after: Hashable | None, limit: int
    ) -> list[PolledRow]:
        """Up to ``limit`` due, unsettled rows with a NULL key, by id, after ``after``."""
        s = _order(self._pools, cfg)
        sql, params = (
            (s.unkeyed, [now_ns, limit])
            if after is None
            else (s.unkeyed_after, [now_ns, after, limit])
        )
        with self._cursor(cfg.name, kind="order_unkeyed") as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())
