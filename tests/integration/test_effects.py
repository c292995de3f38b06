"""Effects exactly once (msgtable.client.effects) against a real server and database: a
handler's writes and its message's ack commit together or not at all, and a second delivery
finds the work done."""

from __future__ import annotations

import asyncio
import threading

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker

from msgtable.aio import Client as AsyncClient
from msgtable.client import effects
from msgtable.core.subscriptions import SEPARATOR

from ..waiting import wait_until
from .helpers import Collector, serve

EFFECTS = "create table effects (message_id bigint not null, note varchar(40))"


def effects_of(s, message_id: int) -> int:
    return s.sql("select count(*) from effects where message_id = :i", i=message_id)[0][0]


def acked(s, table: str, message_id: int) -> bool:
    rows = s.sql(f"select time_acked is not null from {table} where id = :i", i=message_id)
    return bool(rows[0][0])


def test_the_state_table_separator_is_the_subscriptions_one():
    assert effects.STATE_SEPARATOR == SEPARATOR


def test_a_handler_s_writes_and_the_ack_commit_together(db_dsn: str):
    with serve(db_dsn) as s:
        s.create_table("q", vt_ack_wait=1, vt_min_backoff=0.2, vt_max_backoff=0.2)
        s.sql(EFFECTS)
        app = sa.create_engine(db_dsn)
        s.sql("insert into q(id, message) values (1, 'one'), (2, 'two')")
        got = Collector(s.client, "q")
        try:
            first, second = sorted(got.take(2), key=lambda m: m.id)

            def write(conn) -> None:
                conn.execute(sa.text("insert into effects values (:i, 'done')"), {"i": first.id})

            assert first.in_transaction(app, write) is True
            assert effects_of(s, 1) == 1 and acked(s, "q", 1)

            def fail(conn) -> None:
                conn.execute(sa.text("insert into effects values (2, 'half')"))
                raise RuntimeError("the handler failed")

            with pytest.raises(RuntimeError):
                second.in_transaction(app, fail)
            assert effects_of(s, 2) == 0 and not acked(s, "q", 2)  # rolled back, both
            again = got.take(1, timeout_s=10)[0]  # it comes again after its ack wait
            assert again.id == 2 and again.attempt == 2
            assert (
                again.in_transaction(
                    app,
                    lambda conn: conn.execute(sa.text("insert into effects values (2, 'done')")),
                )
                is True
            )
            assert effects_of(s, 2) == 1 and acked(s, "q", 2)
            got.nothing_for(0.5)
        finally:
            got.close()
            app.dispose()


def test_two_deliveries_at_once_make_one_effect(db_dsn: str):
    # a slow first worker: its ack wait ends, the message goes to a second worker, and both
    # run the handler's transaction at the same time
    with serve(db_dsn) as s:
        s.create_table("q", vt_ack_wait=0.5, vt_min_backoff=0.1, vt_max_backoff=0.1)
        s.sql(EFFECTS)
        app = sa.create_engine(db_dsn)
        s.sql("insert into q(id, message) values (7, 'seven')")
        got = Collector(s.client, "q")
        try:
            early = got.take(1)[0]
            late = got.take(1, timeout_s=10)[0]  # sent again: the first was not acked
            assert (early.id, late.id) == (7, 7) and late.attempt > early.attempt
            inside = threading.Event()
            results: list[bool] = []

            def slow(conn) -> None:
                conn.execute(sa.text("insert into effects values (7, 'early')"))
                inside.set()
                conn.execute(sa.text("do sleep(0.5)"))

            worker = threading.Thread(
                target=lambda: results.append(early.in_transaction(app, slow))
            )
            worker.start()
            assert inside.wait(10)
            ran_late = late.in_transaction(
                app, lambda conn: conn.execute(sa.text("insert into effects values (7, 'late')"))
            )
            worker.join(10)
            assert results == [True] and ran_late is False
            assert effects_of(s, 7) == 1 and acked(s, "q", 7)
        finally:
            got.close()
            app.dispose()


def test_a_subscription_s_message_is_acked_in_its_state_table_by_session(db_dsn: str):
    with serve(db_dsn) as s:
        # polled twice a second: the fan-out does not wait for the binlog (a loaded run on
        # MySQL once waited out the 10 s below with the default 30 s poll)
        s.create_table("q", vt_poller_interval=0.5)
        s.sql(EFFECTS)
        s.client.create_subscription("q", "audit")
        app = sa.create_engine(db_dsn)
        sessions = sessionmaker(app)
        s.sql("insert into q(id, message) values (3, 'three')")
        got = Collector(s.client, "q", subscription="audit")
        try:
            m = got.take(1)[0]
            assert m.table == f"q{SEPARATOR}audit"

            def write(session) -> None:
                session.execute(sa.text("insert into effects values (3, 'audit')"))

            assert m.in_session(sessions, write) is True
            assert effects_of(s, 3) == 1
            assert acked(s, f"q{SEPARATOR}audit", 3) and not acked(s, "q", 3)
            assert m.in_session(sessions, write) is False  # done: not again
            assert effects_of(s, 3) == 1
        finally:
            got.close()
            app.dispose()


def test_the_asyncio_client_runs_a_handler_and_the_ack_in_one_transaction(db_dsn: str):
    url = sa.make_url(db_dsn)
    async_url = url.set(drivername="mysql+aiomysql")

    async def main(address: str) -> tuple[bool, bool]:
        app = create_async_engine(async_url)
        sessions = async_sessionmaker(app)
        try:
            async with AsyncClient(address) as client, client.subscribe("q") as sub:
                got = []
                async for m in sub:
                    got.append(m)
                    if len(got) == 2:
                        break

                async def write(conn) -> None:
                    await conn.execute(
                        sa.text("insert into effects values (:i, 'aio')"), {"i": got[0].id}
                    )

                async def write_session(session) -> None:
                    await session.execute(
                        sa.text("insert into effects values (:i, 'aio')"), {"i": got[1].id}
                    )

                return (
                    await got[0].in_transaction(app, write),
                    await got[1].in_session(sessions, write_session),
                )
        finally:
            await app.dispose()

    with serve(db_dsn) as s:
        s.create_table("q")
        s.sql(EFFECTS)
        s.sql("insert into q(id, message) values (4, 'four'), (5, 'five')")
        assert asyncio.run(main(s.server.address)) == (True, True)
        wait_until(lambda: acked(s, "q", 4) and acked(s, "q", 5), what="both acked")
        assert effects_of(s, 4) == effects_of(s, 5) == 1
