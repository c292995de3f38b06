"""The asyncio client's retries, the sync client's tests (test_client_retry) as coroutines
over real gRPC channels to fake engines: a stream opened again when it breaks, passing errors
retried and the others raised at once, retry_for_s, NotLeader followed to the leader, acks
retried within the time-out."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from msgtable import aio
from msgtable.client import router
from msgtable.errors import (
    InvalidArgument,
    NotLeader,
    ResourceExhausted,
    TableNotFound,
    Unavailable,
)
from msgtable.server.servicer import MessagingServer
from tests.unit.server.test_server import WAIT_S, FakeEngine

T = TypeVar("T")


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(router, "RETRY_MIN_S", 0.01)
    monkeypatch.setattr(router, "RETRY_MAX_S", 0.05)


def run(coro: Awaitable[T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, 30)

    return asyncio.run(bounded())


def test_a_stream_that_breaks_is_opened_again_and_iteration_goes_on(engine, server):
    async def test() -> None:
        async with aio.Client(server.address, timeout_s=WAIT_S) as c, c.subscribe("t") as sub:
            first = await asyncio.to_thread(engine.next_subscriber)
            first.put([(1, "a", None)])
            assert (await sub.__anext__()).id == 1
            first.end(Unavailable("database unavailable: lost connection"))
            reader = asyncio.create_task(sub.__anext__())
            second = await asyncio.to_thread(engine.next_subscriber)  # subscribed again
            second.put([(2, "b", None)])
            assert (await reader).id == 2
            assert sub.reconnects == 1
            assert len(engine.subscribe_calls) == 2

    run(test())


def test_a_passing_error_at_subscribe_is_retried_with_backoff(engine, server):
    engine.subscribe_errors = [
        Unavailable("database unavailable"),
        ResourceExhausted("table t already has 1 subscribers"),
    ]

    async def test() -> None:
        async with aio.Client(server.address, timeout_s=WAIT_S) as c, c.subscribe("t") as sub:
            (await asyncio.to_thread(engine.next_subscriber)).put([(7, "x", None)])
            assert (await sub.__anext__()).id == 7
            assert len(engine.subscribe_calls) == 3
            assert sub.reconnects == 0

    run(test())


def test_an_error_that_would_come_again_is_raised_at_once(engine, server):
    async def test() -> None:
        async with aio.Client(server.address, timeout_s=WAIT_S) as c:
            engine.subscribe_error = TableNotFound("message table 't' not found")
            with pytest.raises(TableNotFound):
                await c.subscribe("t").open()
            assert len(engine.subscribe_calls) == 1
            engine.subscribe_error = None
            sub = await c.subscribe("t").open()
            (await asyncio.to_thread(engine.next_subscriber)).end(
                TableNotFound("message table 't' was dropped")
            )
            with pytest.raises(TableNotFound, match="dropped"):
                await sub.__anext__()
            assert len(engine.subscribe_calls) == 2
            await sub.close()

    run(test())


def test_a_subscription_gives_up_after_retry_for_s(engine, server):
    engine.subscribe_error = Unavailable("database unavailable")

    async def test() -> None:
        began = time.monotonic()
        async with aio.Client(server.address, timeout_s=WAIT_S, retry_for_s=0.3) as c:
            with pytest.raises(Unavailable, match=r"gave up after 0\.3s"):
                await c.subscribe("t").open()
        assert 0.3 <= time.monotonic() - began < WAIT_S
        assert len(engine.subscribe_calls) >= 3

    run(test())


def test_close_stops_a_subscription_that_is_retrying(engine, server):
    async def test() -> None:
        async with aio.Client(server.address, timeout_s=WAIT_S) as c:
            sub = await c.subscribe("t").open()
            engine.subscribe_error = Unavailable("database unavailable")
            (await asyncio.to_thread(engine.next_subscriber)).end(
                Unavailable("database unavailable")
            )
            reader = asyncio.create_task(sub.next_batch())
            await asyncio.sleep(0.2)  # it is retrying now
            assert not reader.done()
            await sub.close()
            assert await asyncio.wait_for(reader, WAIT_S) == []

    run(test())


def test_not_leader_sends_the_subscription_and_its_acks_to_the_leader(engine, server):
    follower_engine = FakeEngine()
    follower_engine.subscribe_error = NotLeader("not the leader", leader=server.address)
    follower_engine.ack_error = NotLeader("not the leader", leader=server.address)
    follower = MessagingServer(follower_engine, "127.0.0.1:0", max_workers=8)
    follower.start()

    async def test() -> None:
        async with aio.Client(follower.address, timeout_s=WAIT_S) as c, c.subscribe("t") as sub:
            assert sub.target == server.address
            assert c.leader == server.address
            (await asyncio.to_thread(engine.next_subscriber)).put([(3, "c", None)])
            message = await sub.__anext__()
            engine.ack_result = 1
            assert await message.ack() == 1
            assert [a[2] for a in engine.acks] == [[3]]
            assert len(follower_engine.subscribe_calls) == 1
            assert await c.ack("t", [4]) == 1  # the client's own calls go there too
            assert follower_engine.acks == []

    try:
        run(test())
    finally:
        follower.stop(0)


def test_an_ack_that_fails_for_a_passing_reason_is_sent_again(engine, server):
    engine.ack_errors = [Unavailable("database unavailable: lost connection")]
    engine.ack_result = 2

    async def test() -> None:
        async with aio.Client(server.address, timeout_s=WAIT_S) as c:
            assert await c.ack("t", [1, 2]) == 2

    run(test())
    assert [a[2] for a in engine.acks] == [[1, 2], [1, 2]]


def test_an_ack_gives_up_when_its_time_out_is_spent(engine, server):
    engine.ack_error = Unavailable("database unavailable")

    async def test() -> None:
        began = time.monotonic()
        async with aio.Client(server.address, timeout_s=0.3) as c:
            with pytest.raises(Unavailable):
                await c.ack("t", [1])
        assert time.monotonic() - began < WAIT_S

    run(test())
    assert len(engine.acks) >= 2


def test_an_ack_cut_short_by_its_time_out_says_why_the_tries_before_it_failed(engine, server):
    calls: list[float] = []

    def ack(name: str, keyspace: str, ids: object, subscription: str = "") -> int:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise Unavailable("database unavailable: (2003) Can't connect to MySQL server")
        time.sleep(0.6)  # past the client's time-out
        raise Unavailable("database unavailable: too late")

    engine.ack = ack

    async def test() -> None:
        async with aio.Client(server.address, timeout_s=0.3) as c:
            with pytest.raises(Unavailable, match="Can't connect to MySQL server"):
                await c.ack("t", [1])

    run(test())
    assert len(calls) == 2


def test_arguments_are_checked_as_the_sync_client_checks_them():
    with pytest.raises(InvalidArgument, match="no server address"):
        aio.Client(" , ")
    with pytest.raises(InvalidArgument, match="retry_for_s"):
        aio.Client("a:1", retry_for_s=-1)
    c = aio.Client("a:1")
    with pytest.raises(InvalidArgument, match="max_in_flight"):
        c.subscribe("t", max_in_flight=-1)
    with pytest.raises(InvalidArgument, match="max_lease_s"):
        c.subscribe("t", auto_renew=True, max_lease_s=0)
    with pytest.raises(InvalidArgument, match=r"ids\[1\]"):
        run(c.ack("t", [1, object()]))
    run(c.close())


def test_a_new_client_does_not_inherit_an_older_clients_failed_connection(engine, caplog):
    """As the sync client's test: each asyncio Client connects on its own, so one made after
    its server came back does not fail at first with an older client's refused connection."""
    first = MessagingServer(engine, "127.0.0.1:0")
    first.start()
    address = first.address
    second = MessagingServer(engine, address)

    async def test() -> None:
        async with aio.Client(address, timeout_s=1.0) as old:
            assert await old.list_tables() == []
            first.stop(0)
            with pytest.raises(Unavailable):
                await old.list_tables()  # its connection failed: refused
            second.start()
            caplog.set_level(logging.DEBUG, logger="msgtable.client")
            caplog.clear()  # the old client's retries above are not the subject
            async with aio.Client(address, timeout_s=WAIT_S) as new, new.subscribe("t") as sub:
                (await asyncio.to_thread(engine.next_subscriber)).put([(1, "a", None)])
                assert (await sub.__anext__()).id == 1
                assert await new.list_tables() == []

    try:
        run(test())
    finally:
        second.stop(0)
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert retries == [], retries


def test_an_aio_close_releases_its_rest_only_after_a_running_renewal_returned() -> None:
    """A renewal of the rest (naming the same deliveries) that the server ran after the
    close's release would undo it: close() waits for auto-renew's round first, as the sync
    subscriber joins its Leaser's thread."""
    from types import SimpleNamespace

    from msgtable.aio.subscriber import Subscriber
    from msgtable.proto.msgtable.v1 import messaging_pb2 as pb

    calls: list[str] = []

    class Router:
        closed = False

        def __init__(self) -> None:
            self.renewing = asyncio.Event()
            self.go_on = asyncio.Event()

        async def settle(self, method: str, request: object, target: str = "") -> int:
            calls.append(f"{method} began")
            self.renewing.set()
            await self.go_on.wait()
            calls.append(f"{method} returned")
            return 1

        async def invoke(self, target: str, method: str, request: object, timeout: float) -> None:
            calls.append(method)

    async def scenario() -> None:
        r = Router()
        sub = Subscriber(r, pb.MessageStreamRequest(name="jobs"), retry=False, retry_for_s=None)  # type: ignore[arg-type]
        held = [
            SimpleNamespace(id=i, id_value=pb.Value(int_value=i), attempt=1, sent_ns=1)
            for i in (1, 2)
        ]
        sub._leases.add(held)  # type: ignore[arg-type]
        sub._pending.extend(held)  # type: ignore[arg-type]
        sub._pending_at, sub._stream_ack_wait_s = time.monotonic(), 30.0
        sub._renewer = asyncio.create_task(sub.renew_now())  # a round, its call running
        await r.renewing.wait()
        closing = asyncio.create_task(sub.close())
        await asyncio.sleep(0.05)
        r.go_on.set()
        await closing

    run(scenario())
    assert calls == ["MessageRenew began", "MessageRenew returned", "MessageRelease"]
