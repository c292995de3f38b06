"""The asyncio client (msgtable.aio) passes the sync client's behaviour tests: the same
calls against the real gRPC server and a real MariaDB, as coroutines (each test runs its own
event loop with asyncio.run): delivery and acks, release / reject / renew, auto-renew, the
errors, and leader following with two servers on one database."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa

from msgtable import aio
from msgtable.core.tables import current_layout_ddl
from msgtable.errors import (
    InvalidArgument,
    PermissionDenied,
    TableNotFound,
    Unauthenticated,
    Unavailable,
)
from msgtable.server.servicer import TlsFiles

from .helpers import Served, comment, serve
from .test_placement import PERIOD_S, _server, _settled
from .test_security import WORKER, secured
from .test_security import pki as pki  # a fixture
from .test_settlement import enqueue, ids_in, make_pair

T = TypeVar("T")


@pytest.fixture
def served(db_dsn: str):
    with serve(db_dsn) as s:
        yield s


def run(test: Callable[[aio.Client], Awaitable[T]], target: str, **kwargs: Any) -> T:
    """``test(client)`` on a fresh event loop with an aio Client of ``target``."""

    async def main() -> T:
        async with aio.Client(target, **kwargs) as client:
            return await asyncio.wait_for(test(client), 60)

    return asyncio.run(main())


async def take(sub: aio.Subscriber, n: int, timeout_s: float = 10.0) -> list[aio.Message]:
    """The next ``n`` messages, or an AssertionError saying how many came."""
    got: list[aio.Message] = []

    async def read() -> None:
        async for m in sub:
            got.append(m)
            if len(got) == n:
                return

    try:
        await asyncio.wait_for(read(), timeout_s)
    except TimeoutError:
        raise AssertionError(f"got {len(got)} of {n} messages in {timeout_s}s") from None
    assert len(got) == n, f"the stream ended after {len(got)} of {n}"
    return got


async def nothing_for(sub: aio.Subscriber, seconds: float) -> None:
    try:
        m = await asyncio.wait_for(sub.__anext__(), seconds)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected message {m.id!r}: {m.values!r}")


def test_messages_arrive_in_batches_ack_counts_and_an_acked_message_never_comes_back(
    served: Served,
):
    served.create_table("acked", vt_ack_wait=0.2, vt_min_backoff=0.1, vt_poller_interval=0.1)
    served.sql("insert into acked(id, message) values (1, 'a'), (2, 'b'), (3, 'c')")

    async def test(client: aio.Client) -> None:
        async with client.subscribe("acked") as sub:
            msgs = await take(sub, 3)
            assert sorted(m.id for m in msgs) == [1, 2, 3]
            assert {m.id: m.values["message"] for m in msgs} == {1: "a", 2: "b", 3: "c"}
            assert all(m.attempt == 1 and m.sent_ns > 0 for m in msgs)
            assert sub.field_names[0] == "id"
            assert await client.ack("acked", [1, 2, 999]) == 2
            assert await client.ack("acked", [1]) == 0
            (third,) = (m for m in msgs if m.id == 3)
            assert await third.ack() == 1
            assert await sub.ack([third]) == 0
            await nothing_for(sub, 1.0)  # well past ack wait + backoff

    run(test, served.server.address)
    rows = served.sql("select id, time_acked is not null from acked order by id")
    assert [tuple(r) for r in rows] == [(1, 1), (2, 1), (3, 1)]


def test_an_unacked_message_comes_back_as_the_next_attempt(served: Served):
    served.create_table("jobs", vt_ack_wait=0.3, vt_min_backoff=0.1, vt_poller_interval=0.1)
    enqueue(served, "jobs", [1])

    async def test(client: aio.Client) -> None:
        async with client.subscribe("jobs") as sub:
            (first,) = await take(sub, 1)
            (again,) = await take(sub, 1)
            assert (first.id, again.id) == (1, 1)
            assert (first.attempt, again.attempt) == (1, 2)
            assert await again.ack() == 1

    run(test, served.server.address)


def test_reject_release_and_renew_settle_as_with_the_sync_client(served: Served):
    make_pair(served, vt_ack_wait=30, vt_poller_interval=30)
    enqueue(served, "jobs", [1, 2, 3, 4])

    async def test(client: aio.Client) -> None:
        async with client.subscribe("jobs") as sub:
            msgs = {m.id: m for m in await take(sub, 4)}
            assert await sub.reject([msgs[1], msgs[2]], reason="schema v1") == 2
            assert await msgs[1].reject() == 0  # dead already: not counted again
            assert await msgs[4].renew(extend_s=60) == 1
            assert await client.renew("jobs", [4], extend_s=60) == 1
            assert await msgs[3].release(reason="later") == 1
            (again,) = await take(sub, 1, timeout_s=5)
            assert (again.id, again.attempt) == (3, 2)
            assert again.values["last_error"] == "later"
            assert await again.ack() == 1
            assert await again.reject() == 0  # acked: nothing changes
            assert await client.release("jobs", [4], delay_s=60) == 1
            assert await client.reject("jobs", [4], reason="by id") == 1

    run(test, served.server.address)
    assert ids_in(served, "jobs") == [3]
    rows = served.sql("select id, attempts, last_error from jobs_dead order by id")
    # 4 was sent once: released before it was sent again, then rejected
    assert [tuple(r) for r in rows] == [(1, 1, "schema v1"), (2, 1, "schema v1"), (4, 1, "by id")]


def test_auto_renew_keeps_a_slow_handlers_message(served: Served):
    served.create_table("jobs", vt_ack_wait=0.6, vt_min_backoff=0.05, vt_poller_interval=0.2)
    enqueue(served, "jobs", [1])

    async def test(client: aio.Client) -> None:
        async with client.subscribe("jobs", auto_renew=True) as sub:
            (m,) = await take(sub, 1)
            assert sub.leased == 1
            await asyncio.sleep(2.0)  # the slow handler: over three ack waits
            assert await m.ack() == 1
            assert sub.renewed >= 5
            assert sub.leased == 0

    run(test, served.server.address)
    (row,) = served.sql("select epoch from jobs")
    assert row[0] == 1  # sent once


def test_auto_renew_stops_quietly_once_its_client_is_closed(served: Served, caplog):
    """As the sync client's: a closed client's subscriber stops renewing, without a warning
    a round."""
    served.create_table("jobs", vt_ack_wait=0.6, vt_min_backoff=0.05, vt_poller_interval=0.2)
    enqueue(served, "jobs", [1])
    caplog.set_level(logging.WARNING, logger="msgtable.client")

    async def test(client: aio.Client) -> None:
        sub = client.subscribe("jobs", auto_renew=True)
        async with sub:
            await take(sub, 1)
            await client.close()
            renewer = sub._renewer
            assert renewer is not None
            try:  # it ends by itself
                await asyncio.wait_for(asyncio.shield(renewer), 5)
            except TimeoutError:
                pytest.fail("auto-renew still ran 5 s after its client was closed")

    run(test, served.server.address)
    assert [r.getMessage() for r in caplog.records if "renewing" in r.getMessage()] == []


def test_unknown_tables_and_bad_input_get_the_sync_clients_errors(served: Served):
    served.create_table("known")

    async def test(client: aio.Client) -> None:
        with pytest.raises(TableNotFound, match="nope"):
            async with client.subscribe("nope"):
                pass
        with pytest.raises(TableNotFound, match="nope"):
            await client.ack("nope", [1])
        with pytest.raises(InvalidArgument, match="no ids"):
            await client.ack("known", [])
        with pytest.raises(InvalidArgument, match="malformed"):
            await client.ack("known", ["not a number"])
        with pytest.raises(InvalidArgument, match="max_in_flight"):
            client.subscribe("known", max_in_flight=-1)
        with pytest.raises(InvalidArgument, match="at most 1,000"):
            await client.reject("known", [1], reason="x" * 1001)
        with pytest.raises(TableNotFound):
            await client.ack("known`; drop table known; --", [1])
        assert [t.name for t in await client.list_tables()] == ["known"]
        assert (await client.status()).database_error == ""

    run(test, served.server.address)
    assert served.sql("select count(*) from known")[0][0] == 0  # still there


def test_dropping_a_table_ends_the_iteration_with_not_found(served: Served):
    served.create_table("doomed", vt_poller_interval=0.05)

    async def test(client: aio.Client) -> None:
        async with client.subscribe("doomed") as sub:
            served.sql("drop table doomed")
            with pytest.raises(TableNotFound):
                await asyncio.wait_for(sub.__anext__(), 10)

    run(test, served.server.address)


def test_an_unreachable_server_is_unavailable_naming_it():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    target = f"127.0.0.1:{port}"

    async def test(client: aio.Client) -> None:
        started = time.monotonic()
        with pytest.raises(Unavailable, match=target):
            await client.list_tables()
        assert time.monotonic() - started < 5
        with pytest.raises(Unavailable):
            async with client.subscribe("jobs", retry=False):
                pass

    run(test, target, timeout_s=1.0)


def test_subscriptions_are_created_listed_and_received_as_a_group(served: Served):
    served.create_table("jobs", "kind varchar(10)", vt_poller_interval=0.1)

    async def test(client: aio.Client) -> None:
        assert await client.create_subscription("jobs", "audit", filter="kind = 'x'") == 0
        assert [s.subscription for s in await client.list_subscriptions("jobs")] == ["audit"]
        async with client.subscribe("jobs", subscription="audit") as sub:
            served.sql("insert into jobs(id, message, kind) values (1, 'a', 'x'), (2, 'b', 'y')")
            (m,) = await take(sub, 1)
            assert m.id == 1
            assert await m.ack() == 1
            await nothing_for(sub, 0.5)
        await client.drop_subscription("jobs", "audit")
        assert await client.list_subscriptions("jobs") == []

    run(test, served.server.address)


def test_two_servers_the_client_follows_the_tables_sender_and_the_takeover(db_dsn: str):
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        conn.exec_driver_sql(current_layout_ddl("jobs", comment(vt_poller_interval=0.1)))
    with _server(db_dsn) as (first, first_server), _server(db_dsn) as (second, second_server):
        _settled(first, second)
        (sender, sender_server), (_other, other_server) = sorted(
            [(first, first_server), (second, second_server)], key=lambda p: not p[0].sends("jobs")
        )

        async def test(client: aio.Client) -> None:
            async with client.subscribe("jobs") as sub:
                # the other server first: NotLeader names the sender and the client follows
                assert sub.target == sender_server.address
                assert client.leader == sender_server.address
                with db.connect() as conn:
                    conn.exec_driver_sql("insert into jobs(id, message) values (1, 'a')")
                (m,) = await take(sub, 1)
                assert await client.ack("jobs", [m.id]) == 1
                # the sender shuts down: the other takes over and the same subscriber goes
                # on there
                await asyncio.to_thread(sender_server.stop, 0.5)
                await asyncio.to_thread(sender.close)
                with db.connect() as conn:
                    conn.exec_driver_sql("insert into jobs(id, message) values (3, 'c')")
                (m,) = await take(sub, 1, timeout_s=2 * PERIOD_S + 15)
                assert m.id == 3 and sub.target == other_server.address
                assert sub.reconnects >= 1
                assert await m.ack() == 1

        run(test, f"{other_server.address},{sender_server.address}")
    db.dispose()


def test_tls_and_tokens_allow_and_refuse_as_with_the_sync_client(db_dsn: str, pki):
    tls = TlsFiles(str(pki / "server.pem"), str(pki / "server.key"))  # tokens, no client certs
    ca = str(pki / "ca.pem")
    with secured(db_dsn, pki, tls=tls) as s:

        async def as_worker(client: aio.Client) -> None:
            async with client.subscribe("invoice_in") as sub:
                got = await take(sub, 2)
                assert await sub.ack(got) == 2
            with pytest.raises(PermissionDenied, match=r"billing may not subscribe.*payroll"):
                async with client.subscribe("payroll"):
                    pass
            with pytest.raises(PermissionDenied):
                await client.ack("payroll", [1])
            assert [t.name for t in await client.list_tables()] == ["invoice_in"]

        async def anonymous(client: aio.Client) -> None:
            with pytest.raises(Unauthenticated):
                await client.list_tables()
            with pytest.raises(Unauthenticated):
                async with client.subscribe("invoice_in"):
                    pass

        run(as_worker, s.address, token=WORKER, tls_ca=ca)
        run(anonymous, s.address, tls_ca=ca)
        run(anonymous, s.address, token="not-a-token-of-this-server", tls_ca=ca)


def test_a_client_certificate_is_a_principal_with_mutual_tls(db_dsn: str, pki):
    ca = str(pki / "ca.pem")
    cert = {"tls_cert": str(pki / "client.pem"), "tls_key": str(pki / "client.key")}

    async def with_certificate(client: aio.Client) -> None:
        assert [t.name for t in await client.list_tables()] == ["invoice_in"]
        async with client.subscribe("invoice_in") as sub:
            assert len(await take(sub, 2)) == 2

    with secured(db_dsn, pki) as s:  # the server requires client certificates
        run(with_certificate, s.address, tls_ca=ca, **cert)  # worker-1: billing


def test_closing_a_subscriber_ends_its_iteration_and_unacked_messages_come_again(
    served: Served,
):
    served.create_table("jobs", vt_ack_wait=0.3, vt_min_backoff=0.1, vt_poller_interval=0.1)
    enqueue(served, "jobs", [1])

    async def test(client: aio.Client) -> None:
        sub = await client.subscribe("jobs").open()
        (m,) = await take(sub, 1)
        reader = asyncio.create_task(sub.next_batch())  # waits for more
        await asyncio.sleep(0.1)
        await sub.close()
        assert await asyncio.wait_for(reader, 5) == []
        assert [x async for x in sub] == []
        async with client.subscribe("jobs") as again:
            (m2,) = await take(again, 1)
            assert (m2.id, m2.attempt) == (m.id, 2)
            assert await m2.ack() == 1

    run(test, served.server.address)


def test_a_subscriber_gives_up_after_retry_for_s_without_a_server(db_dsn: str):
    with serve(db_dsn) as served:
        served.create_table("jobs", vt_poller_interval=0.1)

        async def test(client: aio.Client) -> None:
            async with client.subscribe("jobs") as sub:
                await asyncio.to_thread(served.server.stop, 0.5)
                started = time.monotonic()
                with pytest.raises(Unavailable, match="gave up after 1s"):
                    await asyncio.wait_for(sub.__anext__(), 20)
                assert time.monotonic() - started < 10

        run(test, served.server.address, retry_for_s=1.0, timeout_s=1.0)


def test_dead_letters_redrive_and_subscription_changes_as_with_the_sync_client(served: Served):
    make_pair(served, vt_ack_wait=30, vt_poller_interval=0.1)
    enqueue(served, "jobs", [1, 2])

    async def test(client: aio.Client) -> None:
        async with client.subscribe("jobs") as sub:
            msgs = await take(sub, 2)
            assert await sub.reject(msgs, reason="bad") == 2
        dead, total = await client.dead_letters("jobs")
        assert total == 2 and [d.id for d in dead] == [1, 2]
        assert [d.last_error for d in dead] == ["bad", "bad"]
        batch = await client.redrive("jobs", ids=[1])
        assert batch.moved == 1
        assert (await client.dead_letters("jobs"))[1] == 1
        await client.create_subscription("jobs", "audit", filter="id > 100")
        await client.alter_subscription("jobs", "audit", filter="id > 5")
        (info,) = await client.list_subscriptions("jobs")
        assert info.filter == "id > 5"
        with pytest.raises(InvalidArgument, match="unknown subscription setting 'colour'"):
            await client.alter_subscription("jobs", "audit", colour="red")

    run(test, served.server.address)
    assert ids_in(served, "jobs") == [1]  # redriven: a fresh message again


def test_closing_the_client_ends_its_subscribers_quietly(served: Served):
    served.create_table("jobs", vt_poller_interval=0.1)

    async def main() -> None:
        client = aio.Client(served.server.address)
        sub = await client.subscribe("jobs").open()
        reader = asyncio.create_task(sub.next_batch())  # waits for messages
        await asyncio.sleep(0.1)
        await client.close()
        assert await asyncio.wait_for(reader, 5) == []
        with pytest.raises(Unavailable, match="closed"):
            await client.list_tables()

    asyncio.run(main())
