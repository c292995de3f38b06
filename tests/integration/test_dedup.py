"""Idempotent enqueue (vt_dedup) on a real server: the database refuses a duplicate key within
the window to any client, msgtable.enqueue leaves it out and says so, concurrent producers of
the same keys make each message once, and after the window the key may be used again."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from msgtable.cli.output import format_tables
from msgtable.enqueue import enqueue, enqueue_many
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.proto.msgtable.v1 import messaging_pb2_grpc as pb_grpc

from ..waiting import wait_until
from .helpers import Served, serve

SCHEMA = Path(__file__).parents[2] / "schema" / "dedup.sql"
KEY_COLUMNS = (
    "dedup_key varchar(128),\n  unique index dedup_idx(dedup_key),\n"
    "  index dedup_created_idx(time_created, dedup_key)"
)
DEADLOCK = 1213  # InnoDB: producers of the same keys in other orders; the transaction retries


@pytest.fixture
def served(db_dsn: str):
    with serve(db_dsn) as s:
        yield s


def _keyed(served: Served, **fields) -> None:
    fields.setdefault("vt_dedup", "dedup_key")
    served.create_table("jobs", KEY_COLUMNS, **fields)


def test_the_schema_file_loads_and_the_database_refuses_a_duplicate_to_plain_sql(served: Served):
    served.sql(SCHEMA.read_text())
    wait_until(lambda: "order_jobs" in {t.name for t in served.client.list_tables()})
    (t,) = [t for t in served.client.list_tables() if t.name == "order_jobs"]
    assert t.load_error == ""
    served.sql("insert into order_jobs(id, dedup_key, message) values (1, 'k1', 'first')")
    with pytest.raises(sa.exc.IntegrityError, match="1062"):
        served.sql("insert into order_jobs(id, dedup_key, message) values (2, 'k1', 'again')")
    served.sql("insert ignore into order_jobs(id, dedup_key, message) values (3, 'k1', 'x')")
    served.sql(
        "insert into order_jobs(id, dedup_key, message) values (4, 'k1', 'x') "
        "on duplicate key update id = id"
    )
    served.sql("insert into order_jobs(id, dedup_key, message) values (5, NULL, 'no key')")
    served.sql("insert into order_jobs(id, dedup_key, message) values (6, NULL, 'no key')")
    assert [r[0] for r in served.sql("select id from order_jobs order by id")] == [1, 5, 6]


def test_the_schema_files_keys_are_exact_strings_not_their_collation(served: Served):
    """Keys that differ only in case, accents or a trailing blank are different keys (an SQS
    MessageDeduplicationId is case-sensitive): a case-insensitive collation would refuse the
    second as a duplicate and its message would be lost."""
    served.sql(SCHEMA.read_text())
    keys = ["Order-A", "order-a", "ORDER-A", "\u00f3rder-a", "order-a "]
    with served.transaction() as conn:
        went_in = enqueue_many(
            conn, "order_jobs", [{"id": i, "dedup_key": k} for i, k in enumerate(keys, 1)]
        )
    assert went_in == len(keys), served.sql("select id, dedup_key from order_jobs order by id")
    with served.transaction() as conn:
        assert enqueue(conn, "order_jobs", {"id": 9, "dedup_key": "order-a"}) == 0


def test_list_tables_says_each_tables_dedup_column_and_window(served: Served):
    _keyed(served, vt_dedup_window=42.5)
    served.create_table("plain")
    # a generated stub over a real socket: what any gRPC client reads
    with grpc.insecure_channel(served.server.address) as channel:
        stub = pb_grpc.MessagingStub(channel)

        def configs() -> dict[str, pb.TableConfig]:
            got = stub.ListTables(pb.ListTablesRequest(), timeout=10)
            return {t.name: t.config for t in got.tables if not t.subscription}

        by_name = wait_until(
            lambda: (c := configs()).keys() >= {"jobs", "plain"} and c,
            what="ListTables lists jobs and plain",
        )
    assert (by_name["jobs"].dedup, by_name["jobs"].dedup_window_s) == ("dedup_key", 42.5)
    assert (by_name["plain"].dedup, by_name["plain"].dedup_window_s) == ("", 0.0)
    infos = {t.name: t for t in served.client.list_tables() if not t.subscription}
    jobs = infos["jobs"].config
    assert jobs is not None and (jobs.dedup, jobs.dedup_window_s) == ("dedup_key", 42.5)
    text = format_tables(list(infos.values()))
    assert "deduplicated by (vt_dedup):\n  jobs: key dedup_key, window 42.5s" in text, text
    assert "plain:" not in text.partition("deduplicated by")[2], text


def test_a_table_without_its_indexes_is_a_load_error_naming_the_ddl(served: Served):
    served.create_table("jobs", "dedup_key varchar(64)", vt_dedup="dedup_key")
    (t,) = wait_until(lambda: [t for t in served.client.list_tables() if t.name == "jobs"])
    assert t.load_error.endswith(
        "ALTER TABLE jobs ADD UNIQUE INDEX dedup_idx (dedup_key), "
        "ADD INDEX dedup_created_idx (time_created, dedup_key)"
    )


def test_enqueue_leaves_a_duplicate_out_and_says_how_many_went_in(served: Served):
    _keyed(served)
    with served.transaction() as conn:
        assert enqueue(conn, "jobs", {"id": 1, "dedup_key": "a", "message": "m"}) == 1
        assert enqueue(conn, "jobs", {"id": 2, "dedup_key": "a", "message": "m"}) == 0
        rows = [{"id": 10 + i, "dedup_key": k, "message": "m"} for i, k in enumerate("abcbd")]
        assert enqueue_many(conn, "jobs", rows) == 3  # b, c, d: a is held, b is twice
        assert enqueue(conn, "jobs", {"id": 30, "message": "no key"}) == 1
    with pytest.raises(sa.exc.IntegrityError), served.transaction() as conn:
        enqueue(conn, "jobs", {"id": 1, "dedup_key": "new", "message": "m"})  # a taken id
    got = served.sql("select id, dedup_key from jobs order by id")
    assert [tuple(r) for r in got] == [(1, "a"), (11, "b"), (12, "c"), (14, "d"), (30, None)]


def test_eight_producers_of_the_same_ten_thousand_keys_make_ten_thousand_messages(
    served: Served,
):
    _keyed(served)
    keys = [f"key-{i}" for i in range(10_000)]
    made: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def produce(p: int) -> None:
        mine = list(keys)
        random.Random(p).shuffle(mine)
        n = 0
        try:
            for start in range(0, len(mine), 200):
                batch = [
                    {"id": p * 100_000 + start + i, "dedup_key": k, "message": f"p{p}"}
                    for i, k in enumerate(mine[start : start + 200])
                ]
                n += _with_retry(served.db, batch)
        except BaseException as exc:
            errors.append(exc)
        with lock:
            made.append(n)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors
    assert sum(made) == 10_000  # what the producers were told went in
    counted = served.sql("select count(*), count(distinct dedup_key) from jobs")
    assert [tuple(r) for r in counted] == [(10_000, 10_000)]


def _with_retry(db: sa.Engine, batch: list[dict[str, object]]) -> int:
    while True:
        try:
            with db.connect() as conn, conn.begin():
                return enqueue_many(conn, "jobs", batch)
        except sa.exc.OperationalError as exc:
            if getattr(exc.orig, "args", (0,))[0] != DEADLOCK:
                raise


def test_after_the_window_the_key_may_be_used_again_and_the_acked_row_is_purged(db_dsn: str):
    with serve(db_dsn) as served:
        _keyed(served, vt_dedup_window=1, vt_purge_after=0, vt_poller_interval=0.1)
        wait_until(lambda: "jobs" in {t.name for t in served.client.list_tables()})
        with served.transaction() as conn:
            assert enqueue(conn, "jobs", {"id": 1, "dedup_key": "k", "message": "m"}) == 1
        served.sql("update jobs set time_acked = 1 where id = 1")
        with served.transaction() as conn:
            assert enqueue(conn, "jobs", {"id": 2, "dedup_key": "k", "message": "m"}) == 0

        def again() -> bool:
            with served.transaction() as conn:
                return enqueue(conn, "jobs", {"id": 3, "dedup_key": "k", "message": "m"}) == 1

        wait_until(again, timeout_s=10, what="the key free again after its window")
        wait_until(
            lambda: [r[0] for r in served.sql("select id from jobs")] == [3],
            timeout_s=10,
            what="the acked row purged once its key was cleared",
        )
