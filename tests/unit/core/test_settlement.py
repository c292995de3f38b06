"""Settlement step by step on the in-memory store and a fake clock: the manager's release,
reject and renew, death by vt_max_attempts at the send, the comment fields and the dead-letter
table's checks, the limits of a request, and the client's leaser."""

from __future__ import annotations

import random

import pytest

from msgtable.client.leaser import Leaser
from msgtable.client.requests import attempts_of, release_request
from msgtable.core.clock import FakeClock
from msgtable.core.deadletters import check_dead_letter
from msgtable.core.settlement import check_delay, check_reason
from msgtable.core.tables import DEAD_TIME_NEXT, DEMO_COMMENT, Column, load_table
from msgtable.engine import postpone
from msgtable.engine.engine import MessageEngine
from msgtable.engine.manager import MessageManager
from msgtable.engine.subscriber import Subscriber
from msgtable.errors import InvalidArgument, TableLoadError
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.testing import CURRENT_COLUMNS, InMemoryStore

NS = 10**9
QUICK = DEMO_COMMENT.replace("vt_ack_wait=30", "vt_ack_wait=10")
ERROR = (Column("last_error", "varchar", "varchar(100)"),)
DEAD = (
    Column("time_dead", "bigint", "bigint"),
    Column("attempts", "bigint", "bigint"),
    Column("last_error", "varchar", "varchar(100)"),
)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture(params=[1.0, 0.0], ids=["postpone-after-1s", "postpone-before-send"])
def store(request):
    s = InMemoryStore()
    s.create_table("q_dead", DEMO_COMMENT, CURRENT_COLUMNS + DEAD)
    s.create_table(
        "q",
        f"{QUICK},vt_postpone_after={request.param},vt_max_attempts=3,vt_dead_letter=q_dead",
        CURRENT_COLUMNS + ERROR,
    )
    return s


@pytest.fixture
def engine(store, clock):
    e = MessageEngine(
        store, clock=clock, rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    e.refresh()
    yield e
    e.close()


def drain(sub: Subscriber) -> list:
    out = []
    while batch := sub.next_batch(0):
        out.extend(batch)
    return out


def deliver(m: MessageManager, sub: Subscriber) -> list:
    m.poll_once()
    m.send_once()
    return drain(sub)


def postponed(m: MessageManager, clock: FakeClock) -> None:
    clock.advance(m.config.postpone_after_ns / 1e9)
    m.postpone_once()


def test_a_message_released_three_times_dies_into_the_dead_letter_table(engine, store, clock):
    store.insert("q", 1, message="a")
    m = engine._manager("q", "")
    sub = m.subscribe()
    for attempt in (1, 2, 3):
        assert [r[0] for r in deliver(m, sub)] == [1]
        assert store.rows["q"][1]["epoch"] in (attempt - 1, attempt)  # (its postpone may wait)
        assert m.release([1], 0.0, f"no #{attempt}") == 1
        assert store.rows["q"][1]["epoch"] == attempt  # the release counted the send
    assert deliver(m, sub) == []  # at epoch 3, due: buried instead of sent
    assert 1 not in store.rows["q"]
    dead = store.rows["q_dead"][1]
    assert (dead["attempts"], dead["last_error"], dead["message"]) == (3, "no #3", "a")
    assert (m.released, m.dead_lettered, m.rejected) == (3, 1, 0)


def test_the_last_attempt_dies_when_its_ack_wait_ends_not_after_a_backoff(engine, store, clock):
    store.insert("q", 1, message="a", epoch=2)  # sent twice before
    m = engine._manager("q", "")
    sub = m.subscribe()
    sent = clock.now_ns()
    assert len(deliver(m, sub)) == 1
    postponed(m, clock)
    assert store.rows["q"][1]["time_next"] == sent + 10 * NS  # vt_ack_wait, no backoff
    clock.advance(9.9 - m.config.postpone_after_s)
    assert deliver(m, sub) == [] and 1 in store.rows["q"]  # its ack could still come
    clock.advance(0.2)
    assert deliver(m, sub) == []
    assert store.rows["q_dead"][1]["last_error"] == "no ack after 3 attempts (vt_max_attempts=3)"


def test_an_ack_after_the_last_send_keeps_the_message_alive_and_acked(engine, store, clock):
    store.insert("q", 1, message="a", epoch=2)
    m = engine._manager("q", "")
    sub = m.subscribe()
    deliver(m, sub)
    assert m.ack([1]) == 1
    clock.advance(60)
    assert deliver(m, sub) == []
    assert store.rows["q"][1]["time_acked"] is not None and store.rows["q_dead"] == {}


def test_reject_buries_at_once_and_counts_a_send_not_postponed_yet(engine, store, clock):
    store.insert("q", 1, message="a")
    m = engine._manager("q", "")
    sub = m.subscribe()
    deliver(m, sub)
    assert m.reject([1, 1, 2], "poison") == 1  # 2 unknown, 1 named twice
    assert store.rows["q_dead"][1]["attempts"] == 1
    assert m.cache.inflight.count(clock.now_ns()) == 0  # its window's credit is back
    assert m.reject([1], None) == 0
    assert engine.list_tables()[0].dead == 1


def test_renew_keeps_a_message_in_flight_past_its_ack_wait(engine, store, clock):
    store.insert("q", 1, message="a")
    m = engine._manager("q", "")
    sub = m.subscribe()
    deliver(m, sub)
    for _ in range(5):
        clock.advance(8)
        assert m.renew([1], 0.0, None) == 1  # another ack wait (10 s) from now
        m.postpone_once()
        assert deliver(m, sub) == []
        assert m.cache.inflight.count(clock.now_ns()) == 1
    clock.advance(10.1 + 40 * 4 / 3)  # not renewed any more: ack wait, then its backoff
    assert [r[0] for r in deliver(m, sub)] == [1]


def test_a_renew_shorter_than_the_ack_wait_left_keeps_the_later_due_time(engine, store, clock):
    """A renew is a heartbeat: 'not due again before extend_s from now, a later due time is
    kept'. Renewed 1 s after its send with extend_s=1, a message whose ack wait (10 s) is not
    over is not sent again before that ack wait ends, whether its send was postponed yet or
    not (the renew then counts the send and writes its due time)."""
    store.insert("q", 1, message="a")
    m = engine._manager("q", "")
    sub = m.subscribe()
    assert [r[0] for r in deliver(m, sub)] == [1]
    sent = clock.now_ns()
    clock.advance(0.5)
    assert m.renew([1], 1.0, None) == 1
    assert store.rows["q"][1]["time_next"] >= sent + 10 * NS, "the renew brought the due time in"
    clock.advance(5)  # past the renew's 1 s, inside the ack wait
    m.postpone_once()
    assert deliver(m, sub) == [], "sent again before its ack wait ended"
    clock.advance(5)  # the ack wait over: back (after its backoff where postponed)
    m.postpone_once()
    clock.advance(40 * 4 / 3)
    assert [r[0] for r in deliver(m, sub)] == [1]


def test_a_renew_of_messages_from_two_sends_keeps_each_sends_own_due_time(engine, store, clock):
    """Each uncounted send's rows get its own later due time (one UPDATE a send), the rows
    already postponed keep theirs."""
    store.insert("q", 1, message="a")
    m = engine._manager("q", "")
    sub = m.subscribe()
    assert [r[0] for r in deliver(m, sub)] == [1]
    first_sent = clock.now_ns()
    clock.advance(0.4)
    store.insert("q", 2, message="b")
    assert [r[0] for r in deliver(m, sub)] == [2]
    second_sent = clock.now_ns()
    clock.advance(0.1)
    assert m.renew([1, 2], 0.5, None) == 2
    due = {i: store.rows["q"][i]["time_next"] for i in (1, 2)}
    assert due[1] >= first_sent + 10 * NS and due[2] >= second_sent + 10 * NS, due
    assert {store.rows["q"][i]["epoch"] for i in (1, 2)} == {1}


def test_a_late_release_or_renew_of_an_earlier_delivery_changes_nothing(engine, store, clock):
    """Attempt 1's handler settles after its ack wait, once attempt 2 is out (its send not
    counted in the table yet with vt_postpone_after): neither verb touches attempt 2, which
    stays in flight and is still counted by its postpone."""
    store.insert("q", 1, message="a")
    m = engine._manager("q", "")
    sub = m.subscribe()
    assert [r[0] for r in deliver(m, sub)] == [1]
    m.postpone_once()
    clock.advance(10.1 + 40)  # its ack wait and backoff over
    m.postpone_once()
    assert [r[0] for r in deliver(m, sub)] == [1]  # attempt 2
    assert m.release([1], 0.0, "late", attempts=[1]) == 0
    assert m.renew([1], 60.0, "late", attempts=[1]) == 0
    assert m.cache.inflight.count(clock.now_ns()) == 1  # attempt 2 still in flight
    postponed(m, clock)
    assert store.rows["q"][1]["epoch"] == 2  # attempt 2's send counted, by its postpone
    assert store.rows["q"][1].get("last_error") is None
    assert m.renew([1], 60.0, None, attempts=[2]) == 1
    assert m.release([1], 0.0, None, attempts=[0]) == 1  # 0: whichever delivery is current
    assert [r[0] for r in deliver(m, sub)] == [1]  # attempt 3
    with pytest.raises(InvalidArgument, match="2 attempts for 1 id; one per id, or none"):
        m.release([1], 0.0, None, attempts=[3, 3])
    # an id named twice keeps the attempt it was first named with
    assert m.release([1, 1], 0.0, None, attempts=[2, 3]) == 0
    assert m.release([1, 1], 0.0, None, attempts=[3, 2]) == 1


def test_a_late_release_or_renew_leaves_a_later_send_counted_after_its_ack_wait(
    engine, store, clock
):
    """As above, but attempt 2's postpone is not written by the end of its ack wait (a slow
    database held the postpone back): out of flight, its send is still this server's to count.
    A late verb about attempt 1 took it for its statement, which matched nothing (the row
    answers attempt 2), and then let it go as counted: the table kept epoch 1, the row was
    due again while attempt 2 was out, a later release of attempt 1 changed it, and a reject
    buried it with 1 attempt of 2 (the chaos run's findings, issue 42 item 4)."""
    store.insert("q", 1, message="a")
    m = engine._manager("q", "")
    sub = m.subscribe()
    assert [r[0] for r in deliver(m, sub)] == [1]
    postponed(m, clock)
    clock.advance(10.1 + 40)  # its ack wait and backoff over
    assert [r[0] for r in deliver(m, sub)] == [1]  # attempt 2
    clock.advance(10.1)  # attempt 2's ack wait over, its postpone not written yet
    assert m.cache.inflight.count(clock.now_ns()) == 0
    assert m.release([1], 0.0, "late", attempts=[1]) == 0
    assert m.renew([1], 60.0, "late", attempts=[1]) == 0
    m.postpone_once()
    assert store.rows["q"][1]["epoch"] == 2, "attempt 2's send was not counted"
    assert m.release([1], 0.0, "late", attempts=[1]) == 0
    assert m.reject([1], "poison") == 1
    (dead,), _ = engine.dead_letters("q", "", None, 10)
    assert dead.attempts == 2


def test_release_and_renew_validate_before_they_change_anything(engine, store):
    store.insert("q", 1, message="a", epoch=1, time_next=NS)
    m = engine._manager("q", "")
    before = dict(store.rows["q"][1])
    for call in (
        lambda: m.release([1], -1.0, None),
        lambda: m.release([1], float("inf"), None),
        lambda: m.renew([1], 43_201.0, None),
        lambda: m.reject([1], "x" * 1_001),
        lambda: m.release([], 0.0, None),
        lambda: m.renew(["x"], 0.0, None),
    ):
        with pytest.raises(InvalidArgument):
            call()
    assert store.rows["q"][1] == before


def test_without_a_dead_letter_table_dead_is_in_place_and_redrive_revives(clock):
    store = InMemoryStore()
    store.create_table("p", f"{QUICK},vt_max_attempts=1", CURRENT_COLUMNS + ERROR)
    store.insert("p", 1, message="a")
    e = MessageEngine(
        store, clock=clock, rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    e.refresh()
    try:
        m = e._manager("p", "")
        sub = m.subscribe()
        deliver(m, sub)
        postponed(m, clock)
        clock.advance(10)
        assert deliver(m, sub) == []
        assert store.rows["p"][1]["time_next"] == DEAD_TIME_NEXT
        assert m.ack([1]) == 0  # a late ack leaves it dead (a moved one: no row to ack)
        assert store.rows["p"][1]["time_next"] == DEAD_TIME_NEXT
        (dead,), total = e.dead_letters("p", "", None, 10)
        assert (dead.id, dead.attempts, total) == (1, 1, 1)
        batch = e.redrive("p", "", "", None, None, 10)
        assert (batch.moved, batch.last) == (1, 1)
        assert [r[0] for r in deliver(m, sub)] == [1]  # alive, fresh: attempt 1 again
        assert store.rows["p"][1]["epoch"] in (0, 1)
    finally:
        e.close()


# -- definitions ------------------------------------------------------------------------------
def table(comment: str, extra: tuple[Column, ...] = ()):
    return load_table("t", comment, CURRENT_COLUMNS + extra, [("id",)])


@pytest.mark.parametrize(
    ("fields", "extra", "error"),
    [
        (",vt_max_attempts=0", (), "vt_max_attempts=0 must be at least 1"),
        (",vt_max_attempts=two", (), "vt_max_attempts='two' is not a whole number"),
        (",vt_max_attempts=2000000", (), "must be at most 1,000,000"),
        (",vt_dead_letter=t", (), "vt_dead_letter=t is the table itself"),
        (",vt_dead_letter=", (), "vt_dead_letter must name a table"),
        ("", (Column("last_error", "bigint", "bigint"),), "column last_error must be text"),
        (
            "",
            (Column("time_dead", "varchar", "varchar(9)"),),
            "column time_dead must be an integer",
        ),
    ],
)
def test_bad_settlement_fields_are_load_errors_naming_them(fields, extra, error):
    with pytest.raises(TableLoadError, match=error):
        table(DEMO_COMMENT + fields, extra)


def test_a_dead_letter_table_is_checked_against_its_source():
    source = table(DEMO_COMMENT + ",vt_dead_letter=d")
    ok = load_table("d", DEMO_COMMENT, CURRENT_COLUMNS + DEAD, [("id",)])
    assert check_dead_letter(source, ok, None) == ""
    assert "no message table d" in check_dead_letter(source, None, None)
    assert "that table failed to load (boom)" in check_dead_letter(source, None, "boom")
    bare = load_table("d", DEMO_COMMENT, CURRENT_COLUMNS[:5], [("id",)])
    assert check_dead_letter(source, bare, None).endswith(
        "d lacks column message, time_dead, attempts, last_error"
    )
    back = load_table("d", DEMO_COMMENT + ",vt_dead_letter=t", CURRENT_COLUMNS + DEAD, [("id",)])
    assert "sends its dead messages back here" in check_dead_letter(source, back, None)


def test_only_the_last_attempt_skips_the_backoff():
    cfg = table(DEMO_COMMENT + ",vt_max_attempts=3")
    nxt = postpone.next_delivery(cfg, 100 * NS, 1.0)
    assert nxt(2) == 130 * NS  # the third send: due (and dead) when its ack wait ends
    assert nxt(1) > 130 * NS and nxt(0) > 130 * NS


def test_limits_of_a_request():
    assert check_delay("t", "a delay", 0.0) == 0.0
    assert check_delay("t", "a delay", 43_200.0) == 43_200.0
    for bad in (-0.001, float("nan"), float("-inf"), 43_200.5):
        with pytest.raises(InvalidArgument):
            check_delay("t", "a delay", bad)
    assert check_reason("t", "") is None
    assert check_reason("t", "x" * 1_000) == "x" * 1_000
    with pytest.raises(InvalidArgument, match="a reason of 1,001 characters"):
        check_reason("t", "x" * 1_001)


# -- the client's leaser ----------------------------------------------------------------------
class Held:
    def __init__(self, i: int, attempt: int = 1, sent_ns: int = 1) -> None:
        self.id = i
        self.id_value = pb.Value(int_value=i)
        self.attempt = attempt
        self.sent_ns = sent_ns  # 0: from a server that does not say which delivery it is


def test_the_leaser_renews_held_messages_until_settled_or_held_too_long():
    now = [0.0]
    calls: list[list[tuple[int, int]]] = []

    def renew(ids: list[pb.Value], attempts: list[int]) -> int:
        calls.append(sorted(zip((v.int_value for v in ids), attempts, strict=True)))
        return len(ids)

    leaser = Leaser("t", renew, every_s=3600, max_lease_s=10, clock=lambda: now[0])
    try:
        leaser.add([Held(1), Held(2, attempt=4)])
        assert leaser.renew_now() == 2
        leaser.remove([Held(1)])
        now[0] = 5
        leaser.add([Held(3, sent_ns=0)])
        # each with the delivery it renews (0: not known, whichever is current)
        assert leaser.renew_now() == 2 and calls[-1] == [(2, 4), (3, 0)]
        now[0] = 11  # 2 held for 11 s: over max_lease_s, left to its ack wait
        assert leaser.renew_now() == 1 and calls[-1] == [(3, 0)]
        assert leaser.leased == 1
    finally:
        leaser.close()


def test_a_settlement_names_each_delivery_unless_its_server_said_none():
    assert attempts_of([Held(1, attempt=3), Held(2, attempt=1, sent_ns=0)]) == [3, 0]
    assert attempts_of([Held(1, sent_ns=0)]) == []  # by id alone
    request = release_request("t", [pb.Value(int_value=1)], attempts=[3])
    assert list(request.attempts) == [3]
    assert list(release_request("t", [pb.Value(int_value=1)]).attempts) == []
