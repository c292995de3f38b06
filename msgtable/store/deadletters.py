"""Every SQL statement of dead letters: the burial of dead messages (moved to a dead-letter
table, or marked dead in place), their listing and count, and the redrive that moves them back
(what dead means: msgtable.core.deadletters). MySQLStore runs them; the rest of the engine's SQL
is in msgtable.store.statements.

A move is one transaction: a locking read picks the rows (still unacked and alive, and for a
death by vt_max_attempts still at the epoch read and due), an INSERT ... SELECT copies exactly
those, a DELETE removes exactly those (on a table with subscriptions an UPDATE settles them
for the default group instead: the subscriptions still hold them), then the commit; a crash
before the commit leaves all of them where they were. The INSERTs carry no statement mark,
so the binlog follower of every server sees them as new rows of their table (it polls that
table at once).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from msgtable.core.deadletters import (
    ATTEMPTS_COLUMN,
    DeadLetter,
    Move,
    RedriveBatch,
    exhausted_reason,
)
from msgtable.core.sql import MARK, in_list, quote
from msgtable.core.tables import (
    DEAD_TIME_NEXT,
    LAST_ERROR_COLUMN,
    TIME_DEAD_COLUMN,
    Layout,
    TableConfig,
    text_limit,
)
from msgtable.limits import COUNT_DEAD_CAP
from msgtable.store.protocol import Uncounted
from msgtable.store.statements import BY_ID

# The last error of a message rejected without a reason (and none of its own).
REJECTED_REASON = "rejected"


def _q(name: str) -> str:
    """A quoted identifier for a template that str.format() fills (its braces doubled)."""
    return quote(name).replace("{", "{{").replace("}", "}}")


def _error_expr(cfg: TableConfig, source: str) -> str:
    """The last error as written to ``cfg``'s last_error: the reason (a parameter), else
    ``source`` (the row's own, or NULL), else a parameter (the default), cut to fit."""
    col = next(c for c in cfg.columns if c.name == LAST_ERROR_COLUMN)
    return f"LEFT(COALESCE(%s, {source}, %s), {text_limit(col)})"


def first_expr(first: Uncounted) -> tuple[str, list[Any]]:
    """An SQL expression true for the rows of ``first`` (sent, their send not counted yet)
    still at the epoch their send read: a row whose postpone committed unheard was counted."""
    if not first:
        return "FALSE", []
    by_epoch: dict[int | None, list[Hashable]] = {}
    for rid, epoch in first.items():
        by_epoch.setdefault(epoch, []).append(rid)
    terms: list[str] = []
    params: list[Any] = []
    for epoch, group in by_epoch.items():
        in_group, group_params = in_list(group)
        terms.append(f"(`id` IN ({in_group}) AND `epoch` <=> %s)")
        params += [*group_params, epoch]
    return terms[0] if len(terms) == 1 else "(" + " OR ".join(terms) + ")", params


def delivery_expr(
    ids: Sequence[Hashable], attempts: Sequence[int] | None, first_sql: str, first_params: list[Any]
) -> tuple[str, list[Any]]:
    """An SQL condition true for the rows of ``ids`` whose current delivery is the one a
    release or renew answers (msgtable.core.settlement): attempt ``a`` of an id matches while the
    row's sends, counted with its uncounted one (``first_sql``), are ``a``. An attempt of 0,
    or ``attempts`` None, matches any delivery. Ids of one attempt share a term; when all
    share one, the statement's own IN list is enough."""
    if attempts is None:
        return "TRUE", []
    by_attempt: dict[int, list[Hashable]] = {}
    for rid, attempt in zip(ids, attempts, strict=True):
        by_attempt.setdefault(attempt, []).append(rid)
    if len(by_attempt) == 1:  # the usual call (one batch): no second IN list of its ids
        (attempt,) = by_attempt
        if attempt == 0:
            return "TRUE", []
        return f"COALESCE(`epoch`, 0) + ({first_sql}) = {attempt:d}", list(first_params)
    terms: list[str] = []
    params: list[Any] = []
    for attempt, group in by_attempt.items():
        in_group, group_params = in_list(group)
        if attempt == 0:
            terms.append(f"`id` IN ({in_group})")
            params += group_params
        else:
            terms.append(
                f"(`id` IN ({in_group}) AND COALESCE(`epoch`, 0) + ({first_sql}) = {attempt:d})"
            )
            params += [*group_params, *first_params]
    return "(" + " OR ".join(terms) + ")", params


class DeadStatements:
    """The SQL of one table's dead messages (``dead``: its dead-letter table, None: in place)."""

    def __init__(self, cfg: TableConfig, dead: TableConfig | None) -> None:
        self.cfg, self.dead = cfg, dead
        t = _q(cfg.name)
        rid, epoch, acked = quote("id"), quote("epoch"), quote("time_acked")
        raw_next = quote("time_next")
        alive = f"{acked} IS NULL AND NOT ({raw_next} <=> {DEAD_TIME_NEXT})"
        if cfg.layout is Layout.CURRENT:
            due = f"({raw_next} IS NULL OR {raw_next} <= %s)"
        else:
            due = f"COALESCE({raw_next}, {quote('time_scheduled')}, 0) <= %s"
        # the rows a burial takes: by id (a reject), or also at an epoch and due (an expiry)
        self.pick = f"SELECT {rid} FROM {t} {BY_ID} WHERE {rid} IN ({{ids}}) AND {alive}"
        self.pick_expired = f"{self.pick} AND {epoch} <=> %s AND {due} FOR UPDATE"
        self.pick += " FOR UPDATE"
        own_error = _q(LAST_ERROR_COLUMN) if cfg.keeps_errors else "NULL"
        if dead is None:
            sets = [
                f"{epoch} = COALESCE({epoch}, 0) + ({{first}})",
                f"{raw_next} = {DEAD_TIME_NEXT}",
            ]
            if cfg.keeps_errors:
                sets.append(f"{_q(LAST_ERROR_COLUMN)} = {_error_expr(cfg, own_error)}")
            if cfg.has_column(TIME_DEAD_COLUMN):
                sets.append(f"{_q(TIME_DEAD_COLUMN)} = %s")
            self.in_place = (
                f"{MARK}UPDATE {t} {BY_ID} SET {', '.join(sets)} WHERE {rid} IN ({{ids}})"
            )
            where_dead = f"{acked} IS NULL AND {raw_next} = {DEAD_TIME_NEXT}"
            time_dead = _q(TIME_DEAD_COLUMN) if cfg.has_column(TIME_DEAD_COLUMN) else "NULL"
            error = own_error
            attempts = f"COALESCE({epoch}, 0)"
            listed = t
        else:
            move = Move.between(cfg, dead)
            d = _q(dead.name)
            cols = [_q(c) for c in move.values]
            engine = _fresh_columns(dead)
            into = [
                *cols,
                quote(TIME_DEAD_COLUMN),
                quote(ATTEMPTS_COLUMN),
                quote(LAST_ERROR_COLUMN),
            ]
            into += [quote(c) for c, _ in engine]
            values = [
                *cols,
                "%s",
                f"COALESCE({epoch}, 0) + ({{first}})",
                _error_expr(dead, own_error),
            ]
            values += [v for _, v in engine]
            update = ", ".join(f"{c} = VALUES({c})" for c in into if c != quote("id"))
            # A dead letter of the same id already there (a message enqueued again under an
            # id that died before): the newer death replaces it, rather than block the move.
            self.copy = (
                f"INSERT INTO {d} ({', '.join(into)}) SELECT {', '.join(values)} FROM {t} {BY_ID} "
                f"WHERE {rid} IN ({{ids}}) ON DUPLICATE KEY UPDATE {update}"
            )
            # With subscriptions the row is theirs too (msgtable.core.subscriptions): it stays,
            # settled for the default group, until each of them settled it (then the purge
            # takes it); a row not handed to them yet still will be.
            self.remove = (
                f"{MARK}UPDATE {t} {BY_ID} SET {acked} = %s, {raw_next} = NULL "
                f"WHERE {rid} IN ({{ids}})"
                if cfg.fanout
                # the rows it picked alive (naming time_acked keeps MariaDB on the key)
                else f"{MARK}DELETE {t} FROM {t} {BY_ID} WHERE {rid} IN ({{ids}}) "
                f"AND {acked} IS NULL"
            )
            where_dead = f"{acked} IS NULL"
            time_dead, attempts = _q(TIME_DEAD_COLUMN), _q(ATTEMPTS_COLUMN)
            error = _q(LAST_ERROR_COLUMN)
            listed = d
        self.listing = (
            f"SELECT {rid}, {time_dead}, {attempts}, {error} FROM {listed} WHERE {where_dead}"
        )
        self.count = (
            f"SELECT COUNT(*) FROM (SELECT 1 FROM {listed} WHERE {where_dead} "
            f"LIMIT {COUNT_DEAD_CAP}) AS dead"
        )

    def bury(
        self,
        cur: Any,
        ids: Sequence[Hashable],
        now_ns: int,
        reason: str | None,
        first: Uncounted,
        due_at_epoch: tuple[int | None] | None,
    ) -> list[Hashable]:
        """Bury those of ``ids`` still alive (and, with ``due_at_epoch``, at that epoch and
        due) in the transaction of ``cur``; returns the ids buried. The caller commits."""
        in_ids, id_params = in_list(ids)
        if due_at_epoch is None:
            cur.execute(self.pick.format(ids=in_ids), id_params)
        else:
            cur.execute(self.pick_expired.format(ids=in_ids), [*id_params, due_at_epoch[0], now_ns])
        picked = [r[0] for r in cur.fetchall()]
        if not picked:
            return []
        in_ids, id_params = in_list(picked)
        chosen = set(picked)
        first_sql, first_params = first_expr({i: e for i, e in first.items() if i in chosen})
        if due_at_epoch is None:
            default = REJECTED_REASON
        else:
            default = exhausted_reason(self.cfg.max_attempts or (due_at_epoch[0] or 0))
        if self.dead is None:
            params: list[Any] = list(first_params)
            if self.cfg.keeps_errors:
                params += [reason, default]
            if self.cfg.has_column(TIME_DEAD_COLUMN):
                params.append(now_ns)
            cur.execute(self.in_place.format(ids=in_ids, first=first_sql), [*params, *id_params])
            return picked
        params = [now_ns, *first_params, reason, default]
        params += _fresh_params(self.dead, now_ns)
        cur.execute(self.copy.format(ids=in_ids, first=first_sql), [*params, *id_params])
        settled = [now_ns] if self.cfg.fanout else []
        cur.execute(self.remove.format(ids=in_ids), [*settled, *id_params])
        return picked

    def list(self, cur: Any, after: Hashable | None, limit: int) -> list[DeadLetter]:
        sql, params = self.listing, []
        if after is not None:
            sql += " AND `id` > %s"
            params.append(after)
        cur.execute(sql + " ORDER BY `id` LIMIT %s", [*params, limit])
        return [
            DeadLetter(r[0], None if r[1] is None else int(r[1]), int(r[2] or 0), _text(r[3]))
            for r in cur.fetchall()
        ]


def _text(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _fresh_columns(cfg: TableConfig) -> list[tuple[str, str]]:
    """The engine columns of a row arriving in a message table, and their values' SQL: not
    sent yet, due now (``%s``: now), not acked."""
    out = [("epoch", "0"), ("time_next", "%s"), ("time_acked", "NULL")]
    if cfg.layout is Layout.V2018:
        out.append(("time_scheduled", "%s"))
    return out


def _fresh_params(cfg: TableConfig, now_ns: int) -> list[int]:
    return [now_ns, now_ns] if cfg.layout is Layout.V2018 else [now_ns]


class RedriveStatements:
    """The SQL of a redrive of ``dead``'s dead letters to ``target`` (the same table: dead
    in place, made alive again)."""

    def __init__(self, dead: TableConfig, target: TableConfig) -> None:
        self.dead, self.target = dead, target
        d = _q(dead.name)
        t = _q(target.name)
        rid, acked, raw_next = quote("id"), quote("time_acked"), quote("time_next")
        self.in_place = dead.name == target.name
        where = f"{acked} IS NULL"
        if self.in_place:
            where += f" AND {raw_next} = {DEAD_TIME_NEXT}"
        self.pick = f"SELECT {rid} FROM {d} WHERE {where}"
        if self.in_place:
            sets = [f"{quote('epoch')} = 0", f"{raw_next} = %s"]
            if dead.has_column(TIME_DEAD_COLUMN):
                sets.append(f"{_q(TIME_DEAD_COLUMN)} = NULL")
            self.revive = f"{MARK}UPDATE {d} {BY_ID} SET {', '.join(sets)} WHERE {rid} IN ({{ids}})"
            return
        # (time_acked selected too: with the key alone MariaDB scans the whole index: BY_ID)
        self.taken = f"SELECT {rid}, {acked} FROM {t} {BY_ID} WHERE {rid} IN ({{ids}}) FOR UPDATE"
        move = Move.between(dead, target)
        names = [n for n in move.values if n not in (TIME_DEAD_COLUMN, ATTEMPTS_COLUMN)]
        have = {c.name for c in dead.columns}
        names += [c.name for c in target.message_columns if c.name in have and c.name not in names]
        if target.keeps_errors and LAST_ERROR_COLUMN in have and LAST_ERROR_COLUMN not in names:
            names.append(LAST_ERROR_COLUMN)
        cols = [_q(n) for n in names]
        engine = _fresh_columns(target)
        into = ", ".join([*cols, *(_q(c) for c, _ in engine)])
        values = ", ".join([*cols, *(v for _, v in engine)])
        self.copy = (
            f"INSERT INTO {t} ({into}) SELECT {values} FROM {d} {BY_ID} WHERE {rid} IN ({{ids}})"
        )
        self.remove = (
            f"{MARK}DELETE {d} FROM {d} {BY_ID} WHERE {rid} IN ({{ids}}) AND {acked} IS NULL"
        )

    def batch(
        self,
        cur: Any,
        ids: Sequence[Hashable] | None,
        after: Hashable | None,
        limit: int,
        now_ns: int,
    ) -> RedriveBatch:
        """One batch in the transaction of ``cur`` (the caller commits)."""
        sql, params = self.pick, []
        if ids is not None:
            in_ids, id_params = in_list(ids)
            sql += f" AND `id` IN ({in_ids})"
            params += id_params
        if after is not None:
            sql += " AND `id` > %s"
            params.append(after)
        cur.execute(sql + " ORDER BY `id` LIMIT %s FOR UPDATE", [*params, limit])
        picked = [r[0] for r in cur.fetchall()]
        if not picked:
            return RedriveBatch(0, (), None)
        in_ids, id_params = in_list(picked)
        if self.in_place:
            cur.execute(self.revive.format(ids=in_ids), [now_ns, *id_params])
            return RedriveBatch(len(picked), (), picked[-1])
        cur.execute(self.taken.format(ids=in_ids), id_params)
        taken = {r[0] for r in cur.fetchall()}
        movable = [i for i in picked if i not in taken]
        if movable:
            in_ids, id_params = in_list(movable)
            engine_params = _fresh_params(self.target, now_ns)
            cur.execute(self.copy.format(ids=in_ids), [*engine_params, *id_params])
            cur.execute(self.remove.format(ids=in_ids), id_params)
        return RedriveBatch(len(movable), tuple(i for i in picked if i in taken), picked[-1])
