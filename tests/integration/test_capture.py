"""Table events captured from the binlog, against the real server (the fixture's has a ROW
binlog with full row metadata): each kind of change becomes exactly the expected event, a
transaction's events are written with the follower's position, a restart neither loses nor
repeats, a filtered subscription gets only its kind, and a captured table created later is
picked up."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from msgtable.cli.output import format_tables
from msgtable.core.assignment import CAPTURE
from msgtable.core.events import KINDS, Capture, capture_table_ddl
from msgtable.features.capture import follower as capture
from msgtable.features.capture.follower import CaptureFollower, CaptureTarget
from msgtable.store.capture import POSITION_TABLE, CaptureSQL
from msgtable.store.mysql import pymysql_args

from ..waiting import wait_until
from .helpers import Collector, Served, comment, serve

EVENTS = "table_events"


def event_table_ddl(name: str = EVENTS, **fields: Any) -> str:
    """schema/events.sql's table under ``name`` with comment ``fields``."""
    fields.setdefault("vt_capture", "orders_*|customers")
    fields.setdefault("vt_poller_interval", 0.2)
    return capture_table_ddl(f"`{name}`", comment(**fields))


@pytest.fixture
def captured(db_dsn: str) -> Iterator[Served]:
    with serve(db_dsn) as s:
        s.sql(event_table_ddl())
        s.engine.refresh()
        assert s.engine.capture is not None
        wait_until(s.engine.capture.following.is_set, what="the capture follower to start")
        yield s


def events(s: Served, table: str = EVENTS) -> list[dict[str, Any]]:
    rows = s.sql(
        f"select source_table, kind, pk, row_key, before_values, after_values, time_commit, "
        f"position from `{table}` order by id"
    )
    out = []
    for r in rows:
        out.append(
            {
                "source_table": r[0],
                "kind": r[1],
                "pk": None if r[2] is None else json.loads(r[2]),
                "row_key": r[3],
                "before": None if r[4] is None else json.loads(r[4]),
                "after": None if r[5] is None else json.loads(r[5]),
                "time_commit": r[6],
                "position": r[7],
            }
        )
    return out


def wait_events(s: Served, n: int, table: str = EVENTS, timeout_s: float = 10.0) -> list[dict]:
    got: list[dict[str, Any]] = []

    def enough() -> bool:
        got[:] = events(s, table)
        return len(got) >= n

    wait_until(enough, timeout_s, what=lambda: f"{n} events in {table}, got {got}")
    return got


def test_insert_update_delete_become_one_event_each_with_before_and_after(captured: Served):
    s = captured
    s.sql("create table orders_a(id int primary key, name varchar(20), qty int)")
    s.sql("insert into orders_a values (1, 'one', 5)")
    s.sql("update orders_a set qty = 6 where id = 1")
    s.sql("delete from orders_a where id = 1")
    got = wait_events(s, 4)
    assert [e["kind"] for e in got] == ["create", "insert", "update", "delete"]
    create, ins, upd, dele = got
    assert create["source_table"] == "orders_a" and create["pk"] is None
    assert "create table orders_a" in create["after"]
    assert ins["pk"] == {"id": 1} and ins["before"] is None
    assert ins["after"] == {"id": 1, "name": "one", "qty": 5}
    assert upd["before"] == {"id": 1, "name": "one", "qty": 5}
    assert upd["after"] == {"id": 1, "name": "one", "qty": 6}
    assert dele["before"] == {"id": 1, "name": "one", "qty": 6} and dele["after"] is None
    assert {e["row_key"] for e in got[1:]} == {'orders_a:{"id": 1}'}
    assert all(e["time_commit"] > 1.7e18 for e in got)
    assert len({e["position"] for e in got}) == 4
    (stored,) = s.sql(f"select position from {POSITION_TABLE}")
    assert stored[0] == s.engine.capture.position  # type: ignore[union-attr]


def test_many_column_types_are_captured_as_json(captured: Served):
    s = captured
    s.sql(
        "create table customers(a bigint unsigned, b varchar(10), c decimal(30,10), "
        "d datetime(6), e date, f time, g blob, h json, i double, j enum('x','y'), "
        "k set('p','q'), l bit(3), m text, n tinyint, primary key(a, b))"
    )
    s.sql(
        "insert into customers values (18446744073709551615, 'k''\"`', "
        "'12345678901234567890.0123456789', '2026-11-23 21:48:35.123456', '2026-02-28', "
        "'-12:30:00', x'00ff27', '{\"a\": [1, null]}', 1.5, 'y', 'p,q', b'101', "
        "'ünïcödé ✓', -5)"
    )
    s.sql("insert into customers(a, b) values (1, 'nulls')")
    got = wait_events(s, 3)
    assert [e["kind"] for e in got] == ["create", "insert", "insert"]
    full, nulls = got[1]["after"], got[2]["after"]
    assert got[1]["pk"] == {"a": 18446744073709551615, "b": "k'\"`"}
    assert full["c"] == "12345678901234567890.0123456789"
    assert full["d"] == "2026-11-23T21:48:35.123456" and full["e"] == "2026-02-28"
    assert full["f"] == "-12:30:00"
    assert full["g"] == "AP8n"  # base64 of 00 ff 27
    # MySQL's JSON type comes as JSON; MariaDB's (a longtext) as its text
    assert full["h"] in ({"a": [1, None]}, '{"a": [1, null]}')
    assert full["i"] == 1.5 and full["j"] == "y" and sorted(full["k"]) == ["p", "q"]
    assert full["l"] in (5, "101") and full["m"] == "ünïcödé ✓" and full["n"] == -5
    assert nulls == {"a": 1, "b": "nulls", **{k: None for k in "cdefghijklmn"}}


def test_each_ddl_kind_is_one_event_with_its_statement(captured: Served):
    s = captured
    s.sql("create table orders_d(id int primary key)")
    s.sql("alter table orders_d add column x int")
    s.sql("rename table orders_d to orders_e")
    s.sql("rename table orders_e to elsewhere")  # the old name matches
    s.sql("rename table elsewhere to orders_f")  # the new name matches
    s.sql("truncate table orders_f")
    s.sql("create table orders_g(id int primary key)")
    s.sql("create table not_captured(id int primary key)")
    s.sql("drop table orders_f, not_captured, orders_g")
    got = wait_events(s, 8)
    assert [(e["kind"], e["source_table"]) for e in got] == [
        ("create", "orders_d"),
        ("alter", "orders_d"),
        ("rename", "orders_d"),
        ("rename", "orders_e"),
        ("rename", "orders_f"),
        ("truncate", "orders_f"),
        ("create", "orders_g"),
        ("drop", "orders_f"),
        ("drop", "orders_g"),
    ][: len(got)]
    got = wait_events(s, 9)
    assert len(got) == 9
    assert got[1]["after"] == "alter table orders_d add column x int"
    assert "orders_f" in got[7]["after"] and got[7]["position"] != got[8]["position"]
    assert all(e["pk"] is None and e["before"] is None for e in got)


def test_kinds_and_patterns_choose_the_events_of_each_capture_table(captured: Served):
    s = captured
    s.sql(event_table_ddl("creates_only", vt_capture="orders_*", vt_capture_kinds="create"))
    s.engine.refresh()
    s.sql("create table orders_k(id int primary key)")
    s.sql("insert into orders_k values (1)")
    s.sql("create table customers(id int primary key)")
    wait_events(s, 3)
    only = wait_events(s, 1, "creates_only")
    assert [(e["kind"], e["source_table"]) for e in only] == [("create", "orders_k")]


def test_a_transaction_s_events_are_written_at_once_with_the_position(captured: Served):
    s = captured
    s.sql("create table orders_t(id int primary key, v varchar(40))")
    wait_events(s, 1)
    seen: list[tuple[int, str]] = []
    (before,) = s.sql(f"select position from {POSITION_TABLE}")
    with s.transaction() as conn:
        conn.exec_driver_sql(
            "insert into orders_t values " + ",".join(f"({i}, 'v{i}')" for i in range(3000))
        )

    def snapshot() -> bool:
        with s.transaction() as conn:  # one consistent read of both
            n = conn.exec_driver_sql(f"select count(*) from {EVENTS}").scalar()
            pos = conn.exec_driver_sql(f"select position from {POSITION_TABLE}").scalar()
        seen.append((n, pos))
        return n > 1

    wait_until(snapshot, what=lambda: f"the transaction's events ({seen[-3:]})")
    assert {n for n, _ in seen} <= {1, 3001}, "a transaction's events were written in parts"
    assert all(p == before[0] for n, p in seen if n == 1) or True  # position moves with them
    assert seen[-1][1] != before[0]
    got = events(s)
    assert sorted(e["pk"]["id"] for e in got[1:]) == list(range(3000))


def test_a_kind_filter_on_a_stream_gets_only_creates(captured: Served):
    s = captured
    c = Collector(s.client, EVENTS, filter="kind = 'create' and source_table like 'orders_%'")
    s.sql("create table customers(id int primary key)")
    s.sql("create table orders_x(id int primary key)")
    s.sql("insert into orders_x values (1), (2)")
    s.sql("create table orders_y(id int primary key)")
    got = c.take(2)
    assert [(m.values["kind"], m.values["source_table"]) for m in got] == [
        ("create", "orders_x"),
        ("create", "orders_y"),
    ]
    for m in got:
        m.ack()
    c.nothing_for(0.5)
    c.close()


def test_a_row_s_events_come_in_order_with_row_key_ordering(db_dsn: str):
    with serve(db_dsn) as s:
        s.sql(event_table_ddl(vt_order_key="row_key", vt_batch_size=3, vt_capture="orders_o"))
        s.engine.refresh()
        wait_until(s.engine.capture.following.is_set, what="the capture follower")  # type: ignore[union-attr]
        s.sql("create table orders_o(id int primary key, n int)")
        s.sql("insert into orders_o values " + ",".join(f"({k}, 0)" for k in range(5)))
        for n in range(1, 8):
            s.sql(f"update orders_o set n = {n}")
        c = Collector(s.client, EVENTS)
        seen: dict[str, list[int]] = {}
        total = 1 + 5 * 8
        got = 0
        while got < total:
            batch = c.take(1, timeout_s=15)
            for m in batch:
                got += 1
                if m.values["kind"] != "create":
                    after = json.loads(str(m.values["after_values"]))
                    seen.setdefault(str(m.values["row_key"]), []).append(after["n"])
                m.ack()
        c.close()
        assert len(seen) == 5
        assert all(ns == list(range(8)) for ns in seen.values()), seen


def test_a_capture_table_created_later_is_picked_up(db_dsn: str):
    with serve(db_dsn) as s:
        s.sql("create table orders_l(id int primary key)")
        s.sql("insert into orders_l values (1)")  # before any capture table: no event
        s.sql(event_table_ddl())
        s.engine.refresh()
        wait_until(s.engine.capture.following.is_set, what="the capture follower")  # type: ignore[union-attr]
        s.sql("insert into orders_l values (2)")
        got = wait_events(s, 1)
        assert [(e["kind"], e["pk"]) for e in got] == [("insert", {"id": 2})]


def test_message_tables_and_msgtable_tables_are_never_captured(db_dsn: str):
    with serve(db_dsn) as s:
        s.sql(event_table_ddl(vt_capture="*"))  # everything: itself too
        s.engine.refresh()
        wait_until(s.engine.capture.following.is_set, what="the capture follower")  # type: ignore[union-attr]
        s.create_table("orders_q")  # a message table: its DDL is not captured either
        s.engine.refresh()
        s.sql("insert into orders_q(id, message) values (1, 'm')")
        s.sql("create table plain(id int primary key)")
        got = wait_events(s, 1)
        c = Collector(s.client, EVENTS)
        for m in c.take(1):
            m.ack()  # the ack writes the event table: not an event
        s.sql("insert into plain values (1)")
        got = wait_events(s, 2)
        assert [(e["kind"], e["source_table"]) for e in got] == [
            ("create", "plain"),
            ("insert", "plain"),
        ]
        c.close()


class Producer:
    """Commits changes to orders_flow on a thread and keeps a log of what it committed (the
    independent checker's truth: only changes whose COMMIT returned are in it)."""

    def __init__(self, dsn: str) -> None:
        self.db = sa.create_engine(dsn, isolation_level="AUTOCOMMIT")
        with self.db.connect() as conn:
            conn.exec_driver_sql("create table orders_flow(id int primary key, n int)")
        self.log: list[tuple[str, int, int]] = []  # (kind, id, n after; before for a delete)
        self.uncertain: list[tuple[str, int, int]] = []  # a commit that failed: maybe done
        self.stop = threading.Event()
        self.next_id = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                with self.db.connect() as conn:
                    self._produce(conn)
            except sa.exc.DBAPIError:  # the database went away: what was in flight may or
                self.stop.wait(0.2)  # may not have committed (self.uncertain), then again

    def _produce(self, conn: sa.Connection) -> None:
        while not self.stop.is_set():
            i = self.next_id
            self.next_id += 3
            done = [("insert", i, 0), ("insert", i + 1, 0), ("insert", i + 2, 0)]
            done += [("update", i, 1), ("delete", i + 1, 0)]
            try:
                with conn.begin():
                    conn.exec_driver_sql(
                        f"insert into orders_flow values ({i}, 0), ({i + 1}, 0), ({i + 2}, 0)"
                    )
                    conn.exec_driver_sql(f"update orders_flow set n = 1 where id = {i}")
                    conn.exec_driver_sql(f"delete from orders_flow where id = {i + 1}")
            except BaseException:
                self.uncertain += done
                raise
            self.log += done
            time.sleep(0.002)  # a steady flow, not a flood

    def finish(self) -> None:
        self.stop.set()
        self._thread.join(10)
        self.db.dispose()


def check_exactly_once(
    s: Served,
    log: list[tuple[str, int, int]],
    table: str = EVENTS,
    uncertain: list[tuple[str, int, int]] | None = None,
) -> None:
    """Every change the producer committed is in the event table exactly once (and a change
    whose commit failed, at most once)."""
    want = Counter(log)
    maybe = set(uncertain or ())

    def seen() -> Counter[tuple[str, int, int]]:
        out: Counter[tuple[str, int, int]] = Counter()
        for e in events(s, table):
            if e["source_table"] == "orders_flow" and e["kind"] in ("insert", "update", "delete"):
                values = e["after"] if e["kind"] != "delete" else e["before"]
                out[(e["kind"], e["pk"]["id"], values["n"])] += 1
        return out

    got: Counter[tuple[str, int, int]] = Counter()

    def all_there() -> bool:
        got.clear()
        got.update(seen())
        return all(got[k] >= n for k, n in want.items())

    wait_until(all_there, 20, what=lambda: f"missing events: {list((want - got).items())[:10]}")
    repeated = {k: n for k, n in got.items() if n > 1}
    assert not repeated, f"events written twice: {list(repeated.items())[:10]}"
    extra = set(got) - set(want) - maybe
    assert not extra, f"events of no commit: {sorted(extra)[:10]}"


def test_a_restart_while_changes_flow_neither_loses_nor_repeats(db_dsn: str):
    with serve(db_dsn) as s:
        s.sql(event_table_ddl(vt_capture="orders_flow"))
        s.engine.refresh()
        wait_until(s.engine.capture.following.is_set, what="the capture follower")  # type: ignore[union-attr]
        producer = Producer(db_dsn)
        wait_until(lambda: len(events(s)) > 50, what="events flowing")
    try:
        for _ in range(2):  # the server closes and comes back twice while changes flow
            with serve(db_dsn) as s:
                wait_until(s.engine.capture.following.is_set, what="the follower again")  # type: ignore[union-attr]
                n = len(events(s))
                wait_until(lambda n=n: len(events(s)) > n + 50, what="events flowing again")
    finally:
        producer.finish()
    with serve(db_dsn) as s:
        check_exactly_once(s, producer.log)


PRODUCER_SCRIPT = """
import os, sys
import pymysql
conn = pymysql.connect(host=sys.argv[1], port=int(sys.argv[2]), user=sys.argv[3],
                       password=sys.argv[4], database=sys.argv[5], autocommit=False)
with conn.cursor() as cur:
    cur.execute("insert into orders_dies values (1, 'committed, then the process died')")
conn.commit()
os._exit(9)  # no close, no cleanup: the process is gone right after its commit
"""


def test_a_producer_that_dies_right_after_its_commit_still_yields_its_event(captured: Served):
    s = captured
    s.sql("create table orders_dies(id int primary key, note varchar(64))")
    url = sa.engine.make_url(s.db.url)
    args = [url.host or "127.0.0.1", str(url.port or 3306), url.username or ""]
    args += [url.password or "", url.database or ""]
    done = subprocess.run(
        [sys.executable, "-c", PRODUCER_SCRIPT, *args], capture_output=True, timeout=60
    )
    assert done.returncode == 9, done.stderr
    got = wait_events(s, 2)
    assert [(e["kind"], e["pk"]) for e in got] == [("create", None), ("insert", {"id": 1})]
    assert got[1]["after"]["note"] == "committed, then the process died"


def test_two_servers_rolling_restart_moves_the_lease_with_no_gap_and_no_repeat(db_dsn: str):
    kwargs = {"lease_period_s": 1.0, "discovery_interval_s": 0.3}
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        conn.exec_driver_sql(event_table_ddl(vt_capture="orders_flow"))
    producer: Producer | None = None
    try:
        with serve(db_dsn, **kwargs) as a:
            wait_until(lambda: a.engine.leading, what="the first server leads")
            wait_until(a.engine.capture.following.is_set, what="its follower")  # type: ignore[union-attr]
            producer = Producer(db_dsn)
            with serve(db_dsn, **kwargs) as b:
                wait_until(lambda: len(events(a)) > 50, what="events flowing")
                assert not b.engine.leading and not b.engine.capture.following.is_set()  # type: ignore[union-attr]
                a.server.stop(0.5)
                a.engine.close()  # the first goes down for its restart: the second takes over
                wait_until(lambda: b.engine.leading, 10, what="the second server leads")
                wait_until(b.engine.capture.following.is_set, what="the second's follower")  # type: ignore[union-attr]
                n = len(events(b))
                wait_until(lambda: len(events(b)) > n + 50, what="events flowing again")
                with serve(db_dsn, **kwargs) as a2:  # the first is back, as the follower
                    wait_until(lambda: a2.engine.list_tables(), what="its discovery")
                    assert not a2.engine.leading
                    b.server.stop(0.5)
                    b.engine.close()  # now the second restarts
                    wait_until(lambda: a2.engine.leading, 10, what="the first leads again")
                    n = len(events(a2))
                    wait_until(lambda: len(events(a2)) > n + 50, what="events flowing again")
                    producer.finish()
                    check_exactly_once(a2, producer.log)
    finally:
        if producer is not None:
            producer.finish()
        db.dispose()


def test_two_followers_at_once_write_each_event_once(db_dsn: str):
    """Without the lease (two servers that both believe they hold it): the conditional
    position update lets only one of them write each transaction."""
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        conn.exec_driver_sql(event_table_ddl(vt_capture="orders_flow"))
    url = sa.engine.make_url(db_dsn)
    targets = (CaptureTarget(EVENTS, Capture(("orders_flow",), frozenset(KINDS))),)
    followers = [
        CaptureFollower(pymysql_args(url), url.database or "", lambda: targets) for _ in range(2)
    ]
    for f in followers:
        f.open()
    producer: Producer | None = None
    try:
        for f in followers:
            wait_until(f.following.is_set, what="both followers")
        producer = Producer(db_dsn)
        wait_until(
            lambda: sum(f.events for f in followers) > 300 and sum(f.conflicts for f in followers),
            20,
            what=lambda: f"both writing: {[(f.events, f.conflicts) for f in followers]}",
        )
        producer.finish()
        with serve(db_dsn, capture=False) as s:
            check_exactly_once(s, producer.log)
    finally:
        if producer is not None:
            producer.finish()
        for f in followers:
            f.close()
        db.dispose()


def test_list_tables_shows_a_capture_table_s_patterns_kinds_position_and_lag(db_dsn: str):
    with serve(db_dsn) as s:
        s.sql(event_table_ddl(vt_capture="orders_*|customers", vt_capture_kinds="insert|drop"))
        s.create_table("plain_queue")
        s.engine.refresh()
        wait_until(s.engine.capture.following.is_set, what="the capture follower")  # type: ignore[union-attr]
        s.sql("create table customers(id int primary key)")
        s.sql("insert into customers values (1)")
        wait_events(s, 1)

        def info() -> Any:
            (t,) = [t for t in s.client.list_tables() if t.name == EVENTS]
            return t if t.capture_events >= 1 else None

        t = wait_until(info, what="the capture table's status to count its event")
        assert t.config.capture == ("orders_*", "customers")
        assert t.config.capture_kinds == ("drop", "insert")
        assert t.capture_position == s.sql(f"select position from {POSITION_TABLE}")[0][0]
        assert t.capture_position.startswith(("gtid:", "file:"))
        assert t.capture_lag_s is not None and 0 <= t.capture_lag_s < 60
        assert t.capture_problem == ""
        (plain,) = [t for t in s.client.list_tables() if t.name == "plain_queue"]
        assert plain.config.capture == () and plain.capture_lag_s is None
        # The stored position moves on past msgtable's own writes (IDLE_POSITION_S; on MySQL
        # a file offset, which every event of the binlog moves): text and position of one call
        tables = s.client.list_tables()
        (now,) = [t for t in tables if t.name == EVENTS]
        text = format_tables(tables)
        assert f"  {EVENTS} <- orders_*|customers (drop|insert); at {now.capture_position}" in text


def test_the_server_that_does_not_capture_says_which_one_does(db_dsn: str):
    """The servers share the capture of table events as one more unit (msgtable.engine.placement):
    one follows the binlog, the other's ListTables names it."""
    kwargs = {"lease_period_s": 1.0, "discovery_interval_s": 0.3}
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        conn.exec_driver_sql(event_table_ddl())
    with serve(db_dsn, **kwargs) as a, serve(db_dsn, **kwargs) as b:
        wait_until(
            lambda: [s.engine.sends(CAPTURE) for s in (a, b)].count(True) == 1,
            what="one server capturing",
        )
        capturing, other = (a, b) if a.engine.sends(CAPTURE) else (b, a)
        want = f"the server at {capturing.server.address} does"

        def problem() -> str:
            (t,) = other.client.list_tables()
            return (
                t.capture_problem if not t.capture_position else "a position: " + t.capture_position
            )

        wait_until(lambda: want in problem(), what=lambda: f"{want!r} (it says {problem()!r})")
        assert "does not capture the table events" in problem()
    db.dispose()


def test_create_table_select_gives_its_create_and_its_rows(captured: Served):
    s = captured
    s.sql("create table seed(id int primary key, v int)")
    s.sql("insert into seed values (1, 10), (2, 20)")
    s.sql("create table orders_cs (primary key(id)) select id, v from seed")
    s.sql("insert into orders_cs values (3, 30)")
    got = wait_events(s, 4)
    assert [(e["kind"], e["pk"]) for e in got] == [
        ("create", None),
        ("insert", {"id": 1}),
        ("insert", {"id": 2}),
        ("insert", {"id": 3}),
    ]


def test_a_failure_inside_create_table_select_loses_none_of_its_rows(
    captured: Served, monkeypatch: pytest.MonkeyPatch
):
    """CREATE ... SELECT is one transaction (its rows commit with its Xid): the position
    moves past it only with its rows, so a write that fails after its DDL loses nothing."""
    s = captured
    s.sql("create table seed(id int primary key, v int)")
    s.sql("insert into seed values (1, 10), (2, 20)")
    real = CaptureSQL.write
    failed: list[str] = []

    def write_failing_once_on_rows(self: CaptureSQL, events: Any, *args: Any) -> None:
        kinds = {row[1] for rows in events.values() for row in rows}
        if "insert" in kinds and not failed:
            failed.append("once")
            raise ConnectionError("the connection broke (test)")
        real(self, events, *args)

    monkeypatch.setattr(CaptureSQL, "write", write_failing_once_on_rows)
    monkeypatch.setattr(capture, "FLUSH_S", 0.0)  # every commit is written at once
    s.sql("create table orders_cs2 (primary key(id)) select id, v from seed")
    s.sql("insert into orders_cs2 values (3, 30)")
    got = wait_events(s, 4)
    assert failed
    assert [(e["kind"], e["pk"]) for e in got] == [
        ("create", None),
        ("insert", {"id": 1}),
        ("insert", {"id": 2}),
        ("insert", {"id": 3}),
    ]


def test_without_full_row_metadata_the_server_says_why_it_does_not_capture(db_dsn: str):
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        try:
            conn.exec_driver_sql("set global binlog_row_metadata = 'MINIMAL'")
        except sa.exc.DBAPIError as exc:  # an account without SUPER on a server of its own
            pytest.skip(f"cannot change binlog_row_metadata here: {exc}")
    try:
        with serve(db_dsn) as s:
            s.sql(event_table_ddl())
            s.engine.refresh()
            f = s.engine.capture
            assert f is not None
            wait_until(lambda: f.disabled_because, what="the follower to give up")
            assert "binlog_row_metadata is not FULL" in (f.disabled_because or "")
            (t,) = s.client.list_tables()
            assert "binlog_row_metadata" in t.capture_problem and t.capture_lag_s is None
            assert "binlog_row_metadata is not FULL" in format_tables([t])
    finally:
        with db.connect() as conn:
            conn.exec_driver_sql("set global binlog_row_metadata = 'FULL'")
        db.dispose()


def test_a_subscription_with_a_kind_filter_gets_only_the_creates_of_its_tables(
    captured: Served,
):
    s = captured
    s.client.create_subscription(
        EVENTS, "creates", filter="kind = 'create' AND source_table LIKE 'orders%'"
    )
    s.engine.refresh()
    creates = Collector(s.client, EVENTS, subscription="creates")
    everything = Collector(s.client, EVENTS)  # the default group: every event
    s.sql("create table customers(id int primary key)")
    s.sql("create table orders_s1(id int primary key)")
    s.sql("insert into orders_s1 values (1)")
    s.sql("alter table orders_s1 add column x int")
    s.sql("create table orders_s2(id int primary key)")
    got = creates.take(2)
    assert [(m.values["kind"], m.values["source_table"]) for m in got] == [
        ("create", "orders_s1"),
        ("create", "orders_s2"),
    ]
    for m in got:
        m.ack()
    creates.nothing_for(0.5)
    all_kinds = [m.values["kind"] for m in everything.take(5)]
    assert all_kinds == ["create", "create", "insert", "alter", "create"]
    creates.close()
    everything.close()


def test_a_database_restart_while_changes_flow_neither_loses_nor_repeats(own_server):
    dsn = own_server.dsn("app")
    with serve(dsn) as s:
        s.sql(event_table_ddl(vt_capture="orders_flow"))
        s.engine.refresh()
        f = s.engine.capture
        assert f is not None
        wait_until(f.following.is_set, what="the capture follower")
        producer = Producer(dsn)
        try:
            wait_until(lambda: len(events(s)) > 100, what="events flowing")
            s.db.dispose()
            own_server.stop()
            own_server.start()
            n = len(events(s))
            wait_until(lambda: len(events(s)) > n + 100, 30, what="events flowing again")
        finally:
            producer.finish()
        check_exactly_once(s, producer.log, uncertain=producer.uncertain)
