"""Schedules on a real server (msgtable.features.schedules): each tick of a schedule enqueues
one message, on time, exactly once across the servers of the database, through a hand-over
and a server that stops; a tick missed while no server ran is enqueued once or skipped as the
schedule says; bad definitions are refused in one line."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from msgtable.core.schedules import MISSED_AFTER_S
from msgtable.core.tables import current_layout_ddl
from msgtable.engine.engine import MessageEngine
from msgtable.errors import InvalidArgument, TableNotFound
from msgtable.features.assembly import assemble_dsn
from msgtable.observe.metrics import EngineCollector

from ..waiting import wait_until
from .helpers import comment

PERIOD_S = 2.0
SECOND = 1_000_000_000
TICK_COLUMNS = "schedule_tick bigint, schedule_name varchar(64)"


@contextmanager
def _engine(dsn: str, lease: bool = False) -> Iterator[MessageEngine]:
    engine = assemble_dsn(dsn, discovery_interval_s=0.3, lease_period_s=PERIOD_S if lease else None)
    engine.open()
    if lease:
        engine.campaign(f"127.0.0.1:{id(engine) % 50000 + 1024}")
    try:
        yield engine
    finally:
        engine.close()


def _table(db: sa.Engine, name: str = "jobs") -> None:
    ddl = current_layout_ddl(name, comment(vt_poller_interval=0.1))
    ddl = ddl.replace("  primary key(id)", f"  {TICK_COLUMNS},\n  primary key(id)")
    with db.connect() as conn:
        conn.exec_driver_sql(ddl)


def _ticks(db: sa.Engine, table: str = "jobs") -> list[tuple[int, str, str, int | None]]:
    with db.connect() as conn:
        return [
            tuple(r)
            for r in conn.exec_driver_sql(
                f"select schedule_tick, schedule_name, message, time_created from {table} "
                "order by schedule_tick"
            )
        ]


@pytest.fixture
def db(db_dsn: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


def test_each_tick_enqueues_one_message_on_time_until_the_schedule_is_dropped(db_dsn, db):
    _table(db)
    with _engine(db_dsn) as engine:
        assert engine.schedules is not None
        s = engine.schedules.create_schedule(
            "every-second", "jobs", "* * * * * *", values='{"message": "tick"}'
        )
        assert s.next_tick_ns % SECOND == 0
        wait_until(lambda: len(_ticks(db)) >= 4, timeout_s=10, what="four ticks")
        engine.refresh()  # the schedules as the metrics read them: the last discovery's
        text = EngineCollector(engine).exposition().decode()
        for family in ("next_tick_seconds", "last_tick_seconds", "ticks_total", "late_p99_seconds"):
            assert f"msgtable_schedule_{family}" in text, text
        assert 'schedule="every-second",table="jobs"' in text
        assert engine.schedules.drop_schedule("every-second")
        time.sleep(1.5)
        got = _ticks(db)
        ticks = [t for t, *_ in got]
        assert ticks == list(range(ticks[0], ticks[0] + SECOND * len(ticks), SECOND))
        assert {(name, message) for _, name, message, _ in got} == {("every-second", "tick")}
        # enqueued when its time came: time_created is the database's clock at the INSERT
        late = sorted(created - tick for tick, _, _, created in got)
        assert late[-1] < SECOND, late
        (listed,) = [t for t in engine.list_tables() if t.name == "jobs"]
        assert listed.schedules == ()
        assert not engine.schedules.drop_schedule("every-second")


def test_a_bad_definition_is_refused_in_one_line_naming_what_is_wrong(db_dsn, db):
    _table(db)
    with _engine(db_dsn) as engine:
        sched = engine.schedules
        assert sched is not None
        bad = [
            (("x", "jobs", "61 * * * *"), "field 1 (minute) '61' is not valid"),
            (("x", "jobs", "* * *"), "has 3 fields"),
            (("x", "nope", "* * * * *"), "no message table 'nope'"),
            (("x y", "jobs", "* * * * *"), "a schedule's name is"),
            (("x", "jobs", "* * * * *", '{"nope": 1}'), "table jobs has no column 'nope'"),
            (("x", "jobs", "* * * * *", '{"id": 1}'), "column 'id' is set by the schedule"),
            (("x", "jobs", "* * * * *", "{bad"), "values are not JSON"),
            (("x", "jobs", "* * * * *", "{}", "Mars/Base"), "unknown time zone 'Mars/Base'"),
            (("x", "jobs", "* * * * *", "{}", "UTC", "twice"), "missed must be skip or once"),
        ]
        for args, said in bad:
            with pytest.raises((InvalidArgument, TableNotFound)) as e:
                sched.create_schedule(*args)
            assert said in str(e.value) and "\n" not in str(e.value), (args, str(e.value))
        sched.create_schedule("x", "jobs", "0 3 * * *", timezone="Europe/Paris")
        with pytest.raises(InvalidArgument, match="schedule 'x' exists"):
            sched.create_schedule("x", "jobs", "0 3 * * *")
        (t,) = [t for t in engine.list_tables() if t.name == "jobs"]
        (shown,) = t.schedules
        assert (shown.name, shown.cron, shown.timezone, shown.last_tick_ns) == (
            "x",
            "0 3 * * *",
            "Europe/Paris",
            None,
        )


def test_two_servers_tick_once_and_a_server_that_stops_loses_no_tick(db_dsn, db):
    _table(db)
    with _engine(db_dsn, lease=True) as first, _engine(db_dsn, lease=True) as second:
        assert first.schedules is not None
        first.schedules.create_schedule("hb", "jobs", "* * * * * *", values='{"message": "hb"}')
        wait_until(
            lambda: [e.sends("msgtable_schedules") for e in (first, second)].count(True) == 1,
            timeout_s=20,
            what="one server sends the schedules",
        )
        wait_until(lambda: len(_ticks(db)) >= 3, timeout_s=10, what="three ticks")
        holder = first if first.sends("msgtable_schedules") else second
        other = second if holder is first else first
        holder.close()  # a hand-over: the other takes over and catches up
        wait_until(lambda: other.sends("msgtable_schedules"), timeout_s=4 * PERIOD_S + 2)
        stopped = time.time_ns()
        wait_until(
            lambda: any(t > stopped + 2 * SECOND for t, *_ in _ticks(db)),
            timeout_s=15,
            what="ticks after the hand-over",
        )
    ticks = [t for t, *_ in _ticks(db)]
    assert ticks == list(range(ticks[0], ticks[0] + SECOND * len(ticks), SECOND)), ticks


@pytest.mark.parametrize("missed", ["skip", "once"])
def test_ticks_missed_while_no_server_ran_are_skipped_or_enqueued_once(db_dsn, db, missed):
    _table(db)
    with _engine(db_dsn) as engine:
        assert engine.schedules is not None
        engine.schedules.create_schedule("m", "jobs", "0 0 1 1 *", missed=missed)
    # no server ran while the year's tick went by
    gone = time.time_ns() - round(400 * 86400 * SECOND)
    with db.connect() as conn:
        conn.exec_driver_sql("update msgtable_schedules set next_tick = %s", (gone,))
    with _engine(db_dsn) as engine:
        want = 1 if missed == "once" else 0
        if want:
            wait_until(lambda: len(_ticks(db)) == 1, timeout_s=10, what="one message")
        wait_until(
            lambda: _next_tick(db) > time.time_ns(), timeout_s=10, what="the schedule goes on"
        )
        time.sleep(0.5)
        assert len(_ticks(db)) == want
        if want:
            ((tick, *_),) = _ticks(db)
            assert time.time_ns() - tick > MISSED_AFTER_S * SECOND


def _next_tick(db: sa.Engine) -> int:
    with db.connect() as conn:
        return int(conn.exec_driver_sql("select next_tick from msgtable_schedules").scalar())


def test_a_schedule_made_by_plain_sql_starts_at_its_next_tick(db_dsn, db):
    _table(db)
    with _engine(db_dsn) as engine:
        assert engine.schedules is not None
        engine.schedules.create_schedule("first", "jobs", "0 3 * * *")
        with db.connect() as conn:
            conn.exec_driver_sql(
                "INSERT INTO msgtable_schedules (name, table_name, cron, timezone, "
                "message_values, missed, next_tick, time_created) VALUES ('by-hand', 'jobs', "
                "'* * * * * *', 'UTC', '{\"message\": \"sql\"}', 'skip', 0, 0)"
            )
        wait_until(
            lambda: [r for r in _ticks(db) if r[1] == "by-hand"], timeout_s=10, what="a tick"
        )


def test_both_clients_make_list_and_drop_a_schedule_over_grpc(db_dsn, db):
    import asyncio

    from msgtable.aio import Client as AsyncClient

    from .helpers import serve

    _table(db)
    with serve(db_dsn) as s:
        made = s.client.create_schedule("nightly", "jobs", "0 3 * * *", {"message": "n"})
        assert (made.name, made.table, made.next_tick_ns > 0) == ("nightly", "jobs", True)

        async def aio_side() -> tuple[list[str], bool, list[str]]:
            async with AsyncClient(s.server.address) as client:
                await client.create_schedule("hourly", "jobs", "0 * * * *", '{"message": "h"}')
                names = sorted(x.name for x in await client.list_schedules("jobs"))
                dropped = await client.drop_schedule("nightly")
                left = [x.name for x in await client.list_schedules()]
                return names, dropped, left

        assert asyncio.run(aio_side()) == (["hourly", "nightly"], True, ["hourly"])
        assert [x.name for x in s.client.list_schedules()] == ["hourly"]
        assert s.client.drop_schedule("hourly") is True and s.client.drop_schedule("x") is False
