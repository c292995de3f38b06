"""The fan-out's SQL of one message table and its subscriptions (msgtable.store.subscriptions
runs it, in the fan-out's transaction): the pick of rows no subscription has seen, the
filters' verdicts, an ordered table's rows in key order, the INSERT into each eager
subscription's state table, the numbering, and the retained rows of a subscription created
from_start.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from msgtable.core.filters import Filter
from msgtable.core.rows import order_of
from msgtable.core.sql import MARK, in_list, quote
from msgtable.core.subscriptions import FANOUT_COLUMN, order_columns
from msgtable.core.tables import TableConfig
from msgtable.store.ordering import key_identity
from msgtable.store.statements import BY_ID


class FanoutStatements:
    """The fan-out SQL of one message table and its subscriptions.

    The pick reads each row once, with what its state rows need and, per filtered
    subscription, whether its filter (a WHERE fragment with bound parameters) passes it; the
    rows are then written into each state table with a multi-row INSERT: no row of the
    message table is read twice."""

    def __init__(self, table: TableConfig) -> None:
        self.table = table
        self._t = quote(table.name)
        self._created = "`time_created`" if table.has_column("time_created") else "NULL"
        # a message not sent by the default group yet keeps its time_next (a delayed
        # message stays delayed); one it sent is due at once
        self._columns = f"`id`, `priority`, IF(`epoch` = 0, `time_next`, NULL), {self._created}"
        # an ordered table's key (and order) column: each state row carries them; a picked
        # row has then its key's identity and its order value too (in_key_order)
        self.order = tuple(c.name for c in order_columns(table))
        self.width = 4 + len(self.order)  # a picked row's state values
        self._columns += "".join(f", {quote(n)}" for n in self.order)
        self.verdicts_at = self.width  # where the filters' verdicts begin
        if table.ordered:
            key, by = quote(table.order_key), quote(table.order_by)
            self._columns += f", {key_identity(table, key)}, {by}"
            self.verdicts_at += 2
            # (joined with the ids and keys at each use: the names may hold braces)
            self._skipped = (
                f"SELECT {key_identity(table, key)}, {by}, `id` FROM {self._t} "
                f"WHERE {quote(FANOUT_COLUMN)} IS NULL AND `id` <= %s AND `id` NOT IN (",
                f") AND {key} IN (",
                ")",
            )
        acked = "" if table.default_group else ", `time_acked` = COALESCE(`time_acked`, %s)"
        self._acked_param = not table.default_group
        # each row its own number of the sequence (msgtable.store.sequences): the
        # batch's first less one + its place among the ids, which come in id (key) order
        self.mark = (
            f"{MARK}UPDATE {self._t} {BY_ID} SET {quote(FANOUT_COLUMN)} = "
            f"%s + FIELD(`id`, {{ids}}){acked} WHERE `id` IN ({{ids}})"
        )

    def _select(self, filters: Sequence[Filter | None]) -> tuple[str, list[Any]]:
        """The columns a state row needs, then one 0/1 column per filter."""
        parts: list[str] = [self._columns]
        params: list[Any] = []
        for flt in filters:
            if flt is not None:
                frag, fparams = flt.where()
                parts.append(f"({frag}) IS TRUE")
                params.extend(fparams)
        return ", ".join(parts), params

    def pick(self, filters: Sequence[Filter | None], limit: int) -> tuple[str, list[Any]]:
        """Rows no subscription has seen, a batch, locked (a row still being written by an
        open transaction is skipped: it comes in a later batch once committed)."""
        cols, params = self._select(filters)
        sql = (
            f"SELECT {cols} FROM {self._t} WHERE {quote(FANOUT_COLUMN)} IS NULL "
            "ORDER BY `id` LIMIT %s FOR UPDATE SKIP LOCKED"
        )
        return sql, [*params, limit]

    def skipped_sql(self, picked: Sequence[Sequence[Any]]) -> tuple[str, list[Any]]:
        """An ordered table's rows of the picked rows' keys, among the picked ids, that the
        pick skipped (locked by another transaction: an ack by DML not committed yet, the
        default group's send), read without a lock: committed rows, locked or not."""
        in_ids, id_params = in_list([r[0] for r in picked])
        keys = list({r[4] for r in picked if r[4] is not None})
        in_keys = ",".join(["%s"] * len(keys))
        top = max(r[0] for r in picked)
        head, middle, tail = self._skipped
        return head + in_ids + middle + in_keys + tail, [top, *id_params, *keys]

    def in_key_order(
        self, picked: Sequence[Sequence[Any]], skipped: Sequence[Sequence[Any]]
    ) -> list[Sequence[Any]]:
        """The picked rows that come before every skipped row of their key (the others wait
        for a later fan-out, so a subscription never gets a key's messages out of order)."""
        first: dict[Any, tuple[Any, ...]] = {}
        for identity, by, rid in skipped:
            at = order_of(by, rid)
            if identity not in first or at < first[identity]:
                first[identity] = at
        w = self.width
        return [r for r in picked if r[w] not in first or order_of(r[w + 1], r[0]) < first[r[w]]]

    def retained(
        self, flt: Filter | None, after: Hashable | None, limit: int
    ) -> tuple[str, list[Any]]:
        """One batch (by id) of the retained rows a filter passes and the default group (if
        the table has one) has not acked: what a subscription created from_start gets
        besides the new ones (with an index on the filter's column, read through it)."""
        cols, _ = self._select(())
        sql = f"SELECT {cols} FROM {self._t} WHERE {quote(FANOUT_COLUMN)} IS NOT NULL"
        if self.table.default_group:  # else the fan-out acked every row: all are retained
            sql += " AND `time_acked` IS NULL"
        params: list[Any] = []
        if flt is not None:
            frag, fparams = flt.where()
            sql += f" AND {frag}"
            params.extend(fparams)
        if after is not None:
            sql += " AND `id` > %s"
            params.append(after)
        return sql + " ORDER BY `id` LIMIT %s", [*params, limit]

    def insert(
        self, state_table: str, rows: Sequence[Sequence[Any]], now_ns: int
    ) -> tuple[str, list[Any]]:
        """A multi-row INSERT of (id, priority, time_next, time_created[, key, order]) rows
        as the pick read them into a state table (epoch 0; a row it has already is kept)."""
        values: list[str] = []
        params: list[Any] = []
        for row in rows:
            rid, priority, time_next, created = row[:4]
            one = []
            state = (rid, priority, time_next, now_ns if created is None else created)
            for v in (*state, *row[4 : self.width]):
                if v is None:
                    one.append("NULL")
                elif type(v) is int:  # digits and a sign only: written as they are
                    one.append(str(v))
                else:
                    one.append("%s")
                    params.append(v)
            values.append(f"({one[0]}, {one[1]}, {one[2]}, 0, {', '.join(one[3:])})")
        s = quote(state_table)
        extra = "".join(f", {quote(n)}" for n in self.order)
        sql = (
            f"{MARK}INSERT INTO {s} (`id`, `priority`, `time_next`, `epoch`, `time_created`"
            f"{extra}) VALUES {', '.join(values)} ON DUPLICATE KEY UPDATE {s}.`id` = {s}.`id`"
        )
        return sql, params

    def mark_sql(self, ids: Sequence[Hashable], last: int, now_ns: int) -> tuple[str, list[Any]]:
        """Hand ``ids`` (in id order) over: numbers last - len(ids) + 1 ... last of the
        sequence (and, without a default group, acked at ``now_ns``)."""
        in_ids, params = in_list(ids)
        extra = [now_ns] if self._acked_param else []
        return self.mark.format(ids=in_ids), [last - len(ids), *params, *extra, *params]
