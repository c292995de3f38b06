"""Instant delivery by following the binlog, against a real server (the fixture's has a ROW
binlog): rows written by any client arrive long before the next poll, DML acks, deletes and
reschedules are seen at once, a database restart loses and duplicates nothing, and a server
without a binlog falls back to polling, saying why once."""

from __future__ import annotations

import gc
import logging
import shutil
import subprocess
import time
from pathlib import Path

import pymysql
import pytest
import sqlalchemy as sa

from msgtable.core.tables import current_layout_ddl
from msgtable.engine import binlog
from msgtable.store.mysql import ANNOTATIONS_VARIABLE
from msgtable.testing.devdb import LocalServer, free_port

from ..waiting import wait_until
from .helpers import NS, Collector, Served, comment, serve

POLL_S = 30  # every table here polls this rarely: anything faster came by the binlog
FAST_S = 2.0  # "at once", with room for a loaded CI machine


@pytest.fixture
def followed(db_dsn: str):
    with serve(db_dsn, follow_binlog=True) as s:
        assert s.engine.binlog is not None
        wait_until(s.engine.binlog.following.is_set, what="the binlog follower to start")
        yield s


def mysql_cli(dsn: str, statement: str) -> None:
    """Run one statement with the mysql command-line client (not msgtable, not SQLAlchemy)."""
    url = sa.engine.make_url(dsn)
    exe = shutil.which("mariadb") or shutil.which("mysql")
    if exe is None:
        pytest.skip("no mysql command-line client on this machine")
    command = [exe, "-h", url.host or "localhost", "-P", str(url.port or 3306)]
    command += ["-u", url.username or "", f"-p{url.password or ''}", url.database or ""]
    subprocess.run([*command, "-e", statement], check=True, capture_output=True, timeout=30)


def test_a_row_inserted_by_the_mysql_cli_arrives_long_before_the_next_poll(
    followed: Served, db_dsn: str
):
    followed.create_table("cli", vt_poller_interval=POLL_S)
    c = Collector(followed.client, "cli")  # its first poll finds nothing
    time.sleep(0.2)
    began = time.monotonic()
    mysql_cli(db_dsn, "insert into cli(id, message) values (1, 'from the cli')")
    (m,) = c.take(1, timeout_s=FAST_S)
    assert m.id == 1 and time.monotonic() - began < FAST_S
    c.close()


def test_a_reschedule_by_dml_goes_at_its_new_time_without_waiting_for_a_poll(
    followed: Served,
):
    followed.create_table("later", vt_poller_interval=POLL_S, vt_ack_wait=60)
    followed.sql("insert into later(id, message) values (1, 'a')")
    c = Collector(followed.client, "later")
    c.take(1)
    wait_until(
        lambda: followed.sql("select epoch from later")[0][0] == 1, what="the postpone (1 s)"
    )
    c.nothing_for(0.3)  # postponed by a minute
    followed.sql("update later set time_next = 0, epoch = 0 where id = 1")
    (m,) = c.take(1, timeout_s=FAST_S)
    assert m.id == 1
    c.close()


@pytest.mark.parametrize("annotated", [True, False])
def test_a_dml_ack_of_a_sent_message_is_seen_at_once(
    followed: Served, annotated: bool, flavour: str
):
    followed.create_table("seen", vt_poller_interval=POLL_S)
    followed.sql("insert into seen(id, message) values (1, 'a'), (2, 'b')")
    c = Collector(followed.client, "seen")
    c.take(2)
    assert followed.client.ack("seen", [2]) == 1  # msgtable's own statement comes just before
    assert followed.client.list_tables()[0].in_flight == 1
    with followed.db.connect() as conn:
        if not annotated:  # the binlog has no statement text: the follower goes by size
            variable = ANNOTATIONS_VARIABLE[flavour == "mariadb"]
            conn.execute(sa.text(f"set session {variable} = 0"))
        conn.execute(
            sa.text("update seen set time_acked = :t, time_next = null where id = 1"),
            {"t": time.time_ns()},
        )
    wait_until(
        lambda: followed.client.list_tables()[0].in_flight == 0,
        timeout_s=FAST_S,
        what="the DML ack to leave the in-flight count",
    )
    # The DML ack counts when the binlog says another client wrote it; without annotations
    # it cannot tell it from msgtable's own acks, which must not count twice.
    assert followed.client.list_tables()[0].acked == (2 if annotated else 1)
    c.close()


def test_the_follower_starts_where_the_binlog_is_not_at_its_beginning(db_dsn: str):
    with serve(db_dsn) as s:  # history written before the follower starts
        s.sql("create table history(id int primary key, v int)")
        for i in range(200):
            s.sql(f"insert into history values ({i}, {i})")
    with serve(db_dsn, follow_binlog=True) as s:
        assert s.engine.binlog is not None
        wait_until(s.engine.binlog.following.is_set, what="the binlog follower to start")
        s.sql("insert into history values (1000, 0)")
        wait_until(lambda: s.engine.binlog.events >= 1, what="the new row's event")
        time.sleep(0.5)
        assert s.engine.binlog.events == 1  # not the 200 before it


def test_a_row_committed_before_the_follower_s_start_goes_at_once_not_at_the_next_poll(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch
):
    """The follower starts where the binlog is when it starts; a row committed after the
    table's first poll and before that is in neither, and waited for the next poll (30 s
    here: the fault suite's shutdown test timed out on it on a busy CI machine). The
    follower has every table polled again once it knows where it starts."""
    engine = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(current_layout_ddl("jobs", comment(vt_poller_interval=POLL_S)))
    real = binlog.read_status

    def late_status(settings: dict[str, object]) -> binlog.BinlogStatus:
        time.sleep(1.0)  # the table's first poll is over
        with engine.connect() as conn:
            conn.exec_driver_sql("insert into jobs(id, message) values (1, 'early')")
        return real(settings)  # where the follower starts: after that row

    monkeypatch.setattr(binlog, "read_status", late_status)
    try:
        with serve(db_dsn, follow_binlog=True) as s:
            c = Collector(s.client, "jobs")
            got = c.take(1, timeout_s=FAST_S + 1.0)
            assert [m.id for m in got] == [1]
            c.close()
    finally:
        engine.dispose()


def test_a_delete_of_a_cached_message_takes_it_out_of_the_cache(followed: Served):
    followed.create_table("gone", "payload mediumtext", vt_poller_interval=POLL_S, vt_batch_size=1)
    big = "x" * 100_000  # 6 MB: more than gRPC takes for a subscriber that does not read
    for i in range(60):
        followed.sql("insert into gone(id, message, payload) values (:i, 'm', :p)", i=i, p=big)
    sub = followed.client.subscribe("gone")
    seen: list[int] = []

    def settled() -> bool:
        time.sleep(0.2)
        seen.append(followed.client.list_tables()[0].cached)
        return len(seen) >= 2 and seen[-2] == seen[-1] >= 1

    wait_until(settled, what="sending to stop with rows left in the cache")
    followed.sql("delete from gone where id = 59")  # sent last: still in the cache
    wait_until(
        lambda: followed.client.list_tables()[0].cached == seen[-1] - 1,
        timeout_s=FAST_S,
        what="the deleted row to leave the cache",
    )
    sub.close()


def test_a_database_restart_mid_stream_loses_and_duplicates_nothing(tmp_path: Path):
    server = LocalServer(tmp_path / "db", port=free_port(), keep=True)
    server.start()
    server.create_database("app")
    try:
        with serve(server.dsn("app"), discovery_interval_s=0.2, follow_binlog=True) as s:
            s.sql(current_layout_ddl("jobs", comment(vt_poller_interval=POLL_S)))
            assert s.engine.binlog is not None
            wait_until(s.engine.binlog.following.is_set, what="the binlog follower")
            c = Collector(s.client, "jobs")
            s.sql("insert into jobs(id, message) values (1, 'before')")
            assert c.take(1, timeout_s=FAST_S)[0].ack() == 1
            time.sleep(0.5)  # the follower has read the ack
            read = s.engine.binlog.events
            s.db.dispose()
            server.stop()
            server.start()
            wait_until(s.engine.binlog.following.is_set, timeout_s=30, what="a new stream")
            time.sleep(0.5)
            assert s.engine.binlog.events == read  # resumed after what it read, no replay
            began = time.monotonic()
            s.sql("insert into jobs(id, message) values (2, 'after'), (3, 'after')")
            got = c.take(2, timeout_s=15)
            assert sorted(m.id for m in got) == [2, 3]
            assert time.monotonic() - began < 15 < POLL_S  # by the binlog, not a poll
            for m in got:
                assert m.ack() == 1
            c.nothing_for(1.0)  # and nothing twice
            assert sorted(c.arrived_ns) == [1, 2, 3]
            assert all(len(times) == 1 for times in c.arrived_ns.values())
            c.close()
    finally:
        server.keep = False
        server.stop()


def test_what_an_outage_leaves_in_reference_cycles_is_freed_when_the_database_is_back(
    tmp_path: Path,
):
    """A database outage leaves garbage in reference cycles: the binlog stream that broke and
    every connection attempt that failed (PyMySQL's error holds its frame, the frame the
    connection; the library's stream and its events hold each other), each connection with
    an SSL context of the system's CA certificates (about 0.7 MB of OpenSSL memory that
    Python's collector does not see). A long-lived server's heap makes full collections rare,
    so the soak's server grew by that much after every database fault. The server collects
    once the database answers again. (The test's process runs the server: its automatic
    collections are off here, so only the server's own collection can free them.)"""
    server = LocalServer(tmp_path / "db", port=free_port(), keep=True)
    server.start()
    server.create_database("app")
    gc.collect()
    gc.disable()
    try:
        with serve(server.dsn("app"), discovery_interval_s=0.2, follow_binlog=True) as s:
            s.sql(current_layout_ddl("jobs", comment(vt_poller_interval=POLL_S)))
            assert s.engine.binlog is not None
            wait_until(s.engine.binlog.following.is_set, what="the binlog follower")
            s.db.dispose()
            for _ in range(3):
                server.stop()
                time.sleep(1.0)  # the follower's attempts fail meanwhile
                server.start()
                wait_until(s.engine.binlog.following.is_set, timeout_s=30, what="a new stream")
            time.sleep(1.0)
            closed = [
                o
                for o in gc.get_objects()
                if isinstance(o, pymysql.connections.Connection) and not o.open
            ]
            assert len(closed) <= 2, f"{len(closed)} closed connections are still in memory"
    finally:
        gc.enable()
        server.keep = False
        server.stop()


def test_without_a_binlog_it_says_why_once_and_polls(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    server = LocalServer(tmp_path / "db", port=free_port(), binlog=False)
    server.start()
    server.create_database("app")
    try:
        with (
            caplog.at_level(logging.WARNING, logger="msgtable.engine.binlog"),
            serve(server.dsn("app"), follow_binlog=True) as s,
        ):
            follower = s.engine.binlog
            assert follower is not None
            wait_until(lambda: follower.disabled_because is not None, what="the follower to stop")
            s.sql(current_layout_ddl("jobs", comment(vt_poller_interval=0.1)))
            s.sql("insert into jobs(id, message) values (1, 'polled')")
            c = Collector(s.client, "jobs")
            assert c.take(1)[0].id == 1
            c.close()
        warnings = [r.getMessage() for r in caplog.records if "binlog" in r.getMessage()]
        assert len(warnings) == 1 and "log_bin" in warnings[0]
    finally:
        server.stop()


def test_a_binlog_without_statement_texts_is_followed_saying_once_what_it_misses(
    db_dsn: str, flavour: str, caplog: pytest.LogCaptureFixture
):
    """MySQL's binlog has no statement texts unless binlog_rows_query_log_events is on
    (MariaDB's binlog_annotate_row_events is on by default): the follower follows it all the
    same, and says once what it misses, and how to turn them on."""
    variable = ANNOTATIONS_VARIABLE[flavour == "mariadb"]
    admin = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        was = conn.exec_driver_sql(f"select @@global.{variable}").scalar()
        conn.exec_driver_sql(f"set global {variable} = OFF")
    try:
        with (
            caplog.at_level(logging.WARNING, logger="msgtable.engine.binlog"),
            serve(db_dsn, follow_binlog=True) as s,
        ):
            assert s.engine.binlog is not None
            wait_until(s.engine.binlog.following.is_set, what="the binlog follower to start")
            s.create_table("plain", vt_poller_interval=POLL_S)
            c = Collector(s.client, "plain")
            time.sleep(0.2)
            s.sql("insert into plain(id, message) values (1, 'a')")
            assert [m.id for m in c.take(1, timeout_s=FAST_S)] == [1]
            c.close()
        warnings = [r.getMessage() for r in caplog.records if "binlog" in r.getMessage()]
        assert len(warnings) == 1, warnings
        assert f"{variable} is OFF" in warnings[0] and f"{variable} = ON" in warnings[0]
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"set global {variable} = {int(was)}")
        admin.dispose()


def test_a_future_row_inserted_between_polls_goes_at_its_time(followed: Served):
    followed.create_table("soon", vt_poller_interval=POLL_S)
    c = Collector(followed.client, "soon")
    time.sleep(0.2)
    due = time.time_ns() + NS
    followed.sql("insert into soon(id, message, time_next) values (1, 'a', :t)", t=due)
    c.take(1, timeout_s=5)
    late_s = (c.arrived_ns[1][0] - due) / NS
    assert 0 <= late_s < 0.25
    c.close()
