"""Subscriptions end to end (README: Subscriptions): fan-out to named consumer groups, their
filters and projections, their own delivery state, purge held by the slowest, expiry and
max lag, on a real MySQL-family server through the real gRPC server and client."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

from msgtable.errors import InvalidArgument, TableLoadError, TableNotFound

from ..waiting import wait_until
from .helpers import Collector, Served, serve


@pytest.fixture
def served(db_dsn: str):
    with serve(db_dsn, follow_binlog=True) as s:
        yield s


FAST = dict(vt_poller_interval=0.2, vt_ack_wait=2, vt_purge_after=0)
ORDER_COLUMNS = "region varchar(16), kind varchar(16), amount bigint"


def make_orders(s: Served, name: str = "orders", **fields: Any) -> None:
    settings = {**FAST, **fields}
    s.create_table(name, ORDER_COLUMNS, **settings)


def enqueue(s: Served, ids: range | list[int], table: str = "orders", **values: Any) -> None:
    region = values.get("region")
    rows = ",".join(
        f"({i}, 'm{i}', '{region or ('eu' if i % 4 == 0 else 'us')}', "
        f"'{'order' if i % 2 else 'refund'}', {i})"
        for i in ids
    )
    s.sql(f"insert into {table}(id, message, region, kind, amount) values {rows}")


def take_ids(c: Collector, n: int, timeout_s: float = 15.0, ack: bool = True) -> list[int]:
    msgs = c.take(n, timeout_s)
    if ack:
        c.subscription.ack(msgs)
    return sorted(int(m.id) for m in msgs)


def test_every_subscription_gets_every_message_and_acks_on_its_own(served: Served):
    make_orders(served)
    served.client.create_subscription("orders", "billing")
    served.client.create_subscription("orders", "audit")
    enqueue(served, range(1, 41))
    billing = Collector(served.client, "orders", subscription="billing")
    audit = Collector(served.client, "orders", subscription="audit")
    default = Collector(served.client, "orders")
    try:
        assert take_ids(billing, 40) == list(range(1, 41))
        assert take_ids(audit, 40) == list(range(1, 41))
        assert take_ids(default, 40) == list(range(1, 41))
        for c in (billing, audit, default):
            c.nothing_for(0.5)
        unacked = served.sql("select count(*) from orders__billing where time_acked is null")
        assert unacked[0][0] == 0
        wait_until(
            lambda: served.sql("select count(*) from orders")[0][0] == 0,
            10,
            "every group acked every row: all purged (vt_purge_after=0)",
        )
    finally:
        for c in (billing, audit, default):
            c.close()


def test_a_subscription_gets_what_comes_after_it_was_created(served: Served):
    make_orders(served)
    enqueue(served, range(1, 11))
    served.client.create_subscription("orders", "late")
    enqueue(served, range(11, 21))
    c = Collector(served.client, "orders", subscription="late")
    try:
        assert take_ids(c, 10) == list(range(11, 21))
        c.nothing_for(0.5)
    finally:
        c.close()


def test_a_subscription_from_start_gets_the_retained_unacked_messages_too(served: Served):
    make_orders(served)
    served.client.create_subscription("orders", "first")  # the table's rows are now seen
    enqueue(served, range(1, 11))
    wait_until(
        lambda: served.sql("select count(*) from orders where time_fanout is null")[0][0] == 0,
        what="the first subscription was handed the ten rows",
    )
    served.sql("update orders set time_acked = 1 where id <= 3")  # acked by the default group
    n = served.client.create_subscription("orders", "replay", from_start=True)
    assert n == 7
    c = Collector(served.client, "orders", subscription="replay")
    try:
        assert take_ids(c, 7) == list(range(4, 11))
    finally:
        c.close()


def test_a_filtered_subscription_gets_only_its_matches(served: Served):
    make_orders(served)
    served.client.create_subscription("orders", "eu", filter="region = 'eu' AND amount > 4")
    served.client.create_subscription("orders", "matcher", filter="region=eu|xx,kind=refund")
    enqueue(served, range(1, 41))
    eu = Collector(served.client, "orders", subscription="eu")
    matcher = Collector(served.client, "orders", subscription="matcher")
    try:
        expected = [i for i in range(1, 41) if i % 4 == 0 and i > 4]
        assert take_ids(eu, len(expected)) == expected
        expected_m = [i for i in range(1, 41) if i % 4 == 0 and i % 2 == 0]
        assert take_ids(matcher, len(expected_m)) == expected_m
        eu.nothing_for(0.5)
        matcher.nothing_for(0.1)
        # rows that do not match have no state row: they never hold its purge (those that
        # match may be purged already: acked, and vt_purge_after=0)
        state_ids = {int(r[0]) for r in served.sql("select id from orders__eu")}
        assert state_ids <= set(expected), sorted(state_ids - set(expected))
    finally:
        eu.close()
        matcher.close()


def test_a_projection_sends_only_its_columns_id_first(served: Served):
    make_orders(served)
    served.client.create_subscription("orders", "slim", columns=["kind", "id"])
    enqueue(served, [1])
    c = Collector(served.client, "orders", subscription="slim")
    s2 = Collector(served.client, "orders", columns=["amount"])
    try:
        (m,) = c.take(1)
        assert c.subscription.field_names == ("id", "kind")
        assert m.row == (1, "order")
        (m2,) = s2.take(1)
        assert s2.subscription.field_names == ("id", "amount")
        assert m2.row == (1, 1)
    finally:
        c.close()
        s2.close()


def test_purge_waits_for_the_slowest_subscription_and_then_happens(served: Served):
    make_orders(served)
    served.client.create_subscription("orders", "fast")
    served.client.create_subscription("orders", "slow")
    enqueue(served, range(1, 11))
    default, fast = (
        Collector(served.client, "orders"),
        Collector(served.client, "orders", subscription="fast"),
    )
    try:
        take_ids(default, 10)
        take_ids(fast, 10)
        time.sleep(1.5)  # several purge passes (vt_purge_after=0)
        assert served.sql("select count(*) from orders")[0][0] == 10, "slow holds every row"
        slow = Collector(served.client, "orders", subscription="slow")
        try:
            msgs = slow.take(10)
            slow.subscription.ack([m for m in msgs if int(m.id) <= 5])
            wait_until(
                lambda: served.sql("select count(*) from orders")[0][0] == 5,
                what="the five rows every group settled were purged",
            )
            time.sleep(0.5)
            assert sorted(r[0] for r in served.sql("select id from orders")) == [6, 7, 8, 9, 10]
        finally:
            slow.close()
    finally:
        default.close()
        fast.close()


def test_settlement_of_a_subscription_is_its_own(served: Served):
    make_orders(served, vt_min_backoff=0.05, vt_max_backoff=0.1)
    served.client.create_subscription("orders", "work", max_attempts=2)
    enqueue(served, [1, 2])
    c = Collector(served.client, "orders", subscription="work")
    try:
        msgs = c.take(2)
        assert c.subscription.release(msgs, reason="later") == 2
        again = c.take(2)
        assert sorted(m.attempt for m in again) == [2, 2]
        assert c.subscription.reject([m for m in again if int(m.id) == 1], reason="bad") == 1
        # the default group never saw any of this
        rows = served.sql("select epoch, time_acked from orders order by id")
        assert rows == [(0, None), (0, None)]
        dead, total = served.client.dead_letters("orders", subscription="work")
        assert total == 1 and dead[0].id == 1 and dead[0].last_error == "bad"
    finally:
        c.close()


def test_list_tables_counts_a_subscriptions_dead_letters_from_the_database(served: Served):
    """A subscription's ``dead`` is counted in its state table, like a table's: a server
    that never saw the messages die (another one, or this one after a restart) shows them,
    and so does the dashboard, which lists dead letters where ``dead`` says there are some."""
    make_orders(served)
    served.client.create_subscription("orders", "work")
    served.client.create_subscription("orders", "clean")
    enqueue(served, [1, 2, 3])
    c = Collector(served.client, "orders", subscription="work")
    try:
        msgs = c.take(3)
        assert c.subscription.reject([m for m in msgs if int(m.id) != 3], reason="bad") == 2
    finally:
        c.close()

    def dead(listed: list[Any]) -> dict[str, int | None]:
        return {t.subscription: t.dead for t in listed if t.name == "orders"}

    assert dead(served.client.list_tables()) == {"": 0, "work": 2, "clean": 0}
    dsn = served.db.url.render_as_string(hide_password=False)
    with serve(dsn) as fresh:  # a server that saw nothing die
        assert dead(fresh.client.list_tables()) == {"": 0, "work": 2, "clean": 0}


def test_an_ack_by_dml_on_the_state_table_counts(served: Served):
    make_orders(served, vt_ack_wait=0.5, vt_min_backoff=0.2, vt_max_backoff=0.2)
    served.client.create_subscription("orders", "dml")
    enqueue(served, [1, 2])
    c = Collector(served.client, "orders", subscription="dml")
    try:
        c.take(2)
        served.sql("update orders__dml set time_acked = 1 where id = 1 and time_acked is null")
        (again,) = c.take(1, timeout_s=10)
        assert int(again.id) == 2
    finally:
        c.close()


def test_bad_subscriptions_are_refused_cleanly_and_write_nothing(served: Served):
    make_orders(served)
    bad = [
        dict(filter="regoin = 'eu'"),
        dict(filter="region = 'eu'; drop table orders"),
        dict(filter="(select 1) = 1"),
        dict(filter="sleep(1) = 0"),
        dict(columns=["nope"]),
        dict(ack_wait_s=-1),
    ]
    for kwargs in bad:
        with pytest.raises(InvalidArgument):
            served.client.create_subscription("orders", "x", **kwargs)
    with pytest.raises(InvalidArgument):
        served.client.create_subscription("orders", "bad name!")
    with pytest.raises(TableNotFound):
        served.client.create_subscription("nosuch", "x")
    assert served.sql("show tables like 'orders__%'") == []
    served.client.create_subscription("orders", "x")
    with pytest.raises(InvalidArgument, match="exists already"):
        served.client.create_subscription("orders", "x")


def test_a_dropped_subscription_ends_its_subscribers_and_its_state(served: Served):
    make_orders(served)
    served.client.create_subscription("orders", "gone")
    c = Collector(served.client, "orders", subscription="gone", retry=False)
    try:
        served.client.drop_subscription("orders", "gone")
        assert c.done.wait(10), "the subscriber did not end"
        assert isinstance(c.error, TableNotFound)
        assert served.sql("show tables like 'orders__gone'") == []
        with pytest.raises(TableNotFound):
            served.client.drop_subscription("orders", "gone")
    finally:
        c.close()


def test_a_table_without_a_default_group_serves_only_subscriptions(served: Served):
    make_orders(served, vt_default_group="off")
    served.client.create_subscription("orders", "only")
    enqueue(served, range(1, 6))
    c = Collector(served.client, "orders", subscription="only")
    try:
        take_ids(c, 5)
        with pytest.raises(TableLoadError, match="no default group"):
            served.client.subscribe("orders", retry=False)
        wait_until(
            lambda: served.sql("select count(*) from orders")[0][0] == 0,
            what="rows settled by the only subscription are purged",
        )
    finally:
        c.close()


def test_lag_and_state_show_in_list_tables_and_expiry_lets_go_of_the_table(served: Served):
    make_orders(served)
    served.client.create_subscription("orders", "idle", expire_after_s=1)
    served.client.create_subscription("orders", "capped", max_lag=3)
    enqueue(served, range(1, 11))
    default = Collector(served.client, "orders")
    try:
        take_ids(default, 10)

        def sub(name: str):
            return next(t for t in served.client.list_tables() if t.subscription == name)

        wait_until(lambda: sub("capped").lag == 10, 10, "the capped subscription's lag shows")
        wait_until(lambda: not sub("capped").holding, 10, "over max_lag, it lets go of the table")
        assert "max_lag" in sub("capped").not_holding
        wait_until(lambda: sub("idle").state == "expired", 15, "the idle subscription expired")
        wait_until(
            lambda: served.sql("select count(*) from orders")[0][0] == 0,
            what="neither holds the purge any more",
        )
        enqueue(served, [11])
        time.sleep(1)
        assert served.sql("select count(*) from orders__idle where id = 11")[0][0] == 0
        c = Collector(served.client, "orders", subscription="idle")
        try:
            wait_until(lambda: sub("idle").state == "active", 10, "a subscriber revives it")
        finally:
            c.close()
    finally:
        default.close()


def test_subscriptions_created_and_dropped_under_traffic_lose_and_duplicate_nothing(
    served: Served,
):
    # nothing is acked here: an ack wait longer than the test keeps a redelivery by time-out
    # (right behaviour once a busy machine stretches the churn past 2 s) out of "twice", and
    # a window above the traffic keeps the default 1,000 unacked from stopping the stream
    make_orders(served, vt_ack_wait=60)
    served.client.create_subscription("orders", "steady")
    stop = threading.Event()
    sent: list[int] = []

    def produce() -> None:
        i = 1
        while not stop.is_set():
            enqueue(served, range(i, i + 20))
            sent.extend(range(i, i + 20))
            i += 20
            time.sleep(0.02)

    t = threading.Thread(target=produce, daemon=True)
    steady = Collector(served.client, "orders", subscription="steady", max_in_flight=100_000)
    try:
        t.start()
        time.sleep(0.5)
        for k in range(3):
            served.client.create_subscription("orders", f"churn{k}")
            time.sleep(0.2)
            served.client.drop_subscription("orders", f"churn{k}")
        served.client.create_subscription("orders", "joined")
        wait_until(lambda: len(sent) > 0, 10, "traffic")
        joined_from = max(sent) + 1
        time.sleep(0.5)
        stop.set()
        t.join(5)
        got = [int(m.id) for m in steady.take(len(sent), 30)]
        assert sorted(got) == sorted(sent), "steady lost or duplicated a message"
        steady.nothing_for(0.3)
        joined = Collector(served.client, "orders", subscription="joined", max_in_flight=100_000)
        try:
            # it gets every message handed over after it was created: those enqueued after
            # it, and some enqueued just before that were not handed over yet
            after = {i for i in sent if i >= joined_from}
            ids: list[int] = []
            deadline = time.monotonic() + 30
            while not after <= set(ids) and time.monotonic() < deadline:
                ids += [int(m.id) for m in joined.take(1, 30)]
            missing = sorted(after - set(ids))
            assert not missing, f"joined lost {len(missing)} messages after it was created"
            while True:  # what else comes (nothing is acked: none comes twice in 2 s)
                try:
                    ids += [int(m.id) for m in joined.take(1, 0.5)]
                except AssertionError:
                    break
            assert len(ids) == len(set(ids)), "joined got a message twice"
        finally:
            joined.close()
    finally:
        stop.set()
        steady.close()


def test_a_filter_on_one_stream_chooses_among_its_groups_messages(served: Served):
    make_orders(served)
    enqueue(served, range(1, 21))
    eu = Collector(served.client, "orders", filter="region = 'eu'")
    rest = Collector(served.client, "orders", filter="region=us")
    try:
        assert take_ids(eu, 5) == [4, 8, 12, 16, 20]
        assert take_ids(rest, 15) == [i for i in range(1, 21) if i % 4]
        eu.nothing_for(0.3)
        rest.nothing_for(0.1)
    finally:
        eu.close()
        rest.close()
    with pytest.raises(InvalidArgument, match="position"):
        served.client.subscribe("orders", filter="region = ", retry=False)


def test_the_default_group_keeps_its_columns_when_the_first_subscription_comes(served: Served):
    make_orders(served)
    before = Collector(served.client, "orders")
    try:
        served.client.create_subscription("orders", "first")
        enqueue(served, [1])
        (_m,) = before.take(1)
        assert "time_fanout" not in before.subscription.field_names
        assert before.error is None
    finally:
        before.close()


def test_a_subscriptions_settings_show_in_its_listing(served: Served):
    make_orders(served)
    served.client.create_subscription(
        "orders", "s", filter="amount > 1", columns=["amount"], max_lag=7, expire_after_s=60
    )
    (info,) = served.client.list_subscriptions("orders")
    assert (info.subscription, info.filter, info.max_lag, info.expire_after_s) == (
        "s",
        "amount > 1",
        7,
        60,
    )
    assert [f.name for f in info.config.message_columns] == ["id", "amount"]
    served.client.alter_subscription("orders", "s", max_lag=0, filter="")
    (info,) = served.client.list_subscriptions("orders")
    assert (info.max_lag, info.filter) == (None, "")


def test_without_a_default_group_from_start_gets_every_retained_message(served: Served):
    make_orders(served, vt_default_group="off", vt_purge_after=3600)
    enqueue(served, range(1, 6))
    served.client.create_subscription("orders", "first")  # the five are seen by none
    assert served.sql("select count(*) from orders where time_acked is null")[0][0] == 0
    n = served.client.create_subscription("orders", "replay", filter="amount > 2", from_start=True)
    assert n == 3


def test_a_message_the_default_group_moves_to_its_dead_letters_stays_for_the_subscriptions(
    served: Served,
):
    served.create_table(
        "orders_dead",
        f"{ORDER_COLUMNS}, time_dead bigint, attempts bigint, last_error varchar(1000)",
    )
    make_orders(served, vt_dead_letter="orders_dead", vt_purge_after=0)
    served.client.create_subscription("orders", "books")
    enqueue(served, [1, 2])
    default = Collector(served.client, "orders")
    try:
        default.take(2)
        # before the fan-out handed it over or after: either way the subscription gets it
        assert served.client.reject("orders", [1, 2], reason="bad") == 2
        assert sorted(r[0] for r in served.sql("select id from orders_dead")) == [1, 2]
        books = Collector(served.client, "orders", subscription="books")
        try:
            assert take_ids(books, 2) == [1, 2]
            wait_until(
                lambda: served.sql("select count(*) from orders")[0][0] == 0,
                10,
                "both settled by every group: purged",
            )
        finally:
            books.close()
    finally:
        default.close()


def test_a_stalled_subscription_does_not_hold_up_the_others(served: Served):
    make_orders(served)
    served.client.create_subscription("orders", "stalled")
    served.client.create_subscription("orders", "busy")
    stalled = Collector(served.client, "orders", subscription="stalled", max_in_flight=10)
    busy = Collector(served.client, "orders", subscription="busy")
    try:
        enqueue(served, range(1, 501))
        assert len(stalled.take(10)) == 10  # and never acks: its window is full
        assert take_ids(busy, 500, timeout_s=30) == list(range(1, 501))
        stalled.nothing_for(0.3)
        (lag,) = [t.lag for t in served.client.list_subscriptions() if t.subscription == "stalled"]
        assert lag == 500
    finally:
        stalled.close()
        busy.close()


def test_a_subscription_with_a_subscriber_does_not_expire(served: Served):
    make_orders(served)
    served.client.create_subscription("orders", "watched", expire_after_s=1)
    served.client.create_subscription("orders", "idle", expire_after_s=1)
    c = Collector(served.client, "orders", subscription="watched")
    try:

        def state(name: str) -> str:
            return next(
                t.state for t in served.client.list_subscriptions() if t.subscription == name
            )

        wait_until(lambda: state("idle") == "expired", 15, "the idle one expired")
        assert state("watched") == "active"
        active = served.sql(
            "select time_active from msgtable_subscriptions where name = 'watched'"
        )[0][0]
        assert active and active > served.now_ns() - 5 * 10**9  # touched by the upkeep
    finally:
        c.close()


def test_an_ack_reads_the_state_rows_it_acks_not_the_whole_state_table(served: Served):
    """A from_start hand-over fills a state table in one statement, before InnoDB has
    statistics for it: an ack of 100 ids must still go by the primary key (about 100 rows
    read by its check and 100 by its update), not read every unsettled row of the table.

    Rows_read is the database's global count: the server's own work that may run during an
    ack (a poll, the purge, discovery) adds to it, in about one ack of twenty here (CI saw an
    ack "read" 1,302 rows). So three acks of 100 are measured and the least is judged: a plan
    that reads the table makes every one of them read it."""
    make_orders(served, vt_batch_size=100)
    served.client.create_subscription("orders", "first")  # the table's rows are now seen
    enqueue(served, range(1, 1001))
    wait_until(
        lambda: served.sql("select count(*) from orders where time_fanout is null")[0][0] == 0,
        what="the first subscription was handed the 1,000 rows",
    )
    assert served.client.create_subscription("orders", "replay", from_start=True) == 1000
    c = Collector(served.client, "orders", subscription="replay")
    reads = []
    try:
        msgs = c.take(300)
        time.sleep(0.3)  # the cache filled, the fan-out loop idle
        # rows read by every session: MariaDB's Rows_read, MySQL's Innodb_rows_read
        mariadb = "mariadb" in served.sql("select version()")[0][0].lower()
        counter = f"show global status like '{'Rows_read' if mariadb else 'Innodb_rows_read'}'"
        for k in range(0, 300, 100):
            before = served.sql(counter)[0][1]
            c.subscription.ack(msgs[k : k + 100])
            reads.append(int(served.sql(counter)[0][1]) - int(before))
    finally:
        c.close()
    assert min(reads) < 600, (
        f"each ack of 100 ids read rows of a 3,000-row state table: {reads} (bound 600)"
    )


def test_messages_purged_while_a_subscription_let_go_leave_no_lag_behind(served: Served):
    """A subscription over its max_lag lets go of the table; once the rows it never settled
    are purged, they are no longer its lag (nothing is left to deliver), so it holds the
    table again, and their state rows are cleaned up."""
    make_orders(served)
    served.client.create_subscription("orders", "capped", max_lag=3)
    enqueue(served, range(1, 11))
    default = Collector(served.client, "orders")
    try:
        take_ids(default, 10)

        def sub():
            return next(t for t in served.client.list_tables() if t.subscription == "capped")

        wait_until(lambda: not sub().holding, 10, "over max_lag, it lets go of the table")
        wait_until(
            lambda: served.sql("select count(*) from orders")[0][0] == 0,
            what="the default group acked all: purged, the capped one no longer holding",
        )
        wait_until(lambda: sub().lag == 0, 10, "the purged rows are no longer its lag")
        wait_until(lambda: sub().holding, 10, "back under max_lag, it holds the table again")
        wait_until(
            lambda: served.sql("select count(*) from orders__capped")[0][0] == 0,
            10,
            "the state rows of the purged messages cleaned up",
        )
    finally:
        default.close()


def test_a_subscriptions_dead_letters_are_redriven_to_it_alone(served: Served):
    """Redrive with a subscription brings its dead-in-place messages back to it as fresh
    ones (attempt 1 again); the default group and other subscriptions are untouched."""
    make_orders(served)
    served.client.create_subscription("orders", "work")
    served.client.create_subscription("orders", "other")
    enqueue(served, [1, 2, 3])
    c = Collector(served.client, "orders", subscription="work")
    try:
        msgs = c.take(3)
        assert c.subscription.reject([m for m in msgs if int(m.id) != 3], reason="bad") == 2
        c.subscription.ack([m for m in msgs if int(m.id) == 3])
        assert served.client.dead_letters("orders", subscription="work")[1] == 2
        batch = served.client.redrive("orders", subscription="work")
        assert batch.moved == 2 and batch.skipped == ()
        assert served.client.dead_letters("orders", subscription="work")[1] == 0
        again = c.take(2)
        assert sorted(int(m.id) for m in again) == [1, 2]
        assert {m.attempt for m in again} == {1}
        c.subscription.ack(again)
    finally:
        c.close()
    assert served.sql("select count(*) from orders__other where time_acked is not null")[0][0] == 0
    with pytest.raises(InvalidArgument, match="subscription"):
        served.client.redrive("orders", to="orders", subscription="work")


def test_the_purge_waits_for_no_lock_of_a_state_table(served: Served):
    """The chaos run saw the table's purge deadlock with a subscription's acks (and with its
    state table's purge): its DELETE read the state tables with shared locks. The purge
    picks its rows with a plain read, which waits for nobody's lock."""
    make_orders(served, vt_purge_after=3600)  # no purge of its own meanwhile
    served.client.create_subscription("orders", "audit")
    enqueue(served, [1, 2, 3])
    wait_until(
        lambda: served.sql("select count(*) from orders__audit")[0][0] == 3,
        what="the fan-out handed the rows over",
    )
    now = served.now_ns()
    served.sql(f"update orders set time_acked = {now - 10**9}")  # the default group's acks
    served.sql(f"update orders__audit set time_acked = {now - 10**9} where id = 3")
    store = served.engine.store
    cfg = served.engine.find("orders").config
    with served.transaction() as app:  # the application's ack of 1, by DML, still open
        app.execute(sa.text(f"update orders__audit set time_acked = {now - 10**9} where id = 1"))
        purged: list[int] = []
        t = threading.Thread(target=lambda: purged.append(store.purge(cfg, now, 500)))
        t.start()
        t.join(10)
        assert not t.is_alive(), "the purge waited for the open transaction's lock"
        assert purged == [1]  # 3, settled by every group; 1 not yet (not committed), 2 not
    assert sorted(r[0] for r in served.sql("select id from orders")) == [1, 2]
    assert store.purge(cfg, now, 500) == 1  # 1 now settled by both
    assert [r[0] for r in served.sql("select id from orders")] == [2]
