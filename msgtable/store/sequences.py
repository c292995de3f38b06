"""The commit-ordered fan-out sequence of a message table (issue 42, item 3: the design is in
msgtable/features/subscriptions/design.md, section (a)).

``time_fanout`` numbers each row handed to the subscriptions, in commit order: one counter
row per message table in SEQUENCE_TABLE, updated by the fan-out transaction's last statements
but the numbering of its rows (take), so that its lock is held only for that UPDATE, the
numbering and the commit. Two fan-outs of a table (two servers during a hand-over) number
their rows one after the other, each above the numbers of every fan-out that committed before
it: a reader that sees number n sees every smaller number committed.

A fan-out whose server lost its database link between the counter's UPDATE and its commit
would hold the counter row until the database ends its session (wait_timeout). The next
fan-out waits at most WAIT_S for it (MariaDB: a time-out of that statement alone; MySQL: not at
all, a NOWAIT locking read first), then reads the holder's connection id (the counter row's
``holder``, read uncommitted: the holder's own write) and KILLs it if the database shows it
idle (information_schema.PROCESSLIST, ``Sleep``) for WAIT_S or more: a live fan-out is never
idle while it holds the row. The killed transaction rolls back whole, its rows stay unseen and
are handed over again.
"""

from __future__ import annotations

import logging
from typing import Any

from msgtable.core.sql import MARK, quote
from msgtable.core.subscriptions import FANOUT_COLUMN
from msgtable.core.tables import DEAD_TIME_NEXT, TableConfig
from msgtable.store.mysql import error_code

log = logging.getLogger(__name__)

SEQUENCE_TABLE = "msgtable_fanout_sequence"
WAIT_S = 2  # the longest a fan-out waits for another's counter row before it looks why
SEQUENCE = quote(SEQUENCE_TABLE)
SEQUENCE_DDL = f"""CREATE TABLE IF NOT EXISTS {SEQUENCE} (
  table_name VARCHAR(64) NOT NULL,
  last BIGINT NOT NULL,
  holder BIGINT NULL,
  PRIMARY KEY (table_name)
) ENGINE=InnoDB COMMENT 'msgtable fan-out sequences'"""
# the counter's start: above every number (or, from an earlier version, time) already there
START = (
    f"INSERT IGNORE INTO {SEQUENCE} (table_name, last) "
    f"SELECT %s, COALESCE(MAX({quote(FANOUT_COLUMN)}), 0) FROM {{table}}"
)
# n numbers: the new last comes back as the statement's LAST_INSERT_ID (cursor.lastrowid)
_TAKE = (
    f"{SEQUENCE} SET last = LAST_INSERT_ID(last + %s), holder = CONNECTION_ID() "
    "WHERE table_name = %s"
)
# by whether the server is MariaDB: there, the lock wait time-out of this statement alone;
# MySQL has no such thing (innodb_lock_wait_timeout cannot be set by a SET_VAR hint): it
# takes the row's lock with NOWAIT first (LOCK_NOWAIT), one more round trip under the lock
TAKE = {
    True: f"{MARK}SET STATEMENT innodb_lock_wait_timeout = {WAIT_S} FOR UPDATE {_TAKE}",
    False: f"{MARK}UPDATE {_TAKE}",
}
LOCK_NOWAIT = f"SELECT 1 FROM {SEQUENCE} WHERE table_name = %s FOR UPDATE NOWAIT"
HOLDER = f"SELECT holder FROM {SEQUENCE} WHERE table_name = %s"
# the counter row if nobody holds it (autocommit: its lock ends with the statement); the
# holder read after it is still holding it unless it committed in between (then the KILL
# would end an idle connection of its pool, which its next statement takes for a lost link)
FREE = f"SELECT 1 FROM {SEQUENCE} WHERE table_name = %s FOR UPDATE SKIP LOCKED"
IDLE = "SELECT COMMAND, TIME FROM information_schema.PROCESSLIST WHERE ID = %s"
LOCK_WAIT_TIMEOUT = 1205
LOCK_NOWAIT_REFUSED = 3572  # MySQL: a NOWAIT locking read found the row locked
SYNTAX_ERROR = 1064
NO_SUCH_TABLE = 1146
NO_SUCH_THREAD = 1094
NOT_OWNER = 1095


class Stalled(Exception):
    """The counter row of a table is held by another fan-out past WAIT_S."""


def start(cur: Any, table: str) -> None:
    """Make the table's counter row if it has none (autocommit: a row for good)."""
    cur.execute(SEQUENCE_DDL)
    cur.execute(START.format(table=quote(table)), [table])


class Counters:
    """Takes numbers of the tables' sequences (one per store: it learns the flavour of the
    database from its connection's server version, or else from its first statement, a
    MariaDB one; a syntax error there means MySQL)."""

    def __init__(self) -> None:
        self.mariadb: bool | None = None

    def _learn(self, cur: Any) -> None:
        """The flavour from the server version the connection got at its handshake (no
        statement: MySQL is no longer sent a MariaDB statement to refuse)."""
        info = getattr(getattr(cur, "connection", None), "get_server_info", None)
        try:
            version = info() if info is not None else None
        except Exception:
            version = None
        if isinstance(version, bytes | str) and version:
            text = version.decode() if isinstance(version, bytes) else version
            self.mariadb = "mariadb" in text.lower()

    def take(self, cur: Any, table: str, n: int) -> int | None:
        """Take ``n`` numbers of the table's sequence in the fan-out's transaction (the
        counter row locked until its commit): returns the last one (the first is ``last - n
        + 1``), None if the table has no counter row yet (start() it), or raise Stalled if
        another fan-out holds it longer than WAIT_S."""
        if self.mariadb is None:
            self._learn(cur)
        try:
            if self.mariadb is not False:
                try:
                    changed = cur.execute(TAKE[True], [n, table])
                    self.mariadb = True
                except Exception as exc:
                    if self.mariadb is not None or error_code(exc) != SYNTAX_ERROR:
                        raise
                    self.mariadb = False  # MySQL: no SET STATEMENT (nothing was done)
            if self.mariadb is False:
                if not cur.execute(LOCK_NOWAIT, [table]):
                    return None
                changed = cur.execute(TAKE[False], [n, table])
        except Exception as exc:
            if error_code(exc) in (LOCK_WAIT_TIMEOUT, LOCK_NOWAIT_REFUSED):
                raise Stalled(table) from exc
            if error_code(exc) == NO_SUCH_TABLE:  # no sequence table yet
                return None
            raise
        return int(cur.lastrowid) if changed else None


def unstall(cur: Any, table: str) -> bool:
    """On an autocommit cursor: KILL the connection holding the table's counter row if it is
    idle (a fan-out whose server lost its link); returns whether one was killed."""
    if cur.execute(FREE, [table]):  # not held (any more): nobody to kill
        return False
    cur.execute("SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")  # the next one only
    cur.execute(HOLDER, [table])
    row = cur.fetchone()
    holder = None if row is None else row[0]
    if holder is None:
        return False
    cur.execute(IDLE, [int(holder)])
    state = cur.fetchone()
    if state is None:
        return False
    command = state[0].decode() if isinstance(state[0], bytes) else str(state[0])
    if command != "Sleep" or int(state[1] or 0) < WAIT_S:
        return False
    log.warning(
        "table %s: the fan-out of connection %s holds the sequence and has been idle %ss: "
        "killing it (its rows are handed over again)",
        table,
        holder,
        state[1],
    )
    try:
        cur.execute(f"KILL {int(holder)}")
    except Exception as exc:
        if error_code(exc) == NO_SUCH_THREAD:
            return True
        if error_code(exc) == NOT_OWNER:
            log.warning(
                "table %s: this account may not kill connection %s, which holds the fan-out "
                "sequence: KILL %s as an administrator",
                table,
                holder,
                holder,
            )
            return False
        raise
    return True


# -- the cursors (design.md, section (b)): a subscription's place in its table's sequence ---
CURSOR_TABLE = "msgtable_fanout_cursors"
CURSORS = quote(CURSOR_TABLE)
CURSOR_DDL = f"""CREATE TABLE IF NOT EXISTS {CURSORS} (
  table_name VARCHAR(64) NOT NULL,
  name VARCHAR(64) NOT NULL,
  sent_upto BIGINT NOT NULL,
  PRIMARY KEY (table_name, name)
) ENGINE=InnoDB COMMENT 'msgtable subscription cursors'"""
# a new subscription's: at the sequence's last number (it gets what is handed over after it)
CURSOR_START = (
    f"INSERT INTO {CURSORS} (table_name, name, sent_upto) "
    f"SELECT table_name, %s, last FROM {SEQUENCE} WHERE table_name = %s "
    "ON DUPLICATE KEY UPDATE sent_upto = VALUES(sent_upto)"
)
CURSOR = f"SELECT sent_upto FROM {CURSORS} WHERE table_name = %s AND name = %s"
# moved only from where its writer saw it: a sender that lost the lease moves nothing
ADVANCE = (
    f"{MARK}UPDATE {CURSORS} SET sent_upto = %s "
    "WHERE table_name = %s AND name = %s AND sent_upto = %s"
)
CURSOR_DROP = f"DELETE FROM {CURSORS} WHERE table_name = %s AND name = %s"
# an expired subscription active again: what is handed over from now on (as a new one's)
CURSOR_RESTART = (
    f"{MARK}UPDATE {CURSORS} c JOIN {SEQUENCE} q ON q.table_name = c.table_name "
    "SET c.sent_upto = q.last WHERE c.table_name = %s AND c.name = %s"
)


def unsent_sql(table: str, state_table: str, where: str) -> str:
    """The cursor's scan: the ids and numbers of the rows numbered above %s that ``where``
    (a filter's bound-parameter fragment over the message table's columns, or "") passes and
    that have no state row (sent and not settled in cursor order, or acked by DML), in
    sequence order, up to %s; read through fanout_idx."""
    fanout = quote(FANOUT_COLUMN)
    cond = f" AND ({where})" if where else ""
    return (
        f"SELECT m.`id`, m.{fanout} FROM {quote(table)} m "
        f"LEFT JOIN {quote(state_table)} s ON s.`id` = m.`id` "
        f"WHERE m.{fanout} > %s{cond} AND s.`id` IS NULL ORDER BY m.{fanout} LIMIT %s"
    )


def unsent_rows_sql(table: TableConfig, cfg: TableConfig, where: str) -> str:
    """The cursor's scan as a lazy subscription's poll reads it (msgtable.features.
    subscriptions.lazy): the rows of ``unsent_sql`` as a poll of the state table ``cfg``
    would return them (priority, time_next, epoch 0, its message columns, time_created),
    each with its number last. A message the default group has not sent yet keeps its
    time_next (a delayed message stays delayed), as the eager fan-out's state row would."""
    fanout = quote(FANOUT_COLUMN)
    cond = f" AND ({where})" if where else ""
    values = ", ".join(f"m.{quote(c.name)}" for c in cfg.message_columns)
    nxt = "IF(COALESCE(m.`epoch`, 0) = 0, m.`time_next`, NULL)" if table.default_group else "NULL"
    created = "m.`time_created`" if table.has_column("time_created") else "NULL"
    return (
        f"SELECT m.`priority`, {nxt}, 0, {values}, {created}, m.{fanout} "
        f"FROM {quote(table.name)} m LEFT JOIN {quote(cfg.name)} s ON s.`id` = m.`id` "
        f"WHERE m.{fanout} > %s{cond} AND s.`id` IS NULL ORDER BY m.{fanout} LIMIT %s"
    )


def written_sql(state_table: str) -> str:
    """Which ids (``{ids}``: an IN list) have a state row: a plain read by primary key."""
    return (
        f"{MARK}SELECT `id` FROM {quote(state_table)} FORCE INDEX (PRIMARY) WHERE `id` IN ({{ids}})"
    )


def state_rows_sql(state_table: str, n: int, acked: bool, fenced: str = "") -> str:
    """``n`` state rows of a lazy subscription, written when its window can no longer hold
    them alone (postponed, settled by a verb, due later, acked while being postponed):
    (id, priority, time_next, epoch, time_created[, time_acked]) each. A row there already
    is kept; ``acked``: it is acked too, unless it is dead (a late ack leaves a dead letter
    dead), as the ack UPDATE would. ``fenced`` (statements.FENCE, its parameters after
    the rows': MySQLStore.fence_as): the rows are written only if it holds as the statement
    runs, an INSERT ... SELECT of them."""
    s = quote(state_table)
    cols = "`id`, `priority`, `time_next`, `epoch`, `time_created`"
    width = 5
    update = f"{s}.`id` = {s}.`id`"
    if acked:
        cols += ", `time_acked`"
        width = 6
        dead = f"{s}.`time_next` <=> {DEAD_TIME_NEXT}"
        update = (
            f"`time_acked` = IF({dead}, {s}.`time_acked`, "
            f"COALESCE({s}.`time_acked`, VALUES(`time_acked`))), "
            f"`time_next` = IF({dead}, {s}.`time_next`, NULL)"
        )
    one = "(" + ", ".join(["%s"] * width) + ")"
    if not fenced:
        return (
            f"{MARK}INSERT INTO {s} ({cols}) VALUES {', '.join([one] * n)} "
            f"ON DUPLICATE KEY UPDATE {update}"
        )
    first = "SELECT " + ", ".join(f"%s AS c{k}" for k in range(width))
    rest = " UNION ALL SELECT " + ", ".join(["%s"] * width)
    return (
        f"{MARK}INSERT INTO {s} ({cols}) SELECT v.* FROM ({first}{rest * (n - 1)}) AS v "
        f"WHERE 1{fenced} ON DUPLICATE KEY UPDATE {update}"
    )


def unsent_lag_sql(table: TableConfig, state_table: str, where: str, cap: int) -> str:
    """A lazy subscription's messages never sent (up to ``cap``) and the oldest one's
    time_created: the rows above its cursor (the table's and its name, %s and %s) that
    ``where`` passes (its parameters after those) and that have no state row."""
    fanout = quote(FANOUT_COLUMN)
    cond = f" AND ({where})" if where else ""
    created = "m.`time_created`" if table.has_column("time_created") else "NULL"
    above = f"(SELECT c.`sent_upto` FROM {CURSORS} c WHERE c.`table_name` = %s AND c.`name` = %s)"
    return (
        f"SELECT COUNT(*), MIN(tc) FROM (SELECT {created} AS tc FROM {quote(table.name)} m "
        f"LEFT JOIN {quote(state_table)} s ON s.`id` = m.`id` "
        f"WHERE m.{fanout} > {above}{cond} AND s.`id` IS NULL LIMIT {int(cap)}) AS l"
    )
