"""The msgtable data source on a real local Spark session and a real MySQL-family server:
bulk enqueue, partitioned reads with the table's types, state filters, duplicate ids."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import types as T

from msgtable.core.tables import DEAD_TIME_NEXT, current_layout_ddl

from ..integration.helpers import comment

N = 100_000


def make_table(sql, name: str, extra: str = "") -> None:
    ddl = current_layout_ddl(name, comment())
    if extra:
        ddl = ddl.replace("  primary key(id)", f"  {extra},\n  primary key(id)")
    sql.execute(ddl)


def test_100k_rows_written_then_read_back_equal(spark, sql, db_dsn):
    make_table(sql, "bulk", "amount decimal(10,2), seen datetime")
    df = spark.range(N).selectExpr(
        "id",
        "concat('m', id) as message",
        "cast(id % 1000 as decimal(10,2)) / 100 as amount",
        "timestamp'2026-01-02 03:04:05' as seen",
    )
    began = time.time_ns()
    df.write.format("msgtable").option("dsn", db_dsn).mode("append").save("bulk")

    # the engine's columns are a new message's: due now, never sent
    assert sql.scalar("select count(*) from bulk") == N
    assert sql.rows("select min(epoch), max(epoch), max(priority) from bulk") == [(0, 0, 0)]
    low, high = sql.rows("select min(time_next), max(time_next) from bulk")[0]
    assert began - 10**9 <= low <= high <= time.time_ns()
    assert sql.scalar("select count(*) from bulk where time_acked is not null") == 0

    back = spark.read.format("msgtable").option("dsn", db_dsn).option("partitions", 7).load("bulk")
    assert back.rdd.getNumPartitions() == 7
    types = {f.name: f.dataType for f in back.schema.fields}
    assert types["id"] == T.LongType() and types["message"] == T.StringType()
    assert types["amount"] == T.DecimalType(10, 2) and types["seen"] == T.TimestampType()
    got = back.select("id", "message", "amount", "seen").orderBy("id").collect()
    want = df.orderBy("id").collect()
    assert len(got) == N
    assert [tuple(r) for r in got] == [tuple(r) for r in want]
    assert got[123].amount == Decimal("1.23")


def test_a_state_filter_reads_only_the_rows_in_that_state(spark, sql, db_dsn):
    make_table(sql, "states")
    now = time.time_ns()
    later = now + 3600 * 10**9
    sql.execute(
        "insert into states(id, time_next, epoch, time_acked, message) values "
        f"(1, 0, 0, null, 'due'), (2, {later}, 0, null, 'scheduled'), "
        f"(3, {later}, 2, null, 'in flight'), (4, null, 1, {now}, 'acked'), "
        "(5, null, 0, null, 'due, no time'), "
        f"(6, {DEAD_TIME_NEXT}, 3, null, 'dead after 3 sends'), "
        f"(7, {DEAD_TIME_NEXT}, 0, null, 'rejected before its postpone was written'), "
        f"(8, {DEAD_TIME_NEXT}, 3, {now}, 'dead, then acked: settled')"
    )

    def ids(state: str) -> list[int]:
        df = spark.read.format("msgtable").option("dsn", db_dsn).option("state", state)
        return sorted(r.id for r in df.load("states").collect())

    assert ids("all") == [1, 2, 3, 4, 5, 6, 7, 8]
    assert ids("due") == [1, 5]
    assert ids("scheduled") == [2]  # not 7: dead, though never sent as far as epoch says
    assert ids("in_flight") == [3]  # not 6: its time_next is never reached
    assert ids("dead") == [6, 7]
    assert ids("unacked") == [1, 2, 3, 5, 6, 7]  # dead ones included
    assert ids("acked") == [4, 8]
    with pytest.raises(Exception, match="state must be one of"):
        spark.read.format("msgtable").option("dsn", db_dsn).option("state", "odd").load("states")


def test_duplicate_ids_fail_their_partition_whole_or_are_skipped_and_counted(spark, sql, db_dsn):
    make_table(sql, "dups")
    sql.execute("insert into dups(id, message) values (5, 'already here')")
    df = spark.range(10).selectExpr("id", "'new' as message").coalesce(1)
    with pytest.raises(PySparkException, match=r"Duplicate entry '5'.*nothing of this partition"):
        df.write.format("msgtable").option("dsn", db_dsn).mode("append").save("dups")
    assert sql.scalar("select count(*) from dups") == 1  # all or nothing: nothing

    writer = df.write.format("msgtable").option("dsn", db_dsn).option("onDuplicate", "skip")
    writer.mode("append").save("dups")
    assert sql.scalar("select count(*) from dups") == 10
    assert sql.scalar("select message from dups where id = 5") == "already here"


def test_bad_writes_say_what_is_wrong(spark, sql, db_dsn):
    make_table(sql, "picky")
    no_id = spark.range(3).selectExpr("'x' as message")
    with pytest.raises(Exception, match="needs the id column"):
        no_id.write.format("msgtable").option("dsn", db_dsn).mode("append").save("picky")
    odd = spark.range(3).selectExpr("id", "'x' as colour")
    with pytest.raises(Exception, match="no column 'colour'"):
        odd.write.format("msgtable").option("dsn", db_dsn).mode("append").save("picky")
    with pytest.raises(Exception, match="only appends"):
        spark.range(3).write.format("msgtable").option("dsn", db_dsn).mode("overwrite").save(
            "picky"
        )
    with pytest.raises(Exception, match="no message table 'nope'"):
        spark.read.format("msgtable").option("dsn", db_dsn).load("nope").schema  # noqa: B018


def test_a_text_id_table_is_read_in_hash_buckets(spark, sql, db_dsn):
    sql.execute(
        current_layout_ddl("texty", comment()).replace(
            "id bigint not null", "id varchar(40) not null"
        )
    )
    sql.execute(
        "insert into texty(id, message) values " + ",".join(f"('k{i}', 'm{i}')" for i in range(500))
    )
    df = spark.read.format("msgtable").option("dsn", db_dsn).option("partitions", 3).load("texty")
    assert df.rdd.getNumPartitions() == 3
    assert sorted(r.id for r in df.collect()) == sorted(f"k{i}" for i in range(500))


def test_enqueue_takes_the_jdbc_path_and_fills_the_engine_columns(spark, sql, db_dsn):
    from msgtable.spark.jdbc import enqueue

    make_table(sql, "fast")
    df = spark.range(N).selectExpr("id", "concat('m', id) as message", "id % 3 as priority")
    began = time.time_ns()
    assert enqueue(df, db_dsn, "fast", partitions=4) == "jdbc"
    assert sql.scalar("select count(*) from fast") == N
    assert sql.rows("select min(epoch), max(epoch), max(priority) from fast") == [(0, 0, 2)]
    assert sql.scalar("select count(*) from fast where time_next < :t", {"t": began - 10**9}) == 0
    back = spark.read.format("msgtable").option("dsn", db_dsn).load("fast")
    assert (
        back.select("id", "message").orderBy("id").collect()
        == df.select("id", "message").orderBy("id").collect()
    )
    # skipping duplicates needs the msgtable writer (Spark's JDBC writer has no upsert)
    again = spark.range(N - 5, N + 5).selectExpr("id", "'again' as message")
    assert enqueue(again, db_dsn, "fast", on_duplicate="skip") == "msgtable"
    assert sql.scalar("select count(*) from fast") == N + 5
