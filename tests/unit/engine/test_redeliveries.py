"""A redelivery in a group that lags its producer (issue 42, item 4): a pass reads a priority's
fresh rows (time_next 0 or NULL) before its rows given a time, so a due redelivery waited for
the whole backlog of fresh rows; the redelivery poll reads it apart and the cache sends it
before the fresh rows (msgtable.engine.manager._poll_timed, msgtable.engine.due)."""

from __future__ import annotations

import random

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from msgtable.core.clock import FakeClock
from msgtable.core.tables import DEMO_COMMENT
from msgtable.engine.engine import MessageEngine
from msgtable.engine.manager import MessageManager
from msgtable.engine.redeliveries import TIMED_POLL_GAP_NS
from msgtable.engine.subscriber import Subscriber
from msgtable.observe.metrics import registry_for
from msgtable.testing import InMemoryStore

BACKLOG = 200
COMMENT = (
    DEMO_COMMENT.replace("vt_batch_size=10", "vt_batch_size=2")
    .replace("vt_cache_size=10000", "vt_cache_size=8")
    .replace("vt_poller_interval=30", "vt_poller_interval=1")
    + ",vt_min_backoff=0.5,vt_max_backoff=0.5"
)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def store():
    s = InMemoryStore()
    s.create_table("q", COMMENT)
    for i in range(1, BACKLOG + 1):
        s.insert("q", i, message=str(i))
    return s


@pytest.fixture
def engine(store, clock):
    e = MessageEngine(
        store, clock=clock, rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    e.refresh()
    yield e
    e.close()


def step(m: MessageManager, sub: Subscriber, clock: FakeClock, ack: bool = True) -> list:
    """One round of a slow group: a poll, a send, the subscriber takes its batch and acks it;
    then 0.1 s passes. Returns the ids it got."""
    m.poll_once(restart=False)
    m.send_once()
    batch = sub.next_batch(0)
    ids = [v[0] for v in batch]
    if ack and ids:
        m.ack(ids)
    clock.advance(0.1)
    return ids


@pytest.mark.parametrize("how", ["release", "ack wait"])
def test_a_due_redelivery_does_not_wait_for_the_backlog_of_fresh_rows(engine, store, clock, how):
    m = engine._manager("q", "")
    sub = m.subscribe(max_in_flight=2)
    first = step(m, sub, clock, ack=False)
    assert first == [1, 2]
    if how == "release":  # due again in 0.5 s
        assert m.release([1], 0.5, None) == 1
        m.ack([2])
        due_s = 0.5
    else:  # row 2 acked; row 1's ack wait ends, its postpone written: due after its backoff
        m.ack([2])
        clock.advance(m.config.ack_wait_s)
        m.postpone_once(everything=True)
        due_s = (store.rows["q"][1]["time_next"] - clock.now_ns()) / 1e9
        assert due_s > 0
    got: list = []
    rounds = round((due_s + 1.0) / 0.1) + 1  # by its due time + 1 s
    for _ in range(rounds):
        got += step(m, sub, clock)
        if 1 in got:
            break
    assert 1 in got, f"row 1 not redelivered within its due time + 1 s: got {got[-6:]}"
    assert len(got) < BACKLOG - 2, "the fresh backlog was not what held it"


def test_the_redelivery_poll_runs_only_while_the_pass_lags(engine, store, clock):
    m = engine._manager("q", "")
    sub = m.subscribe(max_in_flight=BACKLOG)
    m.poll_once()
    assert m.cache.due.pending  # 8 of 200 read: the pass lags
    before = m._redeliveries._at_ns
    clock.advance(TIMED_POLL_GAP_NS / 1e9)
    m.poll_once(restart=False)
    assert m._redeliveries._at_ns > before
    while drained := step(m, sub, clock):  # the backlog goes, the pass catches up
        assert drained
    at = m._redeliveries._at_ns
    clock.advance(1.0)
    m.poll_once()
    assert not m.cache.due.pending and m._redeliveries._at_ns == at  # caught up: no redelivery poll


def test_the_redelivery_poll_reads_nothing_a_takeovers_floor_holds_back(engine, store, clock):
    """After an unclean takeover, until the hold ends, only the rows the old sender cannot
    have sent are read (due or there after the floor). A redelivery due before the floor and
    made before it (the old sender may have it in flight, its postpone unwritten) waits for
    the hold's end, even while the pass lags; then it goes before the fresh rows."""
    now = clock.now_ns()
    for i in range(1, BACKLOG + 1):  # made before the floor: held back
        store.rows["q"][i]["time_created"] = now - 10**9
    row = store.rows["q"][BACKLOG]
    row.update(epoch=1, time_next=now - 10**6)  # due again (the old sender's attempt 1)
    for i in range(BACKLOG + 1, 2 * BACKLOG + 1):  # made after the floor: read at once
        store.insert("q", i, message=str(i), time_created=now + 10**9)
    m = engine._manager("q", "")
    m.hold(5.0, floor_ns=now)
    sub = m.subscribe(max_in_flight=2)
    m.poll_once()
    assert m.cache.due.pending  # the pass lags: the redelivery poll would read now
    got: list = []
    while clock.now_ns() < now + 4 * 10**9:  # within the hold
        clock.advance(TIMED_POLL_GAP_NS / 1e9)
        got += step(m, sub, clock)
        assert BACKLOG not in got, "a redelivery the takeover's floor holds back went out"
    assert got and min(got) > BACKLOG  # the rows after the floor went out meanwhile
    clock.advance(1.5)  # the hold is over: a new pass, and the redelivery poll reads it
    for _ in range(20):
        got += step(m, sub, clock)
        if BACKLOG in got:
            break
    assert BACKLOG in got, "the held-back redelivery did not come after the hold"


def test_a_filtered_stream_is_not_starved_while_redeliveries_keep_the_others_busy(clock):
    """The chaos run's filter stall (bucket = 0 got nothing for 3.7 s, its messages waiting in
    a lagging table): a stream with filter A drained the rows A passes out of the cache; the
    others' rows filled it, and the stream that takes every row took the redeliveries first,
    which the redelivery poll kept bringing past the cache's size, so the cache never fell to
    half: no pass read on, and A's stream got nothing while its rows waited in the table."""
    store = InMemoryStore()
    store.create_table("f", COMMENT.replace("vt_cache_size=8", "vt_cache_size=100"))
    for i in range(1, 2001):  # the backlog: one row in four passes A
        store.insert("f", i, message="a" if i % 4 == 0 else "b")
    now = clock.now_ns()
    for i in range(10_001, 10_801):  # due redeliveries, none of A's (a stalled B's batches)
        store.insert("f", i, message="b", epoch=1, time_next=now - 10**6)
    e = MessageEngine(
        store, clock=clock, rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    e.refresh()
    try:
        m = e._manager("f", "")
        a = m.subscribe(max_in_flight=4, accepts=lambda values: values[1] == "a")
        m.subscribe(max_in_flight=2, accepts=lambda values: values[1] != "a")  # B: stalled
        anyone = m.subscribe(max_in_flight=4)
        last, longest = clock.now_ns(), 0
        for n in range(100):  # 10 s
            m.poll_once(restart=n % 5 == 0)  # a new pass every poller interval (0.5 s)
            m.send_once()
            for sub in (a, anyone):
                ids = [v[0] for v in drain_batches(sub)]
                if ids:
                    m.ack(ids)
                if sub is a and ids:
                    last = clock.now_ns()
            longest = max(longest, clock.now_ns() - last)
            clock.advance(0.1)
        rows = store.rows["f"]
        waiting = sum(1 for i in range(4, 2001, 4) if rows[i]["time_acked"] is None)
        assert waiting, "A's rows all went: the test no longer lags"
        assert longest <= 3e9, (
            f"A's stream got nothing for {longest / 1e9:.1f} s while {waiting} of its rows "
            "waited in the table (its ack wait + 1 s is the chaos run's bound)"
        )
        # the reads for A's dry stream are counted (msgtable_filter_reads_total), at most
        # one every TIMED_POLL_GAP_NS: 10 s of it
        text = generate_latest(registry_for(e)).decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert "msgtable_filter_reads" in families, "no msgtable_filter_reads_total served"
        reads = [s.value for s in families["msgtable_filter_reads"].samples]
        assert reads == [m.status("").filter_reads], f"the counter's samples: {reads}"
        assert 0 < reads[0] <= 10e9 / TIMED_POLL_GAP_NS + 1, f"reads for dry filters: {reads}"
    finally:
        e.close()


def drain_batches(sub: Subscriber) -> list:
    out = []
    while batch := sub.next_batch(0):
        out.extend(batch)
    return out
