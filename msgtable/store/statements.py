"""The SQL of one message table (or a subscription's state table), written once per TableConfig
from names that came from information_schema, every identifier quoted, every value a
parameter: the polls, the send's claim and locking read, the postpone, the acks, the purge,
settlement, an ordered table's reads (msgtable.store.ordering) and the backlog. MySQLStore runs
them (msgtable.store.mysqlstore); tests/unit/store/test_store.py asserts them as exact strings.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from msgtable.core.dedup import CREATED_COLUMN
from msgtable.core.rows import CachedRow, PollKey
from msgtable.core.sql import MARK, in_list, quote
from msgtable.core.tables import (
    DEAD_TIME_NEXT,
    LAST_ERROR_COLUMN,
    Layout,
    TableConfig,
    text_limit,
)
from msgtable.store.backlog import AGE_BOUNDS_S, STATEMENT_TIMEOUT_S
from msgtable.store.ordering import OrderStatements
from msgtable.store.protocol import Keep
from msgtable.store.sequences import CURSORS

# The servers' placement (msgtable.engine.placement): which server sends which table.
PLACEMENT_TABLE = "msgtable_placement"
# The placement row of a table (%s: the table, or a subscription's source table) if it
# names this server (%s: its holder id), by its primary key.
PLACEMENT_ROW = (
    f"SELECT 1 FROM {PLACEMENT_TABLE} WHERE kind = 'table' AND name = %s AND holder = %s"
)
# A fenced write (MySQLStore.fence_as) changes rows only while that row names this server,
# read as the statement runs (READ COMMITTED reads the latest commit).
FENCE = f" AND EXISTS ({PLACEMENT_ROW})"

Polls = tuple[str, str, str]  # a poll from the start, after a key, after a key with no time_next
# Every UPDATE, DELETE or locking read of rows by id goes by the primary key, locking its rows
# alone, in id order: on a table (or a state table) with few unacked rows the optimizer may
# prefer poller_idx for ``time_acked IS NULL``, and an UPDATE that locks the index's entry
# before the row deadlocks with one that locks the row first (an ack against a release, a
# renew against a send's locking read: the fault suite saw both); with many ids of a small
# table it scans the whole table, locking rows it does not change (the purge against the
# fan-out's mark: tests/integration/test_deadlocks.py). MariaDB 10.11 ignores the hint when
# the statement names no column but the key (a DELETE ... WHERE id IN (...) alone scans the
# table; a SELECT id ... FOR UPDATE scans the whole index): such a statement names another
# column too (tests/integration/test_deadlocks.py: the EXPLAIN of each)
BY_ID = "FORCE INDEX (PRIMARY)"


@dataclass(frozen=True)
class _Names:
    """The quoted names and fragments every statement of one table is written from."""

    t: str  # the table
    tf: str  # the table in a statement with an {ids} template: its braces survive format()
    rid: str
    epoch: str
    acked: str
    values: str  # the message columns, as the poll selects them
    s: str  # "s." on a subscription's state table (its poll joins the message table, m)
    priority: str
    time_next: str  # the poll's time_next (the 2018 layout's stands in for a NULL one)
    p_due: str  # the poll's due condition (one %s)
    due: str  # the due condition on the table's own columns (one %s)
    order: str
    after: str  # a continued poll's condition: after the key of the last row read
    after_null: str  # the same when that row's time_next was NULL

    @classmethod
    def of(cls, cfg: TableConfig) -> _Names:
        t = quote(cfg.name)
        rid, epoch, acked = quote("id"), quote("epoch"), quote("time_acked")
        # A subscription's poll reads its state table (s) and the message table's columns
        # (m) for the values; every other statement touches the state table alone.
        s = "s." if cfg.source else ""
        m = "m." if cfg.source else ""
        values = ", ".join(m + quote(c.name) for c in cfg.message_columns)
        p_rid = s + rid
        if cfg.layout is Layout.CURRENT:
            priority, time_next = s + quote("priority"), s + quote("time_next")
            p_due = f"({time_next} IS NULL OR {time_next} <= %s)"
            order = f"{priority}, {time_next}, {p_rid}"
            after = (
                f" AND ({priority} > %s OR ({priority} = %s AND ({time_next} > %s"
                f" OR ({time_next} = %s AND {p_rid} > %s))))"
            )
            after_null = (
                f" AND ({priority} > %s OR ({priority} = %s AND ({time_next} IS NOT NULL"
                f" OR {p_rid} > %s)))"
            )
            raw = quote("time_next")
            due = f"({raw} IS NULL OR {raw} <= %s)"
        else:  # 2018 layout: no priority; time_scheduled stands in for a NULL time_next
            priority = "0"
            time_next = f"COALESCE({quote('time_next')}, {quote('time_scheduled')}, 0)"
            due = p_due = f"{time_next} <= %s"
            order = f"{time_next}, {rid}"
            after = after_null = f" AND ({time_next} > %s OR ({time_next} = %s AND {rid} > %s))"
        return cls(
            t=t,
            tf=t.replace("{", "{{").replace("}", "}}"),
            rid=rid,
            epoch=epoch,
            acked=acked,
            values=values,
            s=s,
            priority=priority,
            time_next=time_next,
            p_due=p_due,
            due=due,
            order=order,
            after=after,
            after_null=after_null,
        )


class TableStatements:
    """The SQL of one table, written once from its config. ``{ids}`` stands for an IN list.

    Polls go in (priority, time_next, id) order; a continued poll starts after the key of
    the last row read (keyset pagination: no row is read twice in one pass). SQL sorts a
    NULL time_next first, so continuing after one needs its own condition.
    """

    layout: Layout
    # the polls (_write_polls)
    poll: str
    poll_after: str
    poll_after_null: str
    polls_created: Polls  # with each row's time_created last
    polls_floor: Polls  # after an unclean takeover: only rows the old holder cannot have sent
    polls_created_floor: Polls
    floor_params: int
    # the redelivery poll (current layout; "" in the 2018 one)
    first_priority: str
    next_priority: str
    poll_timed: str
    # the send and its postpone (_write_sends)
    claim: str
    claimable: str
    lock: str
    postpone: str
    # the acks and the purge (_write_acks)
    ack: str
    ack_first: str
    ack_mixed: str
    acked: str
    unacked: str
    purge_pick: str
    purge: str
    purge_holders: int
    purge_cursors: tuple[str, ...]  # the purge pick's (table, name) of each lazy holder
    expire_dedup: str  # "" without vt_dedup (msgtable.core.dedup)
    fair_column: str  # the vt_fair_key column as the poll reads it ("": none)
    fair_from: tuple[str, str]  # a skipping poll's FROM: by the fair index (("", ""): none)
    # settlement (_write_settlement)
    alive: str
    release: str
    renew: str
    renew_exact: str

    def __init__(self, cfg: TableConfig) -> None:
        n = _Names.of(cfg)
        self.layout = cfg.layout
        self._write_polls(cfg, n)
        self._write_sends(n)
        self._write_acks(cfg, n)
        self._write_settlement(cfg, n)
        # an ordered table's reads (msgtable.store.ordering)
        self.order = OrderStatements(cfg, n.values, n.epoch) if cfg.ordered else None
        # the backlog (msgtable.store.backlog), on MariaDB (True) and on MySQL (False)
        self.backlog = {m: backlog_sql(cfg, m) for m in (True, False)}

    def _write_polls(self, cfg: TableConfig, n: _Names) -> None:
        # A state table is often small or mostly unsettled, where the optimizer would scan
        # and sort it whole each poll; its index is in (priority, time_next, id) order.
        rid = n.rid
        source = (
            f"{n.t} s FORCE INDEX (`poller_idx`) JOIN {quote(cfg.source)} m ON m.{rid} = s.{rid}"
            if cfg.source
            else n.t
        )
        head = f"SELECT {n.priority}, {n.time_next}, {n.s}{n.epoch}, {n.values}"
        body = f" FROM {source} WHERE {n.s}{n.acked} IS NULL AND {n.p_due}"
        select = head + body
        tail = f" ORDER BY {n.order} LIMIT %s"
        # vt_fair_key: a poll may skip the keys holding their share of the cache (poll_query)
        fair = cfg.flow.fair_key if cfg.flow is not None else ""
        self.fair_column = ("m." if cfg.source else "") + quote(fair) if fair else ""
        # ... by the index on (time_acked, fair key) where the table has one: the others'
        # rows are read, not the skipped keys' backlog row by row (the optimizer prefers
        # poller_idx while the skipped keys are few)
        index = cfg.flow.fair_index if cfg.flow is not None and not cfg.source else ""
        self.fair_from = (
            (f" FROM {source} WHERE", f" FROM {source} FORCE INDEX ({quote(index)}) WHERE")
            if index
            else ("", "")
        )
        self.poll = select + tail
        self.poll_after = select + n.after + tail
        self.poll_after_null = select + n.after_null + tail
        # The same polls with each row's time_created last (the created -> sent delay,
        # msgtable.core.latency); NULL for a table without the column.
        created = n.s + quote("time_created") if cfg.has_column("time_created") else "NULL"
        with_created = f"{head}, {created}{body}"
        self.polls_created = (
            with_created + tail,
            with_created + n.after + tail,
            with_created + n.after_null + tail,
        )
        # After an unclean takeover, until the hold ends (msgtable.engine.engine): only the rows
        # the old holder cannot have sent, due or there after the floor (one %s each).
        floor = f" AND ({n.time_next} > %s" + (f" OR {created} > %s)" if created != "NULL" else ")")
        self.floor_params = 1 if created == "NULL" else 2
        plain = (self.poll, self.poll_after, self.poll_after_null)
        self.polls_floor = cast("Polls", tuple(q.replace(body, body + floor, 1) for q in plain))
        self.polls_created_floor = cast(
            "Polls", tuple(q.replace(body, body + floor, 1) for q in self.polls_created)
        )
        self._write_timed(cfg, n, with_created, tail)

    def _write_timed(self, cfg: TableConfig, n: _Names, with_created: str, tail: str) -> None:
        """The redelivery poll: the due rows given a time (time_next > 0: a redelivery, a
        release, a delayed message) of the priorities ``{ps}`` (with time_created last), which
        a pass reaches only after every fresh row; each priority is one range of poller_idx,
        so it reads those rows alone. The priorities come from a loose scan of the index:
        the lowest unacked one, then the next above %s. The 2018 layout has none: its rows
        all have a time (time_scheduled), and a pass reads them in time order."""
        self.first_priority = self.next_priority = self.poll_timed = ""
        if cfg.layout is not Layout.CURRENT:
            return
        priority, acked = quote("priority"), n.acked
        lowest = f"SELECT MIN({priority}) FROM {n.t} WHERE {acked} IS NULL"
        self.first_priority = lowest
        self.next_priority = f"{lowest} AND {priority} > %s"
        head = with_created.replace("{", "{{").replace("}", "}}")
        self.poll_timed = f"{head} AND {n.time_next} > 0 AND {n.priority} IN ({{ps}}){tail}"

    def _write_sends(self, n: _Names) -> None:
        tf, rid, epoch, acked, due = n.tf, n.rid, n.epoch, n.acked, n.due
        self.claim = (
            f"{MARK}UPDATE {tf} {BY_ID} "
            f"SET {quote('time_next')} = %s, {epoch} = COALESCE({epoch}, 0) + 1 "
            f"WHERE {rid} IN ({{ids}}) AND {epoch} <=> %s AND {acked} IS NULL AND {due}"
        )
        # The claim's slow path: the rows it may claim, locked before its UPDATE (which then
        # matches exactly these), when an UPDATE alone matched only some of its rows.
        self.claimable = (
            f"SELECT {rid} FROM {tf} {BY_ID} WHERE {rid} IN ({{ids}}) AND {epoch} <=> %s "
            f"AND {acked} IS NULL AND {due} FOR UPDATE"
        )
        # The send's locking read: rows a concurrent ack by DML has not reached (it waits).
        # One read of the whole batch, whatever the epochs its rows were read at (the caller
        # compares them), so it locks in id order: one read per epoch locked a later epoch's
        # lower ids after an earlier's higher ones, and deadlocked with a renew or a release
        # (an UPDATE by id, in id order) that held one and wanted the other.
        self.lock = (
            f"SELECT {rid}, {epoch} FROM {tf} {BY_ID} WHERE {rid} IN ({{ids}}) "
            f"AND {acked} IS NULL AND {due} LOCK IN SHARE MODE"
        )
        # The postpone of rows sent (at epoch, at time) and not acked through us: it counts
        # the send even where an ack by DML came first, and moves time_next only where no
        # ack did; a row rescheduled or re-versioned by DML since the send keeps its values.
        self.postpone = (
            f"{MARK}UPDATE {tf} {BY_ID} SET {epoch} = COALESCE({epoch}, 0) + 1, "
            f"{quote('time_next')} = IF({acked} IS NULL, %s, {quote('time_next')}) "
            f"WHERE {rid} IN ({{ids}}) AND {epoch} <=> %s AND ({acked} IS NOT NULL OR {due})"
        )

    def _write_acks(self, cfg: TableConfig, n: _Names) -> None:
        t, tf, rid, epoch, acked = n.t, n.tf, n.rid, n.epoch, n.acked
        set_acked = f"{MARK}UPDATE {tf} {BY_ID} SET {acked} = %s, {quote('time_next')} = NULL"
        # not acked, and not dead in place: a late ack leaves a dead letter dead, as it finds
        # no row of one moved to a dead-letter table
        where_unacked = (
            f" WHERE {rid} IN ({{ids}}) AND {acked} IS NULL "
            f"AND NOT ({quote('time_next')} <=> {DEAD_TIME_NEXT})"
        )
        self.ack = set_acked + where_unacked
        # An ack of rows whose send was not postponed yet counts that send, epoch + 1, where
        # the row is still at the epoch the send read (msgtable.store.protocol.Uncounted):
        # every row of one send (the parameter: its epoch), or ``{first}`` (deadletters.
        # first_expr) of some.
        self.ack_first = (
            set_acked + f", {epoch} = COALESCE({epoch}, 0) + ({epoch} <=> %s)" + where_unacked
        )
        self.ack_mixed = (
            set_acked + f", {epoch} = COALESCE({epoch}, 0) + ({{first}})" + where_unacked
        )
        self.acked = f"SELECT {rid} FROM {tf} WHERE {rid} IN ({{ids}}) AND {acked} = %s"
        self.unacked = f"SELECT {rid} FROM {tf} WHERE {rid} IN ({{ids}}) AND {acked} IS NULL"
        # With subscriptions: only rows handed to them, and settled by each that holds the
        # table, that long ago (msgtable.core.subscriptions).
        holds = "".join(
            f" AND NOT EXISTS (SELECT 1 FROM {quote(h)} h WHERE h.{rid} = {t}.{rid} "
            f"AND (h.{acked} IS NULL OR h.{acked} >= %s))"
            for h in cfg.holders
        )
        # a lazy subscription holds too what its cursor has not passed (it has no state
        # rows for those): the table's name and its own (msgtable.features.subscriptions.lazy)
        cursor = (
            f"(SELECT c.`sent_upto` FROM {CURSORS} c WHERE c.`table_name` = %s AND c.`name` = %s)"
        )
        fanout = quote("time_fanout")
        if cfg.source:  # its state table: a settled row stays until the cursor passed it
            holds += "".join(
                f" AND NOT EXISTS (SELECT 1 FROM {quote(cfg.source)} m WHERE m.{rid} = "
                f"{t}.{rid} AND m.{fanout} > {cursor})"
                for _ in cfg.cursored
            )
        else:
            holds += "".join(f" AND {fanout} <= {cursor}" for _ in cfg.cursored)
        fanned = f" AND {quote('time_fanout')} IS NOT NULL" if cfg.fanout else ""
        # With vt_dedup: a row leaves only once its key is cleared (msgtable.core.dedup).
        keyed = f" AND {quote(cfg.dedup)} IS NULL" if cfg.dedup else ""
        # The purge in two statements, so that it never deadlocks: the pick, a plain read
        # (a consistent read: it locks no row, of this table or of a state table), then the
        # DELETE of exactly the rows picked, by primary key (it locks only those, in id
        # order, all acked: no send, ack or settlement holds or waits for an acked row's
        # lock while holding another). Every condition of the pick holds for good once it
        # holds (an acked row stays acked; a row handed over stays handed over; a settled
        # state row stays settled), so the DELETE checks the ack alone.
        self.purge_pick = f"SELECT {rid} FROM {t} WHERE {acked} < %s{fanned}{holds}{keyed} LIMIT %s"
        # (DELETE t FROM t: the single-table DELETE takes no index hint)
        self.purge = (
            f"{MARK}DELETE {tf} FROM {tf} {BY_ID} WHERE {rid} IN ({{ids}}) AND {acked} < %s"
        )
        self.expire_dedup = ""
        if cfg.dedup:
            key, created = quote(cfg.dedup), quote(CREATED_COLUMN)
            self.expire_dedup = (
                f"{MARK}UPDATE {t} SET {key} = NULL WHERE {created} >= %s AND {created} < %s "
                f"AND {key} IS NOT NULL LIMIT %s"
            )
        self.purge_holders = len(cfg.holders)
        table = cfg.source or cfg.name
        self.purge_cursors = tuple(p for n in cfg.cursored for p in (table, n))

    def _write_settlement(self, cfg: TableConfig, n: _Names) -> None:
        """Settlement (msgtable.core.settlement). ``{first}`` stands for an expression true for
        the rows sent and not postponed yet, whose send the statement counts (epoch + 1):
        deadletters.first_expr, which reads the epoch, so the count is each SET's last (MySQL
        and MariaDB assign left to right: a later ``{first}`` would see the new epoch)."""
        tf, rid, epoch, acked = n.tf, n.rid, n.epoch, n.acked
        raw_next = quote("time_next")
        self.alive = f"{acked} IS NULL AND NOT ({raw_next} <=> {DEAD_TIME_NEXT})"
        count_first = f"{epoch} = COALESCE({epoch}, 0) + ({{first}})"
        error = self.set_error(cfg)
        # release: sent at least once (or now), not acked, not dead: due at the given time.
        # ``{bound}``: the deliveries the call answers (deadstore.delivery_expr)
        self.release = (
            f"{MARK}UPDATE {tf} {BY_ID} SET {raw_next} = %s{error}, {count_first} "
            f"WHERE {rid} IN ({{ids}}) AND {{bound}} AND {self.alive} "
            f"AND (COALESCE({epoch}, 0) > 0 OR {{first}})"
        )
        # renew: sent and not due again yet (so not sent since): due no sooner than ``until``
        # (the first rows: at their own time, given); exact (SQS's visibility): at ``until``
        renew = (
            f"{MARK}UPDATE {tf} {BY_ID} SET "
            f"{raw_next} = IF({{first}}, %s, GREATEST(COALESCE({raw_next}, 0), %s)){error}, "
            f"{count_first} "
            f"WHERE {rid} IN ({{ids}}) AND {{bound}} AND {self.alive} "
            f"AND ({{first}} OR (COALESCE({epoch}, 0) > 0 AND {raw_next} > %s))"
        )
        self.renew = renew
        self.renew_exact = renew.replace(f"GREATEST(COALESCE({raw_next}, 0), %s)", "%s", 1)

    @staticmethod
    def set_error(cfg: TableConfig) -> str:
        """``, last_error = ...`` keeping the old one when the reason (a parameter) is NULL;
        "" for a table without the column."""
        if not cfg.keeps_errors:
            return ""
        le = quote(LAST_ERROR_COLUMN)
        limit = text_limit(next(c for c in cfg.columns if c.name == LAST_ERROR_COLUMN))
        return f", {le} = COALESCE(LEFT(%s, {limit}), {le})"

    def poll_query(
        self,
        now_ns: int,
        limit: int,
        after: PollKey | None,
        created: bool = False,
        floor_ns: int | None = None,
        skip_keys: Sequence[Hashable] = (),
    ) -> tuple[str, list[Any]]:
        """A poll's statement and parameters; ``skip_keys``: values of the vt_fair_key column
        whose rows it leaves out (None among them: the NULL key's)."""
        sql, params = self._poll_query(now_ns, limit, after, created, floor_ns)
        if not skip_keys:
            return sql, params
        head, order, tail = sql.rpartition(" ORDER BY ")
        keys = [k for k in skip_keys if k is not None]
        col = self.fair_column
        if len(keys) == len(skip_keys):  # the NULL key has room: its rows are read
            cond = f" AND ({col} NOT IN ({', '.join(['%s'] * len(keys))}) OR {col} IS NULL)"
        elif keys:  # NOT IN leaves out the NULL key's rows too
            cond = f" AND {col} NOT IN ({', '.join(['%s'] * len(keys))})"
        else:
            cond = f" AND {col} IS NOT NULL"
        if self.fair_from[0]:
            head = head.replace(*self.fair_from, 1)
        return head + cond + order + tail, [*params[:-1], *keys, params[-1]]

    def _poll_query(
        self,
        now_ns: int,
        limit: int,
        after: PollKey | None,
        created: bool,
        floor_ns: int | None,
    ) -> tuple[str, list[Any]]:
        if floor_ns is None:
            plain = (self.poll, self.poll_after, self.poll_after_null)
            polls = self.polls_created if created else plain
            due: list[Any] = [now_ns]
        else:
            polls = self.polls_created_floor if created else self.polls_floor
            due = [now_ns] + [floor_ns] * self.floor_params
        poll, poll_after, poll_after_null = polls
        if after is None:
            return poll, [*due, limit]
        p, t, i = after
        if self.layout is Layout.V2018:
            return poll_after, [*due, t, t, i, limit]
        if t is None:
            return poll_after_null, [*due, p, p, i, limit]
        return poll_after, [*due, p, p, t, t, i, limit]


def backlog_sql(cfg: TableConfig, mariadb: bool) -> str:
    """One table's (or state table's) backlog in one aggregate: its unacked messages that are
    not dead, how many are due (time_next <= the first %s), the oldest time_created and how
    many were created at or after each further %s (now minus each finite bound of
    msgtable.store.backlog.AGE_BOUNDS_S); without a time_created column the counts alone.

    Indexes: a current-layout table (and every state table) reads ``poller_idx (time_acked,
    priority, time_next)``: the unacked rows are one range of it (time_acked IS NULL) and the
    due and dead tests read its time_next, so without time_created the read is index-only;
    time_created costs a primary-key lookup per unacked row. A 2018-layout table has no index
    on time_acked (``next_idx (time_next, epoch)`` orders by time_next): it is scanned. Either
    way it is bounded by a statement time-out (STATEMENT_TIMEOUT_S): MariaDB's ``SET STATEMENT
    max_statement_time=... FOR`` prefix, MySQL 8's ``MAX_EXECUTION_TIME`` optimizer hint
    (milliseconds; MySQL runs the hint on SELECT only, which this is)."""
    t, acked, raw_next = quote(cfg.name), quote("time_acked"), quote("time_next")
    if cfg.layout is Layout.CURRENT:
        due = f"({raw_next} IS NULL OR {raw_next} <= %s)"
    else:
        due = f"COALESCE({raw_next}, {quote('time_scheduled')}, 0) <= %s"
    columns = f"COUNT(*), COALESCE(SUM({due}), 0)"
    if cfg.has_column("time_created"):
        created = quote("time_created")
        columns += f", MIN({created})" + "".join(
            f", COALESCE(SUM({created} >= %s), 0)" for _ in AGE_BOUNDS_S[:-1]
        )
    where = f"{acked} IS NULL AND NOT ({raw_next} <=> {DEAD_TIME_NEXT})"
    if mariadb:
        return (
            f"SET STATEMENT max_statement_time={STATEMENT_TIMEOUT_S:g} FOR "
            f"SELECT {columns} FROM {t} WHERE {where}"
        )
    hint = f"/*+ MAX_EXECUTION_TIME({round(STATEMENT_TIMEOUT_S * 1000)}) */ "
    return f"SELECT {hint}{columns} FROM {t} WHERE {where}"


def claim_rows(
    cur: Any,
    s: TableStatements,
    groups: Sequence[tuple[int | None, list[CachedRow], int]],
    now_ns: int,
    lock_first: bool,
    keep: Keep | None = None,
) -> list[CachedRow] | None:
    """The claim's UPDATEs, one per (epoch, rows read at it, their new time_next); returns
    the rows claimed.

    An UPDATE's count says how many rows it changed, not which: when it changed some of its
    rows but not all, the rows it changed cannot be told from a row that had the new values
    already, so this returns None, and the caller rolls back and claims again with
    ``lock_first``: locking reads pick the rows first (``keep`` chooses among them), and the
    UPDATEs take exactly those."""
    if lock_first:
        ours: set[Hashable] = set()
        for epoch, rows, _ in groups:
            in_ids, id_params = in_list([r.id for r in rows])
            cur.execute(s.claimable.format(ids=in_ids), [*id_params, epoch, now_ns])
            ours.update(r[0] for r in cur.fetchall())
        if keep is not None:
            ours = {r.id for r in keep([r for _, rows, _ in groups for r in rows], ours)}
        groups = [(e, [r for r in rows if r.id in ours], nxt) for e, rows, nxt in groups]
    claimed: list[CachedRow] = []
    for epoch, rows, nxt in groups:
        if not rows:
            continue
        in_ids, id_params = in_list([r.id for r in rows])
        done = cur.execute(s.claim.format(ids=in_ids), [nxt, *id_params, epoch, now_ns])
        if done == len(rows):
            claimed.extend(rows)
        elif done and not lock_first:
            return None
    return claimed
