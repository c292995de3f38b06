"""Every SQL statement of subscriptions (what they are: msgtable.core.subscriptions): the
definitions table, the state tables, the fan-out of new rows, lag, expiry. MySQLStore runs
them (it holds a SubscriptionSQL); the statements that serve a subscription's messages are the
table statements of msgtable.store.statements, run on its state table.

The fan-out of a batch is one transaction: a locking read of rows no subscription has seen
(``time_fanout IS NULL``, skipping rows another transaction still holds: they come in a later
batch once they commit), a shared read of the table's definitions (a definition committed
while a fan-out runs waits for it, or is seen by it: never half), one INSERT ... SELECT into
each active subscription's state table (its filter a WHERE clause with bound parameters), the
table's counter row of the fan-out sequence (msgtable.store.sequences: its lock held from
here to the commit only), one UPDATE of time_fanout numbering the rows in id order, then the
commit. A crash before the commit leaves every row unseen.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from msgtable.core.filters import Filter
from msgtable.core.rows import PolledRow
from msgtable.core.sql import MARK, in_list, quote
from msgtable.core.subscriptions import (
    EAGER,
    FANOUT_COLUMN,
    REGISTRY_TABLE,
    STATE_COMMENT,
    STATE_ORDER_INDEX,
    LoadedSubscription,
    StateRow,
    Subscription,
    SubscriptionState,
    limits_text,
    order_columns,
    parse_columns,
    parse_limits,
    state_order_index,
)
from msgtable.core.tables import DEAD_TIME_NEXT, Column, TableConfig
from msgtable.errors import InvalidArgument, TableNotFound
from msgtable.store import sequences as sequence
from msgtable.store.fanout import FanoutStatements
from msgtable.store.mysql import DUPLICATE_KEY, error_code, server_text
from msgtable.store.statements import BY_ID

log = logging.getLogger(__name__)

MARK_BATCH = 10_000  # rows marked seen per statement when a table gets its first subscription
BACKFILL_BATCH = 5_000

REGISTRY = quote(REGISTRY_TABLE)
REGISTRY_DDL = f"""CREATE TABLE IF NOT EXISTS {REGISTRY} (
  table_name VARCHAR(64) NOT NULL,
  name VARCHAR(64) NOT NULL,
  filter TEXT NULL,
  columns TEXT NULL,
  ack_wait_s DOUBLE NULL,
  max_attempts INT NULL,
  max_lag BIGINT NULL,
  expire_after_s DOUBLE NULL,
  state VARCHAR(16) NOT NULL DEFAULT 'active',
  time_created BIGINT NOT NULL,
  time_active BIGINT NULL,
  limits TEXT NULL,
  state_rows VARCHAR(8) NULL,
  PRIMARY KEY (table_name, name)
) ENGINE=InnoDB COMMENT 'msgtable subscriptions'"""

_FIELDS = (
    "table_name, name, filter, columns, ack_wait_s, max_attempts, max_lag, expire_after_s, "
    "state, time_created, time_active, limits, state_rows"
)
# columns a definitions table made by an earlier version lacks (added by the first create or
# alter: REGISTRY_UPGRADES); read as NULL (no limits of its own; eager state rows) till then
LATER_COLUMNS = ("limits", "state_rows")
REGISTRY_UPGRADES = {
    "limits": f"ALTER TABLE {REGISTRY} ADD COLUMN limits TEXT NULL",
    "state_rows": f"ALTER TABLE {REGISTRY} ADD COLUMN state_rows VARCHAR(8) NULL",
}


def select_all(have: set[str]) -> str:
    """Every definition, from a definitions table with the columns ``have``."""
    fields = _FIELDS
    for col in LATER_COLUMNS:
        if col not in have:
            fields = fields.replace(f", {col}", ", NULL")
    return f"SELECT {fields} FROM {REGISTRY} ORDER BY table_name, name"


SELECT_ALL = select_all(set(LATER_COLUMNS))
# read after the fan-out picked its rows: a row committed after a definition is picked
# after it, so the read sees the definition (READ COMMITTED reads the latest commit)
SELECT_TABLE = f"SELECT name, state FROM {REGISTRY} WHERE table_name = %s"
INSERT = f"INSERT INTO {REGISTRY} ({_FIELDS}) VALUES ({', '.join(['%s'] * 13)})"
UPDATE = (
    f"UPDATE {REGISTRY} SET filter = %s, columns = %s, ack_wait_s = %s, max_attempts = %s, "
    "max_lag = %s, expire_after_s = %s, state = %s, limits = %s "
    "WHERE table_name = %s AND name = %s"
)
DELETE = f"DELETE FROM {REGISTRY} WHERE table_name = %s AND name = %s"
# ``{pairs}``: one "(%s, %s)" per (table_name, name)
TOUCH = f"UPDATE {REGISTRY} SET time_active = %s WHERE (table_name, name) IN ({{pairs}})"
SET_STATE = (
    f"UPDATE {REGISTRY} SET state = %s, time_active = %s WHERE table_name = %s AND name = %s"
)
STATE_COLUMNS_QUERY = (
    "SELECT c.TABLE_NAME, c.COLUMN_NAME, c.DATA_TYPE, c.COLUMN_TYPE "
    "FROM information_schema.COLUMNS c JOIN information_schema.TABLES t "
    "ON t.TABLE_SCHEMA = c.TABLE_SCHEMA AND t.TABLE_NAME = c.TABLE_NAME "
    "WHERE c.TABLE_SCHEMA = %s AND t.TABLE_COMMENT = %s ORDER BY c.TABLE_NAME, c.ORDINAL_POSITION"
)
REGISTRY_COLUMNS = (
    "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
)


TABLE_INDEXES = (
    "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS "
    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY INDEX_NAME, SEQ_IN_INDEX"
)


def state_table_ddl(
    name: str, id_column: Column, order: Sequence[Column] = (), index: Sequence[str] = ()
) -> str:
    """The DDL of a subscription's state table (its id of the message table's id type);
    ``order``: an ordered table's key and order columns (msgtable.engine.ordered), copied with
    each message by the fan-out, and ``index`` the columns of the index its polls read
    them through (subscriptions.state_order_index)."""
    extra = "".join(f"  {quote(c.name)} {c.column_type} NULL,\n" for c in order)
    cols = ", ".join(quote(c) for c in index)
    index_ddl = f",\n  INDEX {STATE_ORDER_INDEX} ({cols})" if index else ""
    return f"""CREATE TABLE {quote(name)} (
  id {id_column.column_type} NOT NULL,
  priority BIGINT NOT NULL DEFAULT 0,
  time_next BIGINT NULL,
  epoch BIGINT NOT NULL DEFAULT 0,
  time_acked BIGINT NULL,
  time_created BIGINT NULL,
  last_error VARCHAR(1000) NULL,
  time_dead BIGINT NULL,
{extra}  PRIMARY KEY (id),
  INDEX poller_idx (time_acked, priority, time_next){index_ddl}
) ENGINE=InnoDB COMMENT '{STATE_COMMENT}'"""


def add_fanout_ddl(table: str) -> str:
    """What a message table needs before its first subscription: the time_fanout column
    (NULL: not handed to the subscriptions yet) and its index."""
    col = quote(FANOUT_COLUMN)
    return f"ALTER TABLE {quote(table)} ADD COLUMN {col} BIGINT NULL, ADD INDEX fanout_idx ({col})"


def mark_all_seen(table: TableConfig) -> str:
    """Rows enqueued before a table's first subscription: seen by none, and to be seen by
    none (a subscription gets what comes after it). Without a default group nobody else
    acks them: acked here, so the purge takes them."""
    acked = "" if table.default_group else ", `time_acked` = COALESCE(`time_acked`, %s)"
    return (
        f"{MARK}UPDATE {quote(table.name)} SET {quote(FANOUT_COLUMN)} = %s{acked} "
        f"WHERE {quote(FANOUT_COLUMN)} IS NULL LIMIT %s"
    )


def row_to_subscription(row: Sequence[Any]) -> Subscription:
    table, name, flt, cols, ack_wait, max_att, max_lag, expire, state, created, active = row[:11]
    limits = row[11] if len(row) > 11 else None
    state_rows = _text(row[12]) if len(row) > 12 and row[12] is not None else EAGER
    try:
        st = SubscriptionState(str(state))
    except ValueError:
        st = SubscriptionState.ACTIVE
    return Subscription(
        table=_text(table),
        name=_text(name),
        filter=_text(flt or ""),
        columns=parse_columns(_text(cols or "")),
        ack_wait_s=None if ack_wait is None else float(ack_wait),
        max_attempts=None if max_att is None else int(max_att),
        max_lag=None if max_lag is None else int(max_lag),
        expire_after_s=None if expire is None else float(expire),
        state=st,
        time_created_ns=int(created or 0),
        time_active_ns=int(active or 0),
        limits=parse_limits(_text(limits or "")),
        state_rows=state_rows,
    )


def subscription_params(sub: Subscription) -> list[Any]:
    return [
        sub.table,
        sub.name,
        sub.filter or None,
        ",".join(sub.columns) or None,
        sub.ack_wait_s,
        sub.max_attempts,
        sub.max_lag,
        sub.expire_after_s,
        sub.state.value,
        sub.time_created_ns,
        sub.time_active_ns or None,
        limits_text(sub.limits) or None,
        sub.state_rows,
    ]


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes | bytearray) else str(v)


def lag_sql(state_table: str, source: str, cap: int) -> str:
    """The unsettled messages of a subscription (up to ``cap``) and the oldest one's
    time_created: what it holds back. A state row whose message row is gone (purged while
    the subscription did not hold the table, or deleted by DML) is not lag: nothing is left
    to deliver."""
    s = quote(state_table)
    return (
        f"SELECT COUNT(*), MIN(tc) FROM (SELECT s.`time_created` AS tc FROM {s} s "
        f"JOIN {quote(source)} m ON m.`id` = s.`id` "
        f"WHERE s.`time_acked` IS NULL AND NOT (s.`time_next` <=> {DEAD_TIME_NEXT}) "
        f"LIMIT {int(cap)}) AS l"
    )


def orphan_scan_sql(state_table: str, source: str, after: bool) -> str:
    """A bounded step over a state table's unsettled rows in id order (``after``: after the
    id %s; up to %s rows), each with whether its message row is gone."""
    since = "s.`id` > %s AND " if after else ""
    return (
        f"SELECT s.`id`, m.`id` IS NULL FROM {quote(state_table)} s "
        f"LEFT JOIN {quote(source)} m ON m.`id` = s.`id` "
        f"WHERE {since}s.`time_acked` IS NULL ORDER BY s.`id` LIMIT %s"
    )


def orphans_delete_sql(state_table: str, source: str) -> str:
    """Delete the unsettled state rows of ``{ids}`` whose message row is still gone."""
    s = quote(state_table).replace("{", "{{").replace("}", "}}")
    m = quote(source).replace("{", "{{").replace("}", "}}")
    return (
        f"{MARK}DELETE {s} FROM {s} {BY_ID} WHERE `id` IN ({{ids}}) AND `time_acked` IS NULL "
        f"AND NOT EXISTS (SELECT 1 FROM {m} m WHERE m.`id` = {s}.`id`)"
    )


def pending_sql(table: str, cap: int) -> str:
    """Rows of a table not handed to its subscriptions yet (up to ``cap``)."""
    return (
        f"SELECT COUNT(*) FROM (SELECT 1 FROM {quote(table)} "
        f"WHERE {quote(FANOUT_COLUMN)} IS NULL LIMIT {int(cap)}) AS p"
    )


class _Pools(Protocol):
    database: str

    def _errors(
        self, table: str | None = None, kind: str = "other"
    ) -> AbstractContextManager[None]: ...

    def _auto_cursor(self) -> AbstractContextManager[Any]: ...

    def _tx_connection(self) -> AbstractContextManager[Any]: ...

    def fence(self, cfg: TableConfig) -> tuple[str, list[Any]]: ...

    def fence_holds(self, cur: Any, fence_params: Sequence[Any]) -> bool: ...

    def count_fenced_postpones(self, cfg: TableConfig, n: int) -> None: ...


class SubscriptionSQL:
    """Subscriptions' SQL, run on a store's pools: MySQLStore holds one and its subscription
    verbs are this object's."""

    def __init__(self, pools: _Pools) -> None:
        self._pools = pools
        self._counters = sequence.Counters()  # the tables' fan-out sequences
        self._scans: dict[tuple[int, int, str], str] = {}  # lazy subscriptions' scans

    @contextmanager
    def _cursor(self, table: str | None = None, *, kind: str) -> Iterator[Any]:
        """A cursor on the store's autocommit pool, its errors the store's (counted, timed
        as ``kind``)."""
        with self._pools._errors(table, kind=kind), self._pools._auto_cursor() as cur:
            yield cur

    def _registry_columns(self, cur: Any) -> set[str]:
        """The definitions table's columns (none: there is no such table yet)."""
        cur.execute(REGISTRY_COLUMNS, [self._pools.database, REGISTRY_TABLE])
        return {server_text(r[0]).lower() for r in cur.fetchall()}

    def _has_registry(self, cur: Any) -> bool:
        return bool(self._registry_columns(cur))

    def _upgrade_registry(self, cur: Any) -> None:
        """Give a definitions table made by an earlier version the columns it lacks
        (concurrent upgrades: the loser's duplicate column is the winner's)."""
        have = self._registry_columns(cur)
        for col in LATER_COLUMNS:
            if col in have:
                continue
            try:
                cur.execute(REGISTRY_UPGRADES[col])
            except Exception as exc:
                if error_code(exc) != 1060:  # duplicate column name
                    raise

    def subscriptions(self) -> tuple[list[Subscription], dict[str, tuple[Column, ...]]]:
        """Every definition, and the columns of every state table (by name)."""
        with self._cursor(kind="subscriptions") as cur:
            have = self._registry_columns(cur)
            if not have:
                return [], {}
            cur.execute(select_all(have))
            subs = [row_to_subscription(r) for r in cur.fetchall()]
            cur.execute(STATE_COLUMNS_QUERY, [self._pools.database, STATE_COMMENT])
            cols: dict[str, list[Column]] = {}
            for tname, cname, data_type, column_type in cur.fetchall():
                cols.setdefault(server_text(tname), []).append(
                    Column(cname, server_text(data_type).lower(), server_text(column_type).lower())
                )
        return subs, {n: tuple(c) for n, c in cols.items()}

    def create_subscription(
        self, table: TableConfig, loaded: LoadedSubscription, from_start: bool, now_ns: int
    ) -> int:
        """Create the definition and state table of a subscription (and, on a table's first,
        its time_fanout column); with ``from_start`` hand it every retained unacked row.
        Returns how many rows it got from the start."""
        sub = loaded.sub
        with self._cursor(table.name, kind="subscription_create") as cur:
            cur.execute(REGISTRY_DDL)
            self._upgrade_registry(cur)
            if not table.has_column(FANOUT_COLUMN):
                log.info("table %s: adding column %s for subscriptions", table.name, FANOUT_COLUMN)
                cur.execute(add_fanout_ddl(table.name))
            cur.execute(f"SELECT COUNT(*) FROM {REGISTRY} WHERE table_name = %s", [table.name])
            first = cur.fetchone()[0] == 0
            if first:  # what was there before is not for subscriptions: seen by none
                mark = mark_all_seen(table)
                params = [now_ns] * (1 if table.default_group else 2) + [MARK_BATCH]
                while cur.execute(mark, params) >= MARK_BATCH:
                    pass
            sequence.start(cur, table.name)  # (numbers above those marks)
            try:
                order = order_columns(table)
                index = state_order_index(table) if table.ordered else ()
                cur.execute(state_table_ddl(sub.state_table, table.id_column, order, index))
            except Exception as exc:
                if error_code(exc) == 1050:
                    raise InvalidArgument(
                        f"subscription {sub.label}: table {sub.state_table} exists already"
                    ) from None
                raise
            try:
                cur.execute(INSERT, subscription_params(sub))
            except Exception as exc:
                cur.execute(f"DROP TABLE IF EXISTS {quote(sub.state_table)}")
                if error_code(exc) == DUPLICATE_KEY:
                    raise InvalidArgument(f"subscription {sub.label} exists already") from None
                raise
            cur.execute(sequence.CURSOR_DDL)  # at the sequence's last: what comes after it
            cur.execute(sequence.CURSOR_START, [sub.name, table.name])
            if not from_start:
                return 0
            statements = FanoutStatements(table)
            total, after = 0, None
            while True:
                sql, params = statements.retained(loaded.filter, after, BACKFILL_BATCH)
                cur.execute(sql, params)
                rows = list(cur.fetchall())
                if not rows:
                    return total
                sql, params = statements.insert(sub.state_table, rows, now_ns)
                total += max(0, cur.execute(sql, params))
                after = rows[-1][0]

    def alter_subscription(self, sub: Subscription) -> None:
        with self._cursor(kind="subscription_alter") as cur:
            if not self._has_registry(cur):
                raise TableNotFound(f"subscription {sub.label} not found")
            self._upgrade_registry(cur)
            p = subscription_params(sub)
            cur.execute(UPDATE, [*p[2:9], p[11], sub.table, sub.name])
            cur.execute(
                f"SELECT COUNT(*) FROM {REGISTRY} WHERE table_name = %s AND name = %s",
                [sub.table, sub.name],
            )
            if not cur.fetchone()[0]:
                raise TableNotFound(f"subscription {sub.label} not found")

    def drop_subscription(self, table: str, name: str, state_table: str) -> None:
        with self._cursor(kind="subscription_drop") as cur:
            if not self._has_registry(cur) or not cur.execute(DELETE, [table, name]):
                raise TableNotFound(f"subscription {table}/{name} not found")
            cur.execute(f"DROP TABLE IF EXISTS {quote(state_table)}")
            cur.execute(sequence.CURSOR_DDL)
            cur.execute(sequence.CURSOR_DROP, [table, name])

    def subscription_cursor(self, table: str, name: str) -> int | None:
        """The subscription's cursor (design.md (b)); None: it has none yet."""
        with self._cursor(table, kind="subscription_cursor") as cur:
            cur.execute(sequence.CURSOR_DDL)
            cur.execute(sequence.CURSOR, [table, name])
            row = cur.fetchone()
        return None if row is None else int(row[0])

    def advance_cursor(self, table: str, name: str, old: int, new: int) -> bool:
        """Move the subscription's cursor from ``old`` to ``new``; False: it was not at
        ``old`` (another sender moved it), and nothing changed."""
        with self._cursor(table, kind="subscription_cursor") as cur:
            return bool(cur.execute(sequence.ADVANCE, [new, table, name, old]))

    def restart_cursor(self, table: str, name: str) -> None:
        """Move the subscription's cursor to its table's sequence's last number."""
        with self._cursor(table, kind="subscription_cursor") as cur:
            cur.execute(sequence.CURSOR_RESTART, [table, name])

    def unsent(
        self, table: TableConfig, loaded: LoadedSubscription, after: int, limit: int
    ) -> list[tuple[Hashable, int]]:
        """The subscription's messages never sent (design.md (b)): the ids and numbers of
        the rows numbered above ``after`` that its filter passes and that have no state
        row, in sequence order, up to ``limit``."""
        where, params = loaded.filter.where("m") if loaded.filter else ("", ())
        sql = sequence.unsent_sql(table.name, loaded.sub.state_table, where)
        with self._cursor(table.name, kind="subscription_unsent") as cur:
            cur.execute(sql, [after, *params, limit])
            return [(r[0], int(r[1])) for r in cur.fetchall()]

    def unsent_rows(
        self, table: TableConfig, cfg: TableConfig, flt: Filter | None, after: int, limit: int
    ) -> Sequence[PolledRow]:
        """The cursor's scan as a poll of the state table ``cfg`` reads rows (with each
        one's time_created), each with its number last: sequences.unsent_rows_sql."""
        where, params = flt.where("m") if flt is not None else ("", ())
        key = (id(table), id(cfg), where)  # the configs are replaced whole when they change
        sql = self._scans.get(key)
        if sql is None:
            if len(self._scans) > 256:
                self._scans.clear()
            sql = self._scans[key] = sequence.unsent_rows_sql(table, cfg, where)
        with self._cursor(table.name, kind="subscription_unsent") as cur:
            cur.execute(sql, [after, *params, limit])
            return cur.fetchall()  # type: ignore[no-any-return]  # (tuples; the number an int)

    def unsent_lag(
        self, table: TableConfig, loaded: LoadedSubscription, cap: int
    ) -> tuple[int, int | None]:
        """A lazy subscription's messages above its cursor never sent (up to ``cap``) and
        the oldest one's time_created (sequences.unsent_lag_sql)."""
        where, params = loaded.filter.where("m") if loaded.filter else ("", ())
        sql = sequence.unsent_lag_sql(table, loaded.sub.state_table, where, cap)
        with self._cursor(table.name, kind="subscription_lag") as cur:
            cur.execute(sql, [table.name, loaded.sub.name, *params])
            n, oldest = cur.fetchone()
        return int(n), None if oldest is None else int(oldest)

    def table_indexes(self, table: str) -> list[tuple[str, ...]]:
        """The indexes of ``table``, each one's columns in order (information_schema)."""
        with self._cursor(table, kind="subscription_indexes") as cur:
            cur.execute(TABLE_INDEXES, [self._pools.database, table])
            rows = cur.fetchall()
        out: dict[str, list[str]] = {}
        for index, column in rows:
            out.setdefault(server_text(index), []).append(server_text(column))
        return [tuple(columns) for columns in out.values()]

    def write_state_rows(
        self, cfg: TableConfig, rows: Sequence[StateRow], acked_ns: int | None = None
    ) -> int:
        """Write a lazy subscription's state rows (sequences.state_rows_sql): a row there
        already is kept (with ``acked_ns``: acked then, unless acked or dead). How many.
        Those of a postpone or a verb (no ``acked_ns``) are fenced (MySQLStore.fence_as): 0
        when the fence did not hold as the statement ran; an ack's are not (an ack that lands
        late is still the subscriber's word)."""
        if not rows:
            return 0
        params: list[Any] = []
        for row in rows:
            params.extend(row)
            if acked_ns is not None:
                params.append(acked_ns)
        fence_sql, fence_params = ("", []) if acked_ns is not None else self._pools.fence(cfg)
        sql = sequence.state_rows_sql(cfg.name, len(rows), acked_ns is not None, fence_sql)
        with self._cursor(cfg.name, kind="subscription_state_rows") as cur:
            written = cur.execute(sql, params + fence_params)
            if not fence_sql or written:
                return len(rows)
            # nothing inserted: every row was there already, or the fence stopped them
            if self._pools.fence_holds(cur, fence_params):
                return len(rows)
        # a postpone's rows (epoch 1; not a row parked before its send) kept out: their
        # sends' counts are lost
        self._pools.count_fenced_postpones(cfg, sum(1 for row in rows if row[3]))
        return 0

    def written_of(self, cfg: TableConfig, ids: Sequence[Hashable]) -> set[Hashable]:
        """Which of ``ids`` have a state row in ``cfg``'s state table (by primary key)."""
        if not ids:
            return set()
        in_ids, params = in_list(ids)
        with self._cursor(cfg.name, kind="subscription_state_rows") as cur:
            cur.execute(sequence.written_sql(cfg.name).format(ids=in_ids), params)
            return {r[0] for r in cur.fetchall()}

    def set_subscription_state(
        self, sub: Subscription, state: SubscriptionState, now_ns: int
    ) -> None:
        with self._cursor(kind="subscription_state") as cur:
            cur.execute(SET_STATE, [state.value, now_ns, sub.table, sub.name])

    def touch_subscriptions(self, subs: Sequence[Subscription], now_ns: int) -> None:
        """Note that these subscriptions have subscribers now (their expiry starts again)."""
        if not subs:
            return
        pairs = ", ".join(["(%s, %s)"] * len(subs))
        params: list[Any] = [now_ns]
        for sub in subs:
            params += [sub.table, sub.name]
        with self._cursor(kind="subscription_touch") as cur:
            cur.execute(TOUCH.format(pairs=pairs), params)

    def subscription_lag(
        self, state_tables: Mapping[str, str], cap: int
    ) -> dict[str, tuple[int, int | None]]:
        """For each state table (mapped to its message table): its unsettled messages still
        in the message table (up to ``cap``) and the oldest one's time_created (None: none)."""
        out: dict[str, tuple[int, int | None]] = {}
        with self._cursor(kind="subscription_lag") as cur:
            for name, source in state_tables.items():
                try:
                    cur.execute(lag_sql(name, source, cap))
                except Exception as exc:
                    if error_code(exc) == 1146:
                        continue
                    raise
                n, oldest = cur.fetchone()
                out[name] = (int(n), None if oldest is None else int(oldest))
        return out

    def delete_orphans(
        self, state_table: str, source: str, after: Hashable | None, limit: int
    ) -> tuple[int, Hashable | None]:
        """One bounded step of the clean-up of a state table: of its next ``limit``
        unsettled rows after id ``after`` (None: from the start), delete those whose message
        row is gone (purged while the subscription did not hold the table). Returns how many
        it deleted and where the next step starts (None: the pass reached the end)."""
        with self._cursor(kind="subscription_orphans") as cur:
            try:
                scan = orphan_scan_sql(state_table, source, after is not None)
                cur.execute(scan, [limit] if after is None else [after, limit])
                rows = cur.fetchall()
                orphans = [r[0] for r in rows if r[1]]
                deleted = 0
                if orphans:
                    in_ids, params = in_list(orphans)
                    sql = orphans_delete_sql(state_table, source).format(ids=in_ids)
                    deleted = int(cur.execute(sql, params))
            except Exception as exc:
                if error_code(exc) == 1146:  # dropped meanwhile
                    return 0, None
                raise
        return deleted, (rows[-1][0] if len(rows) == limit else None)

    def pending_fanout(self, table: str, cap: int) -> int:
        with self._cursor(table, kind="fanout_pending") as cur:
            cur.execute(pending_sql(table, cap))
            return int(cur.fetchone()[0])

    def fanout(
        self,
        table: TableConfig,
        loaded: Mapping[str, LoadedSubscription],
        now_ns: int,
        limit: int,
    ) -> tuple[dict[str, int], set[str]]:
        """Hand up to ``limit`` unseen rows to the table's active subscriptions, in one
        transaction, numbered by the table's sequence (msgtable.store.sequences).
        Returns how many rows each subscription got (key "": rows handed over), and the
        active subscriptions the database has that ``loaded`` lacks (then nothing was handed
        over: load them first)."""
        for _ in range(2):  # again once the sequence is started or a stalled holder killed
            # no table for _errors: a missing table here is a state table dropped meanwhile
            with self._pools._errors(kind="fanout"):
                try:
                    done = self._fanout_batch(table, loaded, now_ns, limit)
                except sequence.Stalled:
                    done = None
                    with self._pools._auto_cursor() as cur:
                        sequence.unstall(cur, table.name)
                if done is not None:
                    return done
        return {"": 0}, set()

    def _fanout_batch(
        self,
        table: TableConfig,
        loaded: Mapping[str, LoadedSubscription],
        now_ns: int,
        limit: int,
    ) -> tuple[dict[str, int], set[str]] | None:
        """fanout's transaction; None: the table's sequence had no counter row (started now:
        try again)."""
        statements = FanoutStatements(table)
        got: dict[str, int] = {}
        names = sorted(loaded)
        filters = [loaded[n].filter for n in names]
        # the column of each filtered subscription's verdict in a picked row
        verdict: dict[str, int] = {}
        for n in names:
            if loaded[n].filter is not None:
                verdict[n] = statements.verdicts_at + len(verdict)
        with self._pools._tx_connection() as conn:
            with conn.cursor() as cur:
                cur.execute(*statements.pick(filters, limit))
                picked = list(cur.fetchall())
                if picked and table.ordered and any(r[4] is not None for r in picked):
                    cur.execute(*statements.skipped_sql(picked))
                    skipped = list(cur.fetchall())
                    if skipped:
                        picked = statements.in_key_order(picked, skipped)
                if not picked:
                    conn.rollback()
                    return {"": 0}, set()
                ids = [r[0] for r in picked]
                cur.execute(SELECT_TABLE, [table.name])
                active = [
                    server_text(n)
                    for n, st in cur.fetchall()
                    if server_text(st) == SubscriptionState.ACTIVE.value
                ]
                unknown = {n for n in active if n not in loaded}
                if unknown:
                    conn.rollback()
                    return {"": 0}, unknown
                for name in active:
                    col = verdict.get(name)
                    rows = [r[: statements.width] for r in picked if col is None or r[col]]
                    if not rows:
                        continue
                    if loaded[name].sub.lazy:  # its cursor's scan reads them: no state rows
                        got[name] = len(rows)
                        continue
                    sql, params = statements.insert(loaded[name].sub.state_table, rows, now_ns)
                    got[name] = max(0, cur.execute(sql, params))
                try:  # the counter row's lock: from here to the commit only
                    last = self._counters.take(cur, table.name, len(ids))
                except sequence.Stalled:
                    conn.rollback()
                    raise
                if last is None:
                    conn.rollback()
                    with self._pools._auto_cursor() as auto:
                        sequence.start(auto, table.name)
                    return None
                cur.execute(*statements.mark_sql(ids, last, now_ns))
            conn.commit()
        got[""] = len(ids)
        return got, set()
