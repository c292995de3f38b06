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
from msgtable.core.subscriptions import FANOUT_COLUMN, LAZY, REGISTRY_TABLE, SEPARATOR
from msgtable.core.tables import DEAD_TIME_NEXT
from msgtable.store.sequences import CURSOR_TABLE

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


def test_the_claim_names_the_servers_tables_and_values():
    assert effects.REGISTRY_TABLE == REGISTRY_TABLE and effects.CURSOR_TABLE == CURSOR_TABLE
    assert effects.FANOUT_COLUMN == FANOUT_COLUMN and effects.LAZY == LAZY
    assert effects.DEAD_TIME_NEXT == DEAD_TIME_NEXT


def cursor_passed(s, table: str, sub: str, message_id: int) -> bool:
    """Whether the subscription's cursor passed the message (its number in the sequence)."""
    rows = s.sql(
        f"select c.sent_upto >= m.time_fanout from msgtable_fanout_cursors c, {table} m "
        "where c.table_name = :t and c.name = :n and m.id = :i",
        t=table,
        n=sub,
        i=message_id,
    )
    return bool(rows and rows[0][0])


def state_rows_of(s, table: str, message_id: int) -> list[tuple]:
    return [
        tuple(r)
        for r in s.sql(
            f"select time_acked is not null, time_next, epoch from {table} where id = :i",
            i=message_id,
        )
    ]


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


def test_a_lazy_subscription_s_message_sent_from_its_cursor_is_worked_once_in_a_transaction(
    db_dsn: str,
):
    # a lazy subscription has no state row of a message sent from its cursor: the claim
    # makes it, the handler runs, the ack commits with it (before, in_transaction found no
    # row and answered False without running the handler, every delivery)
    with serve(db_dsn) as s:
        s.create_table("q", vt_poller_interval=0.5, vt_ack_wait=2)
        s.sql(EFFECTS)
        s.client.create_subscription("q", "audit", state_rows="lazy")
        state = f"q{SEPARATOR}audit"
        app = sa.create_engine(db_dsn)
        sessions = sessionmaker(app)
        s.sql("insert into q(id, message) values (3, 'three'), (4, 'four')")
        got = Collector(s.client, "q", subscription="audit")
        try:
            three, four = sorted(got.take(2), key=lambda m: m.id)
            assert state_rows_of(s, state, 3) == []  # sent from the cursor: no state row

            def write(conn) -> None:
                conn.execute(sa.text("insert into effects values (3, 'lazy')"))

            assert three.in_transaction(app, write) is True
            assert effects_of(s, 3) == 1
            assert state_rows_of(s, state, 3) == [(1, None, 0)]  # acked, the claim's epoch gone
            assert three.in_transaction(app, write) is False  # done: not again
            assert effects_of(s, 3) == 1

            def write_four(session) -> None:
                session.execute(sa.text("insert into effects values (4, 'lazy')"))

            assert four.in_session(sessions, write_four) is True
            assert effects_of(s, 4) == 1
            wait_until(
                lambda: cursor_passed(s, "q", "audit", 4),
                what="the cursor passed both messages acked by the application's transactions",
            )
            got.nothing_for(2.5)  # past the ack wait: neither comes again
            assert effects_of(s, 3) == effects_of(s, 4) == 1
        finally:
            got.close()
            app.dispose()


def test_a_lazy_subscription_s_message_acked_over_grpc_is_not_worked_once_its_cursor_passed_it(
    db_dsn: str,
):
    # no state row and the cursor past the message: settled, though nothing says so but the
    # cursor; the claim rolls back and leaves no row
    with serve(db_dsn) as s:
        s.create_table("q", vt_poller_interval=0.3)
        s.sql(EFFECTS)
        s.client.create_subscription("q", "audit", state_rows="lazy")
        state = f"q{SEPARATOR}audit"
        app = sa.create_engine(db_dsn)
        s.sql("insert into q(id, message) values (5, 'five')")
        got = Collector(s.client, "q", subscription="audit")
        try:
            m = got.take(1)[0]
            assert m.ack() == 1
            wait_until(lambda: cursor_passed(s, "q", "audit", 5), what="the cursor passed 5")
            ran: list[int] = []
            assert m.in_transaction(app, lambda conn: ran.append(1)) is False
            assert ran == [] and state_rows_of(s, state, 5) == []
            s.sql("delete from q where id = 5")  # purged: gone from its table, still settled
            assert m.in_transaction(app, lambda conn: ran.append(1)) is False
            assert ran == [] and state_rows_of(s, state, 5) == []
        finally:
            got.close()
            app.dispose()


def test_an_eager_subscription_s_purged_state_row_is_settled_and_stays_gone(db_dsn: str):
    with serve(db_dsn) as s:
        s.create_table("q", vt_poller_interval=0.3, vt_purge_after=0)
        s.sql(EFFECTS)
        s.client.create_subscription("q", "audit")
        state = f"q{SEPARATOR}audit"
        app = sa.create_engine(db_dsn)
        s.sql("insert into q(id, message) values (6, 'six')")
        got = Collector(s.client, "q", subscription="audit")
        try:
            m = got.take(1)[0]
            assert m.ack() == 1
            wait_until(lambda: state_rows_of(s, state, 6) == [], what="the acked row purged")
            ran: list[int] = []
            assert m.in_transaction(app, lambda conn: ran.append(1)) is False
            assert ran == [] and state_rows_of(s, state, 6) == []  # the claim rolled back
        finally:
            got.close()
            app.dispose()


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "READ COMMITTED"])
@pytest.mark.parametrize("first_fails", [False, True], ids=["first-commits", "first-fails"])
def test_two_claims_of_a_lazy_subscription_s_message_at_once_make_one_effect(
    db_dsn: str, first_fails: bool, isolation: str
):
    # two deliveries of a message with no state row (a server's crash sends it again from
    # the cursor): the second claim waits for the first's transaction, then finds the row
    # acked (or, the first rolled back, claims it itself)
    with serve(db_dsn) as s:
        s.create_table("q", vt_poller_interval=0.5)
        s.sql(EFFECTS)
        s.client.create_subscription("q", "audit", state_rows="lazy")
        app = sa.create_engine(db_dsn, isolation_level=isolation)
        s.sql("insert into q(id, message) values (7, 'seven')")
        got = Collector(s.client, "q", subscription="audit")
        try:
            m = got.take(1)[0]
            inside = threading.Event()
            results: list[object] = []

            def slow(conn) -> None:
                conn.execute(sa.text("insert into effects values (7, 'early')"))
                inside.set()
                conn.execute(sa.text("do sleep(0.5)"))
                if first_fails:
                    raise RuntimeError("the first handler failed")

            def early() -> None:
                try:
                    results.append(m.in_transaction(app, slow))
                except RuntimeError as exc:
                    results.append(str(exc))

            worker = threading.Thread(target=early)
            worker.start()
            assert inside.wait(10)
            ran_late = m.in_transaction(
                app, lambda conn: conn.execute(sa.text("insert into effects values (7, 'late')"))
            )
            worker.join(10)
            if first_fails:
                assert results == ["the first handler failed"] and ran_late is True
            else:
                assert results == [True] and ran_late is False
            assert effects_of(s, 7) == 1 and acked(s, f"q{SEPARATOR}audit", 7)
        finally:
            got.close()
            app.dispose()


def test_the_asyncio_client_claims_a_lazy_subscription_s_message(db_dsn: str):
    url = sa.make_url(db_dsn)
    async_url = url.set(drivername="mysql+aiomysql")

    async def main(address: str) -> tuple[bool, bool, bool]:
        app = create_async_engine(async_url)
        sessions = async_sessionmaker(app)
        try:
            async with (
                AsyncClient(address) as client,
                client.subscribe("q", subscription="audit") as sub,
            ):
                got = []
                async for m in sub:
                    got.append(m)
                    if len(got) == 2:
                        break
                got.sort(key=lambda m: m.id)

                async def write(conn) -> None:
                    await conn.execute(sa.text("insert into effects values (8, 'aio')"))

                async def write_session(session) -> None:
                    await session.execute(sa.text("insert into effects values (9, 'aio')"))

                return (
                    await got[0].in_transaction(app, write),
                    await got[1].in_session(sessions, write_session),
                    await got[0].in_transaction(app, write),
                )
        finally:
            await app.dispose()

    with serve(db_dsn) as s:
        s.create_table("q", vt_poller_interval=0.5)
        s.sql(EFFECTS)
        s.client.create_subscription("q", "audit", state_rows="lazy")
        s.sql("insert into q(id, message) values (8, 'eight'), (9, 'nine')")
        assert asyncio.run(main(s.server.address)) == (True, True, False)
        state = f"q{SEPARATOR}audit"
        assert acked(s, state, 8) and acked(s, state, 9)
        assert effects_of(s, 8) == effects_of(s, 9) == 1
