"""The backlog (README: Metrics, msgtable.store.backlog) against the real database: exact counts
and bounded ages of known rows, on the leader and on a server that does not hold the lease,
for a table and for a subscription, scraped over a real socket."""

from __future__ import annotations

import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from msgtable.core.tables import DEAD_TIME_NEXT
from msgtable.observe.metrics import MetricsServer
from msgtable.store.backlog import AGE_BOUNDS_S
from msgtable.store.mysqlstore import MySQLStore

from ..waiting import wait_until
from .helpers import Collector, Served, explain, serve

S = 10**9
LEASE = {"lease_period_s": 1.0, "discovery_interval_s": 0.3}


def scrape(address: str) -> dict[tuple[str, str, str], float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (s.name, s.labels.get("table", ""), s.labels.get("subscription", "")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def known_rows(s: Served) -> int:
    """jobs: 3 due (created 10 s ago), 2 scheduled an hour ahead (created 400 s ago), 1 acked
    and 1 dead in place (neither is backlog; created 2 days ago). Returns when (unix ns)."""
    s.create_table("jobs", vt_poller_interval=30)
    now = time.time_ns()
    rows = [(1, 0, None, 10), (2, 0, None, 10), (3, None, None, 10)]
    rows += [(4, now + 3600 * S, None, 400), (5, now + 3600 * S, None, 400)]
    rows += [(6, None, now, 2 * 86400), (7, DEAD_TIME_NEXT, None, 2 * 86400)]
    for i, time_next, acked, age_s in rows:
        s.sql(
            "insert into jobs(id, time_next, time_acked, time_created, message) "
            "values (:i, :n, :a, :c, 'm')",
            i=i,
            n=time_next,
            a=acked,
            c=now - age_s * S,
        )
    return now


def test_the_backlog_of_known_rows_is_exact_on_the_sender_and_on_a_passive_server(db_dsn: str):
    with serve(db_dsn, **LEASE) as a, serve(db_dsn, **LEASE) as b:
        began = known_rows(a)
        for s in (a, b):
            wait_until(lambda s=s: s.engine.backlog(0), what="the table discovered")
        # the servers share the tables: one sends jobs, the other is passive for it
        wait_until(
            lambda: sorted([a.engine.sends("jobs"), b.engine.sends("jobs")]) == [False, True],
            what="one server sending jobs",
        )
        for s in (a, b):
            m = MetricsServer(s.engine, "127.0.0.1:0")
            m.open()
            try:
                f = scrape(m.address)
            finally:
                m.close()
            took_s = (time.time_ns() - began) / S
            assert f[("msgtable_messages_due", "jobs", "")] == 3
            assert f[("msgtable_messages_scheduled", "jobs", "")] == 2
            age = f[("msgtable_oldest_unacked_age_seconds", "jobs", "")]
            assert 400 <= age <= 400 + took_s, age
            (b_,) = s.engine.backlog(0)
            assert [n for _, n in b_.by_age] == [3, 3, 5, 5, 5, 5, 5]
            assert [bound for bound, _ in b_.by_age] == list(AGE_BOUNDS_S)


def test_a_subscriptions_backlog_is_its_state_table(db_dsn: str):
    with serve(db_dsn, follow_binlog=True) as s:
        s.create_table("orders", vt_poller_interval=0.2, vt_ack_wait=30, vt_postpone_after=0)
        s.client.create_subscription("orders", "billing")
        s.sql("insert into orders(id, message) values (1, 'a'), (2, 'b'), (3, 'c')")

        def billing():
            return {(b.table, b.subscription): b for b in s.engine.backlog(0)}.get(
                ("orders", "billing")
            )

        wait_until(lambda: billing() and billing().due == 3, what="3 due in billing's backlog")
        c = Collector(s.client, "orders", subscription="billing")
        try:
            got = c.take(3)
            c.subscription.ack(got[:1])
            # sent (postponed at once: vt_postpone_after=0) and not acked: due again later
            wait_until(
                lambda: (billing().due, billing().scheduled) == (0, 2),
                what=lambda: f"billing's backlog: 0 due, 2 scheduled, not {billing()}",
            )
            assert billing().oldest_unacked_age_s is not None
            assert billing().by_age[-1] == (float("inf"), 2)
        finally:
            c.close()


def test_the_backlog_statement_reads_the_poller_index(db_dsn: str):
    """MySQL's variant (its hint is a comment to MariaDB) explained: the unacked rows are one
    range of poller_idx."""
    with serve(db_dsn) as s:
        s.create_table("jobs")
        s.sql("insert into jobs(id, message) values (1, 'a'), (2, 'b')")
        s.sql("analyze table jobs")
        wait_until(lambda: s.engine.backlog(0), what="the table discovered")
        (cfg,) = [m.config for m in s.engine._managers.values()]
        store = s.engine.store
        assert isinstance(store, MySQLStore)
        sql = store.statements(cfg).backlog[False]
        now = time.time_ns()
        params = [now, *(now - round(b * 1e9) for b in AGE_BOUNDS_S[:-1])]
        with store._auto_cursor() as cur:
            plans = explain(cur, sql, params)
        assert [p["key"] for p in plans] == ["poller_idx"], plans


def test_a_table_whose_statement_times_out_keeps_its_last_read_and_the_others_are_read(
    db_dsn: str,
):
    """The real server's time-out (MariaDB's max_statement_time, error 1969; MySQL's
    MAX_EXECUTION_TIME hint, 3024) on one table's backlog statement (made slow on purpose: a
    cross join under a 50 ms time-out) is no error of the read."""
    with serve(db_dsn) as s:
        s.create_table("jobs")
        s.create_table("slow")
        s.sql("insert into slow(id, message) values (1, 'a')")
        wait_until(lambda: len(s.engine.backlog(0)) == 2, what="both tables read")
        store = s.engine.store
        assert isinstance(store, MySQLStore)
        with store._auto_cursor() as cur:
            mariadb = store._is_mariadb(cur)
        (cfg,) = [m.config for m in s.engine._managers.values() if m.config.name == "slow"]
        cols = "information_schema.COLUMNS"
        timed = (
            "SET STATEMENT max_statement_time=0.05 FOR SELECT"
            if mariadb
            else "SELECT /*+ MAX_EXECUTION_TIME(50) */"
        )
        store.statements(cfg).backlog[mariadb] = (
            f"{timed} COUNT(*), 0, NULL"
            + ", 0" * (len(AGE_BOUNDS_S) - 1)
            + f" FROM {cols} a, {cols} b, {cols} c WHERE "
            + " AND ".join(["%s IS NOT NULL"] * len(AGE_BOUNDS_S))
        )
        s.sql("insert into jobs(id, message) values (1, 'a'), (2, 'b')")
        s.sql("insert into slow(id, message) values (2, 'b')")
        errors = store.database_errors
        got = {b.table: b.due for b in s.engine.backlog(0)}
        assert got == {"jobs": 2, "slow": 1}, "slow: its last read (1 due), jobs read anew"
        assert store.database_errors == errors
