from __future__ import annotations

import threading

import pytest

from msgtable.core.window import RECHECK_NS, Window, window_size
from msgtable.engine.cache import MessageCache
from msgtable.engine.due import DueRows
from msgtable.errors import Unavailable


def row(i, priority=0, time_next=0, epoch=0):
    """A row as a poll reads it."""
    return (priority, time_next, epoch, i, f"m{i}")


def cache(size: int) -> MessageCache:
    return MessageCache(size, threading.Lock())


def polled(c: MessageCache, rows, now_ns=None) -> tuple[int, int]:
    """A whole poll: its read returned ``rows``."""
    with c.poll() as poll:
        return poll.add(rows, now_ns)


def sent(c: MessageCache, ids, now_ns=0, epoch=0, unclaimed=True, window=None):
    """Poll, pop and send these rows (``unclaimed``: not postponed yet, vt_postpone_after
    > 0)."""
    polled(c, [row(i, epoch=epoch) for i in ids])
    with c.sending(now_ns) as sending:
        batch = sending.pop(len(ids))
        sending.sent(batch, 100, unclaimed, window)
    return batch


# -- due rows ------------------------------------------------------------------------------
def test_rows_come_out_by_priority_then_time_next():
    c = cache(10)
    polled(c, [row(1, 1, 5), row(2, 0, 9), row(3, 0, 1), row(4, 1, 1)])
    assert [r.id for r in c.due.pop(10)] == [3, 2, 4, 1]


def test_the_cache_is_bounded_and_counts_sending_rows():
    c = cache(3)
    assert polled(c, [row(i) for i in range(5)]) == (3, 3)  # 3 new; rows 3 and 4 not taken in
    with c.sending(0) as sending:
        sending.pop(2)
        assert c.due.queued == 1 and c.cached == 3 and c.due.room() == 0
        assert polled(c, [row(9)]) == (0, 0)
    assert c.cached == 1 and c.due.room() == 2  # the send is over: its rows left


def test_a_sending_row_is_not_queued_again_by_a_poll():
    c = cache(10)
    polled(c, [row(1)])
    with c.sending(0) as sending:
        batch = sending.pop(1)
        assert polled(c, [row(1)]) == (0, 1) and c.due.queued == 0
        sending.sent(batch, 100, False, None)
    assert c.inflight.count(50) == 1 and c.inflight.count(100) == 0


def cache_counting_passes() -> tuple[MessageCache, list[int]]:
    """A cache holding row 1, and the new passes its sends' ends ask for."""
    c = cache(10)
    passes: list[int] = []
    c.on_reread = lambda: passes.append(1)
    polled(c, [row(1)])
    return c, passes


def test_a_row_released_while_its_send_ran_and_skipped_by_a_poll_then_asks_for_a_new_pass():
    """A subscriber's release can reach the database before the send that delivered the row
    ends (its commit, then its rows leave ``sending``): a poll that reads the released row
    meanwhile skips it (being sent) and its pass goes on past it, so the row would wait for
    the next whole pass (vt_poller_interval). The send's end asks for a new pass then."""
    c, passes = cache_counting_passes()
    with c.sending(0) as sending:
        batch = sending.pop(1)
        sending.sent(batch, 100, True, None)
        with c.holding_acks([1], wait=True):  # the release: its send counted as written
            pass
        c.forget([1])  # and the row no longer in flight
        assert polled(c, [row(1, time_next=5, epoch=1)]) == (0, 1)  # read, skipped: sending
        assert passes == []
    assert passes == [1], "the send's end asked for a new pass"
    assert polled(c, [row(1, time_next=5, epoch=1)]) == (1, 1)  # which queues it


def test_a_row_a_poll_skipped_while_sent_and_still_in_flight_asks_for_no_pass():
    c, passes = cache_counting_passes()
    with c.sending(0) as sending:
        batch = sending.pop(1)
        sending.sent(batch, 100, True, None)
        assert polled(c, [row(1)]) == (0, 1)  # the poll's copy is older than the send
    assert passes == [], "delivered and in flight: the skip was right"
    with c.sending(0) as sending:  # nothing to pop: no pass either
        assert sending.pop(1) == []
    assert passes == []


def test_a_send_that_fails_still_ends_its_rows_sending():
    c = cache(10)
    polled(c, [row(1), row(2)])
    with pytest.raises(Unavailable), c.sending(0) as sending:
        sending.pop(2)
        raise Unavailable("the check failed")
    assert c.cached == 0 and polled(c, [row(1), row(2)]) == (2, 2)  # due again, read again


def test_a_poll_refreshes_priority_of_a_queued_row():
    c = cache(10)
    polled(c, [row(1, priority=5), row(2, priority=1)])
    polled(c, [row(1, priority=0)])
    assert [r.id for r in c.due.pop(2)] == [1, 2]
    assert c.due.queued == 0


def test_forgotten_ids_are_never_popped():
    c = cache(10)
    polled(c, [row(1), row(2)])
    c.forget([1])
    assert [r.id for r in c.due.pop(5)] == [2]


def test_clear_drops_queued_rows_and_pending():
    c = cache(10)
    polled(c, [row(1)])
    c.due.pending = True
    c.due.clear()
    assert c.due.queued == 0 and not c.due.pending and c.due.pop(1) == []


def test_stale_heap_entries_are_compacted():
    d = DueRows(1000)
    for p in range(200):
        d.add([row(1, priority=p)], None, (), (), ())
    assert len(d._heap) <= 2 * d.queued + 64 + 1
    assert [r.id for r in d.pop(5)] == [1]


def test_null_priority_and_time_next_sort_as_zero():
    c = cache(10)
    polled(c, [(None, None, None, 1, "a"), row(2, 1, 0)])
    assert [r.id for r in c.due.pop(2)] == [1, 2]


def test_rows_not_due_yet_wait_for_their_time_then_go_by_priority():
    c = cache(10)
    polled(c, [row(1, priority=0, time_next=50), row(2, priority=1, time_next=5)], now_ns=10)
    assert c.due.next_due_ns() == 50
    assert [r.id for r in c.due.pop(5, now_ns=10)] == [2]
    assert c.due.pop(5, now_ns=49) == [] and not c.due.due(49) and c.due.due(50)
    assert [r.id for r in c.due.pop(5, now_ns=50)] == [1]
    assert c.due.next_due_ns() is None


def test_a_scheduled_row_acked_or_re_keyed_leaves_no_stale_wake_up():
    c = cache(10)
    polled(c, [row(1, time_next=50), row(2, time_next=60)], now_ns=0)
    c.forget([1])
    assert c.due.next_due_ns() == 60
    polled(c, [row(2, time_next=80)], now_ns=0)  # rescheduled by DML, read again
    assert c.due.next_due_ns() == 80
    assert c.due.pop(5, now_ns=70) == [] and [r.id for r in c.due.pop(5, now_ns=80)] == [2]


def test_a_half_empty_cache_with_rows_pending_wants_a_refill():
    c = cache(4)
    polled(c, [row(i) for i in range(4)])
    c.due.pending = True
    assert not c.due.wants_refill()
    c.due.pop(2)
    assert c.due.wants_refill()


# -- sent rows -----------------------------------------------------------------------------
def test_a_sent_row_not_postponed_yet_is_never_queued_again():
    c = cache(10)
    sent(c, [1, 2])
    assert c.inflight.unclaimed == 2
    assert polled(c, [row(1), row(2), row(3)]) == (1, 3)  # the table still has 1 and 2 as due
    assert [r.id for r in c.due.pop(5)] == [3]


def test_unclaimed_rows_come_due_for_their_postpone_oldest_first():
    c = cache(10)
    sent(c, [1], now_ns=10, epoch=0)
    sent(c, [2, 3], now_ns=20, epoch=4)
    assert c.inflight.next_postpone_sent_ns() == 10
    with c.holding_postpones(sent_before_ns=5, limit=10) as hold:
        assert hold.rows == {}
    with c.holding_postpones(sent_before_ns=20, limit=2) as hold:
        assert {i: s[:2] for i, s in hold.rows.items()} == {1: (0, 10), 2: (4, 20)}
        assert c.inflight.next_postpone_sent_ns() == 20
        # Held while their postpone is written: still never queued again by a poll.
        assert polled(c, [row(1), row(2)]) == (0, 2) and c.inflight.unclaimed == 3
        hold.written([1, 2])
    assert c.inflight.unclaimed == 1 and polled(c, [row(1)]) == (1, 1)


def test_a_postpone_that_fails_settles_what_it_wrote_and_puts_back_the_rest_first():
    c = cache(10)
    sent(c, [1, 2], now_ns=10)
    sent(c, [3], now_ns=20)
    with pytest.raises(Unavailable), c.holding_postpones(100, 10) as hold:
        hold.written([1])
        raise Unavailable("the second UPDATE failed")
    assert c.inflight.unclaimed == 2
    with c.holding_postpones(100, 10) as hold:
        assert list(hold.rows) == [2, 3]


def test_an_ack_takes_only_rows_still_unclaimed_and_a_failure_puts_them_back_first():
    c = cache(10)
    sent(c, [1, 2], now_ns=10)
    sent(c, [3], now_ns=20)
    with pytest.raises(Unavailable), c.holding_acks([2, 3, 9]) as hold:
        assert {i: s[:2] for i, s in hold.rows.items()} == {2: (0, 10), 3: (0, 20)}
        with c.holding_acks([2, 3]) as second:
            assert second.rows == {}  # held: a second writer gets nothing
        assert polled(c, [row(2), row(3)]) == (0, 2)
        raise Unavailable("the ack failed")
    assert c.inflight.unclaimed == 3
    with c.holding_postpones(sent_before_ns=100, limit=10) as hold:
        assert list(hold.rows) == [2, 3, 1]


def test_clear_keeps_rows_whose_postpone_is_still_to_write():
    c = cache(10)
    sent(c, [1])
    c.due.clear()
    assert c.inflight.unclaimed == 1
    with c.holding_postpones(100, 10) as hold:
        assert list(hold.rows) == [1]


def test_a_full_cache_takes_in_rows_up_to_the_first_it_has_no_room_for():
    c = cache(2)
    sent(c, [1])
    # 1 is in flight (skipped, taken), 2 and 3 fill the cache, 4 finds no room: not taken
    assert polled(c, [row(1), row(2), row(3), row(4), row(5)]) == (2, 3)


def test_rows_a_subscriber_never_got_may_be_sent_again_at_once():
    c = cache(10)
    sent(c, [1, 2])
    assert c.inflight.unsend([1, 9]) == 1
    assert c.inflight.unclaimed == 1 and polled(c, [row(1), row(2)]) == (1, 2)
    assert [r.id for r in c.due.pop(5)] == [1]


# -- a poll's read and what changes meanwhile -----------------------------------------------
def test_a_poll_does_not_queue_again_a_row_acked_while_it_ran():
    """The poll's read began before the ack was written: its copy of the row is stale."""
    c = cache(10)
    sent(c, [1, 2])
    with c.poll() as poll:  # the poll's SELECT starts: rows 1 and 2 are still unacked in it
        with c.holding_acks([1]):
            pass  # the ack of row 1 is written
        assert poll.add([row(1), row(2), row(3)]) == (1, 3)  # only row 3 is new
    assert [r.id for r in c.due.pop(5)] == [3]


def test_a_poll_does_not_queue_again_a_row_claimed_or_postponed_while_it_ran():
    c = cache(10)
    polled(c, [row(1), row(2)])
    with c.poll() as poll:
        with c.sending(0) as sending:
            batch = sending.pop(2)
            sending.sent(batch[:1], 100, False, None)  # row 1 claimed
            sending.sent(batch[1:], 100, True, None)
        with c.holding_postpones(0, 10):
            pass  # row 2's postpone is written
        assert c.reschedule(batch[1], epoch=1, time_next=50)  # and it falls due soon
        assert poll.add([row(1), row(2)], now_ns=0) == (0, 2)
    assert c.due.pop(5, now_ns=0) == []
    assert [(r.id, r.epoch, r.time_next) for r in c.due.pop(5, now_ns=50)] == [(2, 1, 50)]


def test_rows_acked_before_a_poll_began_do_not_hide_later_reads():
    c = cache(10)
    polled(c, [row(1)])
    c.forget([1])  # no poll running: nothing to remember
    assert polled(c, [row(1)]) == (1, 1)  # e.g. a reschedule by DML made it due again
    with c.poll() as poll:
        c.forget([1])
        poll.add([])
    assert polled(c, [row(1)]) == (1, 1)  # remembered for one poll only


def test_a_poll_adds_its_rows_once_and_a_failed_read_leaves_nothing_behind():
    c = cache(10)
    with c.poll() as poll:
        poll.add([row(1)])
        with pytest.raises(RuntimeError):
            poll.add([row(2)])
    with pytest.raises(Unavailable), c.poll():
        raise Unavailable("the SELECT failed")
    assert c.polls == []
    c.forget([1])
    assert polled(c, [row(1)]) == (1, 1)


def test_two_polls_at_once_each_skip_what_changed_during_their_own_read():
    c = cache(10)
    sent(c, [1])
    with c.poll() as first:
        with c.holding_acks([1]):
            pass
        with c.poll() as second:
            assert second.add([row(1)]) == (1, 1)  # began after the ack: its copy is current
        c.forget([1])
        assert first.add([row(1)]) == (0, 1)


# -- windows -------------------------------------------------------------------------------
def test_a_window_counts_what_is_in_flight_to_it_and_reopens_once():
    opened = []
    w = Window(2, lambda: opened.append(1))
    c = cache(10)
    sent(c, [1, 2, 3], window=w)  # past its window (the manager cuts batches; it copes anyway)
    assert w.outstanding == 3 and w.room == 0
    c.forget([1])
    assert opened == [] and w.room == 0
    c.forget([2])
    assert opened == [1] and w.room > 0  # room again: the sender is woken once
    c.forget([3])
    assert opened == [1] and w.outstanding == 0


def test_a_full_window_asks_for_a_recheck_after_a_while_without_credit():
    w = Window(1)
    c = cache(10)
    sent(c, [1], window=w)
    assert not w.recheck_due(0)  # it just filled
    assert not w.recheck_due(RECHECK_NS - 1)
    assert w.recheck_due(RECHECK_NS) and not w.recheck_due(RECHECK_NS + 1)
    assert c.inflight.ids_of(w) == [1]
    assert c.inflight.land_gone(w, [1, 9]) == 1 and w.room > 0 and w.stalled_ns is None


def test_ack_waits_that_end_give_the_credit_back():
    w = Window(5)
    c = cache(10)
    sent(c, [1, 2], now_ns=0, window=w)
    assert c.inflight.count(99) == 2 and w.outstanding == 2
    assert c.inflight.count(100) == 0 and w.outstanding == 0


def test_a_window_size_is_checked():
    assert window_size(0) == 1_000 and window_size(7) == 7
    with pytest.raises(Exception, match="max_in_flight"):
        window_size(-1)


def test_a_settlement_waits_for_a_postpone_holding_its_rows_then_sees_them_counted():
    c = cache(10)
    sent(c, [1, 2], now_ns=10)
    order: list[str] = []
    with c.holding_postpones(100, 10) as postpone:  # the postpone of 1 and 2 is running
        done = threading.Event()

        def reject() -> None:
            with c.holding_acks([1], wait=True) as hold:
                order.append(f"reject counts {sorted(hold.rows)}")
            done.set()

        t = threading.Thread(target=reject)
        t.start()
        assert not done.wait(0.2), "the reject did not wait for the postpone"
        order.append("postpone written")
        postpone.written([1, 2])
    t.join(5)
    # the postpone counted the send: the reject, after it, has nothing more to count
    assert order == ["postpone written", "reject counts []"]


def test_a_plain_ack_does_not_wait_for_a_postpone():
    c = cache(10)
    sent(c, [1], now_ns=10)
    with c.holding_postpones(100, 10), c.holding_acks([1]) as hold:
        assert hold.rows == {}  # the postpone counts it (it counts acked rows too)
