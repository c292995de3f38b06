"""Every statement that locks rows it names by id goes by the primary key.

On a small table an IN list of many ids is planned as a scan of the whole table (MariaDB
10.11, 400 rows, 100 ids: `DELETE ... WHERE id IN (...)` type ALL, `UPDATE` a full index
scan), and a locking statement then locks every row it reads, rows it does not change
included: the purge and the fan-out's mark deadlocked so (tests/integration/test_deadlocks.py
shows the lock). Each such statement carries FORCE INDEX (PRIMARY)."""

from __future__ import annotations

import re

import pytest

from msgtable.core.tables import DEMO_COMMENT, Column, load_table
from msgtable.store.bulk import BulkStatements
from msgtable.store.deadletters import DeadStatements, RedriveStatements
from msgtable.store.statements import BY_ID
from msgtable.store.subscriptions import orphans_delete_sql
from msgtable.testing import CURRENT_COLUMNS

DEAD = (
    Column("time_dead", "bigint", "bigint"),
    Column("attempts", "bigint", "bigint"),
    Column("last_error", "varchar", "varchar(100)"),
)
KEY = (("id",),)


def by_id_statements() -> dict[str, str]:
    q = load_table("q", f"{DEMO_COMMENT},vt_dead_letter=q_dead", CURRENT_COLUMNS, KEY)
    dead = load_table("q_dead", DEMO_COMMENT, CURRENT_COLUMNS + DEAD, KEY)
    in_place = DeadStatements(q, None)
    moved = DeadStatements(q, dead)
    back = RedriveStatements(dead, q)
    revive = RedriveStatements(q, q)
    return {
        "dead letter pick": in_place.pick,
        "dead letter pick (expired)": in_place.pick_expired,
        "dead in place": in_place.in_place,
        "dead letter copy": moved.copy,
        "dead letter remove": moved.remove,
        "redrive taken": back.taken,
        "redrive copy": back.copy,
        "redrive remove": back.remove,
        "redrive in place": revive.revive,
        "subscription orphans": orphans_delete_sql("q__s", "q"),
        "archive delete": BulkStatements(q).delete_acked(3),
    }


@pytest.mark.parametrize("name", sorted(by_id_statements()))
def test_a_locking_statement_by_id_goes_by_the_primary_key(name: str) -> None:
    sql = by_id_statements()[name]
    assert re.search(r"`id` IN \(", sql), f"{name} is not by id: {sql}"
    assert BY_ID in sql, f"{name} may scan the whole table and lock rows it does not name: {sql}"
