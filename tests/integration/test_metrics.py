"""Metrics end to end (README: Metrics): a real server, known traffic over gRPC and by DML,
/metrics scraped over a real socket."""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from msgtable.errors import MsgtableError
from msgtable.observe.metrics import MetricsServer

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
    out: dict[tuple[str, ...], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, s.labels.get("table", ""), s.labels.get("subscription", ""))
            if "via" in s.labels:  # summed over via, and by via too
                out[(*key, s.labels["via"])] = s.value
                out[key] = out.get(key, 0) + s.value
            else:
                out[key] = s.value
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
    assert f[("msgtable_messages_acked_total", "jobs", "", "grpc")] == 4
    assert f[("msgtable_messages_acked_total", "jobs", "", "dml")] == 1
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


def test_enqueued_counts_the_rows_other_clients_inserted_and_the_lag_returns_to_0(
    followed: Served, metrics
):
    began = time.monotonic()
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
    lag_key = ("msgtable_binlog_lag_seconds", "", "")
    assert 0 <= f[lag_key] <= time.monotonic() - began + 1  # whole seconds in the binlog
    wait_until(lambda: scrape(metrics)[lag_key] == 0, what="a heartbeat: the follower caught up")


@pytest.mark.parametrize("ordered", [False, True], ids=["plain", "ordered"])
def test_the_created_to_sent_histogram_counts_first_sends_bounded_by_their_age(
    followed: Served, metrics, ordered: bool
):
    fields: dict[str, Any] = dict(vt_poller_interval=0.2, vt_ack_wait=1)
    if ordered:  # its poll reads by key (msgtable.store.ordering): two keys, and no key
        extra = "k varchar(8), index order_idx(k, time_acked, id)"
        followed.create_table("jobs", extra, vt_order_key="k", **fields)
    else:
        followed.create_table("jobs", **fields)
    created = time.time_ns() - 3 * 10**9  # enqueued 3 s ago
    began = time.monotonic()
    keys = ["'a'", "'b'", "NULL", "'c'"]
    rows = ",".join(f"({i}, 'm', {created}{', ' + keys[i] if ordered else ''})" for i in range(4))
    k = ", k" if ordered else ""
    followed.sql(f"insert into jobs(id, message, time_created{k}) values {rows}")
    c = Collector(followed.client, "jobs")
    try:
        first = c.take(4)
        (again,) = c.take(1, timeout_s=10)  # not acked: sent again after its ack wait
        assert again.attempt == 2
        f = scrape(metrics)
        took_s = time.monotonic() - began
        followed.client.ack("jobs", [m.id for m in first])
    finally:
        c.close()
    name = "msgtable_message_delivery_delay_seconds"
    assert f[(name + "_count", "jobs", "")] == 4, "the 4 first sends, not the redelivery"
    assert 4 * 3 <= f[(name + "_sum", "jobs", "")] <= 4 * (3 + took_s)


def test_statements_of_every_part_are_timed_by_their_kind_none_as_other(db_dsn: str):
    """The lease's, subscriptions', ordering's, table events' and endpoints' statements go
    through the store's one timing path (msgtable_database_statement_duration_seconds)."""
    from msgtable.core.events import capture_table_ddl

    from .helpers import comment

    with serve(db_dsn, follow_binlog=True, lease_period_s=1.0, discovery_interval_s=0.3) as s:
        placement = s.engine._tenure.lease
        assert placement is not None
        wait_until(placement.servers, what="the placement's first step")
        s.create_table("orders", vt_poller_interval=0.2)
        s.client.create_subscription("orders", "billing")
        s.create_table("keyed", "k varchar(16), index key_idx(k, time_acked)", vt_order_key="k")
        s.sql(capture_table_ddl("`events`", comment(vt_capture="orders", vt_poller_interval=0.2)))
        s.engine.refresh()
        assert s.engine.capture is not None
        wait_until(s.engine.capture.following.is_set, what="the capture follower to start")
        s.sql("insert into orders(id, message) values (1, 'a')")
        s.sql("insert into keyed(id, message, k) values (1, 'a', 'x')")
        c = Collector(s.client, "keyed")
        try:
            c.subscription.ack(c.take(1))
        finally:
            c.close()
        m = MetricsServer(s.engine, "127.0.0.1:0")
        m.open()
        try:
            wanted = {
                "lease",
                "lease_prepare",
                "subscriptions",
                "subscription_create",
                "fanout",
                "order_keys",
                "capture_setup",
                "capture_write",
                "endpoints",
            }

            def kinds() -> set[str]:
                f = scrape(m)
                name = "msgtable_database_statement_duration_seconds_count"
                return {k[1] for k in f if len(k) == 2 and k[0] == name and f[k] > 0}

            wait_until(
                lambda: wanted <= kinds(), what=lambda: f"kinds {sorted(wanted - kinds())} timed"
            )
            assert "other" not in kinds()
        finally:
            m.close()


def test_enqueued_rows_of_every_column_type_are_counted_from_the_raw_event(
    followed: Served, metrics
):
    """The fast path steps over each row by its columns' stored sizes (msgtable.engine.binlogrows):
    exact for every type, NULLs included, without the library's parse."""
    columns = (
        "c_tiny tinyint, c_small smallint unsigned, c_med mediumint, c_int int, c_big bigint, "
        "c_float float, c_double double, c_dec decimal(20,7), c_dec2 decimal(5,0), "
        "c_date date, c_time time(3), c_dt datetime(6), c_ts timestamp(2) null, c_year year, "
        "c_char char(10), c_vchar varchar(300), c_bin binary(4), c_vbin varbinary(10), "
        "c_text text, c_blob mediumblob, c_json json, c_enum enum('a','b'), c_set set('x','y'), "
        "c_bit bit(11), c_utf varchar(100) character set utf8mb4"
    )
    followed.create_table("typed", columns, vt_poller_interval=30)
    wait_until(lambda: "typed" in followed.engine.binlog_tables(), what="the table loaded")
    binlog = followed.engine.binlog
    assert binlog is not None and binlog.count_rows
    fast_before = binlog.counted_fast
    full = (
        "1, 65000, -8000000, 7, 9000000000, 1.5, 2.25, -1234567890123.4567890, 99999, "
        "'2024-02-29', '12:34:56.789', '2024-02-29 12:34:56.123456', '2024-02-29 12:34:56.12', "
        "2024, 'ch', REPEAT('v', 300), 'ab', 'xyz', REPEAT('t', 60000), REPEAT('b', 5), "
        "'{\"k\": [1, 2]}', 'b', 'x,y', b'10101010101', 'é€😀'"
    )
    names = ", ".join(c.split()[0] for c in columns.split(", "))
    followed.sql(
        f"insert into typed(id, message, {names}) values (1, 'm', {full}), (2, null, {full}), "
        "(3, 'only an id and a message', " + ", ".join(["null"] * len(columns.split(", "))) + ")"
    )
    followed.sql("insert into typed(id) values (4), (5)")
    key = ("msgtable_messages_enqueued_total", "typed", "")
    wait_until(
        lambda: scrape(metrics).get(key) == 5, what=lambda: f"5 rows, {scrape(metrics).get(key)}"
    )
    # each INSERT is one event or more (the server splits large ones): all counted fast
    assert binlog.counted_fast - fast_before >= 2, "the INSERTs counted on the fast path"
