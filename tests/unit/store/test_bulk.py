"""The pipeline's read conditions (msgtable.store.bulk), asserted as exact strings: every state of a
message table, and dead rows in none of the states that wait to be sent. Needs no server
(tests/spark/test_source.py reads each state from a real one)."""

from __future__ import annotations

import pytest

from msgtable.core.deadletters import holds_dead_letters
from msgtable.core.tables import DEAD_TIME_NEXT, Column, load_table
from msgtable.errors import InvalidArgument
from msgtable.store.bulk import BulkStatements, RowState

NOW = 1_767_225_600 * 10**9
BIGINT = ("bigint", "bigint(20)")
TEXT = ("varchar", "varchar(1000)")


def table(name: str, *extra: tuple[str, tuple[str, str]]) -> BulkStatements:
    """The statements of a table of the current layout (schema/current.sql) and ``extra``."""
    names = ["id", "priority", "time_next", "epoch", "time_acked", "time_created", "message"]
    columns = [Column(n, *BIGINT) for n in names[:-1]] + [Column("message", *TEXT)]
    columns += [Column(n, *kind) for n, kind in extra]
    comment = (
        "vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=10,"
        "vt_cache_size=10000,vt_poller_interval=30"
    )
    return BulkStatements(load_table(name, comment, columns, [["id"]]))


SOURCE = table("orders", ("last_error", TEXT))
DEAD_LETTER = table(
    "orders_dead", ("time_dead", BIGINT), ("attempts", BIGINT), ("last_error", TEXT)
)


@pytest.mark.parametrize(
    ("state", "where", "params"),
    [
        (RowState.ALL, "TRUE", []),
        (RowState.ACKED, "`time_acked` IS NOT NULL", []),
        (RowState.UNACKED, "`time_acked` IS NULL", []),
        (
            RowState.DUE,
            "`time_acked` IS NULL AND (`time_next` IS NULL OR `time_next` <= %s)",
            [NOW],
        ),
        (
            RowState.SCHEDULED,
            "`time_acked` IS NULL AND `time_next` > %s AND `time_next` < %s "
            "AND COALESCE(`epoch`, 0) = 0",
            [NOW, DEAD_TIME_NEXT],
        ),
        (
            RowState.IN_FLIGHT,
            "`time_acked` IS NULL AND `time_next` > %s AND `time_next` < %s "
            "AND COALESCE(`epoch`, 0) > 0",
            [NOW, DEAD_TIME_NEXT],
        ),
        (RowState.DEAD, "`time_acked` IS NULL AND `time_next` = %s", [DEAD_TIME_NEXT]),
    ],
)
def test_each_state_is_one_condition_with_bound_values(state, where, params):
    assert SOURCE.state(state, NOW) == (where, params)


def test_dead_in_a_dead_letter_table_is_every_unacked_row():
    assert holds_dead_letters(DEAD_LETTER.columns) and not holds_dead_letters(SOURCE.columns)
    assert DEAD_LETTER.state(RowState.DEAD, NOW) == ("`time_acked` IS NULL", [])
    assert not holds_dead_letters(["id", "time_dead", "last_error"])  # a table dead in place


def test_a_state_is_named_or_the_error_lists_them_all():
    assert RowState.parse(" Dead ") is RowState.DEAD
    with pytest.raises(InvalidArgument) as caught:
        RowState.parse("undead")
    assert str(caught.value) == (
        "state must be one of all, unacked, due, scheduled, in_flight, dead, acked, not 'undead'"
    )
