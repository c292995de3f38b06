"""A fair table's cache (msgtable.engine.flow): its per-key counts, the keys its polls skip,
and when a key left behind is read again. In-memory, a fixed clock: each poll is an ``add``
of the rows a real poll would have read."""

from __future__ import annotations

from msgtable.core.flow import FlowControl
from msgtable.core.rows import CachedRow, PolledRow
from msgtable.engine.due import DueRows
from msgtable.engine.flow import KeyCounts, KeyedDue, Limiter, follows_tail, skip_keys

NOW = 1_000


def row(rid: int, key: str | None) -> CachedRow:
    return CachedRow(0, 0, 0, (rid, key))


def polled(rid: int, key: str | None) -> PolledRow:
    """As a poll reads it: (priority, time_next, epoch, id, tenant)."""
    return (0, 0, 0, rid, key)


def fair_due(size: int) -> KeyedDue:
    limiter = Limiter(FlowControl(fair_key="tenant"), None, NOW)
    return KeyedDue(size, 1, True, limiter)


def poll(due: KeyedDue, rows: list[PolledRow], full: bool) -> list[object]:
    """One poll's read taken in; ``full``: it filled its page (pending)."""
    new, taken = due.add(rows, NOW, (), (), ())
    assert taken == len(rows)
    due.pending = full
    return new


def send(due: KeyedDue, n: int) -> list[CachedRow]:
    batch = due.pop(n, NOW)
    due.finish(batch)
    return batch


def test_key_counts_follow_rows_in_out_and_re_keyed_and_mark_keys_at_their_share():
    counts = KeyCounts(1, share=3)
    for rid in (1, 2, 3):
        counts[rid] = row(rid, "a")
    counts[4] = row(4, "b")
    counts[5] = row(5, None)
    assert counts.per_key == {"a": 3, "b": 1, None: 1} and counts.full == {"a"}
    counts[3] = row(3, "b")  # the same id read again with another key: counted once, moved
    assert counts.per_key == {"a": 2, "b": 2, None: 1} and counts.full == set()
    counts[6] = row(6, "b")
    assert counts.full == {"b"}
    del counts[6]
    assert counts.pop(4).id == 4 and counts.pop(99, "none") == "none"
    assert counts.per_key == {"a": 2, "b": 1, None: 1} and counts.full == set()
    counts.pop(5)
    assert None not in counts.per_key  # a key with no rows left is forgotten
    counts.reshare(2)  # the cache got smaller: a key at the new share is full at once
    assert counts.full == {"a"}
    counts.clear()
    assert not counts and counts.per_key == {} and counts.full == set()


def test_a_poll_past_a_keys_share_leaves_its_rows_in_the_table_and_the_next_skips_it():
    due = fair_due(8)  # a key's share: 4
    new = poll(due, [polled(i, "noisy") for i in range(1, 7)] + [polled(7, "quiet")], True)
    assert new == [1, 2, 3, 4, 7] and due.left_behind and due.pending
    assert skip_keys(due) == ("noisy",)
    assert not follows_tail(due)  # a new pass must go back for the rows left behind
    # the next poll (skipping it) reads the quiet key's rows only; they are all taken
    assert poll(due, [polled(10, "quiet"), polled(11, "quiet")], False) == [10, 11]
    assert due.left_behind


def test_a_key_left_behind_is_skipped_and_read_again_once_it_sent_half_its_share():
    due = fair_due(8)  # share 4, half 2
    poll(due, [polled(i, "noisy") for i in range(1, 8)], True)
    send(due, 1)  # 3 noisy queued: below its share, still above half
    assert skip_keys(due) == ("noisy",)
    poll(due, [polled(20, "quiet")], False)  # the skipping poll: the page was not full
    assert not due.wants_refill(), "a refill before the key sent half its share"
    assert sorted(r.id for r in send(due, 2)) == [2, 20]  # one turn each
    assert due.wants_refill(), "the key left behind sent half its share: read it again"
    assert skip_keys(due) == ()  # the refill reads it
    new = poll(due, [polled(i, "noisy") for i in range(3, 10)], True)  # from the head
    assert new == [5, 6]  # to its share again (3 and 4 were queued): 7 on left behind
    assert due.left_behind and skip_keys(due) == ("noisy",)


def test_a_fair_pass_that_left_nothing_behind_reads_on_from_its_tail():
    due = fair_due(8)
    poll(due, [polled(1, "a"), polled(2, "b")], False)
    assert not due.left_behind and skip_keys(due) == () and follows_tail(due)
    assert not due.wants_refill()
    poll(due, [polled(i, "a") for i in range(3, 9)], True)
    assert due.left_behind  # a's share (4) filled: 7 and 8 left behind
    send(due, 8)
    poll(due, [], False)  # a new pass (the last one's page was full)...
    # ...begins afresh: what the pass before left behind is read by this one
    poll(due, [polled(7, "a"), polled(8, "a")], False)
    assert not due.left_behind and follows_tail(due)


def test_a_table_that_is_not_fair_skips_no_keys():
    limiter = Limiter(FlowControl(key_column="tenant", key_concurrency=1), 1, NOW)
    assert skip_keys(KeyedDue(8, 1, False, limiter)) == ()
    assert skip_keys(DueRows(8)) == () and not follows_tail(DueRows(8))


def test_a_send_counts_each_keys_rows_out_once_per_turn_and_a_refresh_counts_nothing():
    due = fair_due(8)  # share 4
    poll(due, [polled(i, "noisy") for i in range(1, 5)] + [polled(5, "quiet")], False)
    assert due._counts.per_key == {"noisy": 4, "quiet": 1} and due._counts.full == {"noisy"}
    poll(due, [polled(2, "noisy"), polled(5, "quiet")], False)  # read again, same keys
    assert due._counts.per_key == {"noisy": 4, "quiet": 1}
    assert sorted(r.id for r in send(due, 2)) == [1, 5]  # a turn each
    assert due._counts.per_key == {"noisy": 3} and due._counts.full == set()
    assert [r.id for r in send(due, 8)] == [2, 3, 4]  # a key alone takes all in one turn
    assert due._counts.per_key == {} and len(due._counts) == 0
    poll(due, [polled(9, "quiet")], False)
    assert due._counts.per_key == {"quiet": 1}
