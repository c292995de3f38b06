"""Metrics end to end (README: Metrics): a real server, known traffic over gRPC and by DML,
/metrics scraped over a real socket."""

from __future__ import annotations

import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from msgtable.errors import MsgtableError
from msgtable.metrics import MetricsServer

from ..waiting import wait_until
from .helpers import Collector, Served, serve


@pytest.fixture
def followed(db_dsn: str):
    with serve(db_dsn, follow_binlog=True) as s:
        assert s.engine.binlog is not None
        wait_until(s.engine.binlog.following.is_set, what="the binlog follower to start")
        yield s


@pytest.fixture
def metrics(followed: Served):
    m = MetricsServer(followed.engine, "127.0.0.1:0", followed.server.servicer.streams)
    m.open()
    yield m
    m.close()


def scrape(m: MetricsServer) -> dict[tuple[str, ...], float]:
    """Every sample by (sample name, table, subscription); a statement kind's count and sum
    also by (sample name, kind)."""
    with urllib.request.urlopen(f"http://{m.address}/metrics", timeout=10) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = answer.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, s.labels.get("table", ""), s.labels.get("subscription", ""))] = s.value
            if "kind" in s.labels and not s.name.endswith("_bucket"):
                out[(s.name, s.labels["kind"])] = s.value
    return out


def test_counters_after_known_traffic_are_exact_over_http(followed: Served, metrics):
    followed.create_table("jobs", vt_poller_interval=30, vt_ack_wait=30)
    rows = ",".join(f"({i}, 'm')" for i in range(6))
    followed.sql(f"insert into jobs(id, message) values {rows}")
    began = time.monotonic()
    c = Collector(followed.client, "jobs")
    try:
        got = {m.id: m for m in c.take(6)}
        assert followed.client.ack("jobs", [0, 1, 2]) == 3
        assert got[3].reject("poison") == 1
        followed.sql(  # an ack by DML, in the application's own statement
            "update jobs set time_acked = :t, time_next = null where id = 4", t=time.time_ns()
        )
        assert got[5].release() == 1
        (again,) = c.take(1, timeout_s=5)
        assert again.id == 5 and again.ack() == 1
        wait_until(
            lambda: scrape(metrics)[("msgtable_messages_acked_total", "jobs", "")] == 5,
            what="the DML ack counted by the binlog follower",
        )
        f = scrape(metrics)  # the stream still open
        took_s = time.monotonic() - began
    finally:
        c.close()
    assert f[("msgtable_messages_sent_total", "jobs", "")] == 7
    assert f[("msgtable_messages_redelivered_total", "jobs", "")] == 1
    assert f[("msgtable_messages_released_total", "jobs", "")] == 1
    assert f[("msgtable_messages_rejected_total", "jobs", "")] == 1
    assert f[("msgtable_messages_dead_lettered_total", "jobs", "")] == 1
    assert f[("msgtable_messages_renewed_total", "jobs", "")] == 0
    assert f[("msgtable_messages_in_flight", "jobs", "")] == 0
    assert f[("msgtable_subscribers", "jobs", "")] == 1
    assert f[("msgtable_lease_holder", "", "")] == 1
    assert f[("msgtable_streams", "", "")] == 1
    assert f[("msgtable_binlog_following", "", "")] == 1
    assert f[("msgtable_database_up", "", "")] == 1
    assert f[("msgtable_binlog_row_events_total", "", "")] >= 2  # the insert, the DML ack
    # statements by kind: every poll, claim and ack took some time, none as long as the test
    for kind in ("poll", "ack"):
        n = f[("msgtable_database_statement_duration_seconds_count", kind)]
        total = f[("msgtable_database_statement_duration_seconds_sum", kind)]
        assert n >= 1 and 0 < total < took_s, (kind, n, total)
    wait_until(
        lambda: scrape(metrics)[("msgtable_streams", "", "")] == 0, what="the stream's end counted"
    )
    # send -> ack, of the 5 acks seen while in flight (the reject is no ack): bounded by
    # the test's own duration
    assert f[("msgtable_message_ack_latency_seconds_count", "jobs", "")] == 5
    assert 0 < f[("msgtable_message_ack_latency_seconds_sum", "jobs", "")] < 5 * took_s


def test_a_closed_metrics_server_frees_its_port(followed: Served):
    m = MetricsServer(followed.engine, "127.0.0.1:0")
    m.open()
    address = m.address
    m.close()
    again = MetricsServer(followed.engine, address)
    again.open()  # the port is free again
    again.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{address}/metrics", timeout=2)


def test_a_failed_statement_counts_as_a_database_error(followed: Served, metrics):
    store = followed.engine.store
    before = scrape(metrics)[("msgtable_database_errors_total", "", "")]
    with pytest.raises(MsgtableError), store._errors(), store._auto_cursor() as cur:
        cur.execute("select * from no_such_table")
    assert scrape(metrics)[("msgtable_database_errors_total", "", "")] == before + 1


def test_a_subscription_has_its_own_labels_and_counts(followed: Served, metrics):
    followed.create_table("jobs", vt_poller_interval=30)
    followed.client.create_subscription("jobs", "billing")
    followed.sql("insert into jobs(id, message) values (1, 'a'), (2, 'b'), (3, 'c')")
    billing = Collector(followed.client, "jobs", subscription="billing")
    default = Collector(followed.client, "jobs")
    try:
        billing.subscription.ack(billing.take(3))
        default.subscription.ack(default.take(1, timeout_s=10))
        wait_until(
            lambda: scrape(metrics).get(("msgtable_messages_acked_total", "jobs", "")) == 1,
            what="the default group's ack counted",
        )
        f = scrape(metrics)
    finally:
        billing.close()
        default.close()
    assert f[("msgtable_messages_sent_total", "jobs", "billing")] == 3
    assert f[("msgtable_messages_acked_total", "jobs", "billing")] == 3
    assert f[("msgtable_messages_acked_total", "jobs", "")] == 1
    assert f[("msgtable_subscribers", "jobs", "billing")] == 1


def test_enqueued_counts_the_rows_other_clients_inserted(followed: Served, metrics):
    followed.create_table("jobs", vt_poller_interval=30, vt_ack_wait=30)
    wait_until(lambda: "jobs" in followed.engine.binlog_tables(), what="the table loaded")
    followed.sql("insert into jobs(id, message) values (1, 'a'), (2, 'b'), (3, 'c')")
    followed.sql("insert into jobs(id, message) values (4, 'd')")
    with followed.transaction() as conn:  # two statements in one transaction
        conn.exec_driver_sql("insert into jobs(id, message) values (5, 'e'), (6, 'f')")
        conn.exec_driver_sql("insert into jobs(id, message) values (7, 'g')")
    key = ("msgtable_messages_enqueued_total", "jobs", "")
    wait_until(lambda: scrape(metrics).get(key) == 7, what="7 rows counted as enqueued")
    c = Collector(followed.client, "jobs")
    try:
        assert followed.client.ack("jobs", [m.id for m in c.take(7)]) == 7
    finally:
        c.close()
    wait_until(
        lambda: scrape(metrics)[("msgtable_messages_acked_total", "jobs", "")] == 7, what="acks"
    )
    f = scrape(metrics)
    assert f[key] == 7, "msgtable's own writes (the sends' postpones, the acks) are no enqueue"
