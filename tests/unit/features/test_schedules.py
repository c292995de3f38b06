"""The ticker (msgtable.features.schedules.ticker) on the in-memory store and a fake clock:
each due tick one message with its tick's id, once, however many tickers; plan's missed
ticks; DST as croniter defines it."""

from __future__ import annotations

import datetime
import zoneinfo

from msgtable.core.clock import FakeClock
from msgtable.core.schedules import Missed, Schedule, next_tick, plan, tick_id
from msgtable.core.tables import Column, load_table
from msgtable.features.schedules.ticker import Ticker
from msgtable.testing import CURRENT_COLUMNS, InMemoryStore
from msgtable.testing.schedules import InMemorySchedules

S = 1_000_000_000
COMMENT = (
    "vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=10,"
    "vt_cache_size=10000,vt_poller_interval=30"
)
COLUMNS = (*CURRENT_COLUMNS, Column("schedule_tick", "bigint", "bigint"))


def _setup(start_s: int = 1_800_000_000):
    store = InMemoryStore()
    store.create_table("jobs", COMMENT, COLUMNS)
    cfg = load_table("jobs", COMMENT, COLUMNS, (("id",),))
    schedules = InMemorySchedules(store)
    clock = FakeClock(start_s * S)
    woken: list[str] = []

    def ticker() -> Ticker:
        return Ticker(schedules, {"jobs": cfg}.get, clock, lambda: True, woken.append)

    return store, schedules, clock, ticker, woken


def test_each_due_tick_is_one_message_with_its_ticks_id_and_two_tickers_make_no_double():
    store, schedules, clock, ticker, woken = _setup()
    first = next_tick("* * * * * */10", "UTC", clock.now_ns())
    s = Schedule("s", "jobs", "* * * * * */10", values={"message": "m"}, next_tick_ns=first)
    schedules.create(s, clock.now_ns())
    a, b = ticker(), ticker()
    assert a.tick_once() <= 10 and not store.rows["jobs"]
    for _ in range(5):
        clock.advance(10)
        a.tick_once()
        b.tick_once()
    ticks = sorted(r["schedule_tick"] for r in store.rows["jobs"].values())
    assert ticks == [first + k * 10 * S for k in range(5)]
    assert set(store.rows["jobs"]) == {tick_id("s", t, "integer") for t in ticks}
    assert a.ticks + b.ticks == 5 and woken == ["jobs"] * 5
    (after,) = schedules.schedules()
    assert (after.last_tick_ns, after.ticks) == (ticks[-1], 5)


def test_a_ticker_behind_by_a_few_ticks_catches_up_each_once():
    store, schedules, clock, ticker, _ = _setup()
    first = next_tick("* * * * * *", "UTC", clock.now_ns())
    schedules.create(Schedule("s", "jobs", "* * * * * *", next_tick_ns=first), 0)
    clock.advance(30)  # a hand-over took half a minute: within MISSED_AFTER_S
    ticker().tick_once()
    assert len(store.rows["jobs"]) == 30


def test_missed_ticks_are_skipped_or_enqueued_once_then_the_schedule_goes_on():
    now = 1_800_001_800 * S  # half past
    old = now - 86400 * S
    skip = Schedule("s", "jobs", "0 * * * *", next_tick_ns=old)
    t = plan(skip, now)
    assert t is not None and t.enqueue is None and t.skipped and t.next_ns > now
    once = Schedule("s", "jobs", "0 * * * *", missed=Missed.ONCE, next_tick_ns=old)
    t = plan(once, now)
    assert t is not None and t.enqueue is not None and t.enqueue <= now < t.next_ns
    assert plan(skip, old - 1) is None


def test_dst_is_croniters_a_missing_local_time_skipped_and_a_doubled_one_taken_twice():
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    spring = datetime.datetime(2026, 3, 28, 12, tzinfo=paris)  # 02:30 does not exist on 29th
    at = next_tick("30 2 * * *", "Europe/Paris", int(spring.timestamp()) * S)
    at = next_tick("30 2 * * *", "Europe/Paris", at)
    days = [datetime.datetime.fromtimestamp(at // S, paris)]
    assert days[0].date() == datetime.date(2026, 3, 30)
    autumn = datetime.datetime(2026, 10, 25, 0, tzinfo=paris)  # 02:30 happens twice
    first = next_tick("30 2 * * *", "Europe/Paris", int(autumn.timestamp()) * S)
    second = next_tick("30 2 * * *", "Europe/Paris", first)
    assert second - first == 3600 * S  # 02:30 CEST, then 02:30 CET


def test_the_schema_file_is_the_ddl_the_server_runs():
    from pathlib import Path

    from msgtable.store.schedules import SCHEDULES_DDL

    text = (Path(__file__).parents[3] / "schema" / "msgtable_schedules.sql").read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
    assert body.strip().rstrip(";") == SCHEDULES_DDL.replace("`", "")
