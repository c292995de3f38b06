"""The msgtable streaming source on a real local Spark session, a real msgtable server (gRPC)
and a real MySQL-family server: messages are acked only once their micro-batch's sink has
committed, a failed query gets its unacked messages again, and the query shares the table
with other subscribers."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ..integration.helpers import Collector, serve
from ..waiting import wait_until

N = 300


def acked(s, table: str) -> int:
    return s.sql(f"select count(*) from {table} where time_acked is not null")[0][0]


def stream(spark, address: str, table: str, checkpoint: Path, sink):
    df = (
        spark.readStream.format("msgtable")
        .option("server", address)
        .option("maxMessagesPerBatch", 100)
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
