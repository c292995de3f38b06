"""The SQL msgtable runs, asserted as exact strings (the integration tests run it for real)."""

from __future__ import annotations

import importlib

from msgtable.core.sql import in_list, placeholders, quote
from msgtable.core.tables import Column, load_table
from msgtable.store.mysql import fastest_driver, without_driver
from msgtable.store.mysqlstore import MySQLStore
from msgtable.store.statements import TableStatements
from msgtable.testing import CURRENT_COLUMNS
from tests.unit.core.test_tables import GOOD, V2018_COLUMNS


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
        "/* msgtable */ UPDATE `q` FORCE INDEX (PRIMARY) "
        "SET `time_next` = %s, `epoch` = COALESCE(`epoch`, 0) + 1 "
        "WHERE `id` IN ({ids}) AND `epoch` <=> %s AND `time_acked` IS NULL "
        "AND (`time_next` IS NULL OR `time_next` <= %s)"
    )
    assert s.claimable == (
        "SELECT `id` FROM `q` FORCE INDEX (PRIMARY) WHERE `id` IN ({ids}) AND `epoch` <=> %s "
        "AND `time_acked` IS NULL "
        "AND (`time_next` IS NULL OR `time_next` <= %s) FOR UPDATE"
    )
    assert s.ack == (
        "/* msgtable */ UPDATE `q` FORCE INDEX (PRIMARY) SET `time_acked` = %s, `time_next` = NULL "
        "WHERE `id` IN ({ids}) AND `time_acked` IS NULL "
        "AND NOT (`time_next` <=> 9223372036854775807)"  # a dead one stays dead
    )
    # the redelivery poll: the unacked priorities one index dive each, then the rows given a
    # time of those priorities (one range of poller_idx each), time_created last
    assert s.first_priority == "SELECT MIN(`priority`) FROM `q` WHERE `time_acked` IS NULL"
    assert s.next_priority == s.first_priority + " AND `priority` > %s"
    assert s.poll_timed == (
        select.replace("`message` FROM", "`message`, `time_created` FROM")
        + " AND `time_next` > 0 AND `priority` IN ({ps})"
        + order
    )
    # the purge: a plain read picks the rows, the DELETE takes exactly those by primary key
    assert s.purge_pick == "SELECT `id` FROM `q` WHERE `time_acked` < %s LIMIT %s"
    assert (
        s.purge == "/* msgtable */ DELETE `q` FROM `q` FORCE INDEX (PRIMARY) "
        "WHERE `id` IN ({ids}) AND `time_acked` < %s"
    )
    # the manager's polls read time_created last (the created -> sent delay)
    created = select.replace("`message` FROM", "`message`, `time_created` FROM")
    assert s.polls_created == (
        created + order,
        s.poll_after.replace(select, created),
        s.poll_after_null.replace(select, created),
    )
    bare = [c for c in CURRENT_COLUMNS if c.name != "time_created"]
    s = TableStatements(load_table("q", GOOD, tuple(bare), (("id",),)))
    assert s.polls_created[0] == s.poll.replace("`message` FROM", "`message`, NULL FROM")


def test_the_statements_of_the_deferred_postpone():
    s = TableStatements(load_table("q", GOOD, CURRENT_COLUMNS, (("id",),)))
    due = "(`time_next` IS NULL OR `time_next` <= %s)"
    assert s.lock == (
        "SELECT `id`, `epoch` FROM `q` FORCE INDEX (PRIMARY) WHERE `id` IN ({ids}) "
        f"AND `time_acked` IS NULL AND {due} LOCK IN SHARE MODE"
    )
    assert s.postpone == (
        "/* msgtable */ UPDATE `q` FORCE INDEX (PRIMARY) SET `epoch` = COALESCE(`epoch`, 0) + 1, "
        "`time_next` = IF(`time_acked` IS NULL, %s, `time_next`) "
        f"WHERE `id` IN ({{ids}}) AND `epoch` <=> %s AND (`time_acked` IS NOT NULL OR {due})"
    )
    unacked = (
        " WHERE `id` IN ({ids}) AND `time_acked` IS NULL "
        "AND NOT (`time_next` <=> 9223372036854775807)"
    )
    assert s.ack_first == (
        "/* msgtable */ UPDATE `q` FORCE INDEX (PRIMARY) "
        "SET `time_acked` = %s, `time_next` = NULL, "
        "`epoch` = COALESCE(`epoch`, 0) + (`epoch` <=> %s)" + unacked
    )  # counted where the row is at the epoch the send read: a postpone heard or not
    assert s.ack_mixed == (
        "/* msgtable */ UPDATE `q` FORCE INDEX (PRIMARY) "
        "SET `time_acked` = %s, `time_next` = NULL, "
        "`epoch` = COALESCE(`epoch`, 0) + ({first})" + unacked
    )


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


def test_integer_ids_are_written_as_literals_and_anything_else_is_a_parameter():
    assert in_list([3, -1, 2**63 - 1]) == ("3,-1,9223372036854775807", [])
    assert in_list(["a", "b"]) == ("%s,%s", ["a", "b"])
    # bool is an int subclass but not an id to print as True/False: parameters
    assert in_list([1, True]) == ("%s,%s", [1, True])
    assert in_list([1, "x"]) == ("%s,%s", [1, "x"])


def test_a_url_without_a_driver_gets_the_fastest_one_installed(monkeypatch):
    assert without_driver("mysql+pymysql://u:p%40w@h:3307/db") == "mysql://u:p%40w@h:3307/db"
    assert without_driver("mariadb+mysqldb://u@h/db") == "mariadb://u@h/db"
    real_import = importlib.import_module

    def no_mysqldb(name: str, *args: object) -> object:
        if name == "MySQLdb":
            raise ImportError("No module named 'MySQLdb'")
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_mysqldb)
    assert fastest_driver() == "pymysql"
    assert MySQLStore.from_dsn("mysql://u:p@127.0.0.1:1/db").driver == "pymysql"
    monkeypatch.setattr(importlib, "import_module", real_import)
    assert fastest_driver() == "mysqldb"  # the test extra installs mysqlclient
    assert MySQLStore.from_dsn("mysql://u:p@127.0.0.1:1/db").driver == "mysqldb"
    assert MySQLStore.from_dsn("mysql+pymysql://u:p@127.0.0.1:1/db").driver == "pymysql"


def test_a_table_name_with_braces_survives_the_id_list_template():
    cfg = load_table("we{ids}r{d", GOOD, CURRENT_COLUMNS, (("id",),))
    s = TableStatements(cfg)
    for template in (s.claim, s.claimable, s.lock, s.postpone, s.ack, s.ack_first, s.acked):
        sql = template.format(ids="1,2")
        assert "`we{ids}r{d`" in sql and "IN (1,2)" in sql
    assert "`we{ids}r{d`" in s.ack_mixed.format(ids="1,2", first="1")
    assert "`we{ids}r{d`" in s.poll and "`we{ids}r{d`" in s.purge_pick
    assert "`we{ids}r{d`" in s.purge.format(ids="1,2")


def test_a_fair_tables_skipping_poll_goes_by_its_fair_index_and_its_other_polls_do_not():
    cols = (*CURRENT_COLUMNS, Column("tenant", "varchar", "varchar(64)"))
    index = (("fair_idx", ("time_acked", "tenant", "priority", "time_next")),)
    cfg = load_table("q", GOOD + ",vt_fair_key=tenant", cols, (("id",),), index)
    s = TableStatements(cfg)
    assert "FORCE INDEX" not in s.poll_query(9, 10, None)[0]
    sql, params = s.poll_query(9, 10, None, skip_keys=("a",))
    assert sql.startswith("SELECT ") and " FROM `q` FORCE INDEX (`fair_idx`) WHERE " in sql
    assert sql.endswith(" AND (`tenant` NOT IN (%s) OR `tenant` IS NULL)" + ORDER) and params == [
        9,
        "a",
        10,
    ]
    bare = TableStatements(load_table("q", GOOD + ",vt_fair_key=tenant", cols, (("id",),)))
    assert "FORCE INDEX" not in bare.poll_query(9, 10, None, skip_keys=("a",))[0]


ORDER = " ORDER BY `priority`, `time_next`, `id` LIMIT %s"


def test_a_fair_poll_skips_the_keys_holding_their_share_and_keeps_the_null_key_apart():
    cols = (*CURRENT_COLUMNS, Column("tenant", "varchar", "varchar(64)"))
    s = TableStatements(load_table("q", GOOD + ",vt_fair_key=tenant", cols, (("id",),)))
    order = " ORDER BY `priority`, `time_next`, `id` LIMIT %s"
    head = s.poll.removesuffix(order)
    assert s.poll_query(9, 10, None, skip_keys=()) == (s.poll, [9, 10])
    assert s.poll_query(9, 10, None, skip_keys=("a", "b")) == (
        head + " AND (`tenant` NOT IN (%s, %s) OR `tenant` IS NULL)" + order,
        [9, "a", "b", 10],
    )
    assert s.poll_query(9, 10, None, skip_keys=("a", None)) == (
        head + " AND `tenant` NOT IN (%s)" + order,
        [9, "a", 10],
    )
    assert s.poll_query(9, 10, None, skip_keys=(None,)) == (
        head + " AND `tenant` IS NOT NULL" + order,
        [9, 10],
    )
    # continued after a key: the skip's parameters after the key's, before the limit
    sql, params = s.poll_query(9, 10, (1, 5, 7), skip_keys=("a",))
    assert sql.startswith(s.poll_after.removesuffix(order)) and params == [
        9,
        1,
        1,
        5,
        5,
        7,
        "a",
        10,
    ]
