from __future__ import annotations

from msgtable.cache import MessageCache


def row(i, priority=0, time_next=0, epoch=0):
    """A row as a poll reads it."""
    return (priority, time_next, epoch, i, f"m{i}")


def test_rows_come_out_by_priority_then_time_next():
    c = MessageCache(10)
    c.add([row(1, 1, 5), row(2, 0, 9), row(3, 0, 1), row(4, 1, 1)])
    assert [r.id for r in c.pop(10)] == [3, 2, 4, 1]


def test_the_cache_is_bounded_and_counts_sending_rows():
    c = MessageCache(3)
    assert c.add([row(i) for i in range(5)]) == (3, 3)  # 3 new; rows 3 and 4 not taken in
    c.pop(2)
    assert c.queued == 1 and c.sending == 2 and c.room() == 0
    assert c.add([row(9)]) == (0, 0)


def test_a_sending_row_is_not_queued_again_by_a_poll():
    c = MessageCache(10)
    c.add([row(1)])
    batch = c.pop(1)
    assert c.add([row(1)]) == (0, 1) and c.queued == 0
    c.mark_sent(batch, now_ns=0, ack_wait_ns=100, unclaimed=False)
    c.finish(batch, now_ns=0)
    assert c.in_flight(50) == 1 and c.in_flight(100) == 0


def test_a_poll_refreshes_priority_of_a_queued_row():
    c = MessageCache(10)
    c.add([row(1, priority=5), row(2, priority=1)])
    c.add([row(1, priority=0)])
    assert [r.id for r in c.pop(2)] == [1, 2]
    assert c.queued == 0


def test_forgotten_ids_are_never_popped():
    c = MessageCache(10)
    c.add([row(1), row(2)])
    c.forget([1])
    assert [r.id for r in c.pop(5)] == [2]


def test_clear_drops_queued_rows_and_pending():
    c = MessageCache(10)
    c.add([row(1)])
    c.pending = True
    c.clear()
    assert c.queued == 0 and not c.pending and c.pop(1) == []


def test_stale_heap_entries_are_compacted():
    c = MessageCache(1000)
    for p in range(200):
        c.add([row(1, priority=p)])
    assert len(c._heap) <= 2 * c.queued + 64 + 1
    assert [r.id for r in c.pop(5)] == [1]


def test_null_priority_and_time_next_sort_as_zero():
    c = MessageCache(10)
    c.add([(None, None, None, 1, "a"), row(2, 1, 0)])
    assert [r.id for r in c.pop(2)] == [1, 2]


def sent(c: MessageCache, ids, now_ns=0, epoch=0):
    """Poll, pop and send these rows without postponing them (vt_postpone_after > 0)."""
    c.add([row(i, epoch=epoch) for i in ids])
    batch = c.pop(len(ids))
    c.mark_sent(batch, now_ns=now_ns, ack_wait_ns=100, unclaimed=True)
    c.finish(batch, now_ns=now_ns)
    return batch


def test_a_sent_row_not_postponed_yet_is_never_queued_again():
    c = MessageCache(10)
    sent(c, [1, 2])
    assert c.unclaimed == 2
    assert c.add([row(1), row(2), row(3)]) == (1, 3)  # the table still has 1 and 2 as due
    assert [r.id for r in c.pop(5)] == [3]


def test_unclaimed_rows_come_due_for_their_postpone_oldest_first():
    c = MessageCache(10)
    sent(c, [1], now_ns=10, epoch=0)
    sent(c, [2, 3], now_ns=20, epoch=4)
    assert c.next_postpone_sent_ns() == 10
    assert c.due_postpones(sent_before_ns=5, limit=10) == {}
    taken = c.due_postpones(sent_before_ns=20, limit=2)
    assert {i: sent[:2] for i, sent in taken.items()} == {1: (0, 10), 2: (4, 20)}
    assert c.next_postpone_sent_ns() == 20
    # Held while their postpone is written: still never queued again by a poll.
    assert c.add([row(1), row(2)]) == (0, 2) and c.unclaimed == 3
    c.settle([1, 2])
    assert c.unclaimed == 1 and c.add([row(1)]) == (1, 1)


def test_an_ack_takes_only_rows_still_unclaimed_and_a_failure_puts_them_back_first():
    c = MessageCache(10)
    sent(c, [1, 2], now_ns=10)
    sent(c, [3], now_ns=20)
    taken = c.take_unclaimed([2, 3, 9])
    assert {i: sent[:2] for i, sent in taken.items()} == {2: (0, 10), 3: (0, 20)}
    assert c.take_unclaimed([2, 3]) == {}  # held: a second writer gets nothing
    assert c.add([row(2), row(3)]) == (0, 2)
    c.unhold(taken)  # the ack failed
    assert c.unclaimed == 3
    assert list(c.due_postpones(sent_before_ns=100, limit=10)) == [2, 3, 1]


def test_clear_keeps_rows_whose_postpone_is_still_to_write():
    c = MessageCache(10)
    sent(c, [1])
    c.clear()
    assert c.unclaimed == 1 and list(c.due_postpones(100, 10)) == [1]


def test_a_full_cache_takes_in_rows_up_to_the_first_it_has_no_room_for():
    c = MessageCache(2)
    sent(c, [1])
    # 1 is in flight (skipped, taken), 2 and 3 fill the cache, 4 finds no room: not taken
    assert c.add([row(1), row(2), row(3), row(4), row(5)]) == (2, 3)


def test_rows_a_subscriber_never_got_may_be_sent_again_at_once():
    c = MessageCache(10)
    sent(c, [1, 2])
    assert c.unsend([1, 9]) == 1
    assert c.unclaimed == 1 and c.add([row(1), row(2)]) == (1, 2)
    assert [r.id for r in c.pop(5)] == [1]


def test_rows_not_due_yet_wait_for_their_time_then_go_by_priority():
    c = MessageCache(10)
    c.add([row(1, priority=0, time_next=50), row(2, priority=1, time_next=5)], now_ns=10)
    assert c.next_due_ns() == 50
    assert [r.id for r in c.pop(5, now_ns=10)] == [2]
    assert c.pop(5, now_ns=49) == [] and not c.due(49) and c.due(50)
    assert [r.id for r in c.pop(5, now_ns=50)] == [1]
    assert c.next_due_ns() is None


def test_a_scheduled_row_acked_or_re_keyed_leaves_no_stale_wake_up():
    c = MessageCache(10)
    c.add([row(1, time_next=50), row(2, time_next=60)], now_ns=0)
    c.forget([1])
    assert c.next_due_ns() == 60
    c.add([row(2, time_next=80)], now_ns=0)  # rescheduled by DML, read again
    assert c.next_due_ns() == 80
    assert c.pop(5, now_ns=70) == [] and [r.id for r in c.pop(5, now_ns=80)] == [2]


def test_a_poll_does_not_queue_again_a_row_acked_while_it_ran():
    """The poll's read began before the ack was written: its copy of the row is stale."""
    c = MessageCache(10)
    c.add([row(1), row(2)])
    batch = c.pop(2)
    c.mark_sent(batch, now_ns=0, ack_wait_ns=100, unclaimed=True)
    c.finish(batch, now_ns=0)
    c.begin_poll()  # the poll's SELECT starts: rows 1 and 2 are still unacked in it
    taken = c.take_unclaimed([1])
    c.settle(taken)  # the ack of row 1 is written
    assert c.add([row(1), row(2), row(3)]) == (1, 3)  # only row 3 is new
    assert [r.id for r in c.pop(5)] == [3]


def test_a_poll_does_not_queue_again_a_row_claimed_or_postponed_while_it_ran():
    c = MessageCache(10)
    c.add([row(1), row(2)])
    batch = c.pop(2)
    c.begin_poll()
    c.mark_sent(batch[:1], now_ns=0, ack_wait_ns=100, unclaimed=False)  # row 1 claimed
    c.mark_sent(batch[1:], now_ns=0, ack_wait_ns=100, unclaimed=True)
    c.finish(batch, now_ns=0)
    held = c.due_postpones(0, 10)
    c.settle(held)  # row 2's postpone is written
    assert c.reschedule(batch[1], epoch=1, time_next=50)  # and it falls due soon
    assert c.add([row(1), row(2)], now_ns=0) == (0, 2)
    assert c.pop(5, now_ns=0) == []
    assert [(r.id, r.epoch, r.time_next) for r in c.pop(5, now_ns=50)] == [(2, 1, 50)]


def test_rows_acked_before_a_poll_began_do_not_hide_later_reads():
    c = MessageCache(10)
    c.add([row(1)])
    c.forget([1])  # no poll running: nothing to remember
    c.begin_poll()
    assert c.add([row(1)]) == (1, 1)  # e.g. a reschedule by DML made it due again
    c.begin_poll()
    c.forget([1])
    c.add([])
    c.begin_poll()
    assert c.add([row(1)]) == (1, 1)  # remembered for one poll only
