from __future__ import annotations

import itertools
import random
import threading
import time

import pytest

from msgtable.core.clock import FakeClock
from msgtable.core.tables import DEMO_COMMENT
from msgtable.engine.engine import MessageEngine
from msgtable.engine.manager import MessageManager
from msgtable.engine.purger import PURGE_DUTY_BUSY, PURGE_DUTY_IDLE
from msgtable.engine.subscriber import Subscriber, select_subscribers
from msgtable.errors import (
    DatabaseUnavailable,
    InvalidArgument,
    TableLoadError,
    TableNotFound,
    Unavailable,
)
from msgtable.limits import (
    DEFAULT_MAX_IN_FLIGHT,
    MAX_IN_FLIGHT,
    MAX_MESSAGES,
    SUBSCRIBER_BUFFER_BATCHES,
)
from msgtable.testing import InMemoryStore
from tests.waiting import wait_until

COMMENT = DEMO_COMMENT.replace("vt_batch_size=10", "vt_batch_size=2").replace(
    "vt_cache_size=10000", "vt_cache_size=4"
)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture(params=[1.0, 0.0], ids=["postpone-after-1s", "postpone-before-send"])
def postpone_after(request):
    """vt_postpone_after: the default (postpone a sent row 1 s later unless acked first),
    and 0 (postpone before the send, as Vitess does). Both must keep the same contract."""
    return request.param


@pytest.fixture
def store(postpone_after):
    s = InMemoryStore()
    s.create_table("q", f"{COMMENT},vt_postpone_after={postpone_after}")
    return s


@pytest.fixture
def engine(store, clock):
    e = MessageEngine(
        store, clock=clock, rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    e.refresh()  # discovery without starting any thread: steps are driven by the test
    yield e
    e.close()


def manager(engine) -> MessageManager:
    return engine._manager("q", "")


def postponed(m: MessageManager, clock: FakeClock) -> None:
    """Let vt_postpone_after pass and write the postpones that fall due (none when it is 0:
    the send wrote them)."""
    clock.advance(m.config.postpone_after_ns / 1e9)
    m.postpone_once()


def sent_one(engine, store) -> tuple[MessageManager, Subscriber]:
    """Message 1 ("a") enqueued, polled and sent to a new subscriber, which got it."""
    store.insert("q", 1, message="a")
    m = manager(engine)
    sub = m.subscribe()
    m.poll_once()
    m.send_once()
    assert drain(sub) == [(1, "a")]
    return m, sub


def drain(sub: Subscriber) -> list:
    out = []
    while batch := sub.next_batch(0):
        out.extend(batch)
    return out


def test_nothing_is_polled_or_cached_without_a_subscriber(engine, store):
    store.insert("q", 1, message="a")
    m = manager(engine)
    assert m.poll_once() == 0 and store.polls == 0 and m.cache.due.queued == 0


def test_a_due_row_is_polled_sent_and_postponed_with_epoch_plus_one(engine, store, clock):
    store.insert("q", 1, message="a")
    m = manager(engine)
    sub = m.subscribe()
    assert m.poll_once() == 1
    sent_at = clock.now_ns()
    assert m.send_once() == 1
    assert drain(sub) == [(1, "a")]
    row = store.rows["q"][1]
    if m.config.postpone_after_s:
        assert row["epoch"] == 0 and row["time_next"] == 0  # not before vt_postpone_after
        clock.advance(0.9)
        assert m.postpone_once() == 0
    postponed(m, clock)
    assert row["epoch"] == 1
    # from the send: ack_wait 30 + backoff(epoch 0) = min_backoff 30 * jitter, at least 30
    assert row["time_next"] >= sent_at + 60 * 10**9


def test_a_row_with_null_time_next_is_due(engine, store):
    store.insert("q", 1, message="a", time_next=None)
    m = manager(engine)
    m.subscribe()
    assert m.poll_once() == 1


def test_batches_go_round_robin_and_each_row_to_one_subscriber(engine, store):
    for i in range(4):
        store.insert("q", i, message=str(i))
    m = manager(engine)
    a, b = m.subscribe(), m.subscribe()
    m.poll_once()
    while m.send_once():
        pass
    got_a, got_b = drain(a), drain(b)
    assert len(got_a) == 2 and len(got_b) == 2
    assert sorted(r[0] for r in got_a + got_b) == [0, 1, 2, 3]


def test_a_stream_whose_batches_back_up_is_skipped_and_the_others_get_the_rest(
    engine, store, clock
):
    """A subscriber that does not take its batches (a slow reader: its gRPC writes block)
    is queued at most SUBSCRIBER_BUFFER_BATCHES batches; the sender never waits on it and the
    round-robin gives the rest to the others, though its window has room."""
    for i in range(20):
        store.insert("q", i, message=str(i))
    m = manager(engine)
    slow, fast = m.subscribe(), m.subscribe()
    got_fast: list = []
    for _ in range(30):  # the cache holds 4 rows: several polls
        m.poll_once()
        while m.send_once():
            got_fast += drain(fast)
        got_fast += drain(fast)
        postponed(m, clock)
    got_slow = drain(slow)
    assert slow.window.room > 0
    assert len(got_slow) == SUBSCRIBER_BUFFER_BATCHES * 2  # vt_batch_size=2
    assert sorted(r[0] for r in got_fast + got_slow) == list(range(20))


def test_select_subscribers_takes_those_with_room_in_turn():
    class S:
        def __init__(self, room):
            self.room = room

        def has_room(self):
            return self.room

    subs = [S(True), S(False), S(True)]
    assert select_subscribers(subs, 1) == [2, 0]
    assert select_subscribers(subs, 3) == [0, 2]
    assert select_subscribers([S(False)], 0) == []


def test_an_unacked_message_comes_back_after_its_backoff(engine, store, clock):
    store.insert("q", 1, message="a")
    m = manager(engine)
    sub = m.subscribe()
    m.poll_once()
    m.send_once()
    drain(sub)
    postponed(m, clock)
    clock.advance(29)
    m.poll_once()
    assert m.send_once() == 0  # still in its ack wait + backoff
    clock.advance(31 * 4 / 3)
    m.poll_once()
    assert m.send_once() == 1
    assert drain(sub) == [(1, "a")]
    postponed(m, clock)
    assert store.rows["q"][1]["epoch"] == 2


def test_an_acked_message_is_not_sent_again(engine, store, clock):
    store.insert("q", 1, message="a")
    m = manager(engine)
    sub = m.subscribe()
    m.poll_once()
    m.send_once()
    drain(sub)
    assert engine.ack("q", "", [1]) == 1
    assert engine.ack("q", "", [1]) == 0
    assert store.rows["q"][1]["epoch"] == 1  # one send, counted by the ack or the postpone
    clock.advance(3600)
    assert m.postpone_once() == 0  # nothing left to postpone
    assert m.poll_once() == 0


def test_sends_count_as_their_stream_takes_them_and_never_go_down(engine, store, clock):
    # msgtable_messages_sent_total and _redelivered_total are Prometheus counters: a
    # subscriber that leaves with batches queued for it must not take them back (fresh-clone
    # CI: redelivered 18 -> 13 within one server process and lease tenure, a client
    # connection reset mid-stream)
    for i in range(4):
        store.insert("q", i, message=str(i), epoch=1)  # each sent once before
    m = manager(engine)
    a, b = m.subscribe(), m.subscribe()
    m.poll_once()
    seen = []

    def counts() -> tuple[int, int]:
        s = m.status("memdb")
        seen.append((s.sent, s.redelivered))
        return seen[-1]

    counts()
    m.send_once()  # a batch of 2 queued for each
    counts()
    got_a = drain(a)
    assert counts() == (len(got_a), len(got_a)) == (2, 2)  # what went out, all redeliveries
    b.close()  # its batch never went out
    assert counts() == (2, 2)
    assert all(x <= y for x, y in itertools.pairwise(seen)), seen


def test_a_dml_ack_while_cached_prevents_the_send(engine, store, clock):
    store.insert("q", 1, message="a")
    m = manager(engine)
    sub = m.subscribe()
    m.poll_once()
    store.update("q", 1, time_acked=clock.now_ns(), time_next=None)  # another client's DML
    m.send_once()
    assert drain(sub) == []
    assert m.status("memdb").sent == 0


def test_a_reschedule_to_the_future_while_cached_prevents_the_send(engine, store, clock):
    store.insert("q", 1, message="a")
    m = manager(engine)
    sub = m.subscribe()
    m.poll_once()
    store.update("q", 1, time_next=clock.now_ns() + 10**12)
    m.send_once()
    assert drain(sub) == []


def test_reprioritise_takes_effect_at_the_next_poll(engine, store):
    store.insert("q", 1, message="a", priority=5)
    store.insert("q", 2, message="b", priority=1)
    m = manager(engine)
    sub = m.subscribe()
    m.poll_once()
    store.update("q", 1, priority=0)
    m.poll_once()
    m.send_once()
    assert [r[0] for r in drain(sub)] == [1, 2]


def test_cache_is_bounded_and_refills_when_room_frees(engine, store):
    for i in range(10):
        store.insert("q", i, message=str(i))
    m = manager(engine)
    sub = m.subscribe()
    assert m.poll_once() == 4
    assert m.cache.due.pending
    m._poll_wake.clear()
    m.send_once()
    m.send_once()
    assert m._poll_wake.is_set()  # woken to refill at once, not a poll interval later
    drain(sub)


def test_leaving_subscribers_drop_the_cache(engine, store):
    store.insert("q", 1, message="a")
    m = manager(engine)
    sub = m.subscribe()
    m.poll_once()
    sub.close()
    assert m.cache.due.queued == 0 and m.status("memdb").subscribers == 0


def test_a_message_stays_in_flight_after_its_subscriber_left(engine, store, clock):
    m, sub = sent_one(engine, store)
    sub.close()
    assert m.status("memdb").in_flight == 1  # its ack wait runs on
    clock.advance(31)
    assert m.status("memdb").in_flight == 0


def test_purge_deletes_old_acked_rows_in_batches(engine, store, clock):
    for i in range(1200):
        store.insert("q", i, message="x", time_acked=clock.now_ns() - 86401 * 10**9)
    store.insert("q", "fresh", message="x", time_acked=clock.now_ns())
    store.insert("q", "open", message="x")
    assert manager(engine).purger.purge_once() == 1200
    assert sorted(store.rows["q"]) == ["fresh", "open"]


def test_ack_validates_ids(engine):
    with pytest.raises(InvalidArgument, match="no ids"):
        engine.ack("q", "", [])
    with pytest.raises(InvalidArgument, match="malformed"):
        engine.ack("q", "", [None])
    with pytest.raises(InvalidArgument, match="malformed"):
        engine.ack("q", "", ["abc"])
    with pytest.raises(InvalidArgument, match="at most"):
        engine.ack("q", "", list(range(10_001)))
    assert engine.ack("q", "", ["7", 7.0]) == 0
    with pytest.raises(InvalidArgument, match="malformed"):
        engine.ack("q", "", [1, True])  # a bool is not an id, though Python calls it an int
    # digits Python's str.isdigit() takes and int() does not (found by the fuzz test)
    for text in ("\u00b2", "\u0663", "1\u00b2", "--1", "1_000", "+-1"):
        with pytest.raises(InvalidArgument, match="malformed"):
            engine.ack("q", "", [text])
    assert engine.ack("q", "", [" 12 ", "+3", "-4"]) == 0


def test_an_id_named_twice_in_one_ack_counts_once(engine, store):
    store.insert("q", 1, message="a")
    assert engine.ack("q", "", [1, 1]) == 1


def test_lookup_errors(engine, store):
    with pytest.raises(TableNotFound, match="nope"):
        engine.subscribe("nope")
    with pytest.raises(TableNotFound, match="keyspace"):
        engine.subscribe("q", keyspace="other")
    with pytest.raises(InvalidArgument, match="shard"):
        engine.subscribe("q", shard="-80")
    with pytest.raises(InvalidArgument, match="key_range"):
        engine.subscribe("q", key_range=(b"", b"\x80"))
    with pytest.raises(InvalidArgument):
        engine.subscribe("")
    assert engine.subscribe("q", keyspace="memdb", shard="0") is not None


def test_a_failed_table_is_reported_and_refused_while_others_load(engine, store):
    store.create_table("bad", DEMO_COMMENT.replace("vt_batch_size=10", "vt_batch_size=0"))
    engine.refresh()
    with pytest.raises(TableLoadError, match=r"bad.*vt_batch_size"):
        engine.subscribe("bad")
    with pytest.raises(TableLoadError):
        engine.ack("bad", "", [1])
    statuses = {s.name: s for s in engine.list_tables()}
    assert statuses["bad"].load_error and statuses["q"].load_error is None


def test_dropping_a_table_ends_its_subscribers_with_not_found(engine, store):
    sub = engine.subscribe("q")
    store.drop_table("q")
    engine.refresh()
    with pytest.raises(TableNotFound):
        sub.next_batch(0)


def test_a_changed_comment_is_applied_live(engine, store):
    sub = engine.subscribe("q")
    store.create_table("q", COMMENT.replace("vt_batch_size=2", "vt_batch_size=3"))
    engine.refresh()
    assert manager(engine).config.batch_size == 3
    assert sub.next_batch(0) == []  # still subscribed


def test_database_down_before_discovery_is_unavailable_and_list_tables_says_why_at_once(clock):
    s = InMemoryStore()
    s.down = True
    e = MessageEngine(s, clock=clock, discovery_interval_s=3600)
    with pytest.raises(Unavailable):
        e.refresh()
    with pytest.raises(Unavailable):
        e.subscribe("q")
    assert e.list_tables() == []
    assert e.database_error() == "the database has not answered yet"
    s.outage.down(Unavailable("database unavailable: (2003) gone"))
    assert e.database_error().startswith("waiting for the in-memory database memdb since ")
    assert e.database_error().endswith(": (2003) gone")


def test_close_ends_subscribers_with_unavailable(engine):
    sub = engine.subscribe("q")
    engine.close()
    with pytest.raises(Unavailable, match="shutting down"):
        sub.next_batch(0)


def test_the_loops_deliver_on_their_own_and_stop_on_close(store):
    store.insert("q", 1, message="a")
    e = MessageEngine(store, rng=random.Random(1), discovery_interval_s=3600)
    e.open()
    try:
        sub = e.subscribe("q")
        assert sub.next_batch(5) == [(1, "a")]  # the poller woke at once for the subscriber
        store.insert("q", 2, message="b")
        m = e._manager("q", "")
        m._poll_wake.set()  # what the poll interval (30 s here) would do
        assert sub.next_batch(5) == [(2, "b")]
    finally:
        e.close()
    assert all(not t.is_alive() for t in m._threads)


def test_a_dying_loop_is_reported_as_fatal(store):
    e = MessageEngine(store, rng=random.Random(1), discovery_interval_s=3600)
    e.open()
    try:
        m = e._manager("q", "")

        class Broken(threading.Event):
            def clear(self) -> None:
                raise RuntimeError("the loop's own machinery broke")

        old, m.purger._wake = m.purger._wake, Broken()
        old.set()
        assert e.fatal.wait(5)
        assert "purger loop died" in e.fatal_reason
    finally:
        e.close()


def test_a_backlog_larger_than_the_cache_is_read_once_per_pass(engine, store):
    for i in range(10):
        store.insert("q", i, message=str(i))
    m = manager(engine)
    sub = m.subscribe()
    got = []
    m.poll_once(restart=True)
    while True:
        while m.send_once():
            pass
        got += drain(sub)
        read_in_pass = store.rows_read
        if not m.poll_once(restart=False):  # after the pass ended: a new pass finds nothing
            break
    assert sorted(r[0] for r in got) == list(range(10))
    assert read_in_pass == 10  # each row read once, not again with every refill


def test_one_claim_serves_every_subscriber_with_room(engine, store):
    for i in range(6):
        store.insert("q", i, message=str(i))
    m = manager(engine)
    subs = [m.subscribe() for _ in range(3)]
    claims = []
    method = "send" if m.config.postpone_after_s else "claim"
    real_claim = getattr(store, method)

    def counting_claim(*args, **kwargs):
        claims.append(args[1])
        return real_claim(*args, **kwargs)

    setattr(store, method, counting_claim)
    m.poll_once()
    assert m.send_once() == 4  # cache 4: two batches of 2, for the first two subscribers
    assert len(claims) == 1
    assert [len(drain(s)) for s in subs] == [2, 2, 0]


def test_purge_rests_between_batches_so_its_deletes_take_a_bounded_share_of_time(
    engine, store, clock
):
    for i in range(1200):
        store.insert("q", i, message="x", time_acked=clock.now_ns() - 86401 * 10**9)
    m = manager(engine)
    ticks = iter(range(0, 100, 1))  # every store.purge takes one "second" of the timer
    m.purger.timer = lambda: float(next(ticks))
    rests: list[float] = []
    m.purger.rest = rests.append
    assert m.purger.purge_once() == 1200  # two full batches and a short last one
    idle = 1 / PURGE_DUTY_IDLE - 1
    assert rests == [pytest.approx(idle)] * 2  # no rest after the last, short batch
    for i in range(2000, 3000):
        store.insert("q", i, message="x", time_acked=clock.now_ns() - 86401 * 10**9)
    rests.clear()
    sub = m.subscribe()  # a served table: the purger yields more
    assert m.purger.purge_once() == 1000
    assert rests == [pytest.approx(1 / PURGE_DUTY_BUSY - 1)] * 2
    sub.close()


# -- vt_postpone_after > 0: a sent row is postponed later, unless its ack comes first -------
def polled_for_deferral(engine, store) -> tuple[MessageManager, Subscriber]:
    """One row in the cache of a table at the default vt_postpone_after (1 s), a subscriber
    waiting for it; the test is skipped for vt_postpone_after=0."""
    store.insert("q", 1, message="a")
    m = manager(engine)
    if not m.config.postpone_after_s:
        pytest.skip("postponed before the send")
    sub = m.subscribe()
    m.poll_once()
    return m, sub


@pytest.fixture
def deferred(engine, store, clock):
    """One row, sent at the default vt_postpone_after (1 s), not postponed yet."""
    m, sub = polled_for_deferral(engine, store)
    m.send_once()
    assert drain(sub) == [(1, "a")]
    return m, sub


def test_a_sent_row_not_postponed_yet_is_not_sent_again_though_still_due(deferred, store, clock):
    m, sub = deferred
    clock.advance(0.5)
    assert m.poll_once() == 0 and m.send_once() == 0 and drain(sub) == []
    assert m.status("memdb").in_flight == 1


def test_an_ack_before_the_postpone_writes_the_row_once_and_counts_the_send(
    engine, deferred, store, clock
):
    m, _ = deferred
    assert engine.ack("q", "", [1]) == 1
    row = store.rows["q"][1]
    assert row["epoch"] == 1 and row["time_acked"] == clock.now_ns() and row["time_next"] is None
    clock.advance(10)
    assert m.postpone_once() == 0
    assert row["epoch"] == 1


def test_a_dml_ack_before_the_postpone_is_kept_and_the_send_counted(deferred, store, clock):
    m, _ = deferred
    store.update("q", 1, time_acked=clock.now_ns(), time_next=None)  # another client's DML
    postponed(m, clock)
    row = store.rows["q"][1]
    assert row["epoch"] == 1 and row["time_next"] is None and row["time_acked"] is not None


def test_a_dml_reschedule_before_the_postpone_is_kept(deferred, store, clock):
    m, sub = deferred
    later = clock.now_ns() + 3600 * 10**9
    store.update("q", 1, time_next=later)
    postponed(m, clock)
    assert store.rows["q"][1]["time_next"] == later and store.rows["q"][1]["epoch"] == 0
    clock.advance(3600)
    assert m.poll_once() == 1 and m.send_once() == 1  # at its new time
    assert drain(sub) == [(1, "a")]


def test_a_failed_postpone_is_retried_and_the_row_stays_out_of_the_cache(deferred, store, clock):
    m, _ = deferred
    clock.advance(1)
    store.down = True
    with pytest.raises(Unavailable):
        m.postpone_once()
    store.down = False
    assert m.poll_once() == 0 and m.send_once() == 0  # still in flight, still not resent
    assert m.postpone_once() == 1
    assert store.rows["q"][1]["epoch"] == 1


def test_a_failed_ack_leaves_the_send_to_be_postponed(engine, deferred, store, clock):
    m, _ = deferred
    store.down = True
    with pytest.raises(Unavailable):
        engine.ack("q", "", [1])
    store.down = False
    assert m.poll_once() == 0  # not resent meanwhile
    postponed(m, clock)
    assert store.rows["q"][1]["epoch"] == 1 and store.rows["q"][1]["time_acked"] is None


def test_an_ack_that_arrives_while_its_send_commits_counts_the_send(engine, store, clock):
    m, sub = polled_for_deferral(engine, store)
    acker = threading.Thread(target=engine.ack, args=("q", "", [1]))
    real_put = sub.put

    def put_and_ack_at_once(batch):
        real_put(batch)
        acker.start()  # the subscriber acks at once; its UPDATE waits for the send's commit
        acker.join(0.05)

    sub.put = put_and_ack_at_once
    m.send_once()
    acker.join(5)
    assert store.rows["q"][1]["epoch"] == 1 and store.rows["q"][1]["time_acked"] is not None
    assert m.cache.inflight.unclaimed == 0


def test_close_writes_the_postpones_not_yet_due(engine, deferred, store, clock):
    engine.close()
    row = store.rows["q"][1]
    assert row["epoch"] == 1 and row["time_next"] >= clock.now_ns() + 60 * 10**9


def test_the_send_loop_writes_a_postpone_when_it_falls_due():
    store = InMemoryStore()
    store.create_table("q", f"{COMMENT},vt_postpone_after=0.05")
    store.insert("q", 1, message="a")
    e = MessageEngine(store, rng=random.Random(1), discovery_interval_s=3600)
    e.open()
    try:
        sub = e.subscribe("q")
        assert sub.next_batch(5) == [(1, "a")]
        wait_until(lambda: store.rows["q"][1]["epoch"] == 1, what="the postpone", timeout_s=5)
    finally:
        e.close()


def test_a_pass_from_the_head_reads_past_rows_sent_and_not_postponed(deferred, store, clock):
    m, _ = deferred  # row 1 sent, still due in the table; the cache holds 4
    for i in range(2, 10):
        store.insert("q", i, message=str(i))
    polls = store.polls
    assert m.poll_once(restart=True) == 4  # rows 2-5 in one poll, past the in-flight row 1
    assert store.polls == polls + 1


def test_batches_a_leaving_subscriber_never_got_go_to_another_at_once(engine, store, clock):
    for i in range(4):
        store.insert("q", i, message=str(i))
    m = manager(engine)
    a, b = m.subscribe(), m.subscribe()
    m.poll_once()
    m.send_once()  # a batch of 2 for each
    got_a = drain(a)
    b.close()  # b's batch was queued for it, never taken
    if m.config.postpone_after_s:
        assert m._poll_wake.is_set()  # a new pass is due at once
        assert m.poll_once() == 2 and m.send_once() == 2
        assert sorted(r[0] for r in got_a + drain(a)) == [0, 1, 2, 3]
        assert m.status("memdb").sent == 4
    else:  # postponed before the send: they come back after their backoff
        assert m.poll_once() == 0


# -- on time: rows due before the next poll go out at their time -------------------------
def test_a_row_due_before_the_next_poll_is_sent_at_its_time_not_a_poll_later(engine, store, clock):
    due = clock.now_ns() + 10 * 10**9  # the poll interval is 30 s
    store.insert("q", 1, message="a", time_next=due)
    m = manager(engine)
    sub = m.subscribe()
    assert m.poll_once() == 1  # read ahead
    assert m.send_once() == 0 and m.cache.due.next_due_ns() == due
    assert m._idle_wait_s() == 1.0  # the sender sleeps at most IDLE_WAIT_S, then looks again
    clock.advance(9.5)
    assert m.send_once() == 0 and m._idle_wait_s() == pytest.approx(0.5)
    clock.advance(0.5)
    assert m.send_once() == 1 and drain(sub) == [(1, "a")]
    assert m.cache.due.next_due_ns() is None


def test_a_row_due_after_the_next_poll_is_left_to_that_poll(engine, store, clock):
    store.insert("q", 1, message="a", time_next=clock.now_ns() + 31 * 10**9)
    m = manager(engine)
    m.subscribe()
    assert m.poll_once() == 0


def test_a_row_falling_due_keeps_its_priority_among_the_due(engine, store, clock):
    store.insert("q", 1, message="later", priority=0, time_next=clock.now_ns() + 10**9)
    store.insert("q", 2, message="now", priority=1)
    m = manager(engine)
    sub = m.subscribe()
    m.poll_once()
    clock.advance(1)
    m.send_once()
    assert [r[0] for r in drain(sub)] == [1, 2]


def test_a_scheduled_row_rescheduled_by_dml_goes_at_its_new_time(engine, store, clock):
    store.insert("q", 1, message="a", time_next=clock.now_ns() + 10**9)
    m = manager(engine)
    sub = m.subscribe()
    m.poll_once()
    store.update("q", 1, time_next=clock.now_ns() + 5 * 10**9)
    m.poll_once()  # re-read with its new time
    clock.advance(1)
    assert m.send_once() == 0
    clock.advance(4)
    assert m.send_once() == 1 and drain(sub) == [(1, "a")]


def test_the_sender_wakes_for_a_row_falling_due_between_polls():
    store = InMemoryStore()
    store.create_table("q", COMMENT)  # polls every 30 s
    e = MessageEngine(store, rng=random.Random(1), discovery_interval_s=3600)
    e.open()
    try:
        sub = e.subscribe("q")
        assert sub.next_batch(0.5) == []  # the first poll found nothing
        due = time.time_ns() + 300_000_000
        store.insert("q", 1, message="a", time_next=due)
        e._manager("q", "")._poll_wake.set()  # a poll now, which reads the row ahead
        assert sub.next_batch(5) == [(1, "a")]
        late_s = (time.time_ns() - due) / 1e9
        assert 0 <= late_s < 1.0  # at its time, not 30 s later at the next poll
    finally:
        e.close()


def short_backoff_table(engine, store, postpone_after) -> MessageManager:
    """Table "r": ack wait 1 s, backoff from 1 s, polls every 30 s."""
    comment = (
        COMMENT.replace("vt_ack_wait=30", "vt_ack_wait=1")
        + f",vt_min_backoff=1,vt_postpone_after={postpone_after}"
    )
    store.create_table("r", comment)
    store.insert("r", 1, message="a")
    engine.refresh()
    return engine._manager("r", "")


def test_a_redelivery_due_before_the_next_poll_goes_at_its_time(
    engine, store, clock, postpone_after
):
    m = short_backoff_table(engine, store, postpone_after)
    sub = m.subscribe()
    m.poll_once()
    sent_at = clock.now_ns()
    assert m.send_once() == 1 and drain(sub) == [(1, "a")]
    postponed(m, clock)
    time_next = store.rows["r"][1]["time_next"]
    assert sent_at + 2 * 10**9 <= time_next < sent_at + 2.34 * 10**9  # 1 s wait + 1 s backoff
    assert m.cache.due.next_due_ns() == time_next  # waiting here: no poll is needed to resend it
    clock.advance((time_next - clock.now_ns()) / 1e9 - 0.01)
    assert m.send_once() == 0
    clock.advance(0.01)
    assert m.send_once() == 1 and drain(sub) == [(1, "a")]
    postponed(m, clock)
    assert store.rows["r"][1]["epoch"] == 2


def test_an_ack_before_the_redelivery_cancels_it(engine, store, clock, postpone_after):
    m = short_backoff_table(engine, store, postpone_after)
    sub = m.subscribe()
    m.poll_once()
    m.send_once()
    drain(sub)
    postponed(m, clock)
    assert engine.ack("r", "", [1]) == 1  # late, but before the redelivery
    clock.advance(5)
    assert m.send_once() == 0 and drain(sub) == []


def test_the_engine_follows_the_binlog_only_when_asked():
    dsn = "mysql+pymysql://u:p@127.0.0.1:1/app"  # nothing connects before open()
    assert MessageEngine.from_dsn(dsn).binlog is None
    following = MessageEngine.from_dsn(dsn, follow_binlog=True)
    assert following.binlog is not None
    following.store.close()
    assert MessageEngine(InMemoryStore(), follow_binlog=True).binlog is None  # nothing to follow


# -- a subscriber's window (max_in_flight) -----------------------------------------------
def sent_ids(m: MessageManager, sub: Subscriber) -> list:
    """Poll and send until nothing more goes; the ids the subscriber got."""
    got = []
    while True:
        m.poll_once()
        if not m.send_once():
            break
        got += [r[0] for r in drain(sub)]
    return got


def windowed(engine, store, rows: int, window: int) -> tuple[MessageManager, Subscriber]:
    """``rows`` due messages (ids 0 on) and one subscriber with that window."""
    for i in range(rows):
        store.insert("q", i, message=str(i))
    m = manager(engine)
    return m, m.subscribe(max_in_flight=window)


def test_a_subscriber_never_has_more_than_its_window_unacked(engine, store, clock):
    m, sub = windowed(engine, store, rows=10, window=3)
    assert sent_ids(m, sub) == [0, 1, 2]  # a batch of 2, then one cut to the window's room
    assert sub.window.outstanding == 3 and m.send_once() == 0
    engine.ack("q", "", [0])
    assert sent_ids(m, sub) == [3]
    engine.ack("q", "", [1, 2, 3])
    assert sent_ids(m, sub) == [4, 5, 6]
    assert sub.window.outstanding == 3


def test_the_window_frees_when_ack_waits_end(engine, store, clock):
    m, sub = windowed(engine, store, rows=6, window=2)
    assert sent_ids(m, sub) == [0, 1]
    postponed(m, clock)
    clock.advance(m.config.ack_wait_s)  # the ack wait of 0 and 1 is over
    assert sent_ids(m, sub) == [2, 3]
    assert sub.window.outstanding == 2


def test_a_full_window_whose_messages_were_acked_by_dml_frees_after_a_recheck(engine, store, clock):
    m, sub = windowed(engine, store, rows=6, window=2)
    assert sent_ids(m, sub) == [0, 1]
    store.update("q", 0, time_acked=clock.now_ns(), time_next=None)  # another client's DML
    store.delete("q", 1)
    assert m.recheck_windows() == 0  # the window just filled: not yet
    clock.advance(0.5)
    assert m.recheck_windows() == 0
    clock.advance(0.5)
    assert m.recheck_windows() == 2 and sub.window.outstanding == 0
    assert sent_ids(m, sub) == [2, 3]


def test_a_recheck_keeps_the_credit_of_unacked_messages(engine, store, clock):
    m, sub = windowed(engine, store, rows=4, window=2)
    assert sent_ids(m, sub) == [0, 1]
    m.recheck_windows()
    clock.advance(1)
    assert m.recheck_windows() == 0 and sub.window.outstanding == 2
    assert sent_ids(m, sub) == []


def test_a_subscriber_with_a_limit_is_sent_no_more_whatever_its_acks_give_back(
    engine, store, clock
):
    for i in range(10):
        store.insert("q", i, message=str(i))
    m = manager(engine)
    sub = m.subscribe(max_in_flight=3, max_messages=3)
    assert sent_ids(m, sub) == [0, 1, 2]
    engine.ack("q", "", [0, 1, 2])  # its window is empty again; its limit is spent
    assert sub.window.room == 0 and not sub.has_room()
    assert sent_ids(m, sub) == []
    other = m.subscribe()  # the rest go to whoever comes next
    assert sent_ids(m, other) == list(range(3, 10))
    for bad in (-1, MAX_MESSAGES + 1):
        with pytest.raises(InvalidArgument, match="max_messages"):
            m.subscribe(max_messages=bad)


def test_the_default_window_and_its_bounds(engine):
    m = manager(engine)
    assert m.subscribe().window.size == DEFAULT_MAX_IN_FLIGHT
    assert m.subscribe(max_in_flight=MAX_IN_FLIGHT).window.size == MAX_IN_FLIGHT
    for bad in (-1, MAX_IN_FLIGHT + 1):
        with pytest.raises(InvalidArgument, match="max_in_flight"):
            m.subscribe(max_in_flight=bad)


def test_an_ack_that_frees_a_window_wakes_the_sender(engine, store, clock):
    m, sub = windowed(engine, store, rows=4, window=2)
    assert sent_ids(m, sub) == [0, 1]
    m._send_wake.clear()
    engine.ack("q", "", [0])
    assert m._send_wake.is_set()


def test_a_stream_filter_takes_only_its_rows_and_leaves_the_rest_to_the_others(engine, store):
    for i, text in enumerate(["eu", "us", "eu", "us"], start=1):
        store.insert("q", i, message=text)
    m = manager(engine)
    eu = m.subscribe(accepts=lambda values: values[1] == "eu")
    assert m.poll_once() == 4
    m.send_once()
    assert drain(eu) == [(1, "eu"), (3, "eu")]
    assert m.cache.due.queued == 2  # refused by its filter: queued again, not dropped
    rest = m.subscribe()
    m.send_once()
    assert drain(rest) == [(2, "us"), (4, "us")]
    assert m.cache.due.queued == 0


def test_rows_no_stream_filter_takes_wait_in_the_cache_and_are_not_sent(engine, store):
    store.insert("q", 1, message="us")
    m = manager(engine)
    eu = m.subscribe(accepts=lambda values: values[1] == "eu")
    m.poll_once()
    assert m.send_once() == 0
    assert drain(eu) == [] and m.cache.due.queued == 1
    assert store.rows["q"][1]["epoch"] == 0


def wide(engine, store, rows: list[str]) -> MessageManager:
    """Table "wide" (cache 100, batch 2) with one row per text, ids from 1."""
    store.create_table("wide", COMMENT.replace("vt_cache_size=4", "vt_cache_size=100"))
    engine.refresh()
    for i, text in enumerate(rows, start=1):
        store.insert("wide", i, message=text)
    return engine._manager("wide", "")


def test_a_stream_filter_gets_its_rows_behind_any_number_of_rows_no_filter_passes(engine, store):
    # issue 39: a filtered stream looked through 4 batches of due rows per send, and rows no
    # filter passes gather at the head of the queue: behind 8 of them it got nothing, ever
    m = wide(engine, store, ["??"] * 20 + ["eu", "us", "eu"])
    eu = m.subscribe(accepts=lambda values: values[1] == "eu")
    us = m.subscribe(accepts=lambda values: values[1] == "us")
    m.poll_once()
    m.send_once()
    assert drain(eu) == [(21, "eu"), (23, "eu")] and drain(us) == [(22, "us")]
    assert m.cache.due.queued == 20 and m.cache.stranded == 20


def test_a_stream_filter_gets_its_rows_behind_those_of_a_full_stream(engine, store):
    m = wide(engine, store, ["a"] * 20 + ["b"] * 2)
    a = m.subscribe(max_in_flight=2, accepts=lambda values: values[1] == "a")
    m.poll_once()
    m.send_once()
    assert len(drain(a)) == 2 and not a.has_room()
    b = m.subscribe(accepts=lambda values: values[1] == "b")
    m.send_once()
    assert drain(b) == [(21, "b"), (22, "b")]


def test_a_filtered_stream_with_nothing_leaves_the_send_to_the_next(engine, store):
    m = wide(engine, store, ["us"] * 3)
    eu = m.subscribe(accepts=lambda values: values[1] == "eu")
    us = m.subscribe(accepts=lambda values: values[1] == "us")
    m.poll_once()
    m.send_once()
    assert drain(eu) == [] and [v[0] for v in drain(us)] == [1, 2]


def test_an_insert_polls_at_once_when_the_rows_queued_are_ones_no_filter_passes(engine, store):
    m = wide(engine, store, ["??"] * 10)
    m.subscribe(accepts=lambda values: values[1] == "eu")
    m.poll_once()
    m._poll_wake.clear()
    m.binlog_insert(1)
    assert m._poll_wake.is_set()  # the sender is dry for every stream: read the new row now


def test_a_row_a_settlement_verb_is_writing_is_not_sent_meanwhile(engine, store):
    store.insert("q", 1, message="a")
    store.insert("q", 2, message="b")
    m = manager(engine)
    sub = m.subscribe()
    m.poll_once()
    with m.cache.holding_acks([1], wait=True):  # a reject of 1 is being written
        m.send_once()
    assert drain(sub) == [(2, "b")]  # 1 would have been a send the reject did not count


def test_on_a_lost_lease_every_table_closes_at_once_not_one_after_another():
    from msgtable.engine.engine import _close_all
    from msgtable.errors import NotLeader

    started = []
    both = threading.Barrier(2, timeout=5)

    class Slow:
        def __init__(self, name: str) -> None:
            self.config = type("C", (), {"name": name})()

        def close(self, error) -> bool:
            started.append(self.config.name)
            both.wait()  # each waits for the other to have begun: side by side
            return True

    assert _close_all([Slow("t"), Slow("t__s")], NotLeader("lost"))
    assert sorted(started) == ["t", "t__s"]


def test_closing_ends_the_subscribers_before_waiting_for_the_loops(engine, store):
    m = manager(engine)
    sub = m.subscribe()
    ended_first = []
    t = threading.Thread(target=lambda: None)
    m._threads.append(t)  # a loop that never started: join returns at once
    orig_join = t.join

    def join(timeout=None):
        ended_first.append(sub._ended is not None)
        return orig_join(0)

    t.join = join
    t.start()
    m.close(Unavailable("closing"))
    assert ended_first == [True]


def test_a_server_that_does_not_send_refuses_settlement_verbs_and_names_the_leader(store, clock):
    from msgtable.errors import NotLeader

    store.insert("q", 1, message="a")
    follower = MessageEngine(
        store, clock=clock, discovery_interval_s=3600, run_loops=False, lease_period_s=1.0
    )
    follower.refresh()
    try:
        # it never sent: a send of the leader's not counted yet would be missed by its verb
        for call in (
            lambda: follower.release("q", "", [1], 0, None),
            lambda: follower.reject("q", "", [1], None),
            lambda: follower.renew("q", "", [1], 0, None),
        ):
            with pytest.raises(NotLeader):
                call()
        assert follower.ack("q", "", [1]) == 1  # an ack is counted by the leader's postpone
    finally:
        follower.close()


def test_a_second_subscriber_does_not_make_the_poller_read_the_backlog_again():
    """Only the first subscriber starts a pass from the head (the cache was empty): another
    one arriving (a reconnect storm after a restart: every subscriber) only wakes the poller,
    whose pass goes on after the last row it read."""
    store = InMemoryStore()
    store.create_table("q", DEMO_COMMENT)  # a cache of 10,000; polls every 30 s
    for i in range(1, 6):
        store.insert("q", i, message=str(i))
    e = MessageEngine(store, rng=random.Random(1), discovery_interval_s=3600)
    e.open()
    try:
        first = e.subscribe("q")
        wait_until(lambda: store.rows_read >= 5, what="the first pass read the backlog")
        time.sleep(0.2)
        read = store.rows_read
        second = e.subscribe("q")
        time.sleep(0.3)
        assert store.rows_read == read, "the backlog was read again for the second subscriber"
        first.close()
        second.close()
    finally:
        e.close()


def test_the_ack_wait_counts_from_the_hand_over_not_from_before_a_slow_send_check(
    engine, store, clock
):
    """A send checks its rows in the database before it hands them over; on a slow database
    link that takes a while. The ack wait (the in-flight deadline, and the postpone written
    from it) must count from the hand-over: counted from before the check, the message came
    due again 1.5 s after its subscriber got it with an ack wait of 2 s (the fault suite's
    slow-link fault, in flight to two subscribers at once)."""
    store.insert("q", 1, message="a")
    m = manager(engine)
    sub = m.subscribe()
    m.poll_once()
    real_send, real_claim = store.send, store.claim

    def slow_send(cfg, batch, now_ns, deliver, keep=None):
        clock.advance(0.5)  # the check's round trips on a slow link
        return real_send(cfg, batch, now_ns, deliver, keep)

    def slow_claim(cfg, batch, now_ns, next_ns, deliver, keep=None):
        clock.advance(0.5)
        return real_claim(cfg, batch, now_ns, next_ns, deliver, keep)

    store.send, store.claim = slow_send, slow_claim
    began = clock.now_ns()
    assert m.send_once() == 1
    handed = began + 500_000_000
    assert drain(sub) == [(1, "a")]
    deadline, _, sent_ns, _ = m.cache.inflight._flight[1]
    assert sent_ns == handed, "the send's time is not the hand-over's"
    assert deadline == handed + round(m.config.ack_wait_s * 1e9)


def test_a_close_while_the_loops_start_stops_them_and_joins_none_unstarted(engine, monkeypatch):
    """A table lost (a hand-over, a drop) while it opens: close() from another thread, between
    open()'s threads being made and started, ends every loop and raises nothing."""
    m = manager(engine)
    start = threading.Thread.start
    closing: list[threading.Thread] = []
    failures: list[BaseException] = []

    def close_now() -> None:
        try:
            m.close(timeout_s=5)
        except BaseException as exc:  # what close raised, reported below
            failures.append(exc)

    def start_after_a_close(thread: threading.Thread) -> None:
        if thread.name.startswith("msgtable-q-") and not closing:
            closing.append(threading.Thread(target=close_now))
            start(closing[0])
            closing[0].join(0.3)  # a close that waits for open() to finish goes on below
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_after_a_close)
    m.open()
    monkeypatch.undo()
    closing[0].join(10)
    assert not closing[0].is_alive(), "close() did not return"
    assert failures == []
    assert all(not t.is_alive() for t in m._threads), "a loop outlived close()"


class LostAnswerStore(InMemoryStore):
    """Its postpones commit, then fail as a database link cut before the answer would."""

    lose_postpones = False

    def postpone(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        n = super().postpone(*args, **kwargs)
        if self.lose_postpones:
            raise DatabaseUnavailable("the link was cut before the postpone's answer came")
        return n


@pytest.mark.parametrize("verb", ["ack", "release", "release of attempt 1", "renew", "reject"])
def test_a_send_whose_postpone_committed_unheard_is_counted_once_by_the_next_verb(verb, clock):
    """The postpone's UPDATE committed (epoch 1) but its answer was lost: the manager keeps
    the send as uncounted, and the verb that comes next must not count it again (the fault
    suite's dead letter with 6 attempts of vt_max_attempts 5), nor take the current delivery
    for a later one (a release or renew of attempt 1 answered 0)."""
    store = LostAnswerStore()
    store.create_table("q", f"{COMMENT},vt_postpone_after=1")
    engine = MessageEngine(
        store, clock=clock, rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    engine.refresh()
    try:
        m, _ = sent_one(engine, store)
        store.lose_postpones = True
        with pytest.raises(DatabaseUnavailable):
            postponed(m, clock)
        assert store.rows["q"][1]["epoch"] == 1  # written, unheard
        answered = {
            "ack": lambda: m.ack([1]),
            "release": lambda: m.release([1], 0, None),
            "release of attempt 1": lambda: m.release([1], 0, None, [1]),
            "renew": lambda: m.renew([1], 0, None),
            "reject": lambda: m.reject([1], None),
        }[verb]()
        assert answered == 1
        assert store.rows["q"][1]["epoch"] == 1
    finally:
        engine.close()
