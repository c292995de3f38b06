"""Lazy subscriptions end to end (msgtable.features.subscriptions.lazy; design.md next to it,
layer 2): a subscription created with ``state_rows="lazy"`` is served from its cursor over
the table's fan-out sequence, with state rows only for messages sent and not settled in
order; on a real MySQL-family server, through the real gRPC server and client (a subprocess
server where it is killed)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from msgtable.client import Client
from msgtable.observe.dashboard import DashboardApi, DashboardServer, RateHistory
from msgtable.observe.metrics import MetricsServer

from ..acceptance.helpers import Cli
from ..waiting import wait_until
from .helpers import Collector, Served, serve
from .test_dashboard import call
from .test_metrics import scrape
from .test_subscriptions import enqueue, make_orders, take_ids


@pytest.fixture
def served(db_dsn: str):
    with serve(db_dsn, follow_binlog=True) as s:
        yield s


@contextmanager
def application(dsn: str) -> Iterator[Any]:
    """The application's own connection, for a server in another process: the table's DDL
    and the DML (Served's, without a server in this process)."""
    db = sa.create_engine(dsn, isolation_level="AUTOCOMMIT")
    app = Served.__new__(Served)
    app.db = db
    try:
        yield app
    finally:
        db.dispose()


def state_rows(s: Served, name: str = "orders__lazy") -> int:
    return int(s.sql(f"select count(*) from {name}")[0][0])


def cursor(s: Served, name: str = "lazy") -> int:
    rows = s.sql(
        "select sent_upto from msgtable_fanout_cursors where table_name = 'orders' "
        f"and name = '{name}'"
    )
    return int(rows[0][0])


def last_number(s: Served) -> int:
    return int(s.sql("select coalesce(max(time_fanout), 0) from orders")[0][0])


def test_a_lazy_subscription_delivers_every_message_once_and_acks_write_no_state_row(
    served: Served,
):
    make_orders(served)
    served.client.create_subscription("orders", "lazy", state_rows="lazy")
    served.client.create_subscription("orders", "eager")
    enqueue(served, range(1, 201))
    lazy = Collector(served.client, "orders", subscription="lazy")
    try:
        assert take_ids(lazy, 200) == list(range(1, 201))
        wait_until(
            lambda: cursor(served) == last_number(served),
            10,
            lambda: (
                f"the cursor ({cursor(served)}) passed every message acked in order "
                f"(to {last_number(served)})"
            ),
        )
        lazy.nothing_for(1.0)
        assert state_rows(served) == 0, "acks of messages sent from the cursor write no row"
        assert state_rows(served, "orders__eager") == 200, "the eager one's fan-out rows"
    finally:
        lazy.close()


def test_an_unacked_message_comes_back_after_its_ack_wait_with_attempts_counted(
    served: Served,
):
    make_orders(served, vt_ack_wait=1, vt_min_backoff=0.05, vt_max_backoff=0.1)
    served.client.create_subscription("orders", "lazy", state_rows="lazy")
    enqueue(served, [1, 2, 3])
    c = Collector(served.client, "orders", subscription="lazy")
    try:
        first = c.take(3)
        assert [m.attempt for m in first] == [1, 1, 1]
        c.subscription.ack([m for m in first if int(m.id) == 2])
        again = c.take(2, 15)
        assert sorted(int(m.id) for m in again) == [1, 3]
        assert [m.attempt for m in again] == [2, 2], "the postpone's state row counts attempts"
        c.subscription.ack(again)
        c.nothing_for(2.5)
        wait_until(
            lambda: state_rows(served) == 0,
            10,
            "the two acked state rows purged (vt_purge_after=0)",
        )
        wait_until(
            lambda: cursor(served) == last_number(served),
            10,
            "the cursor passed the acked one and the two held by their state rows",
        )
    finally:
        c.close()


def test_a_filtered_lazy_subscription_gets_only_its_matches(served: Served):
    make_orders(served)
    served.client.create_subscription(
        "orders", "lazy", filter="region = 'eu' AND amount > 4", state_rows="lazy"
    )
    enqueue(served, range(1, 41))
    c = Collector(served.client, "orders", subscription="lazy")
    try:
        expected = [i for i in range(1, 41) if i % 4 == 0 and i > 4]
        assert take_ids(c, len(expected)) == expected
        c.nothing_for(1.0)
        assert state_rows(served) == 0
        wait_until(
            lambda: cursor(served) == last_number(served),
            10,
            "the cursor passed the matches acked and the rows its filter refuses",
        )
    finally:
        c.close()


def test_a_lazy_subscription_holds_the_purge_of_what_it_was_not_sent(served: Served):
    make_orders(served)
    served.client.create_subscription("orders", "lazy", state_rows="lazy")
    enqueue(served, range(1, 11))
    default = Collector(served.client, "orders")
    try:
        take_ids(default, 10)
        wait_until(
            lambda: (
                served.sql("select count(*) from orders where time_acked is not null")[0][0] == 10
            ),
            what="the default group's acks",
        )
        time.sleep(1.5)  # several purge passes (vt_purge_after=0, vt_poller_interval=0.2)
        assert served.sql("select count(*) from orders")[0][0] == 10, "purged before it was sent"
        lazy = Collector(served.client, "orders", subscription="lazy")
        try:
            assert take_ids(lazy, 10) == list(range(1, 11))
            wait_until(
                lambda: served.sql("select count(*) from orders")[0][0] == 0,
                10,
                "every row purged once the lazy subscription's cursor passed it",
            )
        finally:
            lazy.close()
    finally:
        default.close()


def test_settlement_of_a_lazy_subscriptions_message_writes_its_state_row(served: Served):
    make_orders(served, vt_min_backoff=0.05, vt_max_backoff=0.1)
    served.client.create_subscription("orders", "lazy", max_attempts=3, state_rows="lazy")
    enqueue(served, [1, 2, 3])
    c = Collector(served.client, "orders", subscription="lazy")
    try:
        msgs = {int(m.id): m for m in c.take(3)}
        assert c.subscription.release([msgs[1], msgs[2]], reason="later") == 2
        assert c.subscription.reject([msgs[3]], reason="bad") == 1
        again = c.take(2)
        assert sorted((int(m.id), m.attempt) for m in again) == [(1, 2), (2, 2)]
        c.subscription.ack(again)
        dead, total = served.client.dead_letters("orders", subscription="lazy")
        assert total == 1 and dead[0].id == 3 and dead[0].last_error == "bad"
        assert served.sql("select epoch, time_acked from orders order by id") == [
            (0, None),
            (0, None),
            (0, None),
        ], "the default group never saw any of this"
    finally:
        c.close()


def test_a_lazy_subscription_cannot_serve_an_ordered_table_and_says_so(served: Served):
    make_orders(served, vt_order_key="region")
    served.sql("alter table orders add index order_idx (region, time_acked, id)")
    wait_until(
        lambda: any(
            t.name == "orders" and not t.load_error and t.config is not None and t.config.order_key
            for t in served.client.list_tables()
        ),
        15,
        "the ordered table loaded",
    )
    with pytest.raises(Exception, match="ordered table"):
        served.client.create_subscription("orders", "lazy", state_rows="lazy")
    with pytest.raises(Exception, match="state_rows must be eager or lazy"):
        served.client.create_subscription("orders", "odd", state_rows="sometimes")


def test_a_server_killed_mid_stream_loses_no_message_of_a_lazy_subscription(
    db_dsn: str, tmp_path: Path
):
    """SIGKILL with messages in flight from the cursor (no state row) and acks the cursor
    has not passed yet: the next server scans from the durable cursor and sends the rest."""
    cli = Cli(tmp_path)
    args = ("--dsn", db_dsn, "--no-lease", "--discovery-interval", "0.5")
    try:
        first = cli.serve(*args)
        with Client(first.address) as client, application(db_dsn) as app:
            make_orders(app)
            wait_until(
                lambda: any(t.name == "orders" for t in client.list_tables()),
                15,
                "the server found the table",
            )
            client.create_subscription("orders", "lazy", state_rows="lazy")
            enqueue(app, range(1, 301))
            c = Collector(client, "orders", subscription="lazy")
            taken = c.take(120, 20)
            acked = {int(m.id) for m in taken[:100]}
            c.subscription.ack(taken[:100])
            (top,) = app.sql(f"select max(time_fanout) from orders where id in {tuple(acked)}")
            wait_until(
                lambda: cursor(app) >= int(top[0]),
                10,
                "the cursor passed the acked prefix before the kill (20 are in flight)",
            )
            first.popen.send_signal(signal.SIGKILL)
            first.popen.wait(10)
            c.close()
            second = cli.serve(*args)
            with Client(second.address) as client2:
                c2 = Collector(client2, "orders", subscription="lazy")
                got: set[int] = set()
                wanted = set(range(1, 301)) - acked
                deadline = time.monotonic() + 60
                while not wanted <= got and time.monotonic() < deadline:
                    try:
                        msgs = c2.take(1, 10)
                    except AssertionError:
                        break  # nothing more comes: what is missing is said below
                    msgs += [c2.messages.get() for _ in range(c2.messages.qsize())]
                    c2.subscription.ack(msgs)
                    got |= {int(m.id) for m in msgs}
                assert wanted <= got, f"lost after the kill: {sorted(wanted - got)[:20]}"
                wait_until(
                    lambda: cursor(app) == last_number(app),
                    20,
                    lambda: (
                        f"the new server's cursor ({cursor(app)}) passed every "
                        f"message (to {last_number(app)})"
                    ),
                )
                c2.close()
    finally:
        cli.stop_all()


def test_a_lazy_subscriptions_lag_counts_what_it_was_never_sent_and_max_lag_lets_go(
    served: Served,
):
    make_orders(served)
    served.client.create_subscription("orders", "lazy", state_rows="lazy")
    served.client.create_subscription("orders", "capped", max_lag=3, state_rows="lazy")
    served.client.create_subscription("orders", "eu", filter="region = 'eu'", state_rows="lazy")
    enqueue(served, range(1, 11))  # 2 of them eu: 4 and 8

    def sub(name: str) -> Any:
        (info,) = [s for s in served.client.list_subscriptions("orders") if s.subscription == name]
        return info

    assert (sub("lazy").state_rows, sub("capped").state_rows) == ("lazy", "lazy")
    wait_until(lambda: sub("lazy").lag == 10, 10, lambda: f"lag 10, not {sub('lazy').lag}")
    assert sub("lazy").oldest_ns, "the oldest unsent message's time_created"
    assert sub("eu").lag == 2, "only what its filter passes"
    wait_until(lambda: not sub("capped").holding, 10, "over max_lag, it lets go of the table")
    c = Collector(served.client, "orders", subscription="lazy")
    try:
        take_ids(c, 10)
        wait_until(lambda: sub("lazy").lag == 0, 10, "acked: the cursor passed them")
    finally:
        c.close()


def test_the_documented_dml_upsert_acks_a_lazy_subscriptions_message(served: Served):
    """The application's ack by DML of a message with no state row (the subscriptions page's
    upsert): one never sent is skipped by the cursor's scan; one in flight is left acked by
    its postpone (which keeps a row there) and does not come back."""
    make_orders(served, vt_ack_wait=1, vt_min_backoff=0.05, vt_max_backoff=0.1)
    served.client.create_subscription("orders", "lazy", state_rows="lazy")
    enqueue(served, [1, 2, 3])
    upsert = (
        "insert into orders__lazy (id, time_acked) values (:id, :now) on duplicate key update "
        "time_acked = coalesce(time_acked, values(time_acked)), time_next = null"
    )
    served.sql(upsert, id=2, now=served.now_ns())  # before it was ever sent
    c = Collector(served.client, "orders", subscription="lazy")
    try:
        got = c.take(2)
        assert sorted(int(m.id) for m in got) == [1, 3], "the acked one is not sent"
        served.sql(upsert, id=3, now=served.now_ns())  # in flight: acked by the application
        c.subscription.ack([m for m in got if int(m.id) == 1])
        c.nothing_for(3.0)  # past its ack wait and backoff: not sent again
        wait_until(
            lambda: cursor(served) == last_number(served),
            10,
            "the cursor passed all three: acked here, or held by an acked state row",
        )
    finally:
        c.close()


def test_a_dml_upsert_ack_of_a_message_read_into_the_cache_stops_its_send(served: Served):
    """The application's upsert-ack of a message the server already read into its cache
    (behind a subscriber with no room) reaches the server through the binlog, as an eager
    subscription's UPDATE does: the message leaves the cache unsent, and the cursor passes
    it (held by its acked state row)."""
    make_orders(served, vt_ack_wait=30, vt_batch_size=1)
    served.client.create_subscription("orders", "lazy", state_rows="lazy")
    enqueue(served, [1, 2, 3, 4])
    m = served.engine.find("orders", subscription="lazy")
    c = Collector(served.client, "orders", subscription="lazy", max_in_flight=1)
    try:
        first = c.take(1)
        assert [int(x.id) for x in first] == [1]
        wait_until(lambda: m.status("").cached >= 3, 10, "2, 3 and 4 read into the cache")
        upsert = (
            "insert into orders__lazy (id, time_acked) values (:id, :now) on duplicate key "
            "update time_acked = coalesce(time_acked, values(time_acked)), time_next = null"
        )
        for i in (2, 3):
            served.sql(upsert, id=i, now=served.now_ns())
        wait_until(
            lambda: m.status("").acked_dml == 2,
            10,
            "the server saw the two upsert acks in the binlog (acked_dml)",
        )
        c.subscription.ack(first)
        got = c.take(1)
        assert [int(x.id) for x in got] == [4], "the two acked by the upsert are not sent"
        c.subscription.ack(got)
        c.nothing_for(1.0)
        wait_until(
            lambda: cursor(served) == last_number(served),
            10,
            "the cursor passed all four: acked here, or held by an acked state row",
        )
    finally:
        c.close()


def test_a_lazy_subscription_shows_its_mode_cursor_lag_and_cursor_flushes(served: Served):
    """ListTables and the dashboard say how a subscription keeps its state rows and, a lazy
    one's, the messages above its cursor it was never sent (cursor_lag); /metrics counts its
    cursor's flushes (msgtable_subscription_cursor_flushes_total)."""
    make_orders(served)
    served.client.create_subscription("orders", "lazy", state_rows="lazy")
    served.client.create_subscription("orders", "eager")
    enqueue(served, [1, 2, 3, 4, 5])

    def sub(name: str) -> Any:
        listed = served.client.list_subscriptions("orders")
        return next(t for t in listed if t.subscription == name)

    wait_until(lambda: sub("lazy").cursor_lag == 5, 10, "the five above the cursor, never sent")
    assert (sub("lazy").state_rows, sub("eager").state_rows) == ("lazy", "eager")
    assert sub("eager").cursor_lag is None, "an eager subscription has no cursor"
    d = DashboardServer(DashboardApi(served.engine, RateHistory(0.2)), "127.0.0.1:0")
    m = MetricsServer(served.engine, "127.0.0.1:0", served.server.servicer.streams)
    d.open()
    m.open()
    c = Collector(served.client, "orders", subscription="lazy")
    try:
        code, state = call(d, "/api/state")
        assert code == 200
        shown = {t["subscription"]: t for t in state["tables"] if t["subscription"]}
        assert (shown["lazy"]["state_rows"], shown["lazy"]["cursor_lag"]) == ("lazy", 5)
        assert (shown["eager"]["state_rows"], shown["eager"]["cursor_lag"]) == ("eager", None)
        flushes = ("msgtable_subscription_cursor_flushes_total", "orders", "lazy")
        assert scrape(m).get(flushes) == 0, "the lazy subscription's counter, none yet"
        assert take_ids(c, 5) == [1, 2, 3, 4, 5]
        wait_until(lambda: sub("lazy").cursor_lag == 0, 10, "acked: the cursor passed them")
        assert scrape(m).get(flushes, 0) >= 1, "the flush that moved the cursor is counted"
        assert ("msgtable_subscription_cursor_flushes_total", "orders", "eager") not in scrape(m)
    finally:
        c.close()
        m.close()
        d.close()


def acked_rows(s: Any, name: str = "orders__lazy") -> int:
    return int(s.sql(f"select count(*) from {name} where time_acked is not null")[0][0])


def enqueue_behind_one(s: Any, last: int) -> None:
    """Message 1, then 2 to ``last`` numbered above it: message 1 is enqueued alone and
    numbered by the fan-out before the others are enqueued. (Enqueued in one INSERT with
    the others, message 1 is not sure to get the lowest number: the fan-out numbers the
    rows of one batch in id order, but one transaction's rows may come in two batches; seen
    once in about 300 runs under load: message 1 of 201 numbered 58th.)"""
    enqueue(s, [1])
    wait_until(
        lambda: s.sql("select time_fanout from orders where id = 1")[0][0] is not None,
        15,
        "the fan-out numbered message 1",
    )
    enqueue(s, range(2, last + 1))


def take_all(c: Collector, ids: set[int], timeout_s: float = 30.0) -> set[int]:
    """Take and ack (in batches, as they come) until every one of ``ids`` came."""
    got: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while not ids <= got and time.monotonic() < deadline:
        try:
            msgs = c.take(1, max(0.1, deadline - time.monotonic()))
        except AssertionError:
            break  # nothing more comes: the caller says what is missing
        msgs += [c.messages.get() for _ in range(c.messages.qsize())]
        c.subscription.ack(msgs)
        got |= {int(m.id) for m in msgs}
    return got


@pytest.mark.parametrize("end", ["kill", "sigterm"])
def test_acks_behind_a_message_no_stream_takes_survive_their_sender(
    db_dsn: str, tmp_path: Path, end: str
):
    """test_chaos's lazy group: message 1, which no subscriber's stream filter passes, is read
    and never sent, so the cursor cannot pass it, and the acks of the 200 messages behind it
    lived in the sender's window alone: a sender killed then had its successor send all 200
    again. kill: once the cursor is held longer than vt_postpone_after, the acks behind it
    are written (acked state rows, one upsert a flush) and the sender is killed after that;
    sigterm: a sender that lets go writes them at once (no postpone wait in between). Either
    way the next sender sends message 1 only."""
    cli = Cli(tmp_path)
    args = ("--dsn", db_dsn, "--no-lease", "--discovery-interval", "0.5")
    timing = (
        dict(vt_postpone_after=0.5) if end == "kill" else dict(vt_ack_wait=60, vt_postpone_after=30)
    )
    try:
        first = cli.serve(*args)
        with Client(first.address) as client, application(db_dsn) as app:
            make_orders(app, **timing)
            wait_until(
                lambda: any(t.name == "orders" for t in client.list_tables()),
                15,
                "the server found the table",
            )
            client.create_subscription("orders", "lazy", state_rows="lazy")
            enqueue_behind_one(app, 201)
            c = Collector(client, "orders", subscription="lazy", filter="id > 1")
            behind = set(range(2, 202))
            got = take_all(c, behind)
            assert got == behind, f"the stream filter's messages: missing {sorted(behind - got)}"
            ((held,),) = app.sql("select time_fanout from orders where id = 1")
            assert cursor(app) < int(held), "message 1, never sent, holds the cursor"
            if end == "kill":
                wait_until(
                    lambda: acked_rows(app) == 200,
                    20,
                    lambda: (
                        f"the acks of the 200 messages behind the held cursor written before "
                        f"the kill ({acked_rows(app)} acked state rows of {state_rows(app)}: "
                        f"the rest live in the sender's window only; its log's end: "
                        f"{first.stderr[-1500:]!r})"
                    ),
                )
                first.popen.send_signal(signal.SIGKILL)
                first.popen.wait(10)
            else:
                first.stop()  # SIGTERM: the sender lets go
            c.close()
            second = cli.serve(*args)
            with Client(second.address) as client2:
                c2 = Collector(client2, "orders", subscription="lazy")
                again = take_all(c2, {1}, 20)
                again |= take_all(c2, set(range(1, 202)), 3.0)  # and what else comes in 3 s
                assert again == {1}, (
                    f"the next sender sent message 1 and {len(again - {1})} acked before "
                    f"their sender ended again: {sorted(again - {1})[:20]}"
                )
                # the scan does not read rows with a state row: the cursor passes them with
                # the next message it reads
                enqueue(app, [202])
                assert take_all(c2, {202}) == {202}, "the message enqueued after the kill"
                wait_until(
                    lambda: cursor(app) == last_number(app),
                    20,
                    lambda: f"the cursor ({cursor(app)}) passed all (to {last_number(app)})",
                )
                wait_until(
                    lambda: state_rows(app) == 0,
                    20,
                    "the acked state rows purged once the cursor passed them (vt_purge_after=0)",
                )
                c2.close()
    finally:
        cli.stop_all()


def test_acks_written_behind_a_held_cursor_are_counted(served: Served):
    """/metrics counts the acks written as acked state rows behind a cursor held by a message
    never sent (msgtable_subscription_held_acks_written_total), one each, once."""
    make_orders(served, vt_postpone_after=0.5)
    served.client.create_subscription("orders", "lazy", state_rows="lazy")
    enqueue_behind_one(served, 11)
    m = MetricsServer(served.engine, "127.0.0.1:0", served.server.servicer.streams)
    m.open()
    c = Collector(served.client, "orders", subscription="lazy", filter="id > 1")
    written = ("msgtable_subscription_held_acks_written_total", "orders", "lazy")
    try:
        assert take_all(c, set(range(2, 12))) == set(range(2, 12))
        wait_until(
            lambda: acked_rows(served) == 10,
            20,
            lambda: f"the 10 acks behind message 1 written ({acked_rows(served)})",
        )
        wait_until(
            lambda: scrape(m).get(written) == 10,
            10,
            lambda: f"the 10 acks written counted ({scrape(m).get(written)})",
        )
    finally:
        c.close()
        m.close()


@pytest.mark.parametrize("how", ["deleted", "filtered out"])
def test_a_message_no_stream_takes_stops_holding_the_cursor_once_the_application_drops_it(
    served: Served, how: str
):
    """Message 1, which no subscriber's stream filter passes, is read and never sent: it
    holds the cursor (and so the purge of every message after it). Then the application
    deletes it, or changes it so that the subscription's filter no longer passes it: the
    scan from the cursor no longer finds it, so it stops holding the cursor, and nothing
    sends it afterwards (it held the cursor and the purge for good)."""
    make_orders(served)
    served.client.create_subscription("orders", "lazy", filter="amount < 1000", state_rows="lazy")
    enqueue(served, [1, 2, 3])
    default = Collector(served.client, "orders")
    c = Collector(served.client, "orders", subscription="lazy", filter="id > 1")
    try:
        assert take_ids(default, 3) == [1, 2, 3]
        assert take_ids(c, 2) == [2, 3]
        ((held,),) = served.sql("select time_fanout from orders where id = 1")
        time.sleep(1.0)  # several polls and flushes (vt_poller_interval=0.2)
        assert cursor(served) < int(held), "message 1, never sent, holds the cursor"
        assert served.sql("select count(*) from orders")[0][0] == 3, "and the purge"
        if how == "deleted":
            served.sql("delete from orders where id = 1")
        else:
            served.sql("update orders set amount = 5000 where id = 1")
        wait_until(
            lambda: cursor(served) == last_number(served),
            20,
            lambda: (
                f"the cursor ({cursor(served)}) passed message 1 ({how}) and the two acked "
                f"(to {last_number(served)})"
            ),
        )
        wait_until(
            lambda: served.sql("select count(*) from orders")[0][0] == 0,
            10,
            "the messages purged once the cursor passed them",
        )
        assert served.sql("select count(*) from orders__lazy where id = 1")[0][0] == 0, (
            "nothing written for message 1"
        )
        wait_until(
            lambda: state_rows(served) == 0,
            10,
            "the acked state rows behind the held cursor (2 and 3, if written) purged",
        )
        everything = Collector(served.client, "orders", subscription="lazy")
        try:
            everything.nothing_for(1.5)
        finally:
            everything.close()
    finally:
        c.close()
        default.close()


def test_a_lazy_filter_without_its_index_is_advised_the_alter_table_that_adds_it(served: Served):
    """A lazy subscription whose filter compares a column with = has its scan read every
    message above its cursor until the table has an index (that column, time_fanout):
    ListTables (and the dashboard, and msgtable tables) says which ALTER TABLE adds it; run as
    said, the advice goes. An eager subscription's filter, and a lazy one without a filter,
    need nothing."""
    make_orders(served)
    served.client.create_subscription("orders", "eu", filter="region = 'eu'", state_rows="lazy")
    served.client.create_subscription("orders", "any", state_rows="lazy")
    served.client.create_subscription("orders", "eu_eager", filter="region = 'eu'")

    def advice() -> dict[str, str]:
        return {t.subscription: t.advice for t in served.client.list_subscriptions("orders")}

    add = "ALTER TABLE `orders` ADD INDEX `region_fanout_idx` (`region`, time_fanout)"
    reads = "its filter reads every message above its cursor to find its matches"
    assert advice() == {"eu": f"{reads}: {add}", "any": "", "eu_eager": ""}
    d = DashboardServer(DashboardApi(served.engine, RateHistory(0.2)), "127.0.0.1:0")
    d.open()
    try:
        code, state = call(d, "/api/state")
        assert code == 200
        shown = {t["subscription"]: t["advice"] for t in state["tables"] if t["subscription"]}
        assert shown == {"eu": f"{reads}: {add}", "any": "", "eu_eager": ""}
    finally:
        d.close()
    served.sql(add)  # as advised
    assert advice() == {"eu": "", "any": "", "eu_eager": ""}
    enqueue(served, [1, 2, 3, 4, 8])
    c = Collector(served.client, "orders", subscription="eu")
    try:
        assert sorted(take_ids(c, 2)) == [4, 8], "the index serves the filter's scan"
    finally:
        c.close()
