"""Where a plain table's passes got to (msgtable.engine.tail): when a hinted poll may read on
after it, and when it must be a pass from the head."""

from __future__ import annotations

from msgtable.core.rows import PolledRow, PollKey
from msgtable.engine.tail import Tail, cursor

CFG = 30 * 1_000_000_000  # the poll interval
S = 1_000_000_000


def row(rid: int, priority: int = 0, time_next: int | None = 0) -> PolledRow:
    return (priority, time_next, 0, rid, "m")


def keys(*ks: PollKey) -> object:
    return lambda: list(ks)


def ended_at(rid: int, now_ns: int = S) -> Tail:
    tail = Tail()
    assert not tail.read([row(i) for i in range(1, rid + 1)], None, True, now_ns)
    return tail


def test_a_hint_whose_rows_all_sort_after_the_tail_continues_there() -> None:
    tail = ended_at(25)
    assert tail.hint(keys((0, 0, 26), (0, 0, 27)))  # type: ignore[arg-type]
    assert tail.after(2 * S, CFG) == (0, 0, 25)
    assert not tail.read([row(26), row(27)], (0, 0, 25), True, 2 * S)
    assert tail.key == (0, 0, 27)
    assert tail.after(2 * S, CFG) is None  # nothing hinted left: the next poll is the head's


def test_a_row_that_sorts_before_the_tail_needs_a_pass_from_the_head() -> None:
    for before in ((0, 0, 7), (-1, 0, 500), (0, None, 30)):  # a lower id, a better priority
        tail = ended_at(25)
        assert not tail.hint(keys((0, 0, 26), before)), before  # type: ignore[arg-type]
        assert tail.after(2 * S, CFG) is None, before


def test_keys_not_known_or_no_tail_yet_need_a_pass_from_the_head() -> None:
    assert not Tail().hint(keys((0, 0, 1)))  # type: ignore[arg-type]
    tail = ended_at(25)
    assert not tail.hint(None)
    assert not tail.hint(lambda: None)


def test_a_hint_left_to_the_polls_under_way_keeps_them_from_the_tail_until_a_head_pass() -> None:
    tail = ended_at(25)
    tail.ignored(2 * S)  # its rows were not looked at: they may sort before the tail
    assert not tail.hint(keys((0, 0, 26)))  # type: ignore[arg-type]
    tail.read([row(26)], None, True, S)  # a head pass that began before the ignored hint
    assert not tail.hint(keys((0, 0, 27)))  # type: ignore[arg-type]
    tail.read([row(26)], None, True, 3 * S)  # one that began after it
    assert tail.hint(keys((0, 0, 27)))  # type: ignore[arg-type]


def test_a_hinted_row_a_continued_poll_passed_over_unseen_asks_for_a_head_pass() -> None:
    tail = ended_at(25)
    assert tail.hint(keys((0, 0, 26)))  # type: ignore[arg-type]
    assert tail.hint(keys((0, 0, 27)))  # type: ignore[arg-type]
    # 26 not visible yet (the binlog shows a commit a moment early), 27 read
    assert tail.read([row(27)], (0, 0, 25), True, 2 * S)
    assert tail.after(2 * S, CFG) is None


def test_a_hinted_row_not_visible_yet_and_nothing_after_it_is_looked_for_again_there() -> None:
    tail = ended_at(25)
    assert tail.hint(keys((0, 0, 26)))  # type: ignore[arg-type]
    assert not tail.read([], (0, 0, 25), True, 2 * S)
    assert tail.after(2 * S, CFG) == (0, 0, 25)


def test_a_pass_from_the_head_at_least_every_poll_interval() -> None:
    tail = ended_at(25, now_ns=S)
    assert tail.hint(keys((0, 0, 26)))  # type: ignore[arg-type]
    assert tail.after(S + 29 * S, CFG) == (0, 0, 25)
    assert tail.after(S + 30 * S, CFG) is None


def test_the_cursor_after_a_poll() -> None:
    rows = [row(1), row(2), row(3)]
    assert cursor(rows, 3, 3, (0, 0, 3), None, False) == (True, (0, 0, 3))  # a full page
    assert cursor(rows, 2, 5, (0, 0, 3), None, False) == (True, (0, 0, 2))  # the cache is full
    assert cursor(rows, 3, 5, (0, 0, 3), None, False) == (False, None)  # the pass ended
    assert cursor([], 0, 5, None, (0, 0, 9), True) == (False, (0, 0, 9))  # a fair table's
