"""Flow control end to end (issue 45): rates, caps and fair share on a real MySQL-family
server, through the real gRPC server and client, several subscribers and two servers with a
hand-over in the middle, judged by the independent checker in tests/flowcheck.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from msgtable.client import Client
from msgtable.core.tables import current_layout_ddl
from msgtable.engine.engine import MessageEngine
from msgtable.features.assembly import assemble_dsn
from msgtable.server.servicer import MessagingServer

from ..flowcheck import Delivery, FlowLog, cap_violations, rate_overshoots
from ..waiting import wait_until
from .helpers import Served, comment, serve

TENANT = "tenant varchar(64)"
PERIOD_S = 0.6


@pytest.fixture
def served(db_dsn: str):
    with serve(db_dsn) as s:
        yield s


def enqueue(db: sa.Engine, table: str, rows: list[tuple[int, str | None]]) -> None:
    with db.connect() as conn:
        for i in range(0, len(rows), 1000):
            values = ",".join(
                f"({rid}, {'NULL' if k is None else repr(k)}, 'm{rid}')"
                for rid, k in rows[i : i + 1000]
            )
            conn.exec_driver_sql(f"insert into {table}(id, tenant, message) values {values}")


class Workers:
    """``n`` subscribers of ``table`` on threads, each holding every batch ``hold_s`` before
    it acks it, recording deliveries for the checker (keyed on the tenant column)."""

    def __init__(self, client: Client, table: str, n: int, hold_s: float = 0.0, **kw: Any) -> None:
        self.log = FlowLog()
        self.acked: set[Any] = set()
        self.errors: list[BaseException] = []
        self._hold_s = hold_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._subs = [client.subscribe(table, **kw) for _ in range(n)]
        self._threads = [
            threading.Thread(target=self._run, args=(f"w{i}", sub), daemon=True)
            for i, sub in enumerate(self._subs)
        ]
        for t in self._threads:
            t.start()

    def _run(self, name: str, sub: Any) -> None:
        try:
            while not self._stop.is_set():
                batch = sub.next_batch()
                if not batch:
                    continue
                ds = self.log.received(name, batch, "tenant")
                if self._hold_s:
                    time.sleep(self._hold_s)
                FlowLog.settling(ds)
                sub.ack(batch)
                with self._lock:
                    self.acked.update(m.id for m in batch)
        except BaseException as exc:
            if not self._stop.is_set():
                self.errors.append(exc)

    def wait_for(self, n: int, timeout_s: float = 60.0) -> None:
        wait_until(
            lambda: len(self.acked) >= n or self.errors,
            timeout_s=timeout_s,
            what=lambda: f"{n} acked (have {len(self.acked)})",
        )
        assert not self.errors, self.errors

    def close(self) -> None:
        self._stop.set()
        for sub in self._subs:
            sub.close()
        for t in self._threads:
            t.join(5)


def first_attempts(deliveries: list[Delivery]) -> bool:
    return all(d.attempt == 1 for d in deliveries)


def test_a_bad_limit_is_a_load_error_naming_the_field(served: Served):
    served.create_table("jobs", TENANT, vt_rate="fast", vt_key_concurrency=0)
    (t,) = wait_until(lambda: [t for t in served.client.list_tables() if t.name == "jobs"])
    assert "vt_rate='fast' is not a rate" in t.load_error
    assert "vt_key_concurrency=0 must be between 1" in t.load_error


def test_a_rate_holds_across_the_subscribers_and_a_held_message_is_not_an_attempt(
    served: Served,
):
    served.create_table("jobs", TENANT, vt_rate=40, vt_rate_burst=4, vt_ack_wait=5)
    enqueue(served.db, "jobs", [(i, "a") for i in range(1, 121)])
    began = time.monotonic()
    w = Workers(served.client, "jobs", 3)
    try:
        w.wait_for(120)
    finally:
        w.close()
    took = time.monotonic() - began
    assert took >= (120 - 4) / 40 * 0.95  # not faster than the rate
    assert rate_overshoots(w.log.deliveries, 40, 4) == []
    assert first_attempts(w.log.deliveries)  # held back: never counted as an attempt
    assert len({d.subscriber for d in w.log.deliveries}) == 3
    (t,) = [t for t in served.client.list_tables() if t.name == "jobs"]
    assert t.load_error == ""


def test_max_in_flight_caps_the_group_across_its_subscribers(served: Served):
    served.create_table("jobs", TENANT, vt_max_in_flight=4, vt_batch_size=3)
    enqueue(served.db, "jobs", [(i, "a") for i in range(1, 61)])
    w = Workers(served.client, "jobs", 3, hold_s=0.03)
    try:
        w.wait_for(60)
    finally:
        w.close()
    assert cap_violations(w.log.deliveries, 4, 30) == []
    assert first_attempts(w.log.deliveries)


def test_a_key_cap_holds_per_key_and_the_other_keys_go_meanwhile(served: Served):
    served.create_table(
        "jobs", TENANT, vt_limit_key="tenant", vt_key_concurrency=2, vt_batch_size=5
    )
    rows = [(i, "hot") for i in range(1, 41)] + [(100 + i, f"k{i % 4}") for i in range(20)]
    enqueue(served.db, "jobs", rows)
    w = Workers(served.client, "jobs", 4, hold_s=0.05)
    try:
        w.wait_for(len(rows))
    finally:
        w.close()
    assert cap_violations(w.log.deliveries, 2, 30, by_key=True) == []
    # the hot key's backlog did not hold the others back: they were done long before it
    last = {d.key: d.sent_ns for d in sorted(w.log.deliveries, key=lambda d: d.sent_ns)}
    assert max(v for k, v in last.items() if k != "hot") < last["hot"]
    assert first_attempts(w.log.deliveries)


def test_a_key_rate_holds_each_key(served: Served):
    served.create_table("jobs", TENANT, vt_limit_key="tenant", vt_key_rate=20, vt_key_burst=2)
    rows = [(i, f"k{i % 3}") for i in range(1, 61)]
    enqueue(served.db, "jobs", rows)
    began = time.monotonic()
    w = Workers(served.client, "jobs", 2)
    try:
        w.wait_for(60)
    finally:
        w.close()
    assert rate_overshoots(w.log.deliveries, 20, 2, by_key=True) == []
    assert time.monotonic() - began < 10  # the keys went in parallel: 20 each at 20/s


@pytest.mark.parametrize("binlog", [True, False], ids=["binlog", "poll-only"])
def test_fair_share_serves_the_quiet_tenants_before_the_noisy_ones_backlog(
    db_dsn: str, binlog: bool
):
    """The quiet tenants' messages, enqueued behind a noisy tenant's backlog, go out at
    once (with the binlog, as soon as it shows them; else at the next poll), and the noisy
    tenant still gets everything else."""
    with serve(db_dsn, follow_binlog=binlog) as s:
        s.create_table(
            "jobs",
            TENANT,
            vt_fair_key="tenant",
            vt_batch_size=5,
            vt_poller_interval=30 if binlog else 0.5,
        )
        noisy = [(i, "noisy") for i in range(1, 1001)]
        enqueue(s.db, "jobs", noisy)
        w = Workers(s.client, "jobs", 2, hold_s=0.05, max_in_flight=5)
        try:
            wait_until(lambda: len(w.acked) >= 20, what="the noisy tenant under way")
            quiet = [(5000 + i, f"quiet{i % 5}") for i in range(10)]
            enqueue(s.db, "jobs", quiet)
            wait_until(lambda: {rid for rid, _ in quiet} <= w.acked, timeout_s=20, what="quiet")
            assert len(w.acked) < 400  # long before the noisy backlog was done
            w.wait_for(len(noisy) + len(quiet), timeout_s=120)  # the noisy one got the rest
        finally:
            w.close()


@pytest.mark.parametrize("binlog", [True, False], ids=["binlog", "poll-only"])
def test_fair_share_reaches_the_quiet_tenants_past_a_noisy_backlog_larger_than_the_cache(
    db_dsn: str, binlog: bool
):
    """A noisy tenant's backlog 25 times the cache, the quiet tenants' messages behind it:
    they are read past it and go out at once, as if it were not there (a few noisy batches
    first, not the noisy tenant's share of the cache, nor a pass through its backlog), and
    the noisy tenant gets the rest."""
    with serve(db_dsn, follow_binlog=binlog) as s:
        s.create_table(
            "jobs",
            TENANT,
            vt_fair_key="tenant",
            vt_batch_size=5,
            vt_cache_size=200,
            vt_poller_interval=30 if binlog else 0.5,
        )
        noisy = [(i, "noisy") for i in range(1, 5001)]
        quiet = [(9000 + i, f"quiet{i % 5}") for i in range(10)]
        quiet_ids = {rid for rid, _ in quiet}
        enqueue(s.db, "jobs", noisy + quiet)
        w = Workers(s.client, "jobs", 2, hold_s=0.05, max_in_flight=5)
        try:
            wait_until(lambda: quiet_ids <= w.acked, timeout_s=30, what="the quiet messages")
            ds = sorted(w.log.deliveries, key=lambda d: d.sent_ns)
            last_quiet = max(d.sent_ns for d in ds if d.id in quiet_ids)
            noisy_first = sum(1 for d in ds if d.key == "noisy" and d.sent_ns < last_quiet)
            # the first page's batches and one turn each, not a pass through the backlog
            assert noisy_first <= 30, (
                f"{noisy_first} noisy messages went out before the last quiet one (at most "
                "30): the quiet ones waited for a pass through the noisy backlog"
            )
            w.wait_for(len(noisy) + len(quiet), timeout_s=120)  # the noisy one got the rest
        finally:
            w.close()
    assert first_attempts(w.log.deliveries)


@contextmanager
def _server(dsn: str) -> Iterator[tuple[MessageEngine, MessagingServer]]:
    engine = assemble_dsn(dsn, discovery_interval_s=0.3, lease_period_s=PERIOD_S)
    engine.open()
    server = MessagingServer(engine, "127.0.0.1:0")
    server.start()
    engine.campaign(server.address)
    try:
        yield engine, server
    finally:
        server.stop(0.5)
        engine.close()


def _rate_and_key_cap(ds: list[Delivery]) -> list[str]:
    return rate_overshoots(ds, 30, 3) + cap_violations(ds, 1, 2, by_key=True)


def _max_in_flight(ds: list[Delivery]) -> list[str]:
    return cap_violations(ds, 2, 2)


def _key_rate(ds: list[Delivery]) -> list[str]:
    return rate_overshoots(ds, 6, 1, by_key=True)


def _fair(ds: list[Delivery]) -> list[str]:
    """The quiet tenants' rows, enqueued behind the noisy backlog after the hand-over, went
    out in turns with it, not after it."""
    quiet = [d for d in ds if d.key != "noisy"]
    last = max(d.sent_ns for d in quiet)
    first = min(d.sent_ns for d in quiet)
    before = sum(1 for d in ds if d.key == "noisy" and first <= d.sent_ns < last)
    after = sum(1 for d in ds if d.key == "noisy" and d.sent_ns > last)
    out = rate_overshoots(ds, 30, 3)
    if before > 25 or after < 20:
        out.append(f"{before} noisy sent among the quiet ones, {after} after them: no turns")
    return out


# each limit: its comment fields, the rows (id, tenant) and what its deliveries must show
LIMITS: dict[str, tuple[dict[str, Any], list[tuple[int, str]], Any]] = {
    "rate+key_concurrency": (
        {"vt_rate": 30, "vt_rate_burst": 3, "vt_limit_key": "tenant", "vt_key_concurrency": 1},
        [(i, f"k{i % 5}") for i in range(1, 121)],
        _rate_and_key_cap,
    ),
    "max_in_flight": (
        {"vt_max_in_flight": 2},
        [(i, f"k{i % 5}") for i in range(1, 121)],
        _max_in_flight,
    ),
    "key_rate": (
        {"vt_limit_key": "tenant", "vt_key_rate": 6, "vt_key_burst": 1},
        [(i, f"k{i % 5}") for i in range(1, 121)],
        _key_rate,
    ),
    "fair_key": (
        {"vt_fair_key": "tenant", "vt_rate": 30, "vt_rate_burst": 3},
        [(i, "noisy") for i in range(1, 151)],
        _fair,
    ),
}
QUIET = [(1000 + i, f"quiet{i % 5}") for i in range(10)]  # the fair case's, after the hand-over


@pytest.mark.parametrize("limit", list(LIMITS))
def test_limits_hold_on_two_servers_through_a_hand_over(db_dsn: str, limit: str):
    """Each limit, four subscribers spread over two servers; the sender shuts down in the
    middle and the other takes the table over: no window overshot, no cap exceeded, the
    quiet tenants served in turns, before, across and after the hand-over, and every
    message delivered once."""
    fields, rows, check = LIMITS[limit]
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    ddl = current_layout_ddl(
        "jobs", comment(**fields, vt_ack_wait=2, vt_poller_interval=0.2)
    ).replace("  primary key(id)", f"  {TENANT},\n  primary key(id)")
    with db.connect() as conn:
        conn.exec_driver_sql(ddl)
    enqueue(db, "jobs", rows)
    fair = limit == "fair_key"
    with ExitStack() as stack:
        first = stack.enter_context(_server(db_dsn))
        second = stack.enter_context(_server(db_dsn))
        engines = {first[0]: first[1], second[0]: second[1]}
        wait_until(lambda: [e.sends("jobs") for e in engines].count(True) == 1, what="a sender")
        sender = next(e for e in engines if e.sends("jobs"))
        other = next(e for e in engines if e is not sender)
        both = ",".join(s.address for s in engines.values())
        client = stack.enter_context(Client(both))
        w = Workers(client, "jobs", 4, hold_s=0.02)
        try:
            wait_until(lambda: len(w.acked) >= 40, timeout_s=30, what="a third sent")
            engines[sender].stop(0.5)
            sender.close()  # a clean hand-over: the other takes over at once
            wait_until(lambda: other.sends("jobs"), timeout_s=4 * PERIOD_S + 5, what="takeover")
            if fair:  # behind what is left of the noisy backlog
                enqueue(db, "jobs", QUIET)
            w.wait_for(len(rows) + (len(QUIET) if fair else 0), timeout_s=60)
        finally:
            w.close()
    db.dispose()
    ds = w.log.deliveries
    assert check(ds) == []
    assert sorted(d.id for d in ds) == sorted(rid for rid, _ in rows + (QUIET if fair else []))


def _handler_reads(db: sa.Engine) -> int:
    with db.connect() as conn:
        rows = conn.exec_driver_sql("show global status like 'Handler_read_next'").all()
    return int(rows[0][1])


def test_a_fair_tables_skipping_poll_reads_the_other_tenants_rows_by_its_index(db_dsn: str):
    """With an index on (time_acked, tenant, priority, time_next), a poll that leaves out a
    noisy tenant's 5,000-row backlog reads the quiet tenants' rows behind it by the index,
    not through the noisy rows one by one (the optimizer alone takes poller_idx when the
    others' rows are a tenth of the table)."""
    from msgtable.core.tables import load_table
    from msgtable.store.mysqlstore import MySQLStore

    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    ddl = current_layout_ddl("jobs", comment(vt_fair_key="tenant", vt_cache_size=200)).replace(
        "  primary key(id)",
        f"  {TENANT},\n  index fair_idx(time_acked, tenant, priority, time_next),\n"
        "  primary key(id)",
    )
    with db.connect() as conn:
        conn.exec_driver_sql(ddl)
    noisy = [(i, "noisy") for i in range(1, 5001)]
    quiet = [(9000 + i, f"quiet{i % 5}") for i in range(500)]
    enqueue(db, "jobs", noisy + quiet)
    store = MySQLStore.from_dsn(db_dsn)
    try:
        (d,) = [d for d in store.discover() if d.name == "jobs"]
        cfg = load_table(d.name, d.comment, d.columns, d.unique_indexes, d.indexes)
        assert cfg.flow is not None and cfg.flow.fair_index == "fair_idx"
        before = _handler_reads(db)
        rows, _ = store.poll(cfg, time.time_ns(), 100, None, True, None, skip_keys=("noisy",))
        read = _handler_reads(db) - before
    finally:
        store.close()
    assert [r[3] for r in rows] == [rid for rid, _ in quiet[:100]]
    assert read < 1500, (
        f"the poll leaving out the noisy tenant read {read} index entries for 100 rows: it "
        "went through the noisy backlog instead of the fair index"
    )
