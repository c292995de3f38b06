"""The engine end to end: a real MySQL-family server, the real gRPC server and client.

Each test follows a point of the engine's contract: tables by comment, enqueue by SQL,
streaming round-robin, acks by RPC and by DML, backoff, purge, the bounded cache, bad input.
"""

from __future__ import annotations

import threading
import time
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa

from msgtable import cli
from msgtable.client import Client, Message
from msgtable.core.tables import current_layout_ddl, load_table
from msgtable.errors import InvalidArgument, MsgtableError, TableLoadError, TableNotFound
from msgtable.store.mysqlstore import MySQLStore

from ..waiting import wait_until
from .helpers import NS, Collector, Served, comment, serve

SCHEMA = Path(__file__).parents[2] / "schema"


def ddl(file: str) -> str:
    """The one statement of a schema/ file, as a user would paste it."""
    lines = (SCHEMA / file).read_text().splitlines()
    return "\n".join(line for line in lines if not line.startswith("--")).strip().rstrip(";")


@pytest.fixture(params=["pymysql", "mysqldb"])
def served(request: pytest.FixtureRequest, db_dsn: str):
    """The engine on each MySQL driver the store supports (PyMySQL, mysqlclient)."""
    url = sa.engine.make_url(db_dsn)
    dsn = url.set(drivername=f"{url.get_backend_name()}+{request.param}")
    with serve(dsn.render_as_string(hide_password=False)) as s:
        assert s.engine.store.driver == request.param  # type: ignore[attr-defined]
        yield s


# -- 1. tables by comment ----------------------------------------------------------------
def test_the_schema_files_create_tables_that_load(served: Served):
    served.sql(ddl("current.sql"))
    served.sql(ddl("v2018.sql"))
    served.engine.refresh()
    tables = {t.name: t for t in served.client.list_tables()}
    assert tables["my_message"].load_error == ""
    assert tables["my_message"].config.batch_size == 10
    assert tables["old_message"].load_error == ""
    assert tables["old_message"].config.layout == "2018"


def test_a_table_with_a_bad_comment_fails_alone_and_says_why(served: Served):
    served.create_table("good")
    served.create_table("bad", vt_batch_size=0)
    served.create_table("odd", vt_colour="blue")
    served.engine.refresh()
    tables = {t.name: t for t in served.client.list_tables()}
    assert tables["good"].load_error == ""
    assert "bad" in tables["bad"].load_error and "vt_batch_size" in tables["bad"].load_error
    assert "vt_colour" in tables["odd"].load_error
    with pytest.raises(TableLoadError, match="vt_batch_size"):
        next(iter(served.client.subscribe("bad")))
    with pytest.raises(TableLoadError):
        served.client.ack("bad", [1])
    served.sql("insert into good(id, message) values (1, 'still works')")
    c = Collector(served.client, "good")
    assert c.take(1)[0].values["message"] == "still works"
    c.close()


def test_a_table_missing_a_required_column_fails_to_load(served: Served):
    served.sql(
        "create table nocol(id bigint primary key, time_next bigint, epoch bigint, "
        "time_acked bigint, message text) comment "
        "'vitess_message,vt_ack_wait=1,vt_purge_after=1,vt_batch_size=1,"
        "vt_cache_size=1,vt_poller_interval=1'"
    )
    served.engine.refresh()
    (t,) = [t for t in served.client.list_tables() if t.name == "nocol"]
    assert "nocol" in t.load_error and "priority" in t.load_error


# -- 2. enqueue with plain SQL -----------------------------------------------------------
def test_a_plain_insert_is_delivered_without_engine_columns(served: Served):
    served.create_table("my_message")
    served.sql("insert into my_message(id, message) values(1, 'hello world')")
    c = Collector(served.client, "my_message")
    (m,) = c.take(1)
    assert m.id == 1 and m.values == {"id": 1, "message": "hello world"}
    c.close()


def test_rows_committed_in_a_transaction_arrive_and_rolled_back_rows_never(served: Served):
    served.create_table("tx", vt_poller_interval=0.2)
    c = Collector(served.client, "tx")
    with pytest.raises(RuntimeError), served.transaction() as conn:
        conn.execute(sa.text("insert into tx(id, message) values (1, 'rolled back')"))
        time.sleep(0.5)  # several polls see nothing uncommitted
        raise RuntimeError("the application gives up: rollback")
    with served.transaction() as conn:
        conn.execute(sa.text("insert into tx(id, message) values (2, 'committed')"))
    assert [m.id for m in c.take(1)] == [2]
    c.nothing_for(0.6)
    c.close()


def test_null_time_next_is_due_and_future_time_next_waits(served: Served):
    served.create_table("sched", vt_poller_interval=0.1)
    future = served.now_ns() + 2 * NS
    served.sql(
        "insert into sched(id, message, time_next) values (1, 'null', NULL), (2, 'later', :t)",
        t=future,
    )
    c = Collector(served.client, "sched")
    assert [m.id for m in c.take(1)] == [1]
    (m,) = c.take(1, timeout_s=5)
    assert m.id == 2 and c.arrived_ns[2][0] >= future  # not a moment early
    c.close()


def test_the_2018_layout_delivers_by_time_scheduled(served: Served):
    served.sql(ddl("v2018.sql").replace("vt_poller_interval=30", "vt_poller_interval=0.1"))
    future = served.now_ns() + 1 * NS
    served.sql(
        "insert into old_message(time_scheduled, id, message) values (0, 1, 'now'), "
        "(:t, 2, 'later')",
        t=future,
    )
    c = Collector(served.client, "old_message")
    (first,) = c.take(1)
    assert first.values == {"id": 1, "message": "now"}
    (second,) = c.take(1, timeout_s=5)
    assert second.id == 2 and c.arrived_ns[2][0] >= future
    assert served.client.ack("old_message", [1, 2]) == 2
    assert served.sql("select count(*) from old_message where time_acked is null")[0][0] == 0
    c.close()


def test_application_columns_travel_typed(served: Served):
    served.create_table(
        "typed",
        extra_columns=(
            "n int, u bigint unsigned, f double, d decimal(10,2), j json, b varbinary(8), "
            "z varchar(10)"
        ),
    )
    served.sql(
        "insert into typed(id, message, n, u, f, d, j, b, z) values "
        "(1, 'm', -5, 18446744073709551615, 1.5, 12.50, '{\"a\": 1}', x'00ff', NULL)"
    )
    c = Collector(served.client, "typed")
    (m,) = c.take(1)
    v = m.values
    assert (v["n"], v["u"], v["f"], v["d"], v["b"], v["z"]) == (
        -5,
        18446744073709551615,
        1.5,
        Decimal("12.50"),
        b"\x00\xff",
        None,
    )
    assert v["j"].replace(" ", "") == '{"a":1}'
    assert [f.name for f in c.subscription.fields][:2] == ["id", "message"]
    c.close()


# -- 3. streaming ------------------------------------------------------------------------
def test_fields_come_first_then_batches_of_at_most_batch_size(served: Served):
    served.create_table("batched", vt_batch_size=3)
    served.sql(
        "insert into batched(id, message) values " + ",".join(f"({i}, 'm{i}')" for i in range(10))
    )
    sub = served.client.subscribe("batched")
    responses = sub.raw_responses()
    first = next(responses)
    assert [f.name for f in first.fields] == ["id", "message"] and not first.rows
    sizes, seen = [], 0
    while seen < 10:
        r = next(responses)
        assert not r.fields
        sizes.append(len(r.rows))
        seen += len(r.rows)
    assert max(sizes) <= 3
    sub.close()


def test_subscribers_share_messages_round_robin_and_none_gets_one_twice(served: Served):
    served.create_table("rr", vt_batch_size=5, vt_poller_interval=0.2)
    subs = [Collector(served.client, "rr") for _ in range(3)]
    wait_until(lambda: served.client.list_tables()[0].subscribers == 3)
    served.sql("insert into rr(id, message) values " + ",".join(f"({i}, 'm')" for i in range(300)))
    got: list[list[int]] = [[] for _ in subs]
    deadline = time.monotonic() + 15
    while sum(map(len, got)) < 300 and time.monotonic() < deadline:
        for i, c in enumerate(subs):
            while not c.messages.empty():
                m = c.messages.get()
                got[i].append(m.id)
                m.ack()
        time.sleep(0.01)
    everything = sorted(x for g in got for x in g)
    assert everything == list(range(300))  # each message once: no broadcast, no duplicate
    assert all(len(g) >= 5 for g in got), [len(g) for g in got]  # every subscriber served
    for c in subs:
        c.close()


def test_keyspace_shard_and_key_range_may_only_name_this_database(served: Served, db_dsn):
    served.create_table("ks")
    served.sql("insert into ks(id, message) values (1, 'x')")
    database = sa.engine.make_url(db_dsn).database
    c = Collector(served.client, "ks", keyspace=database, shard="0")
    assert c.take(1)[0].id == 1
    c.close()
    with pytest.raises(TableNotFound, match="keyspace"):
        next(iter(served.client.subscribe("ks", keyspace="elsewhere")))
    with pytest.raises(InvalidArgument, match="shard"):
        next(iter(served.client.subscribe("ks", shard="-80")))
    with pytest.raises(InvalidArgument, match="key_range"):
        next(iter(served.client.subscribe("ks", key_range=(b"", b"\x80"))))


def test_a_subscriber_is_sent_no_more_than_its_window_and_others_get_the_rest(
    served: Served,
):
    """max_in_flight: a subscriber that does not ack holds at most its window; the other
    subscribers are not held up by it."""
    served.create_table("win", vt_batch_size=5, vt_poller_interval=0.1)
    served.sql("insert into win(id, message) values " + ",".join(f"({i}, 'm')" for i in range(60)))
    slow = Collector(served.client, "win", max_in_flight=10)
    held = slow.take(10)
    slow.nothing_for(0.5)  # 10 unacked: the window is full
    fast = Collector(served.client, "win")
    rest = []
    while len(rest) < 50:
        batch = fast.take(1)
        rest += batch
        batch[0].ack()
    assert sorted(m.id for m in held + rest) == list(range(60))
    slow.nothing_for(0.3)
    # the slow one alone now (the fast one, idle, would take the new rows before the ack
    # below makes room: which of the two gets them is a race, not the window's rule)
    fast.close()
    served.client.ack("win", [m.id for m in held[:5]])  # 5 unacked: room for one batch
    served.sql(
        "insert into win(id, message) values " + ",".join(f"({i}, 'n')" for i in range(60, 70))
    )
    more = slow.take(5)
    slow.nothing_for(0.3)  # 10 unacked again: the other 5 wait
    assert {m.id for m in more} <= set(range(60, 70))
    slow.close()


def test_tail_with_a_count_leaves_no_message_in_flight_that_it_did_not_show(
    served: Served, capsys: pytest.CaptureFixture[str]
):
    """msgtable tail --count 3 on a table of batch 10: the other 7 are not sent to it (where
    they would wait out their ack wait), so another subscriber gets them at once."""
    served.create_table("t", vt_batch_size=10, vt_poller_interval=0.1)
    served.sql("insert into t(id, message) values " + ",".join(f"({i}, 'm')" for i in range(10)))
    assert cli.main(["tail", "t", "--count", "3", "--server", served.server.address]) == 0
    shown = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert len(shown) == 3
    other = Collector(served.client, "t")
    rest = other.take(7, timeout_s=5)  # the ack wait is 30 s: in flight, they would not come
    assert sorted({f"id={m.id}" for m in rest} | set(shown)) == sorted(f"id={i}" for i in range(10))
    other.close()


def test_a_window_filled_by_messages_acked_by_dml_frees_without_the_binlog(served: Served):
    served.create_table("win_dml", vt_batch_size=5, vt_poller_interval=0.1)
    served.sql(
        "insert into win_dml(id, message) values " + ",".join(f"({i}, 'm')" for i in range(20))
    )
    c = Collector(served.client, "win_dml", max_in_flight=5)
    first = c.take(5)
    c.nothing_for(0.3)
    with served.transaction() as conn:  # the application acks them by DML
        conn.execute(
            sa.text(
                "update win_dml set time_acked = :now, time_next = null where id in :ids"
            ).bindparams(sa.bindparam("ids", expanding=True)),
            {"now": served.now_ns(), "ids": [m.id for m in first]},
        )
    began = time.monotonic()
    nxt = c.take(5, timeout_s=5)  # the server asks the database after a second of no acks
    assert time.monotonic() - began < 4
    assert not {m.id for m in nxt} & {m.id for m in first}
    c.close()


# -- 4. acks -----------------------------------------------------------------------------
def test_message_ack_counts_and_an_acked_message_never_comes_back(served: Served):
    served.create_table("acked", vt_ack_wait=0.2, vt_min_backoff=0.1, vt_poller_interval=0.1)
    served.sql("insert into acked(id, message) values (1, 'a'), (2, 'b')")
    c = Collector(served.client, "acked")
    msgs = c.take(2)
    assert served.client.ack("acked", [1, 2, 999]) == 2
    assert served.client.ack("acked", [1]) == 0
    c.nothing_for(1.0)  # well past ack wait + backoff
    rows = served.sql("select id, time_acked is not null, time_next from acked order by id")
    assert rows == [(1, 1, None), (2, 1, None)]
    assert {m.id for m in msgs} == {1, 2}
    c.close()


def test_acks_queued_with_ack_async_are_merged_sent_and_counted(served: Served):
    served.create_table("async_acks", vt_batch_size=5, vt_poller_interval=0.1)
    values = ", ".join(f"({i}, 'm{i}')" for i in range(1, 101))
    served.sql(f"insert into async_acks(id, message) values {values}")
    sub = served.client.subscribe("async_acks")
    futures, seen = [], []
    while len(seen) < 100:
        batch = sub.next_batch()
        assert len(batch) <= 5
        seen.extend(m.id for m in batch)
        futures.append(sub.ack_async(batch))
    sub.flush_acks(10)
    assert all(f.done() and f.exception() is None for f in futures)
    assert sorted(seen) == list(range(1, 101)) and sub.acked == 100
    assert served.sql("select count(*) from async_acks where time_acked is null") == [(0,)]
    # acking again through the same queue counts nothing: they are acked already
    sub.ack_async(batch).result(10)
    sub.flush_acks(10)
    assert sub.acked == 100
    sub.close()
    with pytest.raises(MsgtableError, match="closed"):
        sub.ack_async(batch)


def test_acks_queued_within_the_linger_go_in_one_call_and_flush_does_not_wait_it(
    served: Served,
):
    served.create_table("linger_acks", vt_batch_size=2, vt_poller_interval=0.1)
    served.sql("insert into linger_acks(id, message) values (1, 'a'), (2, 'b'), (3, 'c')")
    with Client(served.server.address, ack_linger_s=30) as client:
        sub = client.subscribe("linger_acks")
        batches = [sub.next_batch(), sub.next_batch()]
        futures = [sub.ack_async(b) for b in batches]
        time.sleep(0.3)
        assert not any(f.done() for f in futures)  # held for others to join
        began = time.monotonic()
        sub.flush_acks(10)
        assert time.monotonic() - began < 5  # a flush sends at once
        assert (sub.ack_calls, sub.acked) == (1, 3)
        sub.close()
    with pytest.raises(InvalidArgument, match="ack_linger_s"):
        Client(served.server.address, ack_linger_s=-1)


def test_close_sends_the_queued_acks_first(served: Served):
    served.create_table("close_acks", vt_batch_size=10, vt_poller_interval=0.1)
    served.sql("insert into close_acks(id, message) values (1, 'a'), (2, 'b'), (3, 'c')")
    sub = served.client.subscribe("close_acks")
    got: list[Message] = []
    while len(got) < 3:
        got.extend(sub.next_batch())
    future = sub.ack_async(got)
    sub.close()
    assert future.done() and future.exception() is None
    assert served.sql("select count(*) from close_acks where time_acked is null") == [(0,)]


def test_a_failed_async_ack_reaches_its_future_and_flush(served: Served):
    served.create_table("gone_acks", vt_poller_interval=0.1)
    served.sql("insert into gone_acks(id, message) values (1, 'a')")
    sub = served.client.subscribe("gone_acks")
    batch = sub.next_batch()
    served.sql("drop table gone_acks")
    served.engine.refresh()
    future = sub.ack_async(batch)
    with pytest.raises(TableNotFound):
        future.result(10)
    with pytest.raises(TableNotFound):
        sub.flush_acks(10)
    sub.flush_acks(10)  # the error was reported once
    sub.close()


@pytest.mark.parametrize("postpone_after", [0, 0.2])
def test_a_dml_ack_of_a_cached_message_prevents_its_send(served: Served, postpone_after):
    served.create_table(
        "dml",
        "payload mediumtext",
        vt_batch_size=1,
        vt_poller_interval=0.1,
        vt_postpone_after=postpone_after,
    )
    # A subscriber whose window holds 20: of 60 rows, 40 stay in the cache, unsent. (Not a
    # transport that fills: gRPC and the kernel take megabytes for a subscriber that does not
    # read, more or less as its flow-control window grows, so how many stay was a race.)
    for i in range(60):
        served.sql("insert into dml(id, message, payload) values (:i, 'm', :p)", i=i, p="x")
    sub = served.client.subscribe("dml", max_in_flight=20)

    seen: list[int] = []

    def settled() -> bool:
        """Sending stopped (the subscriber's window is full: the count of messages handed
        to it, in flight, stayed the same for 0.2 s) and every one of them has been
        postponed (epoch 1), so epoch 0 means "not sent". (In flight, not sent: a send
        counts once the stream takes its batch, and the last two wait in its buffer.)"""
        time.sleep(0.2)
        t = served.client.list_tables()[0]
        seen.append(t.in_flight)
        postponed = served.sql("select count(*) from dml where epoch = 1")[0][0]
        stopped = len(seen) >= 2 and seen[-2] == t.in_flight > 0
        return stopped and t.cached >= 1 and t.in_flight == postponed

    wait_until(settled, what="the subscriber's window to fill and its rows to be postponed")
    # The application acks every message not sent yet, by DML in its own transaction.
    with served.transaction() as conn:
        unsent = list(
            conn.scalars(
                sa.text("select id from dml where epoch = 0 and time_acked is null for update")
            )
        )
        conn.execute(
            sa.text(
                "update dml set time_acked = :now, time_next = null "
                "where id in :ids and time_acked is null"
            ).bindparams(sa.bindparam("ids", expanding=True)),
            {"now": served.now_ns(), "ids": unsent},
        )
    assert unsent
    received: list[int] = []

    def read() -> None:  # acks each: the window opens again for whatever is still cached
        for m in sub:
            received.append(m.id)
            m.ack()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_until(lambda: len(received) >= 60 - len(unsent), what="the messages sent before the ack")
    time.sleep(0.5)
    sub.close()
    assert sorted(received) == sorted(set(range(60)) - set(unsent))


# -- 4b. the postpone of a sent message waits vt_postpone_after for its ack ---------------
def row_state(served: Served, table: str, i: int) -> tuple[int, int | None, int | None]:
    """(epoch, time_next, time_acked) of one row."""
    return tuple(served.sql(f"select epoch, time_next, time_acked from {table} where id = {i}")[0])


def test_a_message_acked_within_vt_postpone_after_is_written_once_by_its_ack(served: Served):
    served.create_table("once", vt_postpone_after=30, vt_poller_interval=0.05)
    served.sql("insert into once(id, message) values (1, 'a')")
    c = Collector(served.client, "once")
    c.take(1)
    time.sleep(0.3)
    assert row_state(served, "once", 1) == (0, 0, None)  # sent, no postpone written
    c.nothing_for(0.3)  # and, though still due in the table, not sent again
    assert served.client.ack("once", [1]) == 1
    epoch, time_next, acked = row_state(served, "once", 1)
    assert (epoch, time_next) == (1, None) and acked is not None  # the ack counted the send
    c.close()


def test_an_unacked_message_is_postponed_vt_postpone_after_its_send(served: Served):
    served.create_table("late", vt_ack_wait=1, vt_postpone_after=0.3, vt_poller_interval=0.05)
    served.sql("insert into late(id, message) values (1, 'a')")
    before = served.now_ns()
    c = Collector(served.client, "late")
    (m,) = c.take(1)
    assert row_state(served, "late", 1)[0] == 0
    wait_until(lambda: row_state(served, "late", 1)[0] == 1, what="the postpone")
    # not before vt_postpone_after from the send (the server's time of it: on a loaded
    # machine the message may reach the client long after)
    assert m.sent_ns > 0 and served.now_ns() >= m.sent_ns + 0.3 * NS
    # by backoff from the send: ack wait 1 s + clamp(min_backoff 1 s * jitter) >= 1 s
    assert row_state(served, "late", 1)[1] >= before + 2 * NS
    c.nothing_for(1.0)  # not sent again within its ack wait
    c.close()


def test_a_dml_ack_before_the_postpone_is_kept_and_the_send_counted(served: Served):
    served.create_table("dmlfirst", vt_postpone_after=0.3, vt_poller_interval=0.05)
    served.sql("insert into dmlfirst(id, message) values (1, 'a')")
    c = Collector(served.client, "dmlfirst")
    c.take(1)
    acked_at = served.now_ns()
    served.sql("update dmlfirst set time_acked = :t, time_next = null where id = 1", t=acked_at)
    wait_until(lambda: row_state(served, "dmlfirst", 1)[0] == 1, what="the postpone")
    assert row_state(served, "dmlfirst", 1) == (1, None, acked_at)
    c.nothing_for(0.3)
    c.close()


def test_one_ack_of_messages_postponed_and_not_yet_counts_each_send_once(served: Served):
    served.create_table("mixed", vt_postpone_after=0.2, vt_poller_interval=0.05)
    served.sql("insert into mixed(id, message) values (1, 'a')")
    c = Collector(served.client, "mixed")
    c.take(1)
    wait_until(lambda: row_state(served, "mixed", 1)[0] == 1, what="the postpone of 1")
    served.sql("insert into mixed(id, message) values (2, 'b')")
    c.take(1)
    assert row_state(served, "mixed", 2)[0] == 0
    assert served.client.ack("mixed", [1, 2]) == 2
    assert [row_state(served, "mixed", i)[:2] for i in (1, 2)] == [(1, None), (1, None)]
    c.close()


def test_a_clean_shutdown_writes_the_postpones_still_waiting(db_dsn: str):
    with serve(db_dsn) as s:
        s.create_table("shut", vt_postpone_after=60, vt_poller_interval=0.05)
        s.sql("insert into shut(id, message) values (1, 'a')")
        before = s.now_ns()
        c = Collector(s.client, "shut")
        c.take(1)
        assert row_state(s, "shut", 1)[0] == 0
        c.close()
    with serve(db_dsn) as s:
        epoch, time_next, _ = row_state(s, "shut", 1)
        assert epoch == 1 and time_next >= before + 60 * NS  # its postpone kept across restart
        s.sql("drop table shut")


# -- 5. backoff --------------------------------------------------------------------------
def test_an_unacked_message_comes_back_after_its_backoff(served: Served):
    served.create_table("retry", vt_ack_wait=0.3, vt_min_backoff=0.3, vt_poller_interval=0.05)
    served.sql("insert into retry(id, message) values (1, 'a')")
    before = served.now_ns()
    c = Collector(served.client, "retry")

    def claimed(epoch: int) -> int:
        """time_next once the claim of the send at epoch - 1 committed: a message is handed
        over inside the claim's transaction, so it may arrive a moment before the commit."""
        wait_until(
            lambda: served.sql("select epoch from retry")[0][0] == epoch,
            what=f"the claim to epoch {epoch} to commit",
        )
        return int(served.sql("select time_next from retry")[0][0])

    (first,) = c.take(1)
    assert first.attempt == 1 and abs(first.sent_ns - served.now_ns()) < 5 * NS
    first_next = claimed(1)
    # sent at epoch 0: ack wait 0.3 s + backoff clamp(0.3 * 2^0 * jitter) >= 0.3 s
    assert first_next >= before + 0.6 * NS
    (second,) = c.take(1, timeout_s=5)
    assert second.attempt == 2 and second.sent_ns >= first_next  # the message's second delivery
    assert served.now_ns() >= first_next  # not a moment before its time
    second_next = claimed(2)
    # sent again at epoch 1, no earlier than first_next: 0.3 s + clamp(0.3 * 2^1 * jitter) >= 0.4
    assert second_next >= first_next + 0.7 * NS
    (third,) = c.take(1, timeout_s=5)  # and again, after the longer backoff
    assert third.attempt == 3
    claimed(3)
    c.close()


@pytest.mark.parametrize("postpone_after", [0, 0.2])
def test_reschedule_and_reprioritise_by_dml_take_effect_at_the_next_poll(
    served: Served, postpone_after
):
    served.create_table(
        "resched", vt_ack_wait=60, vt_poller_interval=0.1, vt_postpone_after=postpone_after
    )
    served.sql("insert into resched(id, message) values (1, 'a')")
    c = Collector(served.client, "resched")
    c.take(1)
    # Postponed by a minute (with vt_postpone_after > 0, once that has passed: before, the row
    # is as it was at the send, so a DML that sets those same values changes nothing).
    wait_until(lambda: row_state(served, "resched", 1)[0] == 1, what="the postpone")
    c.nothing_for(0.3)
    served.sql("update resched set time_next = 0, epoch = 0 where id = 1 and time_acked is null")
    assert c.take(1, timeout_s=2)[0].id == 1
    c.close()


# -- 5b. on time: a message due before the next poll goes at its time ---------------------
ON_TIME_S = 0.25  # generous for a loaded CI machine; bench/ measures the real lateness


def test_a_future_message_goes_at_its_time_not_at_the_next_poll(served: Served):
    served.create_table("future", vt_poller_interval=3)
    due = served.now_ns() + NS
    served.sql("insert into future(id, message, time_next) values (1, 'a', :t)", t=due)
    c = Collector(served.client, "future")  # its first poll reads the row ahead
    c.take(1, timeout_s=5)
    late_s = (c.arrived_ns[1][0] - due) / NS
    assert 0 <= late_s < ON_TIME_S  # the next poll would have been 3 s after the first
    c.close()


@pytest.mark.parametrize("postpone_after", [0, 1])
def test_a_redelivery_goes_at_the_end_of_its_backoff_not_at_the_next_poll(
    served: Served, postpone_after
):
    served.create_table(
        "again",
        vt_ack_wait=0.3,
        vt_min_backoff=0.3,
        vt_poller_interval=3,
        vt_postpone_after=postpone_after,
    )
    served.sql("insert into again(id, message) values (1, 'a')")
    c = Collector(served.client, "again")
    c.take(1)
    wait_until(lambda: row_state(served, "again", 1)[0] == 1, what="the postpone")
    due = row_state(served, "again", 1)[1]
    c.take(1, timeout_s=5)  # not acked: it comes back
    late_s = (c.arrived_ns[1][1] - due) / NS
    assert 0 <= late_s < ON_TIME_S
    c.close()


# -- 6. purge ----------------------------------------------------------------------------
def test_old_acked_rows_are_purged_in_batches_while_delivery_goes_on(served: Served):
    served.create_table("purged", vt_purge_after=60, vt_poller_interval=0.1)
    old = served.now_ns() - 61 * NS
    rows = ",".join(f"({i}, 'old', {old})" for i in range(1, 1301))  # > 2 purge batches
    served.sql(f"insert into purged(id, message, time_acked) values {rows}")
    served.sql(
        "insert into purged(id, message, time_acked) values (99999, 'young', :t)", t=served.now_ns()
    )
    served.sql("insert into purged(id, message) values (100000, 'open')")
    c = Collector(served.client, "purged")
    assert c.take(1)[0].id == 100000
    wait_until(
        lambda: served.sql("select count(*) from purged")[0][0] == 2,
        timeout_s=15,
        what="old acked rows purged",
    )
    assert sorted(r[0] for r in served.sql("select id from purged")) == [99999, 100000]
    c.close()


# -- 7. the bounded cache ----------------------------------------------------------------
def test_rows_beyond_the_cache_size_are_fetched_as_soon_as_room_frees(served: Served):
    served.create_table("small", vt_cache_size=5, vt_batch_size=5, vt_poller_interval=60)
    served.sql(
        "insert into small(id, message) values " + ",".join(f"({i}, 'm')" for i in range(40))
    )
    c = Collector(served.client, "small")
    got = []
    for _ in range(8):
        batch = c.take(5, timeout_s=5)  # far less than one 60 s poll interval
        got += [m.id for m in batch]
        served.client.ack("small", [m.id for m in batch])
    assert sorted(got) == list(range(40))
    c.close()


class CountingStore(MySQLStore):
    polls = 0

    def poll(self, cfg, now_ns, limit, after=None, created=False, floor_ns=None, **kw):  # type: ignore[no-untyped-def]
        CountingStore.polls += 1
        return super().poll(cfg, now_ns, limit, after, created, floor_ns, **kw)


def test_no_poll_runs_and_nothing_is_cached_without_a_subscriber(db_dsn):
    from msgtable.features.assembly import assemble

    store = CountingStore.from_dsn(db_dsn)
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        conn.execute(
            sa.text(
                "create table idle(id bigint primary key, priority bigint not null default 0, "
                "time_next bigint default 0, epoch bigint not null default 0, time_acked bigint, "
                "message text, index(time_acked, priority, time_next)) comment "
                "'vitess_message,vt_ack_wait=1,vt_purge_after=60,vt_batch_size=1,"
                "vt_cache_size=10,vt_poller_interval=0.05'"
            )
        )
        conn.execute(sa.text("insert into idle(id, message) values (1, 'x')"))
    engine = assemble(store, discovery_interval_s=0.5)
    engine.open()
    try:
        time.sleep(0.5)
        assert CountingStore.polls == 0
        (status,) = engine.list_tables()
        assert status.cached == 0
        sub = engine.subscribe("idle")
        assert sub.next_batch(5) == [(1, "x")]
        assert CountingStore.polls >= 1
        sub.close()
        polls = CountingStore.polls
        time.sleep(0.4)
        assert CountingStore.polls <= polls + 1  # at most one poll that was already running
    finally:
        engine.close()
        db.dispose()


# -- bad input ---------------------------------------------------------------------------
def test_unknown_tables_and_malformed_acks_get_clear_errors(served: Served):
    served.create_table("known")
    with pytest.raises(TableNotFound, match="nope"):
        next(iter(served.client.subscribe("nope")))
    with pytest.raises(TableNotFound, match="nope"):
        served.client.ack("nope", [1])
    with pytest.raises(InvalidArgument, match="no ids"):
        served.client.ack("known", [])
    with pytest.raises(InvalidArgument, match="malformed"):
        served.client.ack("known", ["not a number"])
    with pytest.raises(InvalidArgument, match="max_in_flight"):
        next(iter(served.client.subscribe("known", max_in_flight=1_000_001)))
    with pytest.raises(InvalidArgument, match="max_in_flight"):
        served.client.subscribe("known", max_in_flight=-1)
    with pytest.raises(TableNotFound):
        served.client.ack("known`; drop table known; --", [1])
    assert served.sql("select count(*) from known")[0][0] == 0  # still there


def test_a_table_created_after_start_is_served_without_restart(served: Served):
    served.create_table("late")
    served.sql("insert into late(id, message) values (1, 'x')")
    c = Collector(served.client, "late")
    assert c.take(1)[0].id == 1
    c.close()


def test_list_tables_shows_a_table_created_a_moment_ago(db_dsn: str):
    with serve(db_dsn, discovery_interval_s=3600) as s:  # no periodic discovery to wait for
        assert s.client.list_tables() == []
        s.create_table("fresh")
        assert [t.name for t in s.client.list_tables()] == ["fresh"]


def test_list_tables_shows_each_tables_backlog_read_from_the_database(db_dsn: str):
    with serve(db_dsn) as s:
        s.create_table("aging")
        two_minutes_ago = f"(unix_timestamp(now(6)) - 120) * {NS}"
        s.sql(
            "insert into aging(id, message, time_created) values "
            f"(1, 'a', {two_minutes_ago}), (2, 'b', {two_minutes_ago}), (3, 'c', {two_minutes_ago})"
        )
        later = f"(unix_timestamp(now(6)) + 3600) * {NS}"
        s.sql(
            f"insert into aging(id, message, time_next) values (4, 'd', {later}), (5, 'e', {later})"
        )

        def read() -> object:
            (t,) = [t for t in s.client.list_tables() if t.name == "aging"]
            return t if t.due == 3 else None

        t = wait_until(read, what="ListTables to show the 3 due messages")
        assert t.scheduled == 2
        assert t.oldest_unacked_age_s is not None and 120 <= t.oldest_unacked_age_s < 180


# -- live schema ---------------------------------------------------------------------------
def test_a_new_table_is_served_within_one_discovery_interval(served: Served):
    # The fixture's engine looks every 0.5 s; nothing here names the table to the server.
    created = time.monotonic()
    served.create_table("fresh")
    wait_until(
        lambda: any(t.name == "fresh" and t.loaded for t in served.client.list_tables()),
        timeout_s=5,
        what="the new table to be served",
    )
    assert time.monotonic() - created < 0.5 + 1.0  # one interval, and slack for a busy CI


def test_an_altered_comment_changes_the_batch_size_while_subscribers_stay(served: Served):
    served.create_table("resize", vt_batch_size=2, vt_poller_interval=0.05)
    c = Collector(served.client, "resize")
    served.sql(
        "insert into resize(id, message) values " + ",".join(f"({i}, 'm')" for i in range(10))
    )
    c.subscription.ack(c.take(10))
    assert max(c.batch_sizes) == 2
    served.sql(f"alter table resize comment '{comment(vt_batch_size=5, vt_poller_interval=0.05)}'")
    wait_until(
        lambda: served.client.list_tables()[0].config.batch_size == 5,
        what="the new comment to be applied",
    )
    before = len(c.batch_sizes)
    served.sql(
        "insert into resize(id, message) values " + ",".join(f"({i}, 'm')" for i in range(10, 20))
    )
    c.take(10)  # on the same stream
    assert max(c.batch_sizes[before:]) == 5 and c.error is None
    c.close()


def test_dropping_a_table_ends_its_streams_with_not_found(served: Served):
    served.create_table("doomed", vt_poller_interval=0.05)
    c = Collector(served.client, "doomed")
    served.sql("drop table doomed")
    assert c.done.wait(5), "the stream should end"
    assert isinstance(c.error, TableNotFound)
    with pytest.raises(TableNotFound):
        served.client.subscribe("doomed")


def test_an_invalid_new_comment_stops_the_table_until_it_is_fixed(served: Served):
    served.create_table("fickle", vt_poller_interval=0.05)
    c = Collector(served.client, "fickle")
    bad = comment(vt_poller_interval=0.05).replace("vt_batch_size=10", "vt_batch_size=0")
    served.sql(f"alter table fickle comment '{bad}'")
    assert c.done.wait(5), "the stream should end"
    assert isinstance(c.error, TableLoadError) and "vt_batch_size" in str(c.error)
    (info,) = served.client.list_tables()
    assert not info.loaded and "vt_batch_size" in info.load_error
    with pytest.raises(TableLoadError):
        served.client.subscribe("fickle")
    served.sql(f"alter table fickle comment '{comment(vt_poller_interval=0.05)}'")
    wait_until(lambda: served.client.list_tables()[0].loaded, what="the table to come back")
    served.sql("insert into fickle(id, message) values (1, 'back')")
    again = Collector(served.client, "fickle")
    assert again.take(1)[0].id == 1
    again.close()


def test_lower_priority_goes_first_and_dml_reprioritising_counts_at_the_next_poll(
    served: Served,
):
    served.create_table("prio", vt_batch_size=1)
    served.sql(
        "insert into prio(id, message, priority) values (1, 'a', 5), (2, 'b', 1), (3, 'c', 3)"
    )
    served.sql("update prio set priority = 0 where id = 3 and time_acked is null")
    c = Collector(served.client, "prio")  # its arrival triggers the next poll
    assert [m.id for m in c.take(3)] == [3, 2, 1]  # not the primary key's order
    c.close()


def keyset_order(db_dsn: str) -> tuple[list[object], list[object]]:
    """The ids of the database's one message table as polls of one row each, every poll
    continuing after the last one's key, return them; and as one poll of ten returns them."""
    store = MySQLStore.from_dsn(db_dsn)
    try:
        (d,) = store.discover()
        cfg = load_table(d.name, d.comment, d.columns, d.unique_indexes)
        order, after = [], None
        while True:
            rows, after = store.poll(cfg, time.time_ns(), 1, after)
            if not rows:
                break
            order.append(rows[0][3])
        rows, _ = store.poll(cfg, time.time_ns(), 10)
        return order, [r[3] for r in rows]
    finally:
        store.close()


def test_polls_continue_after_the_last_row_read_in_sql_order(db_dsn: str):
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        # "keys" is a reserved word: every statement msgtable runs must quote it
        conn.execute(sa.text(current_layout_ddl("`keys`", comment())))
        conn.execute(
            sa.text(
                "insert into `keys`(id, priority, time_next, message) values "
                "(2, 0, NULL, 'b'), (1, 0, NULL, 'a'), (4, 0, 0, 'd'), (3, 0, 0, 'c'), "
                "(5, 0, 5, 'e'), (6, 1, NULL, 'f'), (7, 1, 3, 'g')"
            )
        )
    try:
        order, at_once = keyset_order(db_dsn)
        assert order == [1, 2, 3, 4, 5, 6, 7]  # NULL time_next first, then by time, then id
        assert at_once == [1, 2, 3, 4, 5, 6, 7]
    finally:
        db.dispose()


def test_polls_of_the_2018_layout_continue_by_due_time_then_id(db_dsn: str):
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        conn.execute(sa.text(ddl("v2018.sql")))
        conn.execute(
            sa.text(
                "insert into old_message(time_scheduled, id, time_next, message) values "
                "(7, 1, NULL, 'a'), (0, 3, NULL, 'c'), (0, 2, NULL, 'b'), (1, 4, 5, 'd')"
            )
        )
    try:
        order, _ = keyset_order(db_dsn)
        # due at coalesce(time_next, time_scheduled): 2 and 3 at 0, 4 at 5, 1 at 7
        assert order == [2, 3, 4, 1]
    finally:
        db.dispose()
