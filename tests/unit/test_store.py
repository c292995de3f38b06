"""The SQL msgtable runs, asserted as exact strings (the integration tests run it for real)."""

from __future__ import annotations

from msgtable.store import TableStatements, placeholders, quote
from msgtable.tables import load_table
from msgtable.testing import CURRENT_COLUMNS

from .test_tables import GOOD, V2018_COLUMNS


def test_identifiers_are_quoted_and_escaped_for_the_driver():
    assert quote("my_message") == "`my_message`"
    assert quote("we`ird%name") == "`we``ird%%name`"
    assert placeholders(3) == "%s,%s,%s"


def test_the_statements_of_the_current_layout():
    s = TableStatements(load_table("q", GOOD, CURRENT_COLUMNS, (("id",),)))
    select = (
        "SELECT `priority`, `time_next`, `epoch`, `id`, `message` FROM `q` "
        "WHERE `time_acked` IS NULL AND (`time_next` IS NULL OR `time_next` <= %s)"
    )
    order = " ORDER BY `priority`, `time_next`, `id` LIMIT %s"
    assert s.poll == select + order
    assert s.poll_after == (
        select + " AND (`priority` > %s OR (`priority` = %s AND (`time_next` > %s"
        " OR (`time_next` = %s AND `id` > %s))))" + order
    )
    assert s.poll_after_null == (
        select + " AND (`priority` > %s OR (`priority` = %s AND (`time_next` IS NOT NULL"
        " OR `id` > %s)))" + order
    )
    assert s.claim == (
        "UPDATE `q` SET `time_next` = %s, `epoch` = COALESCE(`epoch`, 0) + 1 "
        "WHERE `id` IN ({ids}) AND `epoch` <=> %s AND `time_acked` IS NULL "
        "AND (`time_next` IS NULL OR `time_next` <= %s)"
    )
    assert s.ack == (
        "UPDATE `q` SET `time_acked` = %s, `time_next` = NULL "
        "WHERE `id` IN ({ids}) AND `time_acked` IS NULL"
    )
    assert s.purge == "DELETE FROM `q` WHERE `time_acked` < %s LIMIT %s"


def test_poll_parameters_follow_the_key_it_continues_after():
    s = TableStatements(load_table("q", GOOD, CURRENT_COLUMNS, (("id",),)))
    assert s.poll_query(9, 10, None) == (s.poll, [9, 10])
    assert s.poll_query(9, 10, (1, 5, 7)) == (s.poll_after, [9, 1, 1, 5, 5, 7, 10])
    assert s.poll_query(9, 10, (1, None, 7)) == (s.poll_after_null, [9, 1, 1, 7, 10])


def test_the_2018_layout_reads_time_scheduled_for_a_null_time_next():
    s = TableStatements(load_table("old", GOOD, V2018_COLUMNS, (("id",),)))
    when = "COALESCE(`time_next`, `time_scheduled`, 0)"
    assert s.poll == (
        f"SELECT 0, {when}, `epoch`, `id`, `message` FROM `old` "
        f"WHERE `time_acked` IS NULL AND {when} <= %s ORDER BY {when}, `id` LIMIT %s"
    )
    assert s.poll_query(9, 10, (0, 5, 7)) == (s.poll_after, [9, 5, 5, 7, 10])
