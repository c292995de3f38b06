"""The msgtable streaming source on a real local Spark session, a real msgtable server (gRPC)
and a real MySQL-family server: messages are acked only once their micro-batch's sink has
committed, a failed query gets its unacked messages again, and the query shares the table
with other subscribers; an ordered table's keys keep their order in a micro-batch's partitions
and across micro-batches."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ..integration.helpers import Collector, serve
from ..waiting import wait_until

N = 300


def acked(s, table: str) -> int:
    return s.sql(f"select count(*) from {table} where time_acked is not null")[0][0]


def stream(spark, address: str, table: str, checkpoint: Path, sink, **options):
    df = (
        spark.readStream.format("msgtable")
        .option("server", address)
        .option("maxMessagesPerBatch", 100)
        .options(**options)
        .load(table)
    )
    return (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def test_a_sink_that_fails_once_still_gets_every_message_and_all_are_acked(spark, db_dsn, tmp_path):
    with serve(db_dsn) as s:
        s.create_table("jobs", vt_ack_wait=3, vt_poller_interval=0.2, vt_batch_size=50)
        s.engine.refresh()  # served now, not at the next discovery
        s.sql("insert into jobs(id, message) values " + ",".join(f"({i}, 'm')" for i in range(N)))
        seen: list[int] = []
        failed = threading.Event()
        lock = threading.Lock()

        def sink(batch, batch_id):
            ids = [r.id for r in batch.select("id").collect()]
            if ids and not failed.is_set():
                failed.set()
                raise RuntimeError("the sink fails once")
            with lock:
                seen.extend(ids)

        q = stream(spark, s.server.address, "jobs", tmp_path / "ck", sink)
        wait_until(failed.is_set, timeout_s=60, what="the first batch")
        wait_until(lambda: not q.isActive, timeout_s=60, what="the query to fail")
        assert acked(s, "jobs") == 0  # nothing of the failed batch was acked
        q = stream(spark, s.server.address, "jobs", tmp_path / "ck", sink)  # restarted
        try:
            wait_until(
                lambda: len(set(seen)) == N and acked(s, "jobs") == N,
                timeout_s=90,
                what="every message in the sink and acked",
            )
        finally:
            q.stop()
        assert sorted(set(seen)) == list(range(N))


def test_the_query_shares_the_table_with_other_subscribers(spark, db_dsn, tmp_path):
    with serve(db_dsn) as s:
        s.create_table("shared", vt_ack_wait=30, vt_poller_interval=0.2, vt_batch_size=20)
        s.engine.refresh()
        other = Collector(s.client, "shared", max_in_flight=40)
        seen: list[int] = []
        lock = threading.Lock()

        def sink(batch, batch_id):
            rows = batch.select("id").collect()
            with lock:
                seen.extend(r.id for r in rows)

        q = stream(spark, s.server.address, "shared", tmp_path / "ck", sink)
        try:
            time.sleep(2)  # the query subscribes
            s.sql(
                "insert into shared(id, message) values "
                + ",".join(f"({i}, 'm')" for i in range(N))
            )
            got: list[int] = []

            def everything() -> bool:
                while not other.messages.empty():
                    m = other.messages.get()
                    got.append(m.id)
                    m.ack()
                return len(got) + len(seen) >= N and acked(s, "shared") == N

            wait_until(everything, timeout_s=90, what="every message acked by one of the two")
        finally:
            q.stop()
            other.close()
        assert not set(got) & set(seen)  # no message went to both
        assert sorted(got + seen) == list(range(N))
        assert got and seen  # both took part


@pytest.mark.parametrize("group", ["", "audit"], ids=["default-group", "subscription"])
def test_an_ordered_tables_keys_stay_in_order_in_one_partition_and_across_micro_batches(
    spark, db_dsn, tmp_path, group
):
    """The table's default group, and a subscription (which orders on its own)."""
    from pyspark.sql.functions import monotonically_increasing_id, spark_partition_id

    keys, per_key = 6, 8
    with serve(db_dsn) as s:
        # runs of up to 4 of a key per server batch, cut by partitions of 3: slices would split them
        s.create_table(
            "jobs",
            "k varchar(64), index order_idx(k, time_acked, id)",
            vt_order_key="k",
            vt_ack_wait=30,
            vt_poller_interval=0.2,
            vt_batch_size=4,
        )
        s.engine.refresh()
        if group:
            s.client.create_subscription("jobs", group)
        state = f"jobs__{group}" if group else "jobs"
        rows = [(1 + n * keys + k, f"key{k}") for n in range(per_key) for k in range(keys)]
        s.sql(
            "insert into jobs(id, k, message) values "
            + ",".join(f"({i}, '{k}', 'm')" for i, k in rows)
        )
        seen: list[tuple[str, int, int, int, int]] = []  # key, batch id, partition, position, id
        lock = threading.Lock()

        def sink(batch, batch_id):
            got = batch.select(
                "k",
                spark_partition_id().alias("p"),
                monotonically_increasing_id().alias("pos"),
                "id",
            ).collect()
            with lock:
                seen.extend((r.k, batch_id, r.p, r.pos, r.id) for r in got)

        options = {"subscription": group} if group else {}
        q = stream(
            spark, s.server.address, "jobs", tmp_path / "ck", sink, rowsPerPartition=3, **options
        )
        try:
            wait_until(lambda: acked(s, state) == len(rows), timeout_s=90, what="all acked")
        finally:
            q.stop()
    for k in {k for _, k in rows}:
        mine = sorted((b, pos, rid) for key, b, _, pos, rid in seen if key == k)
        assert [rid for *_, rid in mine] == [i for i, key in rows if key == k]  # once, in order
        assert len({b for b, *_ in mine}) > 1  # its next messages came in a later micro-batch
        for b in {b for b, *_ in mine}:  # a micro-batch's rows of a key: one partition
            assert len({p for key, bb, p, *_ in seen if key == k and bb == b}) == 1, (k, b)
    # the micro-batches were cut into several partitions (the parallel sink's case)
    assert max(len({p for _, bb, p, *_ in seen if bb == b}) for _, b, *_ in seen) > 1


def test_text_keys_that_a_ci_collation_takes_as_one_share_a_partition():
    from msgtable.spark.stream import partition_of

    assert len({partition_of(k, 97) for k in ("Key", "key", "KEY  ", "kéy", "KÉY")}) == 1
    assert len({partition_of(f"key{i}", 8) for i in range(100)}) == 8  # and others spread


def partitioned(key_at: int | None, batches: list[list[tuple[int, str | None]]]) -> list[list[int]]:
    """The ids in each partition of one micro-batch of an ordered table's stream that got
    ``batches`` from the server ((id, key) rows; ``key_at``: where the key is in a row, None
    when the stream's columns leave it out), two rows a partition."""
    from types import SimpleNamespace

    from msgtable.core.codec import FieldType
    from msgtable.spark.stream import MsgtableStreamReader

    reader = MsgtableStreamReader({"table": "jobs", "rowsPerPartition": "2"}, None)
    reader._ordered, reader._key_at = True, key_at
    reader._kinds = (FieldType.INT, FieldType.TEXT)
    messages = [[SimpleNamespace(row=row, id=row[0]) for row in b] for b in batches]
    reader._subscriber = SimpleNamespace(batches=lambda: iter(messages))
    reader._receive()  # what the receiving thread does, here at once
    reader._thread = threading.current_thread()  # subscribed already: latestOffset plans
    end = reader.latestOffset()
    return [[row[0] for row in p.rows] for p in reader.partitions(reader.initialOffset(), end)]


def together(parts: list[list[int]], ids: list[int]) -> bool:
    """Whether one partition holds all of ``ids``, in this order."""
    return any([i for i in p if i in ids] == ids for p in parts)


def test_a_null_key_is_a_key_of_its_own_and_without_the_key_column_server_batches_stay_whole():
    batches = [[(1, "a"), (2, "a"), (3, "a")], [(4, None), (5, None), (6, "b"), (7, "b")]]
    parts = partitioned(1, batches)
    assert sorted(i for p in parts for i in p) == list(range(1, 8))
    assert together(parts, [1, 2, 3]) and together(parts, [6, 7]) and len(parts) > 1
    parts = partitioned(None, batches)  # the key is not among the stream's columns
    assert together(parts, [1, 2, 3]) and together(parts, [4, 5, 6, 7])


def test_a_stream_of_a_keyspace_reads_every_shard_through_a_gateway(
    spark, mysql_server, db_name, tmp_path
):
    from ..integration.test_gateway import keyspace_of

    with keyspace_of(mysql_server, db_name, 2) as c:
        ids = list(range(1, N + 1))
        c.enqueue("q", ids)
        seen: list[int] = []
        lock = threading.Lock()

        def sink(batch, batch_id):
            with lock:
                seen.extend(r.id for r in batch.select("id").collect())

        q = stream(spark, c.server.address, "q", tmp_path / "ck", sink)
        try:
            wait_until(
                lambda: len(set(seen)) == N and sum(map(len, c.acked("q").values())) == N,
                timeout_s=90,
                what="every message of both shards in the sink and acked in its shard",
            )
        finally:
            q.stop()
        assert sorted(set(seen)) == ids
        assert {s: len(a) for s, a in c.acked("q").items()} == {
            s: sum(1 for x in c.keyspace.shards_of(ids) if x.name == s) for s in c.shards
        }
