"""The lease on a real MariaDB: one holder at a time, takeover once a holder stops renewing
(within two periods), an immediate hand-over when it gives the lease back, and two servers
on one database: the follower sends subscribers to the leader, the leader sends."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest
import sqlalchemy as sa

from msgtable.client import Client
from msgtable.engine import MessageEngine
from msgtable.errors import LEADER_METADATA_KEY
from msgtable.lease import Lease, Takeover, connector, session_wait_timeout_s
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.proto.msgtable.v1 import messaging_pb2_grpc as pb_grpc
from msgtable.server import MessagingServer
from msgtable.store import MySQLStore
from msgtable.tables import current_layout_ddl

from ..netfault import FaultProxy
from ..waiting import wait_until
from .helpers import Collector, comment

PERIOD_S = 0.6


class Candidate:
    """A Lease with callbacks that record what happened."""

    def __init__(self, store: MySQLStore, address: str) -> None:
        self.gains: list[tuple[float, Takeover]] = []
        self.losses: list[str] = []
        self.gained = threading.Event()
        self.lease = Lease(
            connector(store.url, store.database),
            address,
            PERIOD_S,
            on_gain=self._gain,
            on_loss=self.losses.append,
        )

    def _gain(self, takeover: Takeover) -> None:
        self.gains.append((time.monotonic(), takeover))
        self.gained.set()

    def crash(self) -> None:
        """Stop renewing without giving the lease back (as a killed process would)."""
        self.lease._stop.set()
        assert self.lease._thread is not None
        self.lease._thread.join(5)
        self.lease._drop_connection()


@pytest.fixture
def store(db_dsn: str) -> Iterator[MySQLStore]:
    s = MySQLStore.from_dsn(db_dsn)
    yield s
    s.close()


def _campaign(store: MySQLStore, address: str) -> Candidate:
    c = Candidate(store, address)
    c.lease.prepare()
    c.lease.start()
    return c


def test_one_holder_at_a_time_and_a_takeover_within_two_periods(store):
    a = _campaign(store, "a:1")
    assert a.gained.wait(5)
    b = _campaign(store, "b:2")
    wait_until(lambda: b.lease.leader_address == "a:1", what="b reads who leads")
    time.sleep(PERIOD_S * 2)
    assert not b.gained.is_set() and a.lease.valid() and not b.lease.valid()
    crashed_at = time.monotonic()
    a.crash()
    assert b.gained.wait(5)
    took, takeover = b.gains[0][0] - crashed_at, b.gains[0][1]
    assert took <= 2 * PERIOD_S, f"takeover took {took:.2f}s"
    assert takeover.previous == a.lease.holder and not takeover.released
    assert 0 <= takeover.ended_s_ago < PERIOD_S
    assert not a.lease.valid()  # the old holder's own clock ended it first
    b.lease.close(released=True)


def test_a_lease_given_back_is_taken_over_at_once_with_no_wait(store):
    a = _campaign(store, "a:1")
    assert a.gained.wait(5)
    b = _campaign(store, "b:2")
    wait_until(lambda: b.lease.leader_address == "a:1", what="b reads who leads")
    a.lease.close(released=True)
    released_at = time.monotonic()
    assert b.gained.wait(5)
    assert b.gains[0][0] - released_at <= PERIOD_S / 3 + 0.5
    assert b.gains[0][1].released
    b.lease.close(released=True)


def test_a_holder_that_cannot_renew_stops_sending_and_says_so(store):
    a = _campaign(store, "a:1")
    assert a.gained.wait(5)
    real = a.lease._connect

    def refused() -> None:
        raise OSError("connection refused")

    a.lease._connect = refused  # the database is gone for this server
    a.lease._drop_connection()
    wait_until(lambda: a.losses, timeout_s=5, what="the loss of the lease")
    assert not a.lease.valid() and not a.lease.held
    a.lease._connect = real
    wait_until(lambda: len(a.gains) == 2, timeout_s=5, what="the lease back")
    assert a.gains[1][1].by_me
    a.lease.close(released=True)


def test_a_renewal_that_comes_back_late_but_still_holds_the_row_is_no_loss(store):
    """On a loaded machine a step can take longer than the period. The row is still this
    server's (a takeover writes its holder), so nobody else can have sent: sends pause
    (the validity is over) and resume with the next renewal; the tables are not closed,
    the streams not ended, nothing held back as after a takeover."""
    a = _campaign(store, "a:1")
    assert a.gained.wait(5)
    real = a.lease._step
    seen: list[bool] = []

    def slow(began: float) -> Takeover | None:
        if not seen:
            time.sleep(PERIOD_S * 1.3)  # the step stalls past the validity it will give
            seen.append(a.lease.valid())
        return real(began)

    a.lease._step = slow  # type: ignore[method-assign]
    wait_until(lambda: seen, timeout_s=5, what="the slow step")
    wait_until(a.lease.valid, timeout_s=5, what="a valid lease again after the slow step")
    time.sleep(PERIOD_S)  # a few more renewals
    assert seen == [False], "sends were not fenced while the renewal was late"
    assert a.losses == [] and len(a.gains) == 1, (a.losses, a.gains)
    assert a.lease.late_renewals == 1
    a.lease.close(released=True)


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


def test_a_holders_renewal_is_one_update_and_its_commit(store):
    """The renewal, every third of the period, is the hot path: one conditional UPDATE and
    its commit, no SELECT ... FOR UPDATE holding the row's lock across round trips."""
    statements: list[str] = []
    connect = connector(store.url, store.database)
    a = Candidate(store, "a:1")
    a.lease._connect = lambda: Recording(connect(), statements)
    a.lease.prepare()
    a.lease.start()
    assert a.gained.wait(5)
    statements.clear()
    time.sleep(PERIOD_S * 2)  # several renewals
    a.lease.close(released=True)
    # the renewals, then close()'s release: each an UPDATE and its COMMIT, nothing else
    assert len(statements) >= 8, statements
    assert statements == ["UPDATE msgtable_lease", "COMMIT"] * (len(statements) // 2), statements


@contextmanager
def _server(dsn: str) -> Iterator[tuple[MessageEngine, MessagingServer]]:
    engine = MessageEngine.from_dsn(dsn, discovery_interval_s=0.3, lease_period_s=PERIOD_S)
    engine.open()
    server = MessagingServer(engine, "127.0.0.1:0")
    server.start()
    engine.campaign(server.address)
    try:
        yield engine, server
    finally:
        server.stop(0.5)
        engine.close()


def test_two_servers_on_one_database_one_sends_and_the_other_redirects(db_dsn):
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        conn.exec_driver_sql(current_layout_ddl("jobs", comment(vt_poller_interval=0.1)))
    with _server(db_dsn) as (first, first_server):
        wait_until(lambda: first.leading, what="the first server leads")
        with _server(db_dsn) as (second, second_server):
            wait_until(lambda: second.list_tables(), what="the second server's discovery")
            assert not second.leading
            # the follower answers UNAVAILABLE with the leader's address in the metadata
            with grpc.insecure_channel(second_server.address) as channel:
                stub = pb_grpc.MessagingStub(channel)
                with pytest.raises(grpc.RpcError) as caught:
                    next(stub.MessageStream(pb.MessageStreamRequest(name="jobs"), timeout=5))
            assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
            assert (LEADER_METADATA_KEY, first_server.address) in caught.value.trailing_metadata()
            # a client given both addresses, follower first, ends up at the leader
            targets = f"{second_server.address},{first_server.address}"
            with Client(targets) as client:
                c = Collector(client, "jobs")
                assert c.subscription.target == first_server.address
                with db.connect() as conn:
                    conn.exec_driver_sql("insert into jobs(id, message) values (1, 'a'), (2, 'b')")
                got = c.take(2)
                assert client.ack("jobs", [m.id for m in got]) == 2
                # the leader shuts down cleanly: the follower takes over at once and the
                # same subscription goes on there
                first_server.stop(0.5)
                first.close()
                wait_until(lambda: second.leading, timeout_s=2 * PERIOD_S + 2, what="takeover")
                with db.connect() as conn:
                    conn.exec_driver_sql("insert into jobs(id, message) values (3, 'c')")
                (m,) = c.take(1, timeout_s=15)
                assert m.id == 3 and c.subscription.target == second_server.address
                assert m.ack() == 1
                c.close()
    db.dispose()


def test_a_verb_sent_to_the_follower_goes_to_the_leader_and_counts_the_unwritten_send(db_dsn):
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        conn.exec_driver_sql(current_layout_ddl("jobs", comment(vt_poller_interval=0.1)))
        conn.exec_driver_sql("insert into jobs(id, message) values (1, 'a')")
    with _server(db_dsn) as (first, first_server):
        wait_until(lambda: first.leading, what="the first server leads")
        with _server(db_dsn) as (second, second_server):
            wait_until(lambda: second.list_tables(), what="the second server's discovery")
            with Client(first_server.address) as at_leader:
                c = Collector(at_leader, "jobs")
                (m,) = c.take(1)  # sent by the leader, its postpone not written yet
                with Client(second_server.address) as at_follower:
                    # the follower answers NotLeader; the client follows it to the leader,
                    # which counts the send it has not written yet
                    assert at_follower.release("jobs", [m.id], delay_s=60) == 1
                with db.connect() as conn:
                    epoch = conn.exec_driver_sql("select epoch from jobs").scalar()
                assert epoch == 1
                c.close()
    db.dispose()


def test_a_holder_cut_off_mid_step_does_not_keep_the_lease_row_locked(store):
    """The holder's link to the database goes silent in the middle of a step (its SELECT ...
    FOR UPDATE done, its UPDATE and COMMIT never arrive): its transaction holds the lease
    row's lock on the database's side. The database must end that session soon (the lease
    connection's wait_timeout, lease.session_wait_timeout_s), not after its default of 8
    hours: the other server takes over within that and two periods."""
    url = store.url
    with FaultProxy(url.host or "127.0.0.1", url.port or 3306) as proxy:
        proxied = url.set(host="127.0.0.1", port=proxy.port)
        gained = threading.Event()
        a = Lease(
            connector(proxied, store.database),
            "a:1",
            PERIOD_S,
            on_gain=lambda _: gained.set(),
            on_loss=lambda _: None,
        )
        a.prepare()
        a.start()
        assert gained.wait(5)
        a._stop.set()  # its thread stops; its connection stays as it is
        assert a._thread is not None
        a._thread.join(5)
        with a._cursor() as cur:  # a step's first statement: the row is locked
            cur.execute("SELECT holder FROM msgtable_lease WHERE name = 'sender' FOR UPDATE")
        proxy.blackhole = True  # the rest of the step never arrives
        cut_at = time.monotonic()
        b = _campaign(store, "b:2")
        bound = session_wait_timeout_s(PERIOD_S) + 2 * PERIOD_S + 1
        took = b.gained.wait(bound + 10) and b.gains[0][0] - cut_at
        assert took is not False, (
            f"b did not take the lease over within {bound + 10:.1f}s of the holder's cut: "
            "the holder's session keeps the lease row locked"
        )
        assert took <= bound, f"takeover took {took:.2f}s (bound {bound:.1f}s)"
        b.lease.close(released=True)
        proxy.heal()
