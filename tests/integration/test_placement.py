"""The placement on a real MariaDB: one sender per table at a time, a takeover once a sender
stops renewing (within two periods), an immediate hand-over when it gives a table back, the
tables spread over the servers and rebalanced as they join and leave, and two servers on one
database: the one that does not send a table sends its subscribers to the one that does."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from functools import partial

import grpc
import pytest
import sqlalchemy as sa

from msgtable import aio
from msgtable.client import Client
from msgtable.core.assignment import CAPTURE, rank
from msgtable.core.tables import current_layout_ddl, load_table
from msgtable.engine.engine import MessageEngine
from msgtable.engine.lease import LEASE_DDL, Takeover, connector, session_wait_timeout_s
from msgtable.engine.placement import (
    FORGET_AFTER_S,
    FORGET_EVERY,
    PLACEMENT_DDL,
    PLACEMENT_TABLE,
    Placement,
)
from msgtable.errors import LEADER_METADATA_KEY
from msgtable.features.assembly import assemble_dsn
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.proto.msgtable.v1 import messaging_pb2_grpc as pb_grpc
from msgtable.server.servicer import MessagingServer
from msgtable.store.mysqlstore import FENCED_READ, MySQLStore

from ..netfault import FaultProxy
from ..waiting import wait_until
from .helpers import Collector, comment

PERIOD_S = 0.6
# the subscriptions a test of several kinds creates, by name: their settings
SUBSCRIPTION: dict[str, dict[str, str]] = {"eager": {}, "lazy": {"state_rows": "lazy"}}


class Candidate:
    """A Placement with callbacks that record what happened, for ``units``."""

    def __init__(self, store: MySQLStore, address: str, units: Collection[str] = ("t",)) -> None:
        self.gains: list[tuple[float, str, Takeover]] = []
        self.losses: list[tuple[float, str, str]] = []
        self.units = set(units)
        self.gained = threading.Event()
        self.lease = Placement(
            connector(store.url, store.database),
            address,
            PERIOD_S,
            units=lambda: self.units,
            on_gain=self._gain,
            on_loss=self._loss,
        )

    def _gain(self, unit: str, takeover: Takeover) -> None:
        self.gains.append((time.monotonic(), unit, takeover))
        self.gained.set()

    def _loss(self, unit: str, sender: str) -> bool:
        self.losses.append((time.monotonic(), unit, sender))
        return True

    def held(self) -> set[str]:
        return set(self.lease.held())

    def crash(self) -> None:
        """Stop renewing without giving anything back (as a killed process would)."""
        self.lease._stop.set()
        self.lease._wake.set()
        assert self.lease._thread is not None
        self.lease._thread.join(5)
        self.lease._drop_connection()


@pytest.fixture
def store(db_dsn: str) -> Iterator[MySQLStore]:
    s = MySQLStore.from_dsn(db_dsn)
    yield s
    s.close()


def _campaign(store: MySQLStore, address: str, units: Collection[str] = ("t",)) -> Candidate:
    c = Candidate(store, address, units)
    c.lease.prepare()
    c.lease.start()
    return c


def test_one_sender_at_a_time_and_a_takeover_within_two_periods(store):
    a = _campaign(store, "a:1")
    assert a.gained.wait(5)
    b = _campaign(store, "b:2")
    wait_until(
        lambda: b.lease.servers().keys() == {a.lease.holder, b.lease.holder},
        what="b reads both servers",
    )
    wait_until(lambda: a.held() | b.held() == {"t"}, what="one of them sends t")
    time.sleep(PERIOD_S * 2)
    # one unit: exactly one sends it; the other names it
    sender, other = (a, b) if a.held() else (b, a)
    assert sender.held() == {"t"} and other.held() == set()
    assert sender.lease.valid("t") and not other.lease.valid("t")
    assert other.lease.sender("t") == sender.lease.address
    other.gained.clear()
    crashed_at = time.monotonic()
    sender.crash()
    assert other.gained.wait(5)
    took, unit, takeover = other.gains[-1]
    took -= crashed_at
    assert unit == "t"
    assert took <= 2 * PERIOD_S, f"takeover took {took:.2f}s"
    assert takeover.previous == sender.lease.holder and not takeover.released
    assert 0 <= takeover.ended_s_ago < PERIOD_S
    assert not sender.lease.valid("t")  # the old sender's own clock ended it first
    other.lease.close()


def test_a_table_given_back_is_taken_over_at_once_with_no_wait(store):
    a = _campaign(store, "a:1")
    assert a.gained.wait(5)
    b = _campaign(store, "b:2")
    wait_until(lambda: len(b.lease.servers()) == 2, what="b reads both servers")
    wait_until(lambda: a.held() | b.held() == {"t"}, what="one of them sends t")
    sender, other = (a, b) if a.held() else (b, a)
    other.gained.clear()
    sender.lease.close(released=lambda unit: True)
    released_at = time.monotonic()
    assert other.gained.wait(5)
    assert other.gains[-1][0] - released_at <= PERIOD_S / 3 + 0.5
    assert other.gains[-1][2].released
    other.lease.close()


def test_a_sender_that_cannot_renew_stops_sending_and_says_so(store):
    a = _campaign(store, "a:1")
    assert a.gained.wait(5)
    real = a.lease._connect

    def refused() -> None:
        raise OSError("connection refused")

    a.lease._connect = refused  # the database is gone for this server
    a.lease._drop_connection()
    wait_until(lambda: a.losses, timeout_s=5, what="the loss of the lease")
    assert not a.lease.valid("t") and "t" not in a.lease.held()
    a.lease._connect = real
    wait_until(lambda: len(a.gains) == 2, timeout_s=5, what="the table back")
    assert a.gains[1][2].by_me
    a.lease.close()


def test_a_renewal_that_comes_back_late_but_still_holds_the_row_is_no_loss(store):
    """On a loaded machine a step can take longer than the period. The rows are still this
    server's (a take writes its holder, and the renewal found this one's), so nobody else
    can have sent: sends pause (the validity is over) and resume with the next renewal; the
    tables are not closed, the streams not ended, nothing held back as after a takeover."""
    a = _campaign(store, "a:1")
    assert a.gained.wait(5)
    real = a.lease._renew_and_read
    seen: list[bool] = []

    def slow(began: float, mine: set[str]):
        if not seen:
            time.sleep(PERIOD_S * 1.3)  # the step stalls past the validity it will give
            seen.append(a.lease.valid("t"))
        return real(began, mine)

    a.lease._renew_and_read = slow  # type: ignore[method-assign]
    wait_until(lambda: seen, timeout_s=5, what="the slow step")
    wait_until(lambda: a.lease.valid("t"), timeout_s=5, what="a valid lease after the slow step")
    time.sleep(PERIOD_S)  # a few more renewals
    assert seen == [False], "sends were not fenced while the renewal was late"
    assert a.losses == [] and len(a.gains) == 1, (a.losses, a.gains)
    assert a.lease.late_renewals == 1
    a.lease.close()


def test_the_tables_are_spread_over_the_servers_and_follow_them_as_they_join_and_leave(store):
    """Four tables and the table events: one server sends all five; a second takes its
    share (3 and 2, no unit twice); a third too (2, 2, 1); one that leaves cleanly hands its
    units over at once, one that dies within two periods; the last one sends all again."""
    units = {"t1", "t2", "t3", "t4", CAPTURE}
    a = _campaign(store, "a:1", units)
    wait_until(lambda: a.held() == units, what="a sends everything")
    b = _campaign(store, "b:2", units)
    c = None

    def spread(*cs: Candidate) -> list[int]:
        held = [x.held() for x in cs]
        together = set().union(*held)
        assert sum(len(h) for h in held) == len(together), f"a unit sent twice: {held}"
        return sorted(len(h) for h in held) if together == units else []

    wait_until(lambda: spread(a, b) == [2, 3], what="a and b share the units (3 and 2)")
    c = _campaign(store, "c:3", units)
    wait_until(lambda: spread(a, b, c) == [1, 2, 2], what="a, b and c share them (2, 2, 1)")
    # each names the sender of every unit it does not send
    for x in (a, b, c):
        for other in (a, b, c):
            for u in other.held():
                wait_until(
                    lambda x=x, u=u, other=other: x.lease.sender(u) == other.lease.address,
                    what=f"{x.lease.address} names {other.lease.address} for {u!r}",
                )
    left = time.monotonic()
    c_units = c.held()
    c.lease.close()
    wait_until(lambda: spread(a, b) == [2, 3], timeout_s=5, what="c's units taken by a and b")
    took = time.monotonic() - left
    assert took <= PERIOD_S + 0.5, f"a clean leave took {took:.2f}s to hand over"
    assert all(t.released for _, u, t in a.gains + b.gains if u in c_units and _ >= left)
    died = time.monotonic()
    a_units = a.held()
    a.crash()
    wait_until(lambda: b.held() == units, timeout_s=5, what="b takes over a's units")
    took = time.monotonic() - died
    assert took <= 2 * PERIOD_S + 0.3, f"a crash took {took:.2f}s to hand over"
    assert a_units and all(not t.released for _, u, t in b.gains if u in a_units and _ >= died)
    b.lease.close()


def test_a_server_that_joins_takes_its_share_only_once_the_holder_gave_it_back(store):
    """A hand-over is clean: the holder stops sending (on_loss) before the row is given
    back released, so the new sender waits for nothing, and no unit is ever valid on two
    servers at once."""
    units = {f"t{i}" for i in range(6)}
    a = _campaign(store, "a:1", units)
    wait_until(lambda: a.held() == units, what="a sends everything")
    overlap: list[str] = []
    stop = threading.Event()

    def watch(b: Candidate) -> None:
        while not stop.is_set():
            overlap.extend(u for u in units if a.lease.valid(u) and b.lease.valid(u))
            time.sleep(0.001)

    b = Candidate(store, "b:2", units)
    watcher = threading.Thread(target=watch, args=(b,), daemon=True)
    watcher.start()
    b.lease.prepare()
    b.lease.start()
    wait_until(lambda: len(b.held()) == 3 and len(a.held()) == 3, what="b takes its share")
    stop.set()
    watcher.join(5)
    assert not overlap, f"valid on both servers at once: {sorted(set(overlap))}"
    handed = {u for _, u, _s in a.losses}
    assert handed == b.held()
    assert all(s == "b:2" for _, _u, s in a.losses)  # clients are sent to the new sender
    assert all(t.released and t.previous == a.lease.holder for _, _u, t in b.gains)
    a.lease.close()
    b.lease.close()


def test_while_a_server_of_an_earlier_version_holds_the_single_lease_nothing_is_taken(store):
    """An upgrade: the old server (one lease for the whole database, msgtable_lease) sends
    every table; a new one must not send beside it, and takes over once it stops."""
    db = sa.create_engine(store.url.set(database=store.database), isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        conn.exec_driver_sql(LEASE_DDL)
        conn.exec_driver_sql(
            "INSERT INTO msgtable_lease (name, holder, address, expires, released) "
            "VALUES ('sender', 'old', 'old:1', UTC_TIMESTAMP(6) + INTERVAL 2 SECOND, 0)"
        )
    a = _campaign(store, "a:1")
    wait_until(lambda: a.lease.old_lease_holder == "old:1", what="a reads the old lease")
    assert not a.gained.is_set() and a.lease.sender("t") == "old:1"
    assert a.gained.wait(5), "the old lease ended and the table was not taken"
    a.lease.close()
    db.dispose()


class Recording:
    """A connection whose statements are recorded (the lease's round trips)."""

    def __init__(self, conn, statements: list[str]) -> None:
        self._conn, self._statements = conn, statements

    def __getattr__(self, name: str):
        return getattr(self._conn, name)

    def commit(self) -> None:
        self._statements.append("COMMIT")
        self._conn.commit()

    def rollback(self) -> None:
        self._statements.append("ROLLBACK")
        self._conn.rollback()

    def cursor(self):
        cur, statements = self._conn.cursor(), self._statements

        class Cursor:
            def __getattr__(self, name: str):
                return getattr(cur, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                cur.close()

            def execute(self, sql: str, args=None):
                statements.append(" ".join(sql.split()[:2]))
                return cur.execute(sql, args)

        return Cursor()


def test_a_senders_renewal_is_one_transaction_that_locks_no_other_servers_row(store):
    """The renewal, every third of the period, is the hot path: this server's leases and
    presence renewed and every row read, in one transaction and its commit; no SELECT ...
    FOR UPDATE holding a row's lock across round trips (only a take locks, its one row)."""
    statements: list[str] = []
    connect = connector(store.url, store.database)
    a = Candidate(store, "a:1")
    a.lease._connect = lambda: Recording(connect(), statements)
    a.lease.prepare()
    a.lease.start()
    assert a.gained.wait(5)
    time.sleep(PERIOD_S / 2)
    statements.clear()
    time.sleep(PERIOD_S * 2)  # several renewals
    steps = len(statements) // 4
    renewals = statements[: steps * 4]
    a.lease.close()
    step = ["UPDATE msgtable_placement", "INSERT INTO", "SELECT kind,", "COMMIT"]
    assert steps >= 4, statements
    assert renewals == step * steps, statements
    # close(): the table given back and the presence ended, in one commit
    assert statements[steps * 4 :] == [
        "UPDATE msgtable_placement",
        "UPDATE msgtable_placement",
        "COMMIT",
    ], statements


@contextmanager
def _server(
    dsn: str, discovery_interval_s: float = 0.3, campaign: bool = True
) -> Iterator[tuple[MessageEngine, MessagingServer]]:
    """An engine and its gRPC server on the database, sharing its tables (``campaign``;
    else it waits until the test calls ``engine.campaign``)."""
    engine = assemble_dsn(dsn, discovery_interval_s=discovery_interval_s, lease_period_s=PERIOD_S)
    engine.open()
    server = MessagingServer(engine, "127.0.0.1:0")
    server.start()
    if campaign:
        engine.campaign(server.address)
    try:
        yield engine, server
    finally:
        server.stop(0.5)
        engine.close()


def _settled(*engines: MessageEngine, table: str = "jobs") -> None:
    """Wait until every engine has read every server and exactly one sends ``table``."""

    def settled() -> bool:
        counts = [len(e._tenure.lease.servers()) for e in engines if e._tenure.lease is not None]
        return (
            counts == [len(engines)] * len(engines)
            and [e.sends(table) for e in engines].count(True) == 1
        )

    wait_until(settled, what=f"one of the servers sends {table}")
    time.sleep(PERIOD_S)  # a hand-over in progress ends within a step
    wait_until(settled, what=f"one of the servers sends {table}, still")


def test_two_servers_on_one_database_one_sends_a_table_and_the_other_redirects(db_dsn):
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        conn.exec_driver_sql(current_layout_ddl("jobs", comment(vt_poller_interval=0.1)))
    with _server(db_dsn) as (first, first_server), _server(db_dsn) as (second, second_server):
        _settled(first, second)
        (sender, sender_server), (other, other_server) = sorted(
            [(first, first_server), (second, second_server)], key=lambda p: not p[0].sends("jobs")
        )
        assert other.sender("jobs") == sender_server.address
        # ListTables of either names the sender (msgtable tables says "sent by")
        for at in (other_server, sender_server):
            with Client(at.address) as asking:
                listed = {t.name: t.sender for t in asking.list_tables()}
            assert listed["jobs"] == sender_server.address, (at.address, listed)
        # the other answers UNAVAILABLE with the sender's address in the metadata
        with grpc.insecure_channel(other_server.address) as channel:
            stub = pb_grpc.MessagingStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                next(stub.MessageStream(pb.MessageStreamRequest(name="jobs"), timeout=5))
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
        assert (LEADER_METADATA_KEY, sender_server.address) in caught.value.trailing_metadata()
        # a client given both addresses, the other first, ends up at the sender
        with Client(f"{other_server.address},{sender_server.address}") as client:
            c = Collector(client, "jobs")
            assert c.subscription.target == sender_server.address
            with db.connect() as conn:
                conn.exec_driver_sql("insert into jobs(id, message) values (1, 'a'), (2, 'b')")
            got = c.take(2)
            assert client.ack("jobs", [m.id for m in got]) == 2
            # the sender shuts down cleanly: the other takes over at once and the same
            # subscription goes on there
            sender_server.stop(0.5)
            sender.close()
            wait_until(lambda: other.sends("jobs"), timeout_s=2 * PERIOD_S + 2, what="takeover")
            with db.connect() as conn:
                conn.exec_driver_sql("insert into jobs(id, message) values (3, 'c')")
            (m,) = c.take(1, timeout_s=15)
            assert m.id == 3 and c.subscription.target == other_server.address
            assert m.ack() == 1
            c.close()
    db.dispose()


def test_a_verb_sent_to_the_other_server_goes_to_the_sender_and_counts_the_unwritten_send(
    db_dsn,
):
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        conn.exec_driver_sql(current_layout_ddl("jobs", comment(vt_poller_interval=0.1)))
        conn.exec_driver_sql("insert into jobs(id, message) values (1, 'a')")
    with _server(db_dsn) as (first, first_server), _server(db_dsn) as (second, second_server):
        _settled(first, second)
        sender_server, other_server = (
            (first_server, second_server) if first.sends("jobs") else (second_server, first_server)
        )
        with Client(sender_server.address) as at_sender:
            c = Collector(at_sender, "jobs")
            (m,) = c.take(1)  # sent by the sender, its postpone not written yet
            with Client(other_server.address) as at_other:
                # the other answers NotLeader; the client follows it to the sender, which
                # counts the send it has not written yet
                assert at_other.release("jobs", [m.id], delay_s=60) == 1
            with db.connect() as conn:
                epoch = conn.exec_driver_sql("select epoch from jobs").scalar()
            assert epoch == 1
            c.close()
    db.dispose()


@pytest.mark.parametrize("subscription", ["", "eager", "lazy"])
@pytest.mark.parametrize("verb", ["postpone", "release"])
def test_a_write_that_reaches_the_database_after_the_table_moved_on_writes_nothing(
    db_dsn, subscription, verb
):
    """The chaos test's "in flight to two subscribers at once": a sender's postpone (or a
    subscriber's release it took) stuck in a slow link (held in a proxy) reaches the
    database after the next sender took the table, waited its hold and sent the row again,
    before writing that send's postpone. The late write must change nothing: it would
    count the new send as its own (epoch 0 -> 1) and make the row due at once (the
    postpone's time_next, from the first send, is past; the release's is now), so the new
    sender would send it again while it is in flight. Fenced: the placement row must still
    name the sender that writes it. For the default group and a subscription."""
    aw = 2.0
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    table = "jobs" if not subscription else f"jobs__{subscription}"
    with db.connect() as conn:
        conn.exec_driver_sql(
            current_layout_ddl(
                "jobs",
                comment(
                    vt_poller_interval=0.1,
                    vt_ack_wait=aw,
                    vt_min_backoff=0.1,
                    vt_postpone_after=0.7,
                ),
            )
        )
    url = sa.make_url(db_dsn)
    answers: list[int] = []
    with FaultProxy(url.host or "127.0.0.1", url.port or 3306) as link:
        proxied = url.set(host="127.0.0.1", port=link.port).render_as_string(hide_password=False)
        with _server(proxied) as (first, first_server), Client(first_server.address) as at_first:
            wait_until(lambda: first.sends("jobs"), what="the first server sends jobs")
            kwargs = {}
            if subscription:
                at_first.create_subscription("jobs", subscription, **SUBSCRIPTION[subscription])
                kwargs = {"subscription": subscription}
            with db.connect() as conn:
                conn.exec_driver_sql("insert into jobs(id, message) values (1, 'a')")
            with _server(db_dsn) as (second, second_server):
                _settled(first, second)
                assert first.sends("jobs"), "the table moved before the test began"
                c1 = Collector(at_first, "jobs", **kwargs)
                (m,) = c1.take(1)
                # from now on what the first server writes waits in the link: its postpone
                # (0.7 s after the send), the release, its lease's renewals
                link.hold()
                caller = threading.Thread(target=lambda: answers.append(m.release(0.0)))
                if verb == "release":
                    caller.start()
                    time.sleep(0.3)  # at the first server, its statement held
                c1.close()
                wait_until(lambda: second.sends("jobs"), timeout_s=10, what="the takeover")
                with Client(second_server.address) as at_second:
                    c2 = Collector(at_second, "jobs", **kwargs)
                    (again,) = c2.take(1, timeout_s=15)  # after its hold (an ack wait)
                    held = link.release()  # the first server's writes land now
                    assert again.id == m.id and held > 0
                    time.sleep(aw - 0.5)  # within the second send's ack wait
                    arrivals = c2.arrived_ns[again.id]
                    with db.connect() as conn:
                        epoch = conn.exec_driver_sql(f"select epoch from {table}").scalar()
                    c2.close()
                if verb == "release":
                    caller.join(10)
                    assert answers == [0], f"the late release answered {answers}"
                assert len(arrivals) == 1, (
                    f"message 1 was sent again {(arrivals[1] - arrivals[0]) / 1e9:.2f}s after "
                    f"the second server's send, within its ack wait ({aw}s): the first "
                    f"server's late {verb} made it due"
                )
                assert epoch == 1, (
                    f"epoch {epoch}: the second server's send should be counted once, by its "
                    f"own postpone, and the first server's late {verb} write nothing"
                )
    db.dispose()


def test_a_sender_cut_off_mid_take_does_not_keep_the_row_locked(store):
    """A server's link to the database goes silent in the middle of a take (its SELECT ...
    FOR UPDATE done, its UPDATE and COMMIT never arrive): its transaction holds the row's
    lock on the database's side. The database must end that session soon (the placement
    connection's wait_timeout, lease.session_wait_timeout_s), not after its default of 8
    hours: the other server takes over within that and two periods."""
    url = store.url
    with FaultProxy(url.host or "127.0.0.1", url.port or 3306) as proxy:
        proxied = url.set(host="127.0.0.1", port=proxy.port)
        gained = threading.Event()
        a = Placement(
            connector(proxied, store.database),
            "a:1",
            PERIOD_S,
            units=lambda: {"t"},
            on_gain=lambda _u, _t: gained.set(),
            on_loss=lambda _u, _s: True,
        )
        a.prepare()
        a.start()
        assert gained.wait(5)
        a._stop.set()  # its thread stops; its connection stays as it is
        a._wake.set()
        assert a._thread is not None
        a._thread.join(5)
        with a._cursor() as cur:  # a take's first statement: the row is locked
            cur.execute(
                "SELECT holder FROM msgtable_placement WHERE kind = 'table' AND name = 't' "
                "FOR UPDATE"
            )
        proxy.blackhole = True  # the rest of the take never arrives
        cut_at = time.monotonic()
        b = _campaign(store, "b:2")
        bound = session_wait_timeout_s(PERIOD_S) + 2 * PERIOD_S + 1
        took = b.gained.wait(bound + 10) and b.gains[0][0] - cut_at
        assert took is not False, (
            f"b did not take the table over within {bound + 10:.1f}s of the sender's cut: "
            "the sender's session keeps the row locked"
        )
        assert took <= bound, f"takeover took {took:.2f}s (bound {bound:.1f}s)"
        b.lease.close()
        proxy.heal()


def test_under_traffic_the_tables_rebalance_as_servers_join_and_leave_and_nothing_is_lost(
    db_dsn,
):
    """Four tables, a producer and a subscriber per table (one client naming every server)
    acking what it gets: two servers share the tables (two each), a third joins and takes
    its share, one leaves cleanly and the other two take its tables. Every message is
    delivered and acked, none twice (each hand-over writes its postpones before the row is
    given back), and each table has one sender at every step."""
    tables = ["t1", "t2", "t3", "t4"]
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        for t in tables:
            conn.exec_driver_sql(
                current_layout_ddl(t, comment(vt_poller_interval=0.2, vt_ack_wait=30))
            )
    stop = threading.Event()
    inserted: dict[str, int] = dict.fromkeys(tables, 0)

    def produce() -> None:
        n = 0
        with db.connect() as conn:
            while not stop.is_set():
                n += 1
                t = tables[n % len(tables)]
                conn.exec_driver_sql(f"insert into {t}(id, message) values ({n}, 'm')")
                inserted[t] += 1
                time.sleep(0.005)

    def senders(*engines: MessageEngine) -> list[int]:
        """How many tables each engine sends, once each table has exactly one sender."""
        counts = [[e.sends(t) for e in engines].count(True) for t in tables]
        return [sum(e.sends(t) for t in tables) for e in engines] if counts == [1] * 4 else []

    with (
        _server(db_dsn) as (a, a_server),
        _server(db_dsn) as (b, b_server),
        _server(db_dsn, campaign=False) as (c, c_server),  # c joins later
    ):
        wait_until(lambda: sorted(senders(a, b)) == [2, 2], what="a and b share the tables")
        addresses = f"{a_server.address},{b_server.address},{c_server.address}"
        with Client(addresses) as client:
            collectors = {t: Collector(client, t) for t in tables}
            acked: dict[str, set[int]] = {t: set() for t in tables}
            got: dict[str, list[int]] = {t: [] for t in tables}

            finished = threading.Event()

            def ack_all() -> None:
                while not finished.is_set():
                    for t, col in collectors.items():
                        while not col.messages.empty():
                            m = col.messages.get()
                            got[t].append(int(m.id))
                            if m.ack() == 1:
                                acked[t].add(int(m.id))
                    time.sleep(0.01)

            producer = threading.Thread(target=produce, daemon=True)
            acker = threading.Thread(target=ack_all, daemon=True)
            producer.start()
            acker.start()
            time.sleep(2)
            c.campaign(c_server.address)  # c joins
            # under traffic a hand-over waits for the holder's postpones: on a slow machine
            # beside the rest of the suite that took over 10 s (how fast one is: the tests
            # above, without traffic)
            wait_until(
                lambda: sorted(senders(a, b, c)) == [1, 1, 2],
                timeout_s=30,
                what=lambda: (
                    "c takes its share: each table's senders (a, b, c) "
                    f"{ {t: [e.sends(t) for e in (a, b, c)] for t in tables} }"
                ),
            )
            time.sleep(2)
            b_server.stop(0.5)  # b leaves cleanly
            b.close()
            wait_until(
                lambda: sorted(senders(a, c)) == [2, 2],
                timeout_s=30,
                what=lambda: (
                    "a and c take b's tables: each table's senders (a, c) "
                    f"{ {t: [e.sends(t) for e in (a, c)] for t in tables} }"
                ),
            )
            time.sleep(2)
            stop.set()
            producer.join(10)

            def all_acked() -> bool:
                with db.connect() as conn:
                    return all(
                        conn.exec_driver_sql(
                            f"select count(*) from {t} where time_acked is null"
                        ).scalar()
                        == 0
                        for t in tables
                    )

            wait_until(
                all_acked,
                timeout_s=30,
                what=lambda: (
                    f"every message acked: inserted {inserted}, acked "
                    f"{ {t: len(v) for t, v in acked.items()} }"
                ),
            )
            time.sleep(1)  # anything sent twice would come by now (nothing is due)
            finished.set()
            acker.join(10)
            for t in tables:
                assert sorted(set(got[t])) == sorted(acked[t]), t
                assert len(acked[t]) == inserted[t], (t, len(acked[t]), inserted[t])
                twice = [i for i in set(got[t]) if got[t].count(i) > 1]
                assert not twice, f"{t}: delivered twice: {twice[:10]}"
            for col in collectors.values():
                col.subscription.close()
    db.dispose()


def test_a_table_one_server_found_is_sent_within_steps_by_the_server_it_is_assigned_to(db_dsn):
    """Servers discover tables at their own pace (--discovery-interval, long here): a table
    one found gets a row in the placement at once, and the server it is assigned to, which
    has not found it yet, discovers it at its next step instead of its next discovery."""
    with (
        _server(db_dsn, discovery_interval_s=600) as (a, _a_server),
        _server(db_dsn, discovery_interval_s=600) as (b, _b_server),
    ):
        pa, pb = a._tenure.lease, b._tenure.lease
        assert pa is not None and pb is not None
        wait_until(lambda: len(pa.servers()) == len(pb.servers()) == 2, what="both servers")
        name = next(
            f"t{i}" for i in range(100) if rank(pb.holder, f"t{i}") > rank(pa.holder, f"t{i}")
        )
        db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
        with db.connect() as conn:
            conn.exec_driver_sql(current_layout_ddl(name, comment(vt_poller_interval=0.1)))
        db.dispose()
        a.refresh()  # a finds it; b would only at its next discovery, 600 s away
        assert a.list_tables() and not a.sends(name)
        wait_until(
            lambda: b.sends(name),
            timeout_s=4 * PERIOD_S + 2,
            what=f"{name} sent by b, the server it is assigned to",
        )


def test_a_step_that_fails_after_a_take_still_tells_of_the_take(store):
    """A step takes several units, one transaction each; the database failing on a later
    one must not leave an earlier one held in the table but never started here (renewed
    for ever, never sent)."""
    units = {"t1", "t2", "t3"}
    a = Candidate(store, "a:1", units)
    real = a.lease._take
    calls: list[str] = []

    def flaky(unit: str):
        calls.append(unit)
        if len(calls) == 2:
            raise OSError("the database went away mid-step")
        return real(unit)

    a.lease._take = flaky  # type: ignore[method-assign]
    a.lease.prepare()
    a.lease.start()
    wait_until(lambda: a.held() == units, what="a holds every unit")
    time.sleep(PERIOD_S)
    gained = {u for _, u, _t in a.gains}
    assert gained == a.held(), f"held but never started: {sorted(a.held() - gained)}"
    a.lease.close()


def test_rows_ended_long_ago_are_forgotten_and_recent_ones_kept(store):
    """Every FORGET_EVERY steps a server deletes the rows whose lease or presence ended
    FORGET_AFTER_S ago (dropped tables, servers restarted under a new id), not others."""
    db = sa.create_engine(store.url.set(database=store.database), isolation_level="AUTOCOMMIT")
    a = Candidate(store, "a:1")
    a.lease.prepare()
    with db.connect() as conn:
        for kind, name, ago_s in [
            ("server", "gone", FORGET_AFTER_S + 60),
            ("table", "dropped", FORGET_AFTER_S + 60),
            ("table", "lately", FORGET_AFTER_S - 600),
        ]:
            conn.exec_driver_sql(
                "INSERT INTO msgtable_placement (kind, name, holder, address, expires, released) "
                "VALUES (%s, %s, 'x', 'x:1', UTC_TIMESTAMP(6) - INTERVAL %s SECOND, 1)",
                (kind, name, ago_s),
            )
    a.lease._steps = FORGET_EVERY - 1  # the first step is the one that forgets
    a.lease.start()
    assert a.gained.wait(5)
    with db.connect() as conn:
        names = {r[0] for r in conn.exec_driver_sql("SELECT name FROM msgtable_placement")}
    assert "gone" not in names and "dropped" not in names
    assert {"lately", "t", a.lease.holder} <= names
    a.lease.close()
    db.dispose()


# -- a client without retries, and the clients' hand-over (issue 39, item 2) ------------------
def _tables(db_dsn: str, *names: str) -> None:
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        for name in names:
            conn.exec_driver_sql(current_layout_ddl(name, comment(vt_poller_interval=0.1)))
    db.dispose()


def _insert(db_dsn: str, table: str, *ids: int) -> None:
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        for i in ids:
            conn.exec_driver_sql(f"insert into {table}(id, message) values ({i}, 'm')")
    db.dispose()


class AioReader:
    """An asyncio client's subscriber of ``table`` at ``target``, read (and acked) on a
    thread of its own, with its own event loop, into a queue until stop()."""

    def __init__(self, target: str, table: str) -> None:
        self.messages: queue.Queue[int] = queue.Queue()
        self.error: BaseException | None = None
        self.sub: aio.Subscriber | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_until_complete, args=(self._read(target, table),), daemon=True
        )
        self._thread.start()

    @property
    def target(self) -> str:
        return self.sub.target if self.sub is not None else ""

    async def _read(self, target: str, table: str) -> None:
        try:
            async with aio.Client(target) as client, client.subscribe(table) as sub:
                self.sub = sub
                async for m in sub:
                    await m.ack()
                    self.messages.put(int(m.id))
        except BaseException as exc:
            self.error = exc

    def take(self, n: int, timeout_s: float = 10.0) -> list[int]:
        got: list[int] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < n:
            try:
                got.append(self.messages.get(timeout=max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(
                    f"the aio subscriber got {got} of {n} in {timeout_s}s ({self.error!r})"
                ) from None
        return got

    def stop(self) -> None:
        if self.sub is not None:
            asyncio.run_coroutine_threadsafe(self.sub.close(), self._loop).result(10)
        self._thread.join(10)
        self._loop.close()


@pytest.mark.parametrize("kind", ["sync", "aio"])
def test_a_subscriber_follows_its_table_through_a_hand_over_with_one_warning(db_dsn, caplog, kind):
    """One server sends tables a and b; a second joins and b is handed over to it (a stays:
    its holder keeps its share). A subscriber of b at the first server (either Python
    client) follows it to the second, saying so in one warning line and nothing more: the
    second waits for b instead of answering "no server holds its lease now"."""
    _tables(db_dsn, "a", "b")
    with _server(db_dsn) as (first, first_server):
        wait_until(lambda: first.sends("a") and first.sends("b"), what="the first sends a and b")
        caplog.set_level(logging.DEBUG, logger="msgtable.client")
        if kind == "sync":
            client = Client(first_server.address)
            sync = Collector(client, "b")

            def take(n: int) -> list[int]:
                return [int(m.id) for m in sync.take(n, timeout_s=15) if m.ack() == 1]

            def target() -> str:
                return sync.subscription.target
        else:
            reader = AioReader(first_server.address, "b")
            take = partial(reader.take, timeout_s=15)

            def target() -> str:
                return reader.target

        try:
            _insert(db_dsn, "b", 1)
            assert take(1) == [1]
            caplog.clear()
            with _server(db_dsn) as (second, second_server):
                wait_until(
                    lambda: second.sends("b") and not first.sends("b"),
                    timeout_s=4 * PERIOD_S + 5,
                    what="b handed over to the second server",
                )
                _insert(db_dsn, "b", 2)
                assert take(1) == [2]
                assert target() == second_server.address
                said = [
                    r.getMessage()
                    for r in caplog.records
                    if r.name == "msgtable.client" and r.levelno >= logging.INFO
                ]
                assert len(said) == 1, said
                assert caplog.records and second_server.address in said[0], said
                warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
                assert [r.getMessage() for r in warned] == said, said
        finally:
            if kind == "sync":
                sync.subscription.close()
                client.close()
            else:
                reader.stop()


def test_a_raw_stream_at_the_server_a_table_is_handed_to_is_served_not_refused(db_dsn):
    """While b is handed over to the second server (its old holder stopped sending it, the
    new one has not taken it yet), a stream of b at the new one, without retries, waits for
    it and is served: it is never told to go back to the old holder, nor that nobody holds
    it."""
    _tables(db_dsn, "a", "b")
    with _server(db_dsn) as (first, _first_server):
        wait_until(lambda: first.sends("a") and first.sends("b"), what="the first sends a and b")
        _insert(db_dsn, "b", 1)
        with _server(db_dsn) as (second, second_server):
            # at once: the hand-over is only beginning (the second's first steps)
            with grpc.insecure_channel(second_server.address) as channel:
                stub = pb_grpc.MessagingStub(channel)
                call = stub.MessageStream(pb.MessageStreamRequest(name="b"), timeout=30)
                try:
                    assert next(call).fields
                    assert [r.values[0].int_value for r in next(call).rows] == [1]
                except grpc.RpcError as exc:
                    pytest.fail(f"refused: {exc.code().name}: {exc.details()}", pytrace=False)
                finally:
                    call.cancel()
            assert second.sends("b")


def test_a_redirect_never_names_a_holder_whose_lease_ran_out(store):
    """A server names another as a table's sender only while that one's lease, as last
    read, lasts by its own clock: once it ran out (its holder died), it names nobody until
    a step reads who sends the table now."""
    a = _campaign(store, "a:1")
    assert a.gained.wait(5)
    b = _campaign(store, "b:2")
    wait_until(lambda: b.lease.sender("t") == "a:1", what="b names a as the sender of t")
    b.lease._stop.set()  # b steps no more: it keeps what it last read
    b.lease._wake.set()
    assert b.lease._thread is not None
    b.lease._thread.join(5)
    a.crash()
    wait_until(
        lambda: b.lease.sender("t") == "",
        timeout_s=PERIOD_S + 1,
        what="b to stop naming a, whose lease ran out",
    )
    b.lease.close()


def test_a_fenced_store_writes_only_while_the_placement_row_names_its_server(store, db_dsn):
    """The fence's SQL on the database (MySQLStore.fence_as): a postpone, release, renew
    and reject change nothing while the table's placement row names another server, and
    do once it names this one."""
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        conn.exec_driver_sql(current_layout_ddl("jobs", comment()))
        conn.exec_driver_sql("insert into jobs(id, message) values (1, 'a'), (2, 'b'), (3, 'c')")
        conn.exec_driver_sql("insert into jobs(id, message) values (4, 'd')")
        conn.exec_driver_sql(PLACEMENT_DDL)
        conn.exec_driver_sql(
            f"insert into {PLACEMENT_TABLE} (kind, name, holder, address, expires) "
            "values ('table', 'jobs', 'b', 'b:2', utc_timestamp(6) + interval 1 hour), "
            "('capture', 'jobs', 'a', 'a:1', utc_timestamp(6) + interval 1 hour)"
        )
    (d,) = [d for d in store.discover() if d.name == "jobs"]
    cfg = load_table(d.name, d.comment, d.columns, d.unique_indexes)
    now = time.time_ns()
    later = now + 10**9

    def writes() -> list[object]:
        return [
            store.postpone(cfg, [1], 0, now, later),
            store.release(cfg, [2], later, None, {2: 0}),
            store.renew(cfg, [3], now, later, None, {3: 0}),
            store.bury(cfg, None, [4], now, None, {4: 0}),
        ]

    def epochs() -> list[int]:
        with db.connect() as conn:
            return [r[0] for r in conn.exec_driver_sql("select epoch from jobs order by id")]

    assert writes() == [1, 1, 1, [4]], "unfenced (a server alone): every write"
    store.fence_as("a")
    assert writes() == [0, 0, 0, []], "fenced by a row naming another server"
    assert epochs() == [1, 1, 1, 1]
    assert store.postpones_fenced == {"jobs": 1}, "the postpone the fence kept out: a count lost"
    with db.connect() as conn:
        conn.exec_driver_sql(f"update {PLACEMENT_TABLE} set holder = 'a' where kind = 'table'")
        conn.exec_driver_sql("update jobs set epoch = 0, time_next = 0, time_acked = null")
    assert writes() == [1, 1, 1, [4]], "fenced by a row naming this server"
    assert epochs() == [1, 1, 1, 1]
    assert store.postpone(cfg, [1], 0, now, later) == 0, "at another epoch: nothing to count"
    assert store.postpones_fenced == {"jobs": 1}, "a postpone that matched nothing, fence held"
    db.dispose()


def test_a_fenced_burial_locks_only_its_tables_placement_row(store, db_dsn):
    """A fenced burial's transaction reads its table's placement row locked (a take waits
    for it): that row alone, so a step renewing this server's presence or another table's
    lease meanwhile neither waits nor deadlocks (the fault suite logged hundreds of
    deadlocks when the read locked the whole placement table)."""
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        conn.exec_driver_sql(PLACEMENT_DDL)
        conn.exec_driver_sql(
            f"insert into {PLACEMENT_TABLE} (kind, name, holder, address, expires) values "
            "('table', 'jobs', 'a', 'a:1', utc_timestamp(6)), "
            "('table', 'other', 'a', 'a:1', utc_timestamp(6)), "
            "('server', 'a', 'a', 'a:1', utc_timestamp(6))"
        )
    burial = db.connect()
    stepper = db.connect()
    try:
        burial.exec_driver_sql("set session transaction isolation level read committed")
        burial.exec_driver_sql("begin")
        assert burial.exec_driver_sql(FENCED_READ, ("jobs", "a")).all() == [(1,)]
        stepper.exec_driver_sql("set session innodb_lock_wait_timeout = 1")
        for kind, name in (("server", "a"), ("table", "other")):
            stepper.exec_driver_sql(
                f"update {PLACEMENT_TABLE} set expires = utc_timestamp(6) "
                "where kind = %s and name = %s",
                (kind, name),
            )
        with pytest.raises(sa.exc.OperationalError, match="1205"):  # the table's own: waits
            stepper.exec_driver_sql(
                f"update {PLACEMENT_TABLE} set holder = 'b' where kind = 'table' and name = 'jobs'"
            )
    finally:
        burial.exec_driver_sql("rollback")
        burial.close()
        stepper.close()
        db.dispose()


def test_a_fenced_lazy_state_row_is_written_only_while_the_row_names_its_server(store, db_dsn):
    """A lazy subscription's postpone and verbs INSERT its state rows (msgtable.store.
    sequences.state_rows_sql): fenced, they are written only while the placement row names
    the server (a row there already counts as written then); an ack's are not fenced."""
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        conn.exec_driver_sql(current_layout_ddl("jobs", comment()))
        conn.exec_driver_sql(
            "create table jobs__lazy (id bigint primary key, priority tinyint, "
            "time_next bigint, epoch bigint, time_created bigint, time_acked bigint)"
        )
        conn.exec_driver_sql(PLACEMENT_DDL)
        conn.exec_driver_sql(
            f"insert into {PLACEMENT_TABLE} (kind, name, holder, address, expires) "
            "values ('table', 'jobs', 'b', 'b:2', utc_timestamp(6) + interval 1 hour)"
        )
    (d,) = [d for d in store.discover() if d.name == "jobs"]
    cfg = load_table(d.name, d.comment, d.columns, d.unique_indexes)
    state = dataclasses.replace(cfg, name="jobs__lazy", source="jobs")
    subs = store.subscription_store
    assert subs is not None
    now = time.time_ns()
    rows = [(1, 0, now, 1, now), (2, 0, now, 1, now)]
    store.fence_as("a")
    assert subs.write_state_rows(state, rows) == 0
    assert store.postpones_fenced == {"jobs": 2}, "the postpone's rows the fence kept out"
    assert subs.write_state_rows(state, [(3, 0, None, 1, now)], now) == 1, "an ack's: unfenced"
    assert subs.write_state_rows(state, [(4, 0, now, 0, now)]) == 0
    assert store.postpones_fenced == {"jobs": 2}, "a row parked before its send (epoch 0): none"
    with db.connect() as conn:
        ids = [r[0] for r in conn.exec_driver_sql("select id from jobs__lazy order by id")]
        assert ids == [3]
        conn.exec_driver_sql(f"update {PLACEMENT_TABLE} set holder = 'a' where name = 'jobs'")
    assert subs.write_state_rows(state, rows[:1]) == 1
    assert subs.write_state_rows(state, rows) == 2  # 1 there already: kept
    assert subs.write_state_rows(state, rows[:1]) == 1  # there: no row inserted, still held
    with db.connect() as conn:
        got = conn.exec_driver_sql("select id, epoch from jobs__lazy order by id").all()
        assert [tuple(r) for r in got] == [(1, 1), (2, 1), (3, 1)]
    db.dispose()
