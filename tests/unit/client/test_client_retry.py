"""The client's retries over real gRPC channels (fake engines behind real servers): a
subscription that subscribes again when its stream breaks, redirects to the leader a
NotLeader answer names, gives up after retry_for_s, and acks that retry passing errors."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from msgtable.client import Client, router
from msgtable.core.retry import Retry
from msgtable.errors import NotLeader, ResourceExhausted, TableNotFound, Unavailable
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.server.servicer import MessagingServer
from tests.unit.server.test_server import WAIT_S, FakeEngine


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(router, "RETRY_MIN_S", 0.01)
    monkeypatch.setattr(router, "RETRY_MAX_S", 0.05)


def _next_in_thread(sub: object) -> tuple[threading.Event, list[object]]:
    got: list[object] = []
    done = threading.Event()

    def run() -> None:
        try:
            got.append(next(sub))  # type: ignore[call-overload]
        except BaseException as exc:
            got.append(exc)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, got


def test_a_stream_that_breaks_is_opened_again_and_iteration_goes_on(engine, server):
    with Client(server.address, timeout_s=WAIT_S) as c, c.subscribe("t") as sub:
        first = engine.next_subscriber()
        first.put([(1, "a", None)])
        assert next(sub).id == 1
        first.end(Unavailable("database unavailable: lost connection"))
        done, got = _next_in_thread(sub)
        second = engine.next_subscriber()  # the client subscribed again by itself
        second.put([(2, "b", None)])
        assert done.wait(WAIT_S)
        assert got[0].id == 2  # type: ignore[attr-defined]
        assert sub.reconnects == 1
        assert len(engine.subscribe_calls) == 2


def test_a_passing_error_at_subscribe_is_retried_with_backoff(engine, server):
    engine.subscribe_errors = [
        Unavailable("database unavailable"),
        ResourceExhausted("table t already has 1 subscribers"),
    ]
    with Client(server.address, timeout_s=WAIT_S) as c, c.subscribe("t") as sub:
        engine.next_subscriber().put([(7, "x", None)])
        assert next(sub).id == 7
        assert len(engine.subscribe_calls) == 3
        assert sub.reconnects == 0  # the first stream, after two refusals


def test_an_error_that_would_come_again_is_raised_at_once(engine, server):
    with Client(server.address, timeout_s=WAIT_S) as c:
        engine.subscribe_error = TableNotFound("message table 't' not found")
        with pytest.raises(TableNotFound):
            c.subscribe("t")
        assert len(engine.subscribe_calls) == 1
        engine.subscribe_error = None
        sub = c.subscribe("t")
        engine.next_subscriber().end(TableNotFound("message table 't' was dropped"))
        time.sleep(0.1)
        with pytest.raises(TableNotFound, match="dropped"):
            next(sub)
        assert len(engine.subscribe_calls) == 2
        sub.close()


def test_a_subscription_gives_up_after_retry_for_s(engine, server):
    engine.subscribe_error = Unavailable("database unavailable")
    began = time.monotonic()
    with (
        Client(server.address, timeout_s=WAIT_S, retry_for_s=0.3) as c,
        pytest.raises(Unavailable, match=r"gave up after 0\.3s"),
    ):
        c.subscribe("t")
    assert 0.3 <= time.monotonic() - began < WAIT_S
    assert len(engine.subscribe_calls) >= 3


def test_close_stops_a_subscription_that_is_retrying(engine, server):
    with Client(server.address, timeout_s=WAIT_S) as c:
        sub = c.subscribe("t")
        engine.subscribe_error = Unavailable("database unavailable")
        engine.next_subscriber().end(Unavailable("database unavailable"))
        done, got = _next_in_thread(sub)
        time.sleep(0.2)  # it is retrying now
        assert not done.is_set()
        sub.close()
        assert done.wait(WAIT_S)
        assert isinstance(got[0], StopIteration)


def test_not_leader_sends_the_subscription_and_its_acks_to_the_leader(engine, server):
    follower_engine = FakeEngine()
    follower_engine.subscribe_error = NotLeader(
        "not the leader of keyspace app", leader=server.address
    )
    follower_engine.ack_error = NotLeader("not the leader", leader=server.address)
    follower = MessagingServer(follower_engine, "127.0.0.1:0", max_workers=8)
    follower.start()
    try:
        with Client(follower.address, timeout_s=WAIT_S) as c, c.subscribe("t") as sub:
            assert sub.target == server.address
            assert c.leader == server.address
            engine.next_subscriber().put([(3, "c", None)])
            message = next(sub)
            engine.ack_result = 1
            assert message.ack() == 1
            assert sub.ack_async([message]).result(WAIT_S) is None
            assert [a[2] for a in engine.acks] == [[3], [3]]
            assert len(follower_engine.subscribe_calls) == 1
            assert c.ack("t", [4]) == 1  # the client's own calls go to the leader too
            assert follower_engine.acks == []
    finally:
        follower.stop(0)


def test_a_dead_leader_sends_the_client_back_to_its_targets(engine, server):
    follower_engine = FakeEngine()
    follower = MessagingServer(follower_engine, "127.0.0.1:0", max_workers=8)
    follower.start()
    gone = MessagingServer(FakeEngine(), "127.0.0.1:0", max_workers=4)
    gone.start()
    dead = gone.address
    gone.stop(0)  # a leader that died: nobody answers at its address
    try:
        follower_engine.subscribe_errors = [NotLeader("not the leader", leader=dead)]
        with (
            Client(f"{follower.address},{server.address}", timeout_s=WAIT_S) as c,
            c.subscribe("t") as sub,
        ):
            assert sub.target in (follower.address, server.address)
            assert c.leader == ""
    finally:
        follower.stop(0)


def test_an_ack_that_fails_for_a_passing_reason_is_sent_again(engine, server):
    engine.ack_errors = [Unavailable("database unavailable: lost connection")]
    engine.ack_result = 2
    with Client(server.address, timeout_s=WAIT_S) as c:
        assert c.ack("t", [1, 2]) == 2
    assert [a[2] for a in engine.acks] == [[1, 2], [1, 2]]


def test_an_ack_gives_up_when_its_time_out_is_spent(engine, server):
    engine.ack_error = Unavailable("database unavailable")
    began = time.monotonic()
    with Client(server.address, timeout_s=0.3) as c, pytest.raises(Unavailable):
        c.ack("t", [1])
    assert time.monotonic() - began < WAIT_S
    assert len(engine.acks) >= 2


def test_an_ack_cut_short_by_its_time_out_says_why_the_tries_before_it_failed(engine, server):
    """A retry that gets no answer in the time left (a loaded machine, the last try started
    late) is not the cause: the call fails with what the tries before it were told (here the
    database away), not with "no answer from the msgtable server"."""
    calls: list[float] = []

    def ack(name: str, keyspace: str, ids: object, subscription: str = "") -> int:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise Unavailable("database unavailable: (2003) Can't connect to MySQL server")
        time.sleep(0.6)  # past the client's time-out
        raise Unavailable("database unavailable: too late")

    engine.ack = ack
    with (
        Client(server.address, timeout_s=0.3) as c,
        pytest.raises(Unavailable, match="Can't connect to MySQL server"),
    ):
        c.ack("t", [1])
    assert len(calls) == 2


def test_an_ack_with_no_answer_at_all_says_so(engine, server):
    engine.ack = lambda *args, **kwargs: time.sleep(0.6) or 1
    with (
        Client(server.address, timeout_s=0.3) as c,
        pytest.raises(Unavailable, match="no answer from the msgtable server"),
    ):
        c.ack("t", [1])


def test_the_backoff_doubles_up_to_its_ceiling_with_jitter():
    backoff = router.Router(("a:1",), None, None, 1.0).backoff
    for failures, ceiling in ((1, 0.01), (2, 0.02), (3, 0.04), (4, 0.05), (40, 0.05)):
        waits = [backoff.delay_s(failures) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits)
        assert len(set(waits)) > 1


def test_while_servers_answer_not_leader_the_wait_stays_short(monkeypatch):
    """A NotLeader answer comes from a live server while the lease changes hands (a new
    holder within a lease period): retried at most every NOT_LEADER_RETRY_MAX_S, not on the
    backoff's ceiling for a server that does not answer."""
    monkeypatch.setattr(router, "RETRY_MAX_S", 5.0)
    from msgtable.core.retry import Retry

    route = router.Route(("a:1", "b:2"), 1.0)
    election = Retry("test", logging.getLogger("test"), route.backoff)
    waits = [
        route.failed(NotLeader("no server holds the lease now"), route.next_target(), election)
        for _ in range(12)
    ]
    assert max(waits) <= router.NOT_LEADER_RETRY_MAX_S < 5.0
    # the dead leader refuses, the live follower names it: short waits too
    dead = router.Route(("a:1", "b:2"), 1.0)
    both = Retry("test", logging.getLogger("test"), dead.backoff)
    waits = []
    for _ in range(6):
        waits.append(dead.failed(Unavailable("connection refused"), "a:1", both))
        waits.append(dead.failed(NotLeader("not me", leader="a:1"), "b:2", both))
    assert max(waits) <= router.NOT_LEADER_RETRY_MAX_S
    # no server answers at all: the whole backoff
    away_route = router.Route(("a:1",), 1.0)
    away = Retry("test", logging.getLogger("test"), away_route.backoff)
    waits = [away_route.failed(Unavailable("refused"), "a:1", away) for _ in range(12)]
    assert max(waits) > router.NOT_LEADER_RETRY_MAX_S


def test_a_call_racing_the_clients_close_fails_as_closed_not_with_a_grpc_error():
    """close() may close the channel between a call taking its stub and invoking it (a killed
    worker's client, its ack queue still sending): the call fails as Unavailable "the client
    is closed", a MsgtableError, not grpc's ValueError."""
    r = router.Router(("127.0.0.1:1",), None, None, 1.0)
    take = r.stub

    def racing(target: str) -> Any:
        stub = take(target)
        r.close()  # closed right after the stub was taken
        return stub

    r.stub = racing  # type: ignore[method-assign]
    with pytest.raises(Unavailable, match="the client is closed"):
        r.unary("MessageAck", pb.MessageAckRequest(name="t"))


def test_a_new_client_does_not_inherit_an_older_clients_failed_connection(engine, caplog):
    """grpc shares connections between the channels of one process by default: a Client made
    after its server came back on the same address, while an older Client still holds the
    connection that failed, would fail its first calls with the old "Connection refused" and
    retry. Each Client connects on its own."""
    first = MessagingServer(engine, "127.0.0.1:0")
    first.start()
    address = first.address
    with Client(address, timeout_s=1.0) as old:
        assert old.list_tables() == []
        first.stop(0)
        with pytest.raises(Unavailable):
            old.list_tables()  # its connection failed: refused
        second = MessagingServer(engine, address)
        second.start()
        try:
            caplog.set_level(logging.DEBUG, logger="msgtable.client")
            caplog.clear()  # the old client's retries above are not the subject
            with Client(address, timeout_s=WAIT_S) as new, new.subscribe("t") as sub:
                engine.next_subscriber().put([(1, "a", None)])
                assert next(sub).id == 1
                assert new.list_tables() == []
            retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
            assert retries == [], retries
        finally:
            second.stop(0)


def test_each_table_goes_to_the_sender_a_notleader_named_for_it():
    """The servers share the tables (msgtable.engine.placement): a NotLeader about one table names
    that table's sender, and calls about another table do not follow it."""
    route = router.Route(("a:1", "b:2"), 1.0)
    jobs, mail = "/jobs", "/mail"
    retry = Retry("test", logging.getLogger("test"), route.backoff)
    assert route.next_target(jobs) == route.next_target(mail) == "a:1"
    delay = route.failed(NotLeader("jobs: sent by b:2", leader="b:2"), "a:1", retry, jobs)
    assert delay == 0.0  # a redirect: at once
    assert route.next_target(jobs) == "b:2" and route.leader_of(jobs) == "b:2"
    assert route.next_target(mail) == "a:1" and route.leader_of(mail) == ""
    # the sender of jobs fails (not a redirect): jobs goes to the targets in turn again
    route.failed(Unavailable("b:2 is down"), "b:2", retry, jobs)
    assert route.leader_of(jobs) == ""
    # keys as the requests give them: keyspace and name; none for ListTables
    assert router.table_key(pb.MessageStreamRequest(name="jobs")) == jobs
    assert router.table_key(pb.MessageAckRequest(keyspace="ks", name="jobs")) == "ks/jobs"
    assert router.table_key(pb.ListTablesRequest()) == ""


def test_without_retries_a_following_stream_goes_where_the_servers_send_it_and_no_further(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """retry=False with follow=True (msgtable tail): a NotLeader is followed (to the sender
    it names, or waiting out a hand-over) and a failure at a server a NotLeader named goes
    back to the servers given; any other failure at a server given raises. A NotLeader that
    begins a run is the one line logged, a WARNING; the rest of the run says nothing above
    DEBUG."""
    route = router.Route(("b:2",), 1.0)
    key = "/jobs"
    retry = Retry("stream of jobs", logging.getLogger("msgtable.client"), route.backoff)

    def reopen(error: Unavailable, target: str, following: bool = True) -> float:
        return route.reopen_delay(
            error,
            target,
            retry,
            retrying=False,
            started=time.monotonic(),
            retry_for_s=None,
            key=key,
            following=following,
        )

    caplog.set_level(logging.DEBUG, logger="msgtable.client")
    with pytest.raises(NotLeader):  # without follow: raised, as before
        reopen(NotLeader("not me", leader="a:1"), "b:2", following=False)
    assert reopen(NotLeader("not me", leader="a:1"), "b:2") == 0.0
    assert route.next_target(key) == "a:1"
    reopen(Unavailable("a:1 refused"), "a:1")  # the sender named died: back to b
    assert route.next_target(key) == "b:2"
    reopen(NotLeader("nobody holds it now"), "b:2")  # a hand-over: waited out
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "following it to a:1" in warned[0], warned
    assert [r.levelno for r in caplog.records if r.levelno > logging.DEBUG] == [logging.WARNING]
    with pytest.raises(Unavailable, match="server shutting down"):  # b itself: a fault
        reopen(Unavailable("server shutting down"), "b:2")
