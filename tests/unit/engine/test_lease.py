"""The engine's side of the lease, driven by hand on the in-memory store: a server without
the lease redirects subscribers, a new holder waits out the old one's unwritten leases, a
lost lease ends subscriptions with NotLeader, and a send never hands over without the lease.
(The placement table itself, against a real MariaDB, is in
tests/integration/test_placement.py.)"""

from __future__ import annotations

import random
import time

import pytest

from msgtable.core.clock import FakeClock
from msgtable.core.tables import DEMO_COMMENT
from msgtable.engine.engine import MessageEngine
from msgtable.engine.lease import Takeover
from msgtable.errors import NotLeader
from msgtable.testing import InMemoryStore
from msgtable.testing.memory import CURRENT_COLUMNS
from tests.unit.engine.test_manager import drain, postponed
from tests.unit.engine.test_ordered import INDEX, KEYED

COMMENT = DEMO_COMMENT.replace("vt_ack_wait=30", "vt_ack_wait=10")
NO_CREATED = tuple(c for c in CURRENT_COLUMNS if c.name != "time_created")


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def store():
    s = InMemoryStore()
    s.create_table("later", f"{COMMENT},vt_postpone_after=1")  # sent rows: lease unwritten
    s.create_table("before", f"{COMMENT},vt_postpone_after=0")  # lease written at the send
    return s


def new_engine(store: InMemoryStore, clock: FakeClock) -> MessageEngine:
    """An engine on ``store`` that runs no loop and has discovered its tables."""
    e = MessageEngine(
        store,
        clock=clock,
        rng=random.Random(1),
        discovery_interval_s=3600,
        run_loops=False,
        lease_period_s=1.0,
    )
    e.refresh()
    return e


@pytest.fixture
def engine(store, clock):
    e = new_engine(store, clock)
    yield e
    e.close()


FIRST = Takeover(previous="", ended_s_ago=float("inf"), released=True, by_me=False)


def gain(engine: MessageEngine, takeover: Takeover) -> None:
    """The engine gains the lease of every table it has (msgtable.engine.placement's on_gain)."""
    for unit in sorted(engine._units()):
        engine._gain(unit, takeover)


def lose(engine: MessageEngine, sender: str) -> None:
    """The engine loses the lease of every table it sends (msgtable.engine.placement's on_loss)."""
    for unit in sorted(engine._tenure.sending):
        engine._lose(unit, sender)


def one_row_polled(engine, store, table: str = "later", **values):
    """Row 1 of ``table`` inserted, a subscriber, and a poll: (manager, subscriber)."""
    store.insert(table, 1, message="a", **values)
    m = engine._manager(table, "")
    sub = engine.subscribe(table)
    m.poll_once()
    return m, sub


def test_without_the_lease_subscribers_are_sent_to_the_leader_and_acks_are_served(engine, store):
    assert not engine.leading
    with pytest.raises(NotLeader, match="no server holds its lease") as caught:
        engine.subscribe("later")
    assert caught.value.leader == ""
    store.insert("later", 1, message="a")
    assert engine.ack("later", "", [1]) == 1  # any server may write an ack
    assert [t.name for t in engine.list_tables()] == ["before", "later"]


def test_the_first_holder_sends_at_once(engine, store):
    gain(engine, FIRST)
    m, sub = one_row_polled(engine, store)
    assert m.send_once() == 1 and drain(sub) == [(1, "a")]


@pytest.mark.parametrize(
    ("takeover", "hold_later"),
    [
        (Takeover("old", 2.0, released=False, by_me=False), 8.0),  # crashed 2 s ago
        (Takeover("old", 30.0, released=False, by_me=False), 0.0),  # long ago: leases over
        (Takeover("old", 0.0, released=True, by_me=False), 0.0),  # gave it back cleanly
    ],
)
def test_a_new_holder_waits_out_the_leases_the_old_one_did_not_write(
    engine, store, clock, takeover, hold_later
):
    gain(engine, takeover)
    assert engine._tenure.hold_s(engine._manager("later", "").config) == pytest.approx(
        hold_later, abs=0.5
    )
    # vt_postpone_after=0: every send wrote its postpone first, nothing to wait for
    assert engine._tenure.hold_s(engine._manager("before", "").config) == 0.0
    # there a minute before the old lease ended: that holder may have sent it
    m, sub = one_row_polled(engine, store, time_created=clock.now_ns() - 60 * 10**9)
    if hold_later:
        assert m.send_once() == 0  # held: the old holder's subscriber may still have it
        clock.advance(hold_later + 0.5)
        m.poll_once(restart=False)  # the poll that lifts the hold reads it
    assert m.send_once() == 1 and drain(sub) == [(1, "a")]


def test_after_a_crash_only_what_the_old_holder_may_have_sent_is_held(engine, store, clock):
    """The old holder (crashed, lease over 2 s ago) can only have sent a row that was due
    and in the table before its lease ended: time_next and time_created both at or before
    that end (plus the clock margin). Everything else goes out at once; the rest after the
    hold, in a new pass."""
    now = clock.now_ns()
    ended = now - 2 * 10**9
    old = ended - 10 * 10**9
    store.insert("later", 1, message="old", time_created=old)  # due, there before the end
    store.insert("later", 2, message="new", time_created=now)  # inserted after the end
    store.insert("later", 3, message="later", time_created=old, time_next=now)  # due after it
    # inside the margin: the old holder's clock may have been that far ahead
    store.insert("later", 4, message="edge", time_created=ended + 10**8)
    gain(engine, Takeover("old", 2.0, released=False, by_me=False))
    m = engine._manager("later", "")
    sub = engine.subscribe("later")
    m.poll_once()
    assert m.send_once() == 2
    assert sorted(drain(sub)) == [(2, "new"), (3, "later")]
    clock.advance(7.0)  # still held
    m.poll_once(restart=False)
    assert m.send_once() == 0
    clock.advance(1.5)  # vt_ack_wait (10 s) after the old lease ended: the rest comes
    m.poll_once(restart=False)  # the hold's end begins a new pass itself
    assert m.send_once() == 2
    assert sorted(drain(sub)) == [(1, "old"), (4, "edge")]


def test_a_table_without_time_created_holds_by_time_next_alone(store, clock):
    store.create_table("bare", f"{COMMENT},vt_postpone_after=1", columns=NO_CREATED)
    e = new_engine(store, clock)
    try:
        now = clock.now_ns()
        store.insert("bare", 1, message="unknown age")  # time_next 0: due since any time
        store.insert("bare", 2, message="due after the end", time_next=now)
        gain(e, Takeover("old", 2.0, released=False, by_me=False))
        m = e._manager("bare", "")
        sub = e.subscribe("bare")
        m.poll_once()
        assert m.send_once() == 1 and drain(sub) == [(2, "due after the end")]
        clock.advance(8.5)
        m.poll_once(restart=False)
        assert m.send_once() == 1 and drain(sub) == [(1, "unknown age")]
    finally:
        e.close()


def test_losing_the_lease_ends_subscriptions_with_the_leaders_address(engine, store, clock):
    gain(engine, FIRST)
    m, sub = one_row_polled(engine, store)
    assert m.send_once() == 1
    drain(sub)
    lose(engine, "10.0.0.2:50051")
    assert not engine.leading
    with pytest.raises(NotLeader) as caught:
        sub.next_batch(0)
    assert caught.value.leader == "10.0.0.2:50051"
    # the sent row's postpone was written on the way out (a clean hand-over)
    assert store.rows["later"][1]["epoch"] == 1
    assert all(engine._tenure.clean_demotion.values())
    with pytest.raises(NotLeader, match=r"the leader is at 10\.0\.0\.2:50051"):
        engine.subscribe("later")
    # got back, by this same server after a clean loss: no wait
    gain(engine, Takeover("me", 0.0, released=False, by_me=True))
    assert engine._tenure.hold_s(engine._manager("later", "").config) == 0.0


def test_a_send_does_not_hand_over_once_the_lease_is_gone(engine, store, clock):
    gain(engine, FIRST)
    m, sub = one_row_polled(engine, store)
    m._may_send = lambda: False  # the lease ended while the claim ran
    with pytest.raises(NotLeader):
        m.send_once()
    assert drain(sub) == []
    assert m.sent == 0
    postponed(m, clock)
    assert store.rows["later"][1]["epoch"] == 0  # nothing was sent, so nothing postponed


def test_an_ordered_table_waits_out_the_old_holders_ack_waits_even_when_it_postponed_first(
    store, clock
):
    # vt_postpone_after=0 with a backoff shorter than the ack wait: the old holder's sent head
    # falls due again while its subscriber may still hold the key's batch
    store.create_table(
        "keyed",
        f"{COMMENT},vt_postpone_after=0,vt_min_backoff=1,vt_order_key=k",
        KEYED,
        indexes=INDEX,
    )
    e = new_engine(store, clock)
    try:
        gain(e, Takeover("old", 2.0, released=False, by_me=False))
        assert e._tenure.hold_s(e._manager("keyed", "").config) == pytest.approx(8.0, abs=0.5)
    finally:
        e.close()


def test_a_server_that_lost_the_lease_never_names_itself_as_its_holder(engine):
    """The lease's last read named this server (its own renewal) until a step reads the
    row again; while its steps fail (the database away), the server that lost the lease
    must not tell the dashboard it is the holder: it does not know who is."""

    class LostLease:  # what msgtable.engine.placement.Placement holds after a loss, before a read
        address = "10.0.0.1:50051"
        leader_address = "10.0.0.1:50051"
        holding = True

        def valid(self, unit: str) -> bool:
            return False

        def sender(self, unit: str) -> str:
            if self.holding:
                return self.address
            return "" if self.leader_address == self.address else self.leader_address

        last_sender = sender  # what the server shows: the same here

    gain(engine, FIRST)
    engine._tenure.lease = LostLease()  # type: ignore[assignment]
    try:
        assert engine.lease_holder == "10.0.0.1:50051"  # it holds it: its own address
        lose(engine, "")
        LostLease.holding = False
        assert engine.lease_holder == ""  # lost, holder unknown until the next read
        LostLease.leader_address = "10.0.0.2:50051"  # the next read names the new holder
        assert engine.lease_holder == "10.0.0.2:50051"
    finally:
        engine._tenure.lease = None


def test_during_a_takeovers_hold_a_named_release_or_renew_changes_only_what_this_server_sent(
    engine, store, clock
):
    """The old holder (crashed 2 s ago) may have sent row 1 again, at attempt 2, its count
    not written: the table still says epoch 1. A late release or renew naming attempt 1
    cannot be told from one of a current delivery, so during the hold it changes nothing
    (answered 0: the message comes back after its ack wait, at the latest). Row 2, which
    this server sent since it took over, is released as usual; after the hold, row 1 too."""
    now = clock.now_ns()
    old = now - 12 * 10**9
    store.insert("later", 1, message="old", time_created=old, epoch=1)
    store.insert("later", 2, message="new", time_created=now)
    gain(engine, Takeover("old", 2.0, released=False, by_me=False))
    m = engine._manager("later", "")
    sub = engine.subscribe("later")
    m.poll_once()
    assert m.send_once() == 1 and drain(sub) == [(2, "new")]
    before = dict(store._table("later")[1])
    assert engine.release("later", "", [1], 0.0, "late", attempts=[1]) == 0
    assert engine.renew("later", "", [1], 5.0, "late", attempts=[1]) == 0
    assert store._table("later")[1] == before  # untouched: the old holder's send stands
    assert engine.release("later", "", [2], 0.0, "mine", attempts=[1]) == 1
    clock.advance(8.5)  # vt_ack_wait (10 s) after the old lease ended: the hold is over
    assert engine.release("later", "", [1], 0.0, "late", attempts=[1]) == 1


class EndedLease:
    """A lease whose last tenure's validity ended ``ago_s`` ago (monotonic)."""

    address = "me:1"
    leader_address = ""

    def __init__(self, ago_s: float) -> None:
        self.ended = time.monotonic() - ago_s

    def held_until_s(self, unit: str) -> float:
        return self.ended

    def valid(self, unit: str) -> bool:
        return False

    def sender(self, unit: str) -> str:
        return ""

    def close(self, released: object) -> None:
        pass


@pytest.mark.parametrize(("ago_s", "written"), [(2.0, True), (6.0, False)])
def test_a_server_whose_lease_ended_long_ago_writes_no_postpones_on_its_way_out(
    engine, store, clock, ago_s, written
):
    """A server cut off from the database notices the end of its lease late. Past half an
    ack wait (10 s here) after that end, the next holder may have sent its rows again, that
    send not counted in the table yet: a postpone written now would match its epoch and
    make the row due at once while it is in flight. So the demotion writes none then (the
    count is lost; the next holder holds the rows until a whole ack wait after the end);
    before that, it writes them as a clean hand-over does."""
    gain(engine, FIRST)
    m, sub = one_row_polled(engine, store)
    assert m.send_once() == 1
    drain(sub)
    engine._tenure.lease = EndedLease(ago_s)
    lose(engine, "10.0.0.2:50051")
    assert store.rows["later"][1]["epoch"] == (1 if written else 0)
    assert all(engine._tenure.clean_demotion.values()) is written
    # counted for the metrics (msgtable_postpones_skipped_total): the log line is not enough
    assert engine.postpones_skipped == ({} if written else {"later": 1})


def test_a_takeovers_hold_shows_in_the_tables_status_until_it_ends(engine, store, clock):
    """ListTables / msgtable tables say what the log said alone: how long a table's sends
    are still held after an unclean takeover, and whether all of them or only the old
    holder's may-have-sent rows (a floor)."""
    assert all(s.hold_s == 0 and not s.hold_whole for s in engine.list_tables())
    gain(engine, Takeover("old", 2.0, released=False, by_me=False))  # crashed 2 s ago
    later = {s.name: s for s in engine.list_tables()}["later"]
    assert later.hold_s == pytest.approx(8.0, abs=0.5)  # vt_ack_wait 10 s after its end
    assert not later.hold_whole  # the table has time_created: a floor, the rest flows
    assert {s.name: s for s in engine.list_tables()}["before"].hold_s == 0
    clock.advance(8.5)
    assert {s.name: s for s in engine.list_tables()}["later"].hold_s == 0


def test_a_hold_without_a_floor_says_it_holds_every_send(store, clock):
    store.create_table("bare", f"{COMMENT},vt_postpone_after=1", columns=NO_CREATED)
    e = new_engine(store, clock)
    try:
        e._manager("bare", "").hold(5.0)  # no floor: every send of the table waits
        bare = {s.name: s for s in e.list_tables()}["bare"]
        assert bare.hold_s == pytest.approx(5.0) and bare.hold_whole
    finally:
        e.close()
