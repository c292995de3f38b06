from __future__ import annotations

from msgtable.cache import CachedRow, MessageCache


def row(i, priority=0, time_next=0, epoch=0):
    return CachedRow(priority, time_next, epoch, (i, f"m{i}"))


def test_rows_come_out_by_priority_then_time_next():
    c = MessageCache(10)
    c.add([row(1, 1, 5), row(2, 0, 9), row(3, 0, 1), row(4, 1, 1)])
    assert [r.id for r in c.pop(10)] == [3, 2, 4, 1]


def test_the_cache_is_bounded_and_counts_sending_rows():
    c = MessageCache(3)
    assert c.add([row(i) for i in range(5)]) == 3
    c.pop(2)
    assert c.queued == 1 and c.sending == 2 and c.room() == 0
    assert c.add([row(9)]) == 0


def test_a_sending_row_is_not_queued_again_by_a_poll():
    c = MessageCache(10)
    c.add([row(1)])
    batch = c.pop(1)
    assert c.add([row(1)]) == 0 and c.queued == 0
    c.finish(batch, [1], now_ns=0, ack_wait_ns=100)
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
    c.add([CachedRow(None, None, None, (1, "a")), row(2, 1, 0)])
    assert [r.id for r in c.pop(2)] == [1, 2]
