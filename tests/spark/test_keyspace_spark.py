"""The msgtable data source on a keyspace of shards (``.option("keyspace", FILE)``), on a real
local Spark session and real databases: each shard is a database of its own on the test
server. A write puts each row in the shard its id hashes to and nowhere else; a read takes
every row of every shard once, in any state or subscription; a table missing or different on
a shard, an unreachable shard and an id with no shard fail in one line naming the cause."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import types as T

from msgtable.core import keyspace
from msgtable.core.keyspace import Keyspace
from msgtable.core.tables import DEAD_TIME_NEXT, current_layout_ddl
from msgtable.errors import (
    InvalidArgument,
    MsgtableError,
    TableLoadError,
    TableNotFound,
    Unavailable,
)
from msgtable.spark.errors import spark_error
from msgtable.spark.source import DuplicateMessage, Enqueued, MsgtableDataSource
from msgtable.testing.devdb import free_port

from ..conftest import Sql
from ..integration.helpers import comment, serve
from ..waiting import wait_until

RANGES = {2: ("-80", "80-"), 4: ("-40", "40-80", "80-c0", "c0-")}
N = 2_000


@dataclass
class Shards:
    """A keyspace of databases on the test server: its file, and a connection to each shard
    in key-range order."""

    path: Path
    keyspace: Keyspace
    sql: list[Sql]

    def create_table(self, name: str = "t", extra: str = "", only: int | None = None) -> None:
        ddl = current_layout_ddl(name, comment())
        if extra:
            ddl = ddl.replace("  primary key(id)", f"  {extra},\n  primary key(id)")
        for k, sql in enumerate(self.sql):
            if only is None or k == only:
                sql.execute(ddl)

    def where(self, ids: list[int]) -> list[set[int]]:
        """The ids each shard should hold, as the keyspace places them."""
        want: list[set[int]] = [set() for _ in self.sql]
        index = {s.name: k for k, s in enumerate(self.keyspace.shards)}
        for i, shard in zip(ids, self.keyspace.shards_of(ids), strict=True):
            want[index[shard.name]].add(i)
        return want

    def ids(self, table: str = "t") -> list[set[int]]:
        return [{int(r[0]) for r in sql.rows(f"select id from {table}")} for sql in self.sql]


@pytest.fixture
def make_shards(mysql_server: Any, db_name: str, tmp_path: Path) -> Iterator[Callable[..., Shards]]:
    """Make a keyspace of n shards: n databases (dropped afterwards) and its file; ``dsns``
    replaces a shard's DSN in the file (by shard index)."""
    made: list[str] = []
    opened: list[Sql] = []

    def make(n: int = 2, dsns: dict[int, str] | None = None) -> Shards:
        lines = ['name = "app"']
        sqls = []
        for k, key_range in enumerate(RANGES[n]):
            database = f"{db_name}_s{k}"
            mysql_server.drop_database(database)
            mysql_server.create_database(database)
            made.append(database)
            dsn = mysql_server.dsn(database)
            sqls.append(Sql(dsn))
            dsn = (dsns or {}).get(k, dsn)
            lines += ["", "[[shards]]", f'key_range = "{key_range}"', f"dsn = {json.dumps(dsn)}"]
        opened.extend(sqls)
        path = tmp_path / f"keyspace-{n}.toml"
        path.write_text("\n".join(lines) + "\n")
        return Shards(path, keyspace.load(path), sqls)

    yield make
    for sql in opened:
        sql.close()
    for database in made:
        mysql_server.drop_database(database)


def read(spark: Any, path: Path, table: str = "t", **options: str) -> Any:
    reader = spark.read.format("msgtable").option("keyspace", str(path))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(table)


def write(df: Any, path: Path, table: str = "t", **options: str) -> None:
    writer = df.write.format("msgtable").option("keyspace", str(path))
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.mode("append").save(table)


def failure(action: Callable[[], Any]) -> BaseException:
    """What ``action`` raised, as the one-line msgtable error it means."""
    try:
        action()
    except Exception as exc:
        meant = spark_error(exc)
        assert isinstance(meant, MsgtableError), repr(exc)
        assert "\n" not in str(meant)
        return meant
    raise AssertionError("it did not fail")


def ids_of(df: Any) -> list[int]:
    return sorted(r.id for r in df.select("id").collect())


# -- writes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 4])
def test_a_bulk_write_puts_each_row_in_the_shard_its_id_hashes_to(spark, make_shards, n):
    shards = make_shards(n)
    shards.create_table()
    ids = [k * 1_000_003 + 7 for k in range(N - 1)] + [2**63 - 1]
    df = spark.createDataFrame([(i, f"m{i}") for i in ids], "id long, message string")
    began = time.time_ns()
    write(df.repartition(3), shards.path)

    want = shards.where(ids)
    assert all(len(w) > N // (4 * n) for w in want)  # every shard gets its share
    assert shards.ids() == want  # each row in its shard, and in no other
    for sql in shards.sql:  # a new message's engine columns, the row's own message
        assert sql.scalar("select count(*) from t where message <> concat('m', id)") == 0
        assert sql.rows("select max(epoch), max(priority), max(time_acked) from t") == [
            (0, 0, None)
        ]
        assert sql.scalar("select min(time_next) from t") >= began - 10**9

    back = read(spark, shards.path).select("id", "message").collect()
    assert sorted((r.id, r.message) for r in back) == sorted((i, f"m{i}") for i in ids)


def test_a_write_counts_each_shard_s_rows_and_skips_duplicates_per_shard(make_shards, caplog):
    """One partition's write, run as an executor runs it (no Spark: the writer's own code),
    then the driver's log line."""
    shards = make_shards(2)
    shards.create_table()
    ids = list(range(1, 201))
    want = shards.where(ids)
    taken = min(want[1])  # already in its shard: a duplicate there, not in the other
    shards.sql[1].execute(f"insert into t(id, message) values ({taken}, 'already here')")
    source = MsgtableDataSource({"keyspace": str(shards.path), "path": "t"})
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("message", T.StringType())]
    )

    writer = source.writer(schema, overwrite=False)
    with pytest.raises(DuplicateMessage) as info:
        writer.write(iter([(i, "new") for i in ids]))
    assert str(info.value).startswith(
        f"shard 80- of keyspace 'app': partition 0: Duplicate entry '{taken}'"
    )
    assert "nothing of this partition was enqueued" in str(info.value)
    assert shards.ids() == [set(), {taken}]  # neither shard: each rolled back

    skipping = MsgtableDataSource(
        {"keyspace": str(shards.path), "path": "t", "onDuplicate": "skip", "batchRows": "7"}
    ).writer(schema, overwrite=False)
    done = skipping.write(iter([(i, "new") for i in ids]))
    s0, s1 = len(want[0]), len(want[1])
    assert done == Enqueued(0, 199, 1, (("-80", s0, 0), ("80-", s1 - 1, 1)))
    assert shards.ids() == want
    assert shards.sql[1].scalar(f"select message from t where id = {taken}") == "already here"

    with caplog.at_level(logging.WARNING, logger="msgtable.spark"):
        skipping.commit([done, Enqueued(1, 3, 0, (("80-", 3, 0),))])
    assert caplog.messages[-1] == (
        "msgtable: enqueued 202 messages into t in 2 partitions (1 duplicate ids skipped); "
        f"by shard of keyspace 'app': -80 {s0} (0 skipped), 80- {s1 - 1 + 3} (1 skipped)"
    )
    with caplog.at_level(logging.WARNING, logger="msgtable.spark"):
        skipping.abort([done, None])
    assert caplog.messages[-1].startswith(
        "msgtable: the enqueue into t failed; 1 partitions (0) committed 199 messages before "
        f"it did (by shard of keyspace 'app': -80 {s0} (0 skipped), 80- {s1 - 1} (1 skipped)), "
        "every other partition none (a failed one's error names any shard that committed it)"
    )


def test_a_duplicate_fails_the_partition_in_every_shard_or_is_skipped(spark, make_shards):
    shards = make_shards(2)
    shards.create_table()
    ids = list(range(100))
    want = shards.where(ids)
    taken = max(want[0])
    shards.sql[0].execute(f"insert into t(id, message) values ({taken}, 'already here')")
    df = spark.createDataFrame([(i, "new") for i in ids], "id long, message string").coalesce(1)

    error = failure(lambda: write(df, shards.path))
    assert isinstance(error, DuplicateMessage)
    assert str(error).startswith("shard -80 of keyspace 'app': partition 0: Duplicate entry")
    assert shards.ids() == [{taken}, set()]  # the other shard's rows were not committed either

    write(df, shards.path, onDuplicate="skip")
    assert shards.ids() == want
    assert shards.sql[0].scalar(f"select message from t where id = {taken}") == "already here"


@pytest.mark.parametrize(
    ("kind", "bad", "text"),
    [
        ("long", "-1", "id -1 has no shard"),
        ("long", "null", "id None has no shard"),
        ("decimal(20,1)", "2.5", "id Decimal('2.5') has no shard"),
        ("string", "'x7'", "id '0' has no shard"),  # a text id, even of digits
    ],
)
def test_an_id_that_is_not_an_integer_of_64_bits_fails_its_partition(
    spark, make_shards, kind, bad, text
):
    shards = make_shards(2)
    shards.create_table()
    good = spark.range(50).selectExpr(f"cast(id as {kind}) as id", "'ok' as message")
    df = good.union(spark.range(1).selectExpr(f"cast({bad} as {kind}) as id", "'bad'"))
    # small batches: rows before the bad one are inserted, and rolled back
    error = failure(lambda: write(df.coalesce(1), shards.path, batchRows="10"))
    assert isinstance(error, InvalidArgument)
    assert str(error).startswith(f"partition 0: {text}: a keyspace's ids are integers")
    assert str(error).endswith("nothing of this partition was enqueued")
    assert shards.ids() == [set(), set()]


# -- reads -----------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 4])
def test_a_read_returns_every_row_of_every_shard_once(spark, make_shards, n):
    shards = make_shards(n)
    shards.create_table()
    want = []
    for k, sql in enumerate(shards.sql):  # shards of different sizes, ids far apart
        rows = [(k * 10**6 + i, f"s{k}-{i}") for i in range(100 + 37 * k)]
        sql.execute(
            "insert into t(id, message) values " + ",".join(f"({i}, '{m}')" for i, m in rows)
        )
        want += rows
    df = read(spark, shards.path, partitions="3")
    assert df.rdd.getNumPartitions() == 3 * n  # each shard's own partitions
    got = [(r.id, r.message) for r in df.select("id", "message").collect()]
    assert len(got) == len(want)  # none twice
    assert sorted(got) == sorted(want)


def test_a_text_id_table_is_read_in_hash_buckets_of_each_shard(spark, make_shards):
    shards = make_shards(2)
    for k, sql in enumerate(shards.sql):
        sql.execute(current_layout_ddl("texty", comment()).replace("id bigint", "id varchar(40)"))
        sql.execute(
            "insert into texty(id, message) values "
            + ",".join(f"('s{k}-{i}', 'm')" for i in range(60))
        )
    df = read(spark, shards.path, "texty", partitions="3")
    assert df.rdd.getNumPartitions() == 6
    assert sorted(r.id for r in df.collect()) == sorted(
        f"s{k}-{i}" for k in range(2) for i in range(60)
    )


def test_a_state_filter_reads_the_rows_in_that_state_in_every_shard(spark, make_shards):
    shards = make_shards(2)
    shards.create_table()
    now = time.time_ns()
    later = now + 3600 * 10**9
    shards.sql[0].execute(
        "insert into t(id, time_next, epoch, time_acked, message) values "
        f"(1, 0, 0, null, 'due'), (2, null, 1, {now}, 'acked'), "
        f"(3, {DEAD_TIME_NEXT}, 3, null, 'dead'), (4, {later}, 2, null, 'in flight')"
    )
    shards.sql[1].execute(
        "insert into t(id, time_next, epoch, time_acked, message) values "
        f"(11, 0, 0, null, 'due'), (12, null, 2, {now}, 'acked'), "
        f"(13, {later}, 0, null, 'scheduled'), (14, {DEAD_TIME_NEXT}, 1, null, 'dead')"
    )

    def state(name: str) -> list[int]:
        return ids_of(read(spark, shards.path, state=name, partitions="2"))

    assert state("all") == [1, 2, 3, 4, 11, 12, 13, 14]
    assert state("due") == [1, 11]
    assert state("acked") == [2, 12]
    assert state("dead") == [3, 14]
    assert state("scheduled") == [13]
    assert state("in_flight") == [4]
    assert state("unacked") == [1, 3, 4, 11, 13, 14]


def test_a_read_of_a_subscription_takes_its_view_in_every_shard(spark, make_shards):
    shards = make_shards(2)
    for k, sql in enumerate(shards.sql):
        with serve(sql.dsn) as s:
            s.create_table("t", vt_poller_interval=0.2)
            s.engine.refresh()
            s.client.create_subscription("t", "work" if k == 0 else "other")
            if k == 1:
                s.client.create_subscription("t", "work")
            s.sql(
                "insert into t(id, message) values "
                + ",".join(f"({k * 100 + i}, 'm')" for i in range(1, 6))
            )
            wait_until(
                lambda s=s: s.sql("select count(*) from t where time_fanout is null")[0][0] == 0,
                timeout_s=30,
                what=f"the fan-out of shard {k} to hand its rows to its subscriptions",
            )
    now = time.time_ns()
    shards.sql[0].execute(f"update t__work set time_acked = {now}, epoch = 1 where id = 2")
    shards.sql[1].execute(f"update t__work set time_acked = {now}, epoch = 1 where id = 104")
    shards.sql[1].execute(f"update t set time_acked = {now} where id = 105")  # default group

    every = [1, 2, 3, 4, 5, 101, 102, 103, 104, 105]
    assert ids_of(read(spark, shards.path, subscription="work")) == every
    assert ids_of(read(spark, shards.path, subscription="work", state="acked")) == [2, 104]
    assert ids_of(read(spark, shards.path, state="acked")) == [105]  # the table's own

    error = failure(lambda: read(spark, shards.path, subscription="other").schema)
    assert isinstance(error, TableNotFound)
    assert str(error).startswith(
        "shard -80 of keyspace 'app': message table t has no subscription 'other'"
    )


# -- errors ----------------------------------------------------------------------------------
def test_dsn_and_keyspace_are_one_or_the_other(spark, make_shards, db_dsn):
    shards = make_shards(2)
    shards.create_table()
    both = spark.read.format("msgtable").option("dsn", db_dsn).option("keyspace", str(shards.path))
    error = failure(lambda: both.load("t").schema)
    assert isinstance(error, InvalidArgument)
    assert str(error) == (
        "give the msgtable data source one of .option('dsn', URL) and "
        ".option('keyspace', FILE), not both"
    )
    df = spark.range(3).selectExpr("id", "'m' as message")
    writer = df.write.format("msgtable").option("dsn", db_dsn).option("keyspace", str(shards.path))
    error = failure(lambda: writer.mode("append").save("t"))
    assert "not both" in str(error)
    assert shards.ids() == [set(), set()]

    error = failure(lambda: spark.read.format("msgtable").load("t").schema)
    assert isinstance(error, InvalidArgument)
    assert str(error) == (
        "the msgtable data source needs .option('dsn', URL) (or MSGTABLE_DSN) or "
        ".option('keyspace', FILE)"
    )


def test_a_table_missing_or_different_on_a_shard_fails_naming_the_shard(spark, make_shards):
    shards = make_shards(4)
    shards.create_table(only=0)
    shards.create_table(only=1)
    shards.create_table(only=3)
    error = failure(lambda: read(spark, shards.path).schema)
    assert isinstance(error, TableNotFound)
    assert str(error).startswith("shard 80-c0 of keyspace 'app': no message table 't' in ")

    df = spark.range(20).selectExpr("id", "'m' as message")
    error = failure(lambda: write(df, shards.path))
    assert str(error).startswith("shard 80-c0 of keyspace 'app': no message table 't'")
    for k in (0, 1, 3):  # nothing written to the shards that have it
        assert shards.sql[k].scalar("select count(*) from t") == 0

    shards.create_table(extra="colour varchar(10)", only=2)
    error = failure(lambda: read(spark, shards.path).schema)
    assert isinstance(error, TableLoadError)
    assert str(error) == (
        "shard 80-c0 of keyspace 'app': message table 't' is not as on shard -40: it has "
        "column colour too"
    )


def test_an_unreachable_shard_fails_naming_the_shard(spark, make_shards, mysql_server):
    import sqlalchemy

    gone = sqlalchemy.make_url(mysql_server.dsn("nowhere")).set(port=free_port())
    shards = make_shards(2, {1: gone.render_as_string(hide_password=False)})
    shards.create_table()
    error = failure(lambda: read(spark, shards.path).schema)
    assert isinstance(error, Unavailable)
    assert str(error).startswith("shard 80- of keyspace 'app': database unavailable: (2003)")

    df = spark.range(20).selectExpr("id", "'m' as message")
    error = failure(lambda: write(df, shards.path))
    assert str(error).startswith("shard 80- of keyspace 'app': database unavailable")
    assert shards.ids()[0] == set()


def test_an_ordered_table_s_keys_each_live_in_one_shard(spark, make_shards):
    shards = make_shards(2)
    shards.create_table(extra="k varchar(64), index order_idx (k, time_acked, id)")
    for sql in shards.sql:  # an ordered table: vt_order_key=k
        sql.execute(f"alter table t comment '{comment(vt_order_key='k')}'")
    ks = shards.keyspace
    rows, at = [], 1
    for n in range(30):
        key = f"customer-{n % 6}"
        i = ks.id_for(key, at)
        at = i + 1
        rows.append((i, f"m{n}", key))
    df = spark.createDataFrame(rows, "id long, message string, k string")
    write(df.coalesce(2), shards.path)
    index = {s.name: k for k, s in enumerate(ks.shards)}
    for key in {r[2] for r in rows}:
        home = shards.sql[index[ks.shard_of_key(key).name]]
        got = sorted(int(r[0]) for r in home.rows(f"select id from t where k = '{key}'"))
        assert got == sorted(r[0] for r in rows if r[2] == key)  # the whole key there
    key = "customer-0"
    wrong = next(i for i in range(10**6, 10**6 + 100) if ks.shard_of(i) != ks.shard_of_key(key))
    bad = spark.createDataFrame([(wrong, "x", key)], "id long, message string, k string")
    error = failure(lambda: write(bad.coalesce(1), shards.path))
    assert isinstance(error, InvalidArgument)
    assert f"id {wrong} lives in shard {ks.shard_of(wrong).name} and its key" in str(error)
    assert str(error).endswith("nothing of this partition was enqueued")
