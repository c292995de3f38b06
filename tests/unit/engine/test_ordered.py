"""Ordering per key in memory (msgtable.engine.ordered): the manager's steps driven one by one on
the
in-memory store with a fake clock; the real server's behaviour is in
tests/integration/test_ordering.py."""

from __future__ import annotations

import random

import pytest

from msgtable.core.clock import FakeClock
from msgtable.core.tables import DEMO_COMMENT, Column, load_table
from msgtable.engine.engine import MessageEngine
from msgtable.engine.manager import MessageManager
from msgtable.engine.ordered import OrderedDue, Unkeyed, whole_keys
from msgtable.engine.subscriber import Subscriber
from msgtable.errors import TableLoadError
from msgtable.testing import InMemoryStore
from msgtable.testing.memory import CURRENT_COLUMNS

KEYED = (*CURRENT_COLUMNS, Column("k", "varchar", "varchar(64)"), Column("seq", "bigint", "bigint"))
INDEX = (("order_idx", ("k", "time_acked", "id")),)
COMMENT = DEMO_COMMENT.replace("vt_batch_size=10", "vt_batch_size=3") + ",vt_order_key=k"


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture(params=[1.0, 0.0], ids=["postpone-after-1s", "postpone-before-send"])
def store(request):
    s = InMemoryStore()
    s.create_table("q", f"{COMMENT},vt_postpone_after={request.param}", KEYED, indexes=INDEX)
    return s


@pytest.fixture
def engine(store, clock):
    e = MessageEngine(
        store, clock=clock, rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    e.refresh()
    yield e
    e.close()


def manager(engine) -> MessageManager:
    return engine._manager("q", "")


def step(m: MessageManager) -> None:
    m.poll_once(restart=True)
    m.send_once()


def ids(sub: Subscriber) -> list[list[int]]:
    out = []
    while batch := sub.next_batch(0):
        out.append([v[0] for v in batch])
    return out


# -- the config --------------------------------------------------------------------------------
def test_vt_order_key_needs_its_index_and_names_the_statement_that_adds_it():
    with pytest.raises(TableLoadError) as err:
        load_table("jobs", COMMENT, KEYED, [("id",)], [])
    assert "vt_order_key=k needs an index that begins (k, time_acked, id)" in str(err.value)
    assert "ALTER TABLE jobs ADD INDEX order_idx (k, time_acked, id)" in str(err.value)


@pytest.mark.parametrize(
    ("fields", "indexes", "error"),
    [
        (",vt_order_key=nope", INDEX, "vt_order_key names unknown column 'nope'"),
        (",vt_order_key=priority", INDEX, "vt_order_key=priority is an engine column"),
        (",vt_order_key=k,vt_order_by=k", INDEX, "vt_order_by must be another column"),
        (",vt_order_by=seq", INDEX, "vt_order_by needs vt_order_key"),
        (",vt_order_key=k,vt_order_by=seq", INDEX, "begins (k, time_acked, seq)"),
    ],
)
def test_bad_ordering_fields_are_load_errors_naming_the_field(fields, indexes, error):
    comment = DEMO_COMMENT + fields
    with pytest.raises(TableLoadError, match=error.replace("(", r"\(").replace(")", r"\)")):
        load_table("jobs", comment, KEYED, [("id",)], indexes)


def test_an_ordered_table_loads_with_its_index_and_order_column():
    cfg = load_table("jobs", COMMENT, KEYED, [("id",)], INDEX)
    assert (cfg.order_key, cfg.order_by, cfg.order_index) == ("k", "id", "order_idx")
    by_seq = load_table(
        "jobs",
        COMMENT + ",vt_order_by=seq",
        KEYED,
        [("id",)],
        [("by_seq", ("k", "time_acked", "seq", "id"))],
    )
    assert (by_seq.order_by, by_seq.order_index) == ("seq", "by_seq")
    # InnoDB appends the primary key: (k, time_acked) orders by id
    short = load_table("jobs", COMMENT, KEYED, [("id",)], [("o", ("k", "time_acked"))])
    assert short.order_index == "o"


# -- the manager -------------------------------------------------------------------------------
def test_a_keys_next_batch_waits_for_every_message_of_the_one_before(engine, store):
    for i, k in enumerate("aaaaab", start=1):
        store.insert("q", i, k=k)
    m = manager(engine)
    sub = m.subscribe(max_in_flight=100)
    step(m)
    step(m)
    assert ids(sub) == [[1, 2, 3], [6]]  # a's run (batch size 3), then b's
    m.ack([1, 2])
    step(m)
    assert ids(sub) == []  # 3 is still in flight: a waits
    m.ack([3, 6])
    step(m)
    assert ids(sub) == [[4, 5]]


def test_keys_take_turns_so_a_hot_key_does_not_starve_the_others(engine, store):
    n = 1
    for _ in range(30):
        store.insert("q", n, k="hot")
        n += 1
    for k in ("x", "y"):
        store.insert("q", n, k=k)
        n += 1
    m = manager(engine)
    sub = m.subscribe(max_in_flight=100)
    sent: list[list[int]] = []
    for _ in range(4):
        step(m)
        got = ids(sub)
        sent += got
        for batch in got:
            m.ack(batch)
    # x and y went out in the first rounds, not after the hot key's 30 messages
    first = [i for b in sent[:2] for i in b]
    assert 31 in first and 32 in first
    hot = [i for b in sent for i in b if i <= 30]
    assert hot == list(range(1, len(hot) + 1)) and len(hot) >= 6


def test_a_released_head_parks_its_key_until_its_delay_and_comes_back_first(engine, store, clock):
    for i, k in enumerate("aab", start=1):
        store.insert("q", i, k=k)
    m = manager(engine)
    cfg = m.config
    assert cfg.batch_size == 3
    sub = m.subscribe(max_in_flight=1)  # one message at a time: 1, then 2 must wait
    step(m)
    assert ids(sub) == [[1]]
    m.release([1], delay_s=5, reason=None)
    for _ in range(3):
        step(m)
    assert ids(sub) == [[3]]  # b goes on, a waits for 1
    m.ack([3])
    clock.advance(5)
    step(m)
    assert ids(sub) == [[1]]
    m.ack([1])
    step(m)
    assert ids(sub) == [[2]]


def test_an_ack_wait_over_frees_the_key_and_its_head_comes_again(engine, store, clock):
    store.insert("q", 1, k="a")
    store.insert("q", 2, k="a")
    m = manager(engine)
    sub = m.subscribe(max_in_flight=1)
    step(m)
    assert ids(sub) == [[1]]
    clock.advance(m.config.ack_wait_s + 1)
    m.postpone_once(everything=True)
    clock.advance(m.config.ack_wait_s * 2)
    for _ in range(2):
        step(m)
    assert ids(sub) == [[1]]  # again, not 2


def test_rows_of_no_key_are_each_their_own_key(engine, store):
    for i in (1, 2, 3):
        store.insert("q", i, k=None)
    m = manager(engine)
    sub = m.subscribe(max_in_flight=100)
    step(m)
    step(m)
    assert sorted(i for b in ids(sub) for i in b) == [1, 2, 3]


def test_status_counts_keys_in_flight_and_waiting(engine, store):
    for i, k in enumerate("abc", start=1):
        store.insert("q", i, k=k)
    m = manager(engine)
    m.subscribe(max_in_flight=1)
    step(m)
    st = m.status("ks")
    assert (st.keys_in_flight, st.keys_waiting) == (1, 2)


# -- OrderedDue alone --------------------------------------------------------------------------
def row(
    rid: int, key: object, time_next: int = 0, priority: int = 0, epoch: int = 0
) -> tuple[object, ...]:
    return (priority, time_next, epoch, rid, f"m{rid}", None, rid, key, key)


def test_a_run_is_cut_before_a_row_sent_and_not_postponed_yet():
    due = OrderedDue(100, lambda rid: False)
    new, taken = due.add([row(1, "a"), row(2, "a"), row(3, "a")], 0, {2}, (), ())
    assert (new, taken) == ([1], 3)
    assert [r.id for r in due.pop(10, 0)] == [1]


def test_a_run_of_a_busy_key_is_not_taken_in():
    flying: set[int] = set()
    due = OrderedDue(100, flying.__contains__)
    due.add([row(1, "a")], 0, (), (), ())
    (r,) = due.pop(10, 0)
    flying.add(1)
    due.finish([r])
    assert due.add([row(2, "a")], 0, (), (), ()) == ([], 1)
    assert due.pop(10, 0) == []
    flying.discard(1)
    due.landed(1)
    assert due.take_wanted(10) == ["a"]


def test_priority_orders_keys_and_a_head_not_due_holds_its_key():
    due = OrderedDue(100, lambda rid: False)
    due.add(
        [row(1, "a", priority=5), row(2, "b", priority=1), row(3, "c", time_next=50)],
        0,
        (),
        (),
        (),
    )
    assert [r.id for r in due.pop(1, 0)] == [2]
    assert [r.id for r in due.pop(10, 0)] == [1]
    assert due.next_due_ns() == 50
    assert [r.id for r in due.pop(10, 60)] == [3]


def test_a_pop_stops_a_run_at_a_row_not_due_yet():
    due = OrderedDue(100, lambda rid: False)
    due.add([row(1, "a"), row(2, "a", time_next=99), row(3, "a")], 0, (), (), ())
    assert [r.id for r in due.pop(10, 10)] == [1]


def test_rows_put_back_by_filters_go_back_to_the_front_of_their_key():
    due = OrderedDue(100, lambda rid: False)
    due.add([row(1, "a"), row(2, "a"), row(3, "b")], 0, (), (), ())
    popped = due.pop(10, 0)
    due.put_back(popped)
    due.finish(popped)
    assert [r.id for r in due.pop(10, 0)] == [1, 2, 3]


def test_runs_whose_head_falls_due_after_the_lookahead_are_left_for_a_later_pass():
    due = OrderedDue(100, lambda rid: False, lookahead_ns=10)
    rows = [row(1, "a", time_next=500), row(2, "a"), row(3, "b", time_next=5)]
    assert due.add(rows, 0, (), (), ()) == ([3], 3)  # all taken: a is read again later
    assert due.keys_waiting == 1 and due.take_wanted(10) == []


def test_unkeyed_rows_are_keys_of_their_own():
    due = OrderedDue(100, lambda rid: False)
    due.add([row(1, None), row(2, None)], 0, (), (), ())
    assert sorted(r.id for r in due.pop(10, 0)) == [1, 2]
    assert due.key_of(1) == Unkeyed((1,))


def test_a_key_waits_for_its_sent_rows_not_due_yet_but_not_for_rows_never_sent():
    due = OrderedDue(100, lambda rid: False)
    rows = [
        row(1, "a", epoch=2),  # released, due
        row(2, "a", time_next=70, epoch=1),  # out (from another server): a waits for it
        row(3, "b"),
        row(4, "b", time_next=90),  # a delayed enqueue: holds only itself and what follows
    ]
    due.add(rows, 0, (), (), ())
    assert [r.id for r in due.pop(10, 0)] == [3]
    assert due.next_due_ns() == 70
    assert due.pop(10, 69) == []
    assert [r.id for r in due.pop(10, 70)] == [1, 2]


def test_a_key_whose_sent_rows_fall_due_after_the_lookahead_is_left_for_a_later_pass():
    due = OrderedDue(100, lambda rid: False, lookahead_ns=10)
    assert due.add([row(1, "a", epoch=1), row(2, "a", time_next=50, epoch=1)], 0, (), (), ()) == (
        [],
        2,
    )
    assert due.keys_waiting == 0


def test_a_send_that_lost_a_row_of_a_key_sends_none_of_that_key():
    due = OrderedDue(100, lambda rid: False)
    due.add([row(1, "a"), row(2, "a"), row(3, "b"), row(4, "b")], 0, (), (), ())
    batch = due.pop(10, 0)
    kept = whole_keys(batch, {1, 3, 4}, due.key_of)  # 2 was renewed elsewhere since
    assert [r.id for r in kept] == [3, 4]


def test_a_key_that_lost_a_row_in_the_send_check_is_read_again_and_sent_whole(engine, store, clock):
    m = manager(engine)
    for i, k in ((1, "a"), (2, "a"), (3, "b")):
        store.insert("q", i, k=k)
    sub = m.subscribe(max_in_flight=100)
    m.poll_once(restart=True)
    out_until = clock.now_ns() + 5_000_000_000
    store.rows["q"][2].update(time_next=out_until, epoch=1)  # renewed through another server
    m.send_once()
    assert ids(sub) == [[3]]
    clock.advance(5.0)
    step(m)
    assert ids(sub) == [[1, 2]]
