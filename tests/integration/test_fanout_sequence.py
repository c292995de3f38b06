"""The commit-ordered fan-out sequence (issue 42, item 3, section (a) of
msgtable/features/subscriptions/design.md) on a real MySQL-family server through the real
server: time_fanout numbers each row handed over, one number each, in id order within a
batch, above every number (or, from before, time) already there and above every number a
fan-out that committed earlier gave; a fan-out stalled with the counter row (its server lost
its link) is killed, not waited for until the database ends its session."""

from __future__ import annotations

import threading

import pymysql
import pytest
from sqlalchemy.engine import make_url

from msgtable.store.mysql import pymysql_args
from msgtable.store.sequences import SEQUENCE_TABLE, unsent_sql

from ..waiting import wait_until
from .helpers import Served, serve
from .test_subscriptions import enqueue, make_orders

HANDED = "select count(*) from orders where time_fanout is null"


@pytest.fixture
def served(db_dsn: str):
    with serve(db_dsn, follow_binlog=True) as s:
        yield s


def numbers(s: Served) -> dict[int, int]:
    return {int(i): int(n) for i, n in s.sql("select id, time_fanout from orders order by id")}


def connect(dsn: str) -> pymysql.connections.Connection:
    url = make_url(dsn)
    return pymysql.connect(**pymysql_args(url), database=url.database, autocommit=False)


def test_rows_are_numbered_one_each_in_order_above_what_was_there(served: Served):
    make_orders(served)
    enqueue(served, [1, 2])  # before the first subscription: seen by none (a time)
    served.client.create_subscription("orders", "audit")
    (before,) = served.sql("select max(time_fanout) from orders")[0]
    enqueue(served, [3, 4, 5])
    wait_until(lambda: served.sql(HANDED)[0][0] == 0, what="rows 3-5 handed over")
    first = numbers(served)
    assert [first[i] for i in (3, 4, 5)] == [before + 1, before + 2, before + 3], first
    enqueue(served, [7, 6])
    wait_until(lambda: served.sql(HANDED)[0][0] == 0, what="rows 6 and 7 handed over")
    second = numbers(served)
    assert [second[i] for i in (6, 7)] == [before + 4, before + 5], second
    (last,) = served.sql(f"select last from {SEQUENCE_TABLE} where table_name = 'orders'")[0]
    assert last == before + 5


def test_a_fanout_numbers_its_rows_above_one_that_committed_before_it(served: Served, db_dsn):
    make_orders(served)
    served.client.create_subscription("orders", "audit")
    enqueue(served, [1])
    wait_until(lambda: served.sql(HANDED)[0][0] == 0, what="row 1 handed over")
    other = connect(db_dsn)  # another server's fan-out, in its last two statements
    try:
        with other.cursor() as cur:
            cur.execute(
                f"update {SEQUENCE_TABLE} set last = last_insert_id(last + 1), "
                "holder = connection_id() where table_name = 'orders'"
            )
            mine = cur.lastrowid
            cur.execute(
                "insert into orders(id, message, region, kind, amount, time_fanout) "
                f"values (4, 'm4', 'eu', 'order', 4, {mine})"
            )
            enqueue(served, [5])  # committed: this server's fan-out picks it, and waits
            done = threading.Timer(1.0, other.commit)  # live: committed within a second
            done.start()
            wait_until(lambda: served.sql(HANDED)[0][0] == 0, 15, "row 5 handed over")
            done.join()
    finally:
        other.close()
    got = numbers(served)
    assert got[5] > got[4] == mine, f"row 5 numbered above the other fan-out's row 4: {got}"


def test_a_fanout_stalled_with_the_sequence_is_killed_not_waited_for(served: Served, db_dsn):
    """A fan-out whose server lost its link after it took its numbers holds the counter row
    until the database ends its session (wait_timeout, innodb_lock_wait_timeout: 50 s and
    more); the server's next fan-out kills it once it is idle that long, and hands over."""
    make_orders(served)
    served.client.create_subscription("orders", "audit")
    enqueue(served, [1])
    wait_until(lambda: served.sql(HANDED)[0][0] == 0, what="row 1 handed over")
    lost = connect(db_dsn)
    lost_id = lost.thread_id()
    try:
        with lost.cursor() as cur:
            cur.execute(
                f"update {SEQUENCE_TABLE} set last = last_insert_id(last + 1), "
                "holder = connection_id() where table_name = 'orders'"
            )
        enqueue(served, [2])  # the server's fan-out waits for the lost one's counter row
        wait_until(
            lambda: served.sql(HANDED)[0][0] == 0,
            20,
            "row 2 handed over: the stalled fan-out was not killed",
        )
        alive = served.sql(
            f"select count(*) from information_schema.processlist where id = {lost_id}"
        )
        assert alive[0][0] == 0, "the stalled fan-out's connection is gone"
    finally:
        lost.close()
    got = numbers(served)
    assert got[2] == got[1] + 1, f"the killed fan-out's number was not kept: {got}"


def test_a_row_the_fanout_skipped_as_locked_is_handed_over_soon_after_its_lock_ends(
    served: Served, db_dsn
):
    """The fan-out's pick skips rows another transaction holds locked (SKIP LOCKED). A
    committed row whose lock ends without a binlog event (a locking read, such as the
    default group's send check; or, woken by the binlog, the commit of the inserting
    transaction still completing as the pick runs) was left unseen until the next insert
    or the table's poller interval (30 s here): the fan-out now sees the committed rows it
    left and looks again soon."""
    make_orders(served, vt_poller_interval=30)
    served.client.create_subscription("orders", "audit")
    enqueue(served, [1])  # the fan-out's runs since the creation are over once it is in
    wait_until(lambda: served.sql(HANDED)[0][0] == 0, what="row 1 handed over")
    app = connect(db_dsn)
    try:
        with app.cursor() as cur:
            cur.execute("set session sql_log_bin = 0")  # row 2: no binlog event wakes anyone
            cur.execute(
                "insert into orders(id, message, region, kind, amount) "
                "values (2, 'm2', 'us', 'refund', 2)"
            )
            app.commit()
            cur.execute("set session sql_log_bin = 1")
            cur.execute("select time_fanout from orders where id = 2 for update")
            assert cur.fetchone() == (None,), "row 2 unseen when its lock was taken"
            enqueue(served, [3])  # the binlog wakes the fan-out: row 3 in, row 2 locked
            wait_until(
                lambda: served.sql("select time_fanout from orders where id = 3")[0][0],
                10,
                "row 3 handed over",
            )
            assert served.sql("select time_fanout from orders where id = 2")[0][0] is None
            app.rollback()  # the lock ends: nothing is written, no binlog event
        wait_until(
            lambda: served.sql(HANDED)[0][0] == 0,
            10,
            "row 2 handed over within 10 s of its lock's end (the poller interval is 30 s)",
        )
    finally:
        app.close()
    assert served.sql("select count(*) from orders__audit")[0][0] == 3, "all in its state"


def test_the_cursor_scan_reads_from_the_cursor_through_fanout_idx(served: Served):
    """The scan of a subscription's never-sent messages (design.md (b)) is a range of
    fanout_idx from its cursor, each row's state row looked up by its key: the rows it reads
    are those above the cursor, not the table's."""
    make_orders(served)
    served.client.create_subscription("orders", "audit")
    enqueue(served, range(1, 301))
    wait_until(lambda: served.sql(HANDED)[0][0] == 0, what="rows 1-300 handed over")
    (top,) = served.sql("select max(time_fanout) from orders")[0]
    served.sql("analyze table orders")
    sql = unsent_sql("orders", "orders__audit", "").replace("%s", "{}")
    (version,) = served.sql("select version()")[0]
    explain = "explain " if "mariadb" in version.lower() else "explain format=traditional "
    plan = served.sql(explain + sql.format(top - 5, 100))
    keys = {(str(r._mapping["table"]), str(r._mapping["key"])) for r in plan}
    assert keys == {("m", "fanout_idx"), ("s", "PRIMARY")}, plan
