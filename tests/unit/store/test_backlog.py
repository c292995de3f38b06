from __future__ import annotations

import random
import threading

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from msgtable.core.clock import FakeClock
from msgtable.core.tables import DEAD_TIME_NEXT, DEMO_COMMENT
from msgtable.engine.engine import MessageEngine
from msgtable.observe.metrics import registry_for
from msgtable.store.backlog import AGE_BOUNDS_S, Backlog, BacklogCounts, BacklogReader
from msgtable.testing import InMemoryStore
from msgtable.testing.memory import CURRENT_COLUMNS
from tests.waiting import wait_until

S = 10**9


def make_engine(store: InMemoryStore, **kwargs) -> MessageEngine:
    e = MessageEngine(
        store,
        clock=FakeClock(),
        rng=random.Random(1),
        discovery_interval_s=3600,
        run_loops=False,
        **kwargs,
    )
    e.refresh()
    return e


def known_rows(store: InMemoryStore, now: int) -> None:
    """q: 2 due (created 10 s and 2 h ago), 1 scheduled (created 400 s ago), 1 acked and
    1 dead (neither is backlog, both created 3 days ago)."""
    store.create_table("q")
    store.insert("q", 1, time_next=0, time_created=now - 10 * S)
    store.insert("q", 2, time_next=now - S, time_created=now - 7200 * S)
    store.insert("q", 3, time_next=now + 60 * S, time_created=now - 400 * S)
    store.insert("q", 4, time_acked=now - S, time_created=now - 3 * 86400 * S)
    store.insert("q", 5, time_next=DEAD_TIME_NEXT, time_created=now - 3 * 86400 * S)


def test_the_backlog_of_known_rows_is_exact():
    store = InMemoryStore()
    now = FakeClock().now_ns()
    known_rows(store, now)
    e = make_engine(store)
    try:
        (b,) = e.backlog()
        assert b == Backlog(
            table="q",
            subscription="",
            due=2,
            scheduled=1,
            oldest_unacked_age_s=7200.0,
            by_age=tuple(zip(AGE_BOUNDS_S, (1, 1, 2, 2, 3, 3, 3), strict=True)),
        )
        assert [bound for bound, _ in b.by_age] == list(AGE_BOUNDS_S)
        e.clock.advance(120)  # row 3 falls due, every row is 2 minutes older
        (b,) = e.backlog(max_age_s=0)
        assert (b.due, b.scheduled, b.oldest_unacked_age_s) == (3, 0, 7320.0)
        assert b.by_age[0] == (60.0, 0)
    finally:
        e.close()


def test_a_table_without_time_created_has_counts_but_no_ages():
    store = InMemoryStore()
    store.create_table("q", columns=tuple(c for c in CURRENT_COLUMNS if c.name != "time_created"))
    store.insert("q", 1)
    e = make_engine(store)
    try:
        (b,) = e.backlog()
        assert (b.due, b.scheduled, b.oldest_unacked_age_s, b.by_age) == (1, 0, None, ())
        f = scrape(e)
        assert sample(f, "msgtable_messages_due") == 1
        assert not f["msgtable_oldest_unacked_age_seconds"].samples
    finally:
        e.close()


def test_a_table_without_a_default_group_has_no_backlog_of_its_own():
    store = InMemoryStore()
    store.create_table("q", DEMO_COMMENT + ",vt_default_group=off")
    store.create_table("r")
    e = make_engine(store)
    try:
        assert [b.table for b in e.backlog()] == ["r"]
    finally:
        e.close()


def test_the_backlog_is_read_at_most_once_per_max_age():
    store = InMemoryStore()
    store.create_table("q")
    store.insert("q", 1)
    e = make_engine(store)
    try:
        first = e.backlog(max_age_s=3600)
        store.insert("q", 2)
        assert e.backlog(max_age_s=3600) is first  # no read: the same answer
        assert e._backlog.reads == 1
        (b,) = e.backlog(max_age_s=0)
        assert b.due == 2 and e._backlog.reads == 2
    finally:
        e.close()


class SlowStore:
    """A backlog store whose read waits until released, counting its reads."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail = False

    def backlog(self, cfgs, now_ns):
        self.calls += 1
        self.entered.set()
        assert self.release.wait(10), "the test never released the read"
        if self.fail:
            raise RuntimeError("database away")
        return {c.name: BacklogCounts(self.calls, 0, None) for c in cfgs}


def reader_over(store) -> BacklogReader:
    engine = make_engine(table_store())  # a real loaded config, through discovery
    configs = [m.config for m in engine._managers.values()]
    engine.close()
    return BacklogReader(store, lambda: configs, FakeClock().now_ns)


def table_store() -> InMemoryStore:
    s = InMemoryStore()
    s.create_table("q")
    return s


def test_concurrent_callers_share_one_read():
    store = SlowStore()
    reader = reader_over(store)
    answers: list[list[Backlog]] = []
    threads = [threading.Thread(target=lambda: answers.append(reader.backlog(0))) for _ in range(4)]
    threads[0].start()
    assert store.entered.wait(10), "the first caller never reached the database"
    for t in threads[1:]:
        t.start()
    wait_until(lambda: reader.waiting == 3, 10, what="3 callers waiting for the first's read")
    assert not answers
    store.release.set()
    for t in threads:
        t.join(10)
    assert store.calls == 1, f"{store.calls} reads for 4 concurrent callers"
    assert len(answers) == 4 and all(a == answers[0] for a in answers)
    assert answers[0][0].due == 1


def test_a_failing_database_gives_the_last_answer_or_nothing_never_an_exception():
    store = SlowStore()
    store.release.set()
    reader = reader_over(store)
    store.fail = True
    assert reader.backlog(0) == []  # never read: nothing to show
    store.fail = False
    (good,) = reader.backlog(0)
    store.fail = True
    assert reader.backlog(0) == [good]


def test_a_server_that_does_not_hold_the_lease_reads_the_backlog_too():
    store = InMemoryStore()
    now = FakeClock().now_ns()
    known_rows(store, now)
    e = make_engine(store, lease_period_s=30)  # no campaign: it never leads
    try:
        assert not e.leading
        (b,) = e.backlog()
        assert (b.due, b.scheduled) == (2, 1)
    finally:
        e.close()


def scrape(engine) -> dict[str, object]:
    text = generate_latest(registry_for(engine)).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(families, name: str, table: str = "q") -> float:
    for s in families[name].samples:
        if s.labels["table"] == table and s.labels["subscription"] == "":
            return s.value
    raise AssertionError(f"{name}: no sample for table {table!r}")


def test_the_backlog_gauges_read_it_and_a_scrape_reads_at_most_once_per_max_age():
    store = InMemoryStore()
    now = FakeClock().now_ns()
    known_rows(store, now)
    e = make_engine(store)
    try:
        f = scrape(e)
        assert sample(f, "msgtable_messages_due") == 2
        assert sample(f, "msgtable_messages_scheduled") == 1
        assert sample(f, "msgtable_oldest_unacked_age_seconds") == pytest.approx(7200.0)
        for _ in range(5):
            scrape(e)
        assert e._backlog.reads == 1, "a scrape read the backlog again within max_age_s"
    finally:
        e.close()


def test_the_backlog_statement_is_written_once_per_flavour():
    from msgtable.core.tables import load_table
    from msgtable.store.statements import backlog_sql

    cfg = load_table("q", DEMO_COMMENT, CURRENT_COLUMNS, (("id",),))
    ages = ", COALESCE(SUM(`time_created` >= %s), 0)" * 6
    body = (
        f"COUNT(*), COALESCE(SUM((`time_next` IS NULL OR `time_next` <= %s)), 0), "
        f"MIN(`time_created`){ages} FROM `q` "
        f"WHERE `time_acked` IS NULL AND NOT (`time_next` <=> {DEAD_TIME_NEXT})"
    )
    assert backlog_sql(cfg, True) == f"SET STATEMENT max_statement_time=2 FOR SELECT {body}"
    assert backlog_sql(cfg, False) == f"SELECT /*+ MAX_EXECUTION_TIME(2000) */ {body}"
    bare = load_table(
        "q", DEMO_COMMENT, tuple(c for c in CURRENT_COLUMNS if c.name != "time_created"), (("id",),)
    )
    assert "time_created" not in backlog_sql(bare, True)


def test_a_caller_with_a_wait_bound_answers_the_last_read_while_a_slow_read_goes_on():
    store = SlowStore()
    store.release.set()
    reader = reader_over(store)
    (first,) = reader.backlog(0)  # read 1, done
    store.release.clear()
    answers: list[list[Backlog]] = []
    t = threading.Thread(target=lambda: answers.append(reader.backlog(0, wait_s=0.05)))
    t.start()
    t.join(5)
    assert not t.is_alive(), "a caller with a wait bound waited for a read the database holds"
    assert store.entered.wait(5) and store.calls == 2, "the read did not start"
    assert answers == [[first]], "not the last read while the new one is held"
    # a second caller while the read is still held: the same answer, no second read
    assert reader.backlog(0, wait_s=0.05) == [first] and store.calls == 2
    store.release.set()
    wait_until(lambda: reader.reads == 2, 10, what="the held read to finish in the background")
    (second,) = reader.backlog(3600, wait_s=0.05)
    assert second.due == 2, "the background read's answer was not kept"


def test_a_scrape_does_not_wait_for_a_backlog_read_the_database_holds():
    store = InMemoryStore()
    now = FakeClock().now_ns()
    known_rows(store, now)
    e = make_engine(store)
    held, entered = threading.Event(), threading.Event()
    real = store.backlog

    def slow(cfgs, now_ns):
        entered.set()
        assert held.wait(10), "the test never released the read"
        return real(cfgs, now_ns)

    try:
        assert sample(scrape(e), "msgtable_messages_due") == 2
        store.backlog = slow  # type: ignore[method-assign]
        e._backlog._read_at = None  # the next scrape reads again
        families: list[dict[str, object]] = []
        t = threading.Thread(target=lambda: families.append(scrape(e)))
        t.start()
        t.join(5)
        assert not t.is_alive(), "a scrape waited for a backlog read the database holds"
        assert entered.is_set(), "the scrape did not start a read"
        assert sample(families[0], "msgtable_messages_due") == 2  # the last read
    finally:
        held.set()
        e.close()
