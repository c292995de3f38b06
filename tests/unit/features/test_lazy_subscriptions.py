"""A lazy subscription (msgtable.features.subscriptions.lazy) served on the in-memory store,
step by step (run_loops=False, a fake clock): the cursor's scan, the window, the state rows
written only where the window cannot stand for a message, and the races its verbs meet (an
ack while the postpone is written, rows the cache let go, a cursor another sender moved).
The SQL of each verb is tested against MariaDB and MySQL in
tests/integration/test_lazy_subscriptions.py and the store contract."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from msgtable.core.clock import FakeClock
from msgtable.core.subscriptions import Subscription, state_table_name
from msgtable.core.tables import DEMO_COMMENT
from msgtable.engine.engine import MessageEngine
from msgtable.engine.manager import MessageManager
from msgtable.features.assembly import assemble
from msgtable.features.subscriptions import lazy as lazy_mod
from msgtable.features.subscriptions.lazy import LazyStore
from msgtable.features.subscriptions.registry import Registry
from msgtable.testing import InMemoryStore
from tests.unit.engine.test_manager import drain

STATE = state_table_name("q", "lazy")


@pytest.fixture
def engine() -> Iterator[MessageEngine]:
    store = InMemoryStore()
    store.create_table("q", DEMO_COMMENT)
    e = assemble(
        store, clock=FakeClock(), rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    e.refresh()
    e.create_subscription(Subscription("q", "lazy", state_rows="lazy"))
    yield e
    e.close()


def memory(e: MessageEngine) -> InMemoryStore:
    assert isinstance(e.store, InMemoryStore)
    return e.store


def fan_out(e: MessageEngine) -> int:
    registry = e._subscriptions
    assert isinstance(registry, Registry)
    return registry._fanouts["q"].fanout_once()


def served(e: MessageEngine) -> tuple[MessageManager, LazyStore]:
    m = e.loaded(STATE)
    assert m is not None, "the lazy subscription's state table is served"
    assert isinstance(m.store, LazyStore), "served through its lazy store"
    return m, m.store


def cursor(e: MessageEngine) -> int | None:
    subs = memory(e).subscription_store
    return subs.subscription_cursor("q", "lazy")


def enqueue(e: MessageEngine, *ids: int, **values: object) -> None:
    for i in ids:
        memory(e).insert("q", i, message=f"m{i}", **values)
    assert fan_out(e) == len(ids)


def sent_out(
    e: MessageEngine, *ids: int, filter: str | None = None
) -> tuple[MessageManager, LazyStore, Any, list[object]]:
    """``ids`` enqueued, read by the lazy subscription's scan and sent to a new subscriber
    of it (``filter``: its stream filter): its manager, its store, the subscriber and the
    ids it got."""
    enqueue(e, *ids)
    m, lazy = served(e)
    kw = {} if filter is None else {"filter": filter}
    sub = e.subscribe("q", subscription="lazy", **kw)
    m.poll_once()
    m.send_once()
    return m, lazy, sub, [v[0] for v in drain(sub)]


def test_messages_go_from_the_cursor_and_in_order_acks_write_no_state_row(engine):
    enqueue(engine, 1, 2, 3)
    m, _ = served(engine)
    sub = engine.subscribe("q", subscription="lazy")
    m.poll_once()
    assert m.send_once() == 3
    assert [v[0] for v in drain(sub)] == [1, 2, 3]
    assert engine.ack("q", "", [1, 2, 3], subscription="lazy") == 3
    assert memory(engine).rows[STATE] == {}, "acks in the window write nothing"
    m.poll_once()  # the flush: the cursor over the settled prefix
    assert cursor(engine) == 3
    assert m.send_once() == 0, "nothing is read again once the cursor passed it"


def test_an_out_of_order_ack_holds_the_cursor_until_the_earlier_one_is_settled(engine):
    m, _, _, _ = sent_out(engine, 1, 2, 3)
    engine.ack("q", "", [2, 3], subscription="lazy")
    m.poll_once()
    assert cursor(engine) == 0, "1 is in flight: the cursor may not pass it"
    engine.ack("q", "", [1], subscription="lazy")
    m.poll_once()
    assert cursor(engine) == 3


def test_an_unacked_message_gets_its_state_row_at_its_postpone_and_the_cursor_passes_it(
    engine,
):
    m, _, _, _ = sent_out(engine, 1, 2)
    engine.ack("q", "", [2], subscription="lazy")
    engine.clock.advance(m.config.postpone_after_s)  # type: ignore[attr-defined]
    assert m.postpone_once() == 1
    state = memory(engine).rows[STATE]
    assert list(state) == [1] and state[1]["epoch"] == 1 and state[1]["time_acked"] is None
    assert cursor(engine) == 2, "held by its state row: passed (the postpone flushes)"
    assert engine.ack("q", "", [1], subscription="lazy") == 1
    assert state[1]["time_acked"] is not None


def test_an_ack_while_its_postpone_is_written_upserts_an_acked_state_row(engine):
    """The cache holds a message whose postpone is being written: its ack is not among the
    ack's ``first``; whichever of the two statements commits first, it ends acked."""
    m, lazy, _, _ = sent_out(engine, 1)
    now = engine.clock.now_ns()
    assert lazy.ack(m.config, [1], now, first=()) == 1
    assert lazy.acked_ids(m.config, [1], now) == {1}
    row = memory(engine).rows[STATE][1]
    assert row["time_acked"] == now and row["epoch"] == 1
    lazy.postpone(m.config, [1], 0, now, now + 10**9)  # the postpone lands after: kept
    assert memory(engine).rows[STATE][1]["time_acked"] == now


def test_release_and_reject_write_the_state_row_then_the_verb(engine):
    m, _, sub, _ = sent_out(engine, 1, 2)
    assert engine.release("q", "", [1], 0.0, "later", subscription="lazy") == 1
    assert engine.reject("q", "", [2], "bad", subscription="lazy") == 1
    state = memory(engine).rows[STATE]
    assert state[1]["epoch"] == 1 and state[1]["last_error"] == "later"
    assert state[2]["time_dead"] is not None
    m.poll_once()
    assert cursor(engine) == 2, "both held by their state rows"
    assert m.send_once() == 1, "the release's redelivery, from the state table"
    again = drain(sub)
    assert [v[0] for v in again] == [1]


def test_rows_the_cache_let_go_are_read_again_at_the_next_poll(engine):
    """The last subscriber left: the cache is dropped, nothing was sent. The next poll reads
    the rows again at once (the manager said which it let go: no wait for a scan from the
    cursor, no clock moved)."""
    enqueue(engine, 1, 2)
    m, _ = served(engine)
    sub = engine.subscribe("q", subscription="lazy")
    m.poll_once()
    sub.close()
    sub = engine.subscribe("q", subscription="lazy")
    m.poll_once()
    assert m.send_once() == 2
    assert [v[0] for v in drain(sub)] == [1, 2]


def test_rows_a_full_cache_did_not_take_are_read_again_at_the_next_poll(engine):
    """A pass from the head asks for room + the rows in flight (the default group's table
    has those at its head); the scan has not, so it reads past the cache's room and the
    cache takes what fits. The rest are read again by the next poll, no clock moved."""
    enqueue(engine, 1, 2, 3, 4, 5, 6)
    m, lazy = served(engine)
    m.cache.due.size = 2
    sub = engine.subscribe("q", subscription="lazy")
    m.poll_once()
    assert m.send_once() == 2  # 1 and 2 in flight, not postponed yet
    got = [v[0] for v in drain(sub)]
    m.poll_once()  # room 2, the scan asked for 4: 3 and 4 taken, 5 and 6 let go
    assert lazy._window is not None and lazy._window.scan_after == 4, "read again from 5"
    assert m.send_once() == 2
    got += [v[0] for v in drain(sub)]
    assert engine.ack("q", "", [1, 2, 3, 4], subscription="lazy") == 4
    m.poll_once()
    assert m.send_once() == 2
    assert got + [v[0] for v in drain(sub)] == [1, 2, 3, 4, 5, 6]


def test_rows_a_leaving_subscriber_never_took_are_sent_again_and_hold_the_cursor(engine):
    """A subscriber leaves with a batch handed over and not taken: the window's rows are
    read again at the next poll and go to the other subscriber; meanwhile the cursor does
    not pass them, however the messages after them are acked."""
    enqueue(engine, 1, 2)
    m, _ = served(engine)
    leaving = engine.subscribe("q", subscription="lazy")
    m.poll_once()
    assert m.send_once() == 2  # to ``leaving``, who never takes them
    staying = engine.subscribe("q", subscription="lazy")
    leaving.close()
    enqueue(engine, 3)
    m.poll_once()
    assert m.send_once() == 3
    assert [v[0] for v in drain(staying)] == [1, 2, 3]
    assert engine.ack("q", "", [3], subscription="lazy") == 1
    m.poll_once()
    assert cursor(engine) == 0, "1 and 2 are in flight again: the cursor may not pass them"
    assert engine.ack("q", "", [1, 2], subscription="lazy") == 2
    m.poll_once()
    assert cursor(engine) == 3


def test_without_a_word_the_scan_reads_from_the_cursor_again_only_as_a_net():
    """Rows read past and never said to be let go are not read again at each poll
    interval; the scan from the cursor still comes every REWIND_NET_S (a row some path
    dropped without a word: none is known)."""
    store = InMemoryStore()
    store.create_table("q", DEMO_COMMENT.replace("vt_poller_interval=30", "vt_poller_interval=1"))
    e = assemble(
        store, clock=FakeClock(), rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    try:
        e.refresh()
        e.create_subscription(Subscription("q", "lazy", state_rows="lazy"))
        enqueue(e, 1, 2)
        m, _ = served(e)
        assert m.config.poller_interval_s == 1
        sub = e.subscribe("q", subscription="lazy")
        m.poll_once()
        with m._lock:  # dropped without telling the store
            m.cache.due.clear()
        e.clock.advance(m.config.poller_interval_s)  # type: ignore[attr-defined]
        m.poll_once()
        assert m.send_once() == 0, "not read again at the next pass"
        e.clock.advance(lazy_mod.REWIND_NET_S)  # type: ignore[attr-defined]
        m.poll_once()
        assert m.send_once() == 2
        assert [v[0] for v in drain(sub)] == [1, 2]
    finally:
        e.close()


def test_a_delayed_message_is_parked_in_its_state_row(engine):
    later = engine.clock.now_ns() + 3600 * 10**9
    enqueue(engine, 1, time_next=later)
    enqueue(engine, 2)
    m, _ = served(engine)
    sub = engine.subscribe("q", subscription="lazy")
    m.poll_once()
    assert m.send_once() == 1
    assert [v[0] for v in drain(sub)] == [2]
    state = memory(engine).rows[STATE]
    assert list(state) == [1] and state[1]["time_next"] == later and state[1]["epoch"] == 0
    engine.ack("q", "", [2], subscription="lazy")
    m.poll_once()
    assert cursor(engine) == 2


def test_a_cursor_another_sender_moved_drops_the_window(engine):
    m, _, _, _ = sent_out(engine, 1, 2, 3)
    subs = memory(engine).subscription_store
    assert subs.advance_cursor("q", "lazy", 0, 2)  # another server's flush
    engine.ack("q", "", [1, 2, 3], subscription="lazy")
    m.poll_once()  # its flush finds the cursor moved: the window goes
    assert cursor(engine) == 2, "moved only by the sender that knew where it was"


@pytest.mark.parametrize("how", ["poll", "let go"])
def test_acks_of_a_window_dropped_for_a_cursor_another_sender_moved_are_written(engine, how):
    """The window's own acks beyond where another sender moved the cursor are written as
    acked state rows before the window goes: 3 (no stream filter passes it) holds the cursor,
    1, 2, 4, 5, 6 are acked here, another server moved the cursor to 1 meanwhile. Without the
    write, the next scan (from 1) sent 2, 4, 5 and 6 again after their ack (the chaos run's
    "delivered after their ack" of a lazy subscription after two servers swapped its table)."""
    m, lazy, _, got = sent_out(engine, 1, 2, 3, 4, 5, 6, filter="id != 3")
    assert got == [1, 2, 4, 5, 6]
    engine.ack("q", "", [1, 2, 4, 5, 6], subscription="lazy")
    subs = memory(engine).subscription_store
    assert subs.advance_cursor("q", "lazy", 0, 1)  # another server's flush
    if how == "poll":
        m.poll_once()  # its flush finds the cursor moved: the window goes
    else:
        lazy.let_go()  # a lost lease: the same, on letting go
    assert cursor(engine) == 1, "moved only by the sender that knew where it was"
    state = memory(engine).rows[STATE]
    assert sorted(state) == [2, 4, 5, 6], "the acks beyond the other's cursor written"
    assert all(r["time_acked"] is not None and r["time_next"] is None for r in state.values())
    table = engine.loaded("q")
    assert table is not None
    loaded = engine._subscriptions._subs[STATE]  # type: ignore[union-attr]
    scanned = subs.unsent_rows(table.config, m.config, loaded.filter, 1, 10)
    assert sorted(r[3] for r in scanned) == [3], "the next scan sends 3 alone"


def test_letting_go_during_a_flush_writes_the_acks_behind_a_held_cursor(engine):
    """A lost lease lets go while the poll's flush is moving the cursor: the letting go
    waits for that flush and writes the acks the window alone knows (before, it found a
    flush under way and returned: the acks went with the window)."""
    m, lazy, _, got = sent_out(engine, 1, 2, 3, 4, filter="id != 2")
    assert got == [1, 3, 4]
    engine.ack("q", "", [1, 3, 4], subscription="lazy")
    subs = memory(engine).subscription_store
    moving, go_on = threading.Event(), threading.Event()
    advance = subs.advance_cursor

    def slow_advance(*args: object) -> bool:
        moving.set()
        assert go_on.wait(10), "the test let the flush go on"
        return advance(*args)  # type: ignore[arg-type]

    subs.advance_cursor = slow_advance  # type: ignore[method-assign]
    poller = threading.Thread(target=m.poll_once)
    poller.start()
    assert moving.wait(10), "the poll's flush moves the cursor (1 is settled)"
    letting_go = threading.Thread(target=lazy.let_go)
    letting_go.start()
    letting_go.join(0.2)
    go_on.set()
    poller.join(10)
    letting_go.join(10)
    assert not poller.is_alive() and not letting_go.is_alive()
    assert cursor(engine) == 1
    state = memory(engine).rows[STATE]
    assert sorted(state) == [3, 4], "the acks behind 2 written on letting go"


@pytest.mark.parametrize("let_go", [False, True])
def test_an_ack_after_the_lease_ended_writes_its_acked_state_row(engine, monkeypatch, let_go):
    """This server no longer sends the table (its lease ended; its letting go already ran
    or not yet): an ack of a message it sent is written at once as an acked state row, not
    kept in the window, which no flush here moves any more; the next sender, which scans
    from the cursor after its hold, skips it. Before, the ack lived in this window alone and
    the next sender sent the message again (the chaos run: a database link cut ended the
    lease, the ack came 0.8 s after the link was back, the next sender sent it 1.7 s later)."""
    _, lazy, _, got = sent_out(engine, 1, 2, 3)
    assert got == [1, 2, 3]
    monkeypatch.setattr(engine, "may_send", lambda unit: False)
    if let_go:
        lazy.let_go()
    assert engine.ack("q", "", [1, 3], subscription="lazy") == 2
    state = memory(engine).rows[STATE]
    assert sorted(state) == [1, 3], "acked state rows, written at once"
    assert all(r["time_acked"] is not None for r in state.values())


@pytest.mark.parametrize("postpone_after", [None, 0])
def test_a_message_another_server_wrote_a_state_row_for_since_the_scan_is_not_sent(
    postpone_after, monkeypatch
):
    """The scan read 1-3 into the window (a takeover's hold keeps them back); the last
    sender, which sent 2 before its lease ended, writes its acked state row (its
    subscriber's late ack); the send hands over 1 and 3 only, and 2 is the state table's
    from then on (an acked row: never sent again). Before, the window's rows were sent with
    no look at the state table, and 2 went out again after its ack."""
    store = InMemoryStore()
    extra = "" if postpone_after is None else f",vt_postpone_after={postpone_after}"
    store.create_table("q", DEMO_COMMENT + extra)
    e = assemble(
        store, clock=FakeClock(), rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    try:
        e.refresh()
        e.create_subscription(Subscription("q", "lazy", state_rows="lazy"))
        enqueue(e, 1, 2, 3)
        m, _ = served(e)
        assert (m.config.postpone_after_ns == 0) is (postpone_after == 0)
        sub = e.subscribe("q", subscription="lazy")
        m.poll_once()
        subs = memory(e).subscription_store
        subs.write_state_rows(m.config, [(2, 0, None, 1, None)], e.clock.now_ns())
        # this server gained the table after 1-3 were made (the last sender may have sent them)
        monkeypatch.setattr(e, "others_sent_before_ns", lambda unit: 2**63 - 1)
        m.send_once()
        assert [v[0] for v in drain(sub)] == [1, 3]
        row = memory(e).rows[STATE][2]
        assert row["time_acked"] is not None, "2's acked row as the other server wrote it"
        assert m.send_once() == 0 and drain(sub) == []
    finally:
        e.close()


def test_messages_made_since_this_server_sends_the_table_are_sent_with_no_read(engine, monkeypatch):
    """The look at the state table is for rows another server may have sent: rows created
    after this server gained the table go from the window with no statement."""
    enqueue(engine, 1, 2)
    m, _ = served(engine)
    sub = engine.subscribe("q", subscription="lazy")
    m.poll_once()
    subs = memory(engine).subscription_store
    looked: list[object] = []
    written_of = subs.written_of
    monkeypatch.setattr(subs, "written_of", lambda *a: looked.append(a[1]) or written_of(*a))
    monkeypatch.setattr(engine, "others_sent_before_ns", lambda unit: 0)
    assert m.send_once() == 2 and [v[0] for v in drain(sub)] == [1, 2]
    assert looked == [], "no read for rows made since this server sends the table"


def test_the_counters_go_on_when_the_store_is_made_anew(engine):
    """A lazy subscription's store is made anew when its table is loaded again; its
    counters (cursor flushes, held acks written) are the process's and go on from where
    they were (the chaos run's scrape saw msgtable_subscription_cursor_flushes_total go
    from 80 to 0 in one server process)."""
    m, _, _, _ = sent_out(engine, 1, 2, 3)
    engine.ack("q", "", [1, 2, 3], subscription="lazy")
    m.poll_once()
    registry = engine._subscriptions
    assert isinstance(registry, Registry)
    assert registry.cursor_flushes() == {("q", "lazy"): 1}
    registry.store_for(m.config)  # its table loaded again: a new store for its manager
    assert registry.cursor_flushes() == {("q", "lazy"): 1}


def test_an_ack_of_a_message_another_sender_sent_writes_its_acked_state_row(engine):
    """The sender that sent it crashed (its window lost); the subscriber's ack comes to the
    next sender, whose window does not have it and which finds no state row to UPDATE: an
    acked state row is upserted, so the cursor's scan does not send it again."""
    m, lazy, _, _ = sent_out(engine, 1, 2, 3)
    lazy.reset()  # the window is gone, as a new sender's after the old one crashed
    assert engine.ack("q", "", [1], subscription="lazy") == 1, "the ack counts"
    row = memory(engine).rows[STATE].get(1)
    assert row is not None and row["time_acked"] is not None, "an acked state row for 1"
    subs = memory(engine).subscription_store
    cfg = m.config
    table = engine.loaded("q")
    assert table is not None
    loaded = engine._subscriptions._subs[STATE]  # type: ignore[union-attr]
    scanned = subs.unsent_rows(table.config, cfg, loaded.filter, 0, 10)
    assert sorted(r[3] for r in scanned) == [2, 3], "the scan skips the acked one"


def test_a_sender_that_lets_go_flushes_what_was_acked_since_its_last_poll(engine):
    """A clean close (or a lost lease) moves the cursor over the acks since the last poll:
    the next sender does not send them again."""
    sent_out(engine, 1, 2, 3)
    engine.ack("q", "", [1, 2, 3], subscription="lazy")
    assert cursor(engine) == 0, "not flushed yet: no poll since"
    engine.close()
    assert cursor(engine) == 3


def test_acks_behind_a_message_never_sent_are_written_once_it_held_the_cursor_long_enough(
    engine,
):
    """Message 1, which no stream filter passes, is read and never sent: the cursor stays
    below it and the acks of 2-5 live in the window alone. Once the same message held the
    cursor vt_postpone_after, a flush writes them (acked state rows, one upsert); none for 1
    (still to send); nothing again at the next flush; the cursor passes all once 1 is acked."""
    m, lazy, _, got = sent_out(engine, 1, 2, 3, 4, 5, filter="id > 1")
    assert got == [2, 3, 4, 5]
    engine.ack("q", "", [2, 3, 4, 5], subscription="lazy")
    state = memory(engine).rows[STATE]
    m.poll_once()
    assert (cursor(engine), state) == (0, {}), "held just now: nothing written yet"
    engine.clock.advance(m.config.postpone_after_s)  # type: ignore[attr-defined]
    m.poll_once()
    assert sorted(state) == [2, 3, 4, 5], "the acks behind the held cursor written"
    assert all(r["time_acked"] is not None and r["time_next"] is None for r in state.values())
    assert cursor(engine) == 0, "1 still holds it"
    written = {i: dict(r) for i, r in state.items()}
    engine.clock.advance(m.config.postpone_after_s)  # type: ignore[attr-defined]
    m.poll_once()
    assert state == written, "nothing acked since: nothing written again"
    everyone = engine.subscribe("q", subscription="lazy")
    assert m.send_once() == 1
    assert [v[0] for v in drain(everyone)] == [1]
    engine.ack("q", "", [1], subscription="lazy")
    m.poll_once()
    assert cursor(engine) == 5
    assert lazy.cursor_writes == 1


def test_an_expired_lazy_subscription_active_again_gets_what_is_handed_over_from_then_on():
    """As an eager one: nothing of its expiry (its cursor moves to the sequence's last when
    a subscriber comes back), everything after."""
    store = InMemoryStore()
    store.create_table("q", DEMO_COMMENT)
    clock = FakeClock()
    e = assemble(
        store, clock=clock, rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    try:
        e.refresh()
        e.create_subscription(Subscription("q", "lazy", expire_after_s=1.0, state_rows="lazy"))
        enqueue(e, 1)
        clock.advance(2.0)
        registry = e._subscriptions
        assert isinstance(registry, Registry)
        registry.upkeep()
        (status,) = e.list_subscriptions("q")
        assert status.state == "expired"
        enqueue(e, 2)
        sub = e.subscribe("q", subscription="lazy")  # active again
        m, _ = served(e)
        m.poll_once()
        assert m.send_once() == 0, "nothing of its expiry"
        enqueue(e, 3)
        m.poll_once()
        assert m.send_once() == 1
        assert [v[0] for v in drain(sub)] == [3]
    finally:
        e.close()


def test_after_a_takeover_new_messages_go_at_once_and_the_old_ones_after_the_hold(engine):
    """A new sender holds back what the old one may have sent (there before the floor) for
    the hold, as the default group does; a message enqueued after it goes at once, and the
    cursor does not pass a message held back."""
    floor = engine.clock.now_ns()
    enqueue(engine, 1, time_created=floor - 10**9)  # the old sender may have sent it
    enqueue(engine, 2, time_created=floor + 10**9)  # it cannot have
    m, _ = served(engine)
    m.hold(5.0, floor)
    sub = engine.subscribe("q", subscription="lazy")
    m.poll_once()
    assert m.send_once() == 1
    assert [v[0] for v in drain(sub)] == [2]
    engine.ack("q", "", [2], subscription="lazy")
    m.poll_once()
    assert cursor(engine) == 0, "1 was held back: the cursor may not pass it"
    engine.clock.advance(5.0)  # type: ignore[attr-defined]
    m.poll_once()
    assert m.send_once() == 1
    assert [v[0] for v in drain(sub)] == [1]
    engine.ack("q", "", [1], subscription="lazy")
    m.poll_once()
    assert cursor(engine) == 2


@pytest.mark.parametrize("how", ["deleted", "acked by DML", "filtered out"])
def test_a_message_let_go_that_the_scan_no_longer_finds_does_not_hold_the_cursor(how):
    """The cache let 1 and 2 go unsent (the last subscriber left); then the application
    deleted 1, acked it by its upsert (no binlog here to say so), or changed it so that the
    subscription's filter no longer passes it. The scan from below 1 does not find it: the
    window stops standing for it, so the cursor passes it once 2 is acked (it held the
    cursor, and so the purge, for good)."""
    store = InMemoryStore()
    store.create_table("q", DEMO_COMMENT)
    e = assemble(
        store, clock=FakeClock(), rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    try:
        e.refresh()
        flt = "message != 'gone'" if how == "filtered out" else ""
        e.create_subscription(Subscription("q", "lazy", state_rows="lazy", filter=flt))
        for i in (1, 2):
            store.insert("q", i, message=f"m{i}")
        assert fan_out(e) == 2
        m, _ = served(e)
        sub = e.subscribe("q", subscription="lazy")
        m.poll_once()
        sub.close()  # 1 and 2 let go, unsent
        if how == "deleted":
            store.delete("q", 1)
        elif how == "filtered out":
            store.update("q", 1, message="gone")
        else:
            store.subscription_store.write_state_rows(
                m.config, [(1, 0, None, 1, None)], e.clock.now_ns()
            )
        sub = e.subscribe("q", subscription="lazy")
        m.poll_once()
        assert m.send_once() == 1
        assert [v[0] for v in drain(sub)] == [2]
        assert e.ack("q", "", [2], subscription="lazy") == 1
        m.poll_once()
        assert cursor(e) == 2, f"1 ({how}) still holds the cursor"
    finally:
        e.close()


def test_a_claim_whose_state_rows_the_fence_kept_out_hands_nothing_over(monkeypatch):
    """vt_postpone_after=0: a lazy subscription's claim writes the state rows (the postpone)
    before the hand-over. When the store's fence keeps them out (this server no longer sends
    the table: write_state_rows answers 0, as MySQLStore's does; tested on the databases in
    test_placement), the rows are not handed over: the next sender sends them from the
    cursor, and a hand-over here too would have two subscribers hold them at once."""
    store = InMemoryStore()
    store.create_table("q", f"{DEMO_COMMENT},vt_postpone_after=0")
    e = assemble(
        store, clock=FakeClock(), rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    try:
        e.refresh()
        e.create_subscription(Subscription("q", "lazy", state_rows="lazy"))
        m, _ = served(e)
        assert m.config.postpone_after_s == 0
        enqueue(e, 1, 2)
        monkeypatch.setattr(store.subscription_store, "write_state_rows", lambda *a, **k: 0)
        sub = e.subscribe("q", subscription="lazy")
        m.poll_once()
        m.send_once()
        assert drain(sub) == [], "handed over with no state row written"
        assert store.rows[STATE] == {}
        assert cursor(e) == 0
    finally:
        e.close()
