"""The Spark pipeline and subscriptions (msgtable.core.subscriptions), on a real local Spark
session,
a real msgtable server (gRPC) and a real MySQL-family server: a streaming query consumes one
subscription of a table and acks in it alone; a batch read lists a subscription's view of the
table with the subscription's own delivery state; an unknown subscription fails in one line."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from msgtable.core.tables import DEAD_TIME_NEXT, Column, load_table
from msgtable.errors import InvalidArgument, TableNotFound
from msgtable.spark.errors import spark_error
from msgtable.spark.subview import SubscriptionStatements, subscription_view
from msgtable.store.bulk import RowState

from ..integration.helpers import Served, comment, serve
from ..waiting import wait_until

ORDER_COLUMNS = "region varchar(16), kind varchar(16), amount bigint"
N = 40
EU = [i for i in range(1, N + 1) if i % 4 == 0]  # the rows enqueue() puts in region eu


def make_orders(s: Served) -> None:
    s.create_table("orders", ORDER_COLUMNS, vt_poller_interval=0.2, vt_ack_wait=30)
    s.engine.refresh()  # served now, not at the next discovery


def enqueue(s: Served, ids: range | list[int]) -> None:
    rows = ",".join(
        f"({i}, 'm{i}', '{'eu' if i % 4 == 0 else 'us'}', '{'order' if i % 2 else 'refund'}', {i})"
        for i in ids
    )
    s.sql(f"insert into orders(id, message, region, kind, amount) values {rows}")


def handed_over(s: Served) -> None:
    wait_until(
        lambda: s.sql("select count(*) from orders where time_fanout is null")[0][0] == 0,
        timeout_s=30,
        what="the fan-out to hand every row of orders to its subscriptions",
    )


def read(spark: Any, dsn: str, **options: str) -> Any:
    reader = spark.read.format("msgtable").option("dsn", dsn)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load("orders")


def ids(df: Any) -> list[int]:
    return sorted(r.id for r in df.select("id").collect())


def test_a_subscriptions_view_is_its_state_table_joined_to_the_message_table():
    def bigint(name: str) -> Column:
        return Column(name, "bigint", "bigint(20)")

    engine = [bigint(c) for c in ("id", "priority", "time_next", "epoch", "time_acked")]
    table = load_table(
        "jobs",
        comment(),
        [*engine, Column("message", "varchar", "varchar(128)"), bigint("time_fanout")],
        [["id"]],
    )
    state = [*engine, bigint("time_created"), Column("last_error", "varchar", "varchar(1000)")]
    view = subscription_view(table, "billing", state)
    assert view.config.name == "jobs__billing" and view.config.source == "jobs"
    statements = SubscriptionStatements(view)
    where, params = statements.state(RowState.ACKED, 0)
    assert statements.select_range(where) == (
        "SELECT `id`, `priority`, `time_next`, `epoch`, `time_acked`, `message`, `time_fanout`, "
        "`time_created`, `last_error` FROM (SELECT s.`id`, s.`priority`, s.`time_next`, "
        "s.`epoch`, s.`time_acked`, m.`message`, m.`time_fanout`, s.`time_created`, "
        "s.`last_error` FROM `jobs__billing` AS s JOIN `jobs` AS m ON m.`id` = s.`id`) AS v "
        "WHERE `id` BETWEEN %s AND %s AND (`time_acked` IS NOT NULL) ORDER BY `id`"
    )
    assert params == []
    # a subscription's dead messages are dead in place, in its state table
    assert statements.state(RowState.DEAD, 0) == (
        "`time_acked` IS NULL AND `time_next` = %s",
        [DEAD_TIME_NEXT],
    )


def test_a_stream_of_a_subscription_gets_its_messages_and_acks_them_in_it_alone(
    spark, db_dsn, tmp_path: Path
):
    with serve(db_dsn) as s:
        make_orders(s)
        s.client.create_subscription("orders", "billing")
        s.client.create_subscription("orders", "eu", filter="region = 'eu'")
        enqueue(s, range(1, N + 1))
        seen: list[tuple[int, int, str]] = []
        lock = threading.Lock()

        def sink(batch: Any, batch_id: int) -> None:
            rows = batch.collect()
            with lock:
                seen.extend((r.id, r.amount, r.region) for r in rows)

        df = (
            spark.readStream.format("msgtable")
            .option("server", s.server.address)
            .option("subscription", "eu")
            .option("columns", "amount,region")
            .option("maxMessagesPerBatch", 4)
            .load("orders")
        )
        assert df.columns == ["id", "amount", "region"]  # the schema follows the projection

        def acked_in_eu() -> int:
            return s.sql("select count(*) from orders__eu where time_acked is not null")[0][0]

        q = (
            df.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        try:
            wait_until(
                lambda: len(seen) >= len(EU) and acked_in_eu() == len(EU),
                timeout_s=90,
                what=lambda: (
                    f"the {len(EU)} messages of subscription eu in the sink and acked in it "
                    f"(the sink has ids {sorted(r[0] for r in seen)}, {acked_in_eu()} acked)"
                ),
            )
        finally:
            q.stop()

        assert sorted(seen) == [(i, i, "eu") for i in EU]  # exactly eu's, each once
        assert s.sql("select count(*) from orders__eu")[0][0] == len(EU)
        # the default group and the other subscription are as the fan-out left them
        default = s.sql("select count(*), max(epoch), max(time_acked) from orders")
        assert default == [(N, 0, None)]
        billing = s.sql("select count(*), max(epoch), max(time_acked) from orders__billing")
        assert billing == [(N, 0, None)]

        # the batch reader lists them as the subscription has them: acked
        acked = read(spark, db_dsn, subscription="eu", state="acked")
        assert ids(acked) == EU
        assert all(r.epoch == 1 and r.time_acked for r in acked.collect())
        assert ids(read(spark, db_dsn, subscription="eu", state="unacked")) == []
        assert ids(read(spark, db_dsn, subscription="billing", state="acked")) == []
        assert ids(read(spark, db_dsn, subscription="billing", state="due")) == list(
            range(1, N + 1)
        )
        assert ids(read(spark, db_dsn, state="acked")) == []  # the table's own: none


def test_a_read_of_a_subscription_lists_its_view_with_its_own_state(spark, db_dsn):
    with serve(db_dsn) as s:
        make_orders(s)
        s.client.create_subscription("orders", "work", filter="amount > 2")
        enqueue(s, range(1, 9))
        handed_over(s)
    # the server is gone: a row enqueued now is handed to no subscription
    enqueue(s, [12])
    later = time.time_ns() + 3600 * 10**9
    s.sql(f"update orders__work set time_acked = {time.time_ns()}, epoch = 1 where id = 3")
    s.sql(f"update orders__work set time_next = {later}, epoch = 1 where id = 4")
    s.sql(
        f"update orders__work set time_next = {DEAD_TIME_NEXT}, epoch = 2, "
        f"last_error = 'bad amount', time_dead = {time.time_ns()} where id = 5"
    )
    s.sql(f"update orders__work set time_next = {later} where id = 6")
    s.sql(f"update orders set time_acked = {time.time_ns()} where id in (7, 8)")  # default group

    def state(name: str) -> list[int]:
        return ids(read(spark, db_dsn, subscription="work", state=name, partitions="3"))

    assert state("all") == [3, 4, 5, 6, 7, 8]  # not 1, 2 (filtered out), 12 (not handed over)
    assert state("acked") == [3]  # not 7, 8: acked by the default group only
    assert state("due") == [7, 8]
    assert state("scheduled") == [6]
    assert state("in_flight") == [4]
    assert state("dead") == [5]
    assert state("unacked") == [4, 5, 6, 7, 8]

    df = read(spark, db_dsn, subscription="work", state="dead")
    assert df.columns == [
        "id",
        "priority",
        "time_next",
        "epoch",
        "time_acked",
        "time_created",
        "message",
        "region",
        "kind",
        "amount",
        "time_fanout",
        "last_error",
        "time_dead",
    ]
    (dead,) = df.collect()
    assert (dead.message, dead.amount, dead.epoch) == ("m5", 5, 2)
    assert dead.last_error == "bad amount" and dead.time_dead


def test_an_unknown_subscription_fails_in_one_line(spark, db_dsn, tmp_path: Path):
    with serve(db_dsn) as s:
        make_orders(s)
        s.client.create_subscription("orders", "billing")

        def meant(exc: pytest.ExceptionInfo[BaseException]) -> BaseException:
            error = spark_error(exc.value)
            assert "\n" not in str(error)
            return error

        with pytest.raises(Exception) as info:
            read(spark, db_dsn, subscription="nope").schema  # noqa: B018
        error = meant(info)
        assert isinstance(error, TableNotFound)
        assert str(error).startswith("message table orders has no subscription 'nope'")

        def stream() -> Any:  # a new reader each time: option() changes the one it is called on
            return spark.readStream.format("msgtable").option("server", s.server.address)

        with pytest.raises(Exception) as info:
            stream().option("subscription", "nope").load("orders").schema  # noqa: B018
        error = meant(info)
        assert isinstance(error, TableNotFound)
        assert str(error) == "message table orders has no subscription 'nope'"

        with pytest.raises(Exception) as info:
            stream().option("subscription", "billing").option("columns", "id,colour").load("orders")
        error = meant(info)
        assert isinstance(error, InvalidArgument)
        assert str(error).startswith("orders/billing: unknown column 'colour' in columns")

        # dropped between load() and the query's subscribe: the server's NOT_FOUND
        df = stream().option("subscription", "billing").load("orders")
        s.client.drop_subscription("orders", "billing")
        q = (
            df.writeStream.foreachBatch(lambda batch, batch_id: None)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        try:
            wait_until(
                lambda: not q.isActive,
                timeout_s=60,
                what="the query of a dropped subscription to fail",
            )
        finally:
            q.stop()
        failure = q.exception()
        assert failure is not None, "the query ended without the server's NOT_FOUND"
        error = spark_error(failure)
        assert isinstance(error, TableNotFound), error
        assert "\n" not in str(error)
        assert "orders/billing not found" in str(error)
