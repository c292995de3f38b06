"""msgtable.engine.routes through msgtable.engine.due: the due rows by the connected filters that
pass them."""

from __future__ import annotations

from msgtable.engine.due import DueRows


def row(i, region, priority=0, time_next=0):
    """A row as a poll reads it: (priority, time_next, epoch, id, region)."""
    return (priority, time_next, 0, i, region)


def queue(regions, size=10_000) -> DueRows:
    due = DueRows(size)
    due.add([row(i, r) for i, r in enumerate(regions, 1)], None, (), (), ())
    return due


def region_is(region):
    return lambda values: values[1] == region


def ids(rows):
    return [r.id for r in rows]


def test_a_filter_pops_the_rows_it_passes_however_many_rows_it_refuses_come_first():
    due = queue([None] * 500 + ["a", "b", "a"])
    a = region_is("a")
    due.connect(a)
    assert ids(due.pop_for(a, 10)) == [501, 503]
    assert due.pop_for(a, 10) == []
    assert due.queued == 501 and due.sending == {501, 503}


def test_a_filter_pops_best_first_across_the_classes_it_is_in():
    due = DueRows(100)
    rows = [row(1, "a", priority=5), row(2, "ab", priority=1), row(3, "a", priority=0)]
    due.add(rows, None, (), (), ())
    a = lambda values: "a" in values[1]  # noqa: E731
    b = lambda values: "b" in values[1]  # noqa: E731
    due.connect(a)
    due.connect(b)
    assert ids(due.pop_for(a, 2)) == [3, 2]
    assert due.pop_for(b, 2) == []  # its one row went to the other filter's stream
    assert ids(due.pop_for(a, 2)) == [1]


def test_rows_no_connected_filter_passes_are_stranded_until_one_that_passes_them_connects():
    due = queue(["a", None, "b", None])
    a, b = region_is("a"), region_is("b")
    due.connect(a)
    assert due.stranded == 3
    due.connect(b)
    assert due.stranded == 2
    assert ids(due.pop_for(b, 5)) == [3]
    due.disconnect(a)
    assert due.stranded == 3  # 1 was a's only: it waits now
    assert due.pop_for(a, 5) == []
    due.disconnect(b)
    assert due.stranded == 0 and due._routes is None  # no filter: the plain queue again
    assert ids(due.pop(5)) == [1, 2, 4]


def test_two_streams_of_one_filter_share_it_until_both_left():
    due = queue(["a", "a"])
    a = region_is("a")
    due.connect(a)
    due.connect(a)
    due.disconnect(a)
    assert ids(due.pop_for(a, 1)) == [1]
    due.disconnect(a)
    assert due._routes is None


def test_a_stream_without_a_filter_takes_every_row_and_a_filtered_pop_skips_those():
    due = queue(["a", None, "a", "b"])
    a = region_is("a")
    due.connect(a)
    assert ids(due.pop(2)) == [1, 2]  # the plain queue, in its order
    assert due.stranded == 1  # 4
    assert ids(due.pop_for(a, 5)) == [3]
    assert ids(due.pop(5)) == [4] and due.stranded == 0


def test_rows_queued_later_come_due_or_are_put_back_are_classified_as_they_enter():
    due = DueRows(100)
    a = region_is("a")
    due.connect(a)
    due.add([row(1, "a", time_next=50), row(2, None)], 10, (), (), ())
    assert due.pop_for(a, 5, now_ns=10) == [] and due.stranded == 1
    (late,) = due.pop_for(a, 5, now_ns=50)
    assert late.id == 1
    due.put_back([late])
    assert ids(due.pop_for(a, 5, now_ns=50)) == [1]


def test_a_row_whose_values_changed_while_queued_is_classified_again():
    due = queue(["a", "b"])
    a, b = region_is("a"), region_is("b")
    due.connect(a)
    due.connect(b)
    due.add([row(1, "b"), row(2, "b")], None, (), (), ())  # a DML moved 1 to b
    assert due.pop_for(a, 5) == []
    assert sorted(ids(due.pop_for(b, 5))) == [1, 2]


def test_forgotten_rows_leave_every_class_and_the_stale_entries_are_compacted():
    due = queue(["a"] * 300 + [None] * 300)
    a = region_is("a")
    due.connect(a)
    due.forget(range(1, 601))
    assert due.queued == 0 and due.stranded == 0
    assert due._routes is not None and due._routes.entries() <= 64
    due.add([row(601, "a")], None, (), (), ())
    assert ids(due.pop_for(a, 5)) == [601]


def test_a_cleared_queue_keeps_its_filters():
    due = queue(["a", None])
    a = region_is("a")
    due.connect(a)
    due.clear()
    assert due.stranded == 0 and due.pop_for(a, 5) == []
    due.add([row(3, "a"), row(4, None)], None, (), (), ())
    assert ids(due.pop_for(a, 5)) == [3] and due.stranded == 1


def test_a_table_without_filtered_streams_keeps_no_routes():
    due = queue(["a", None])
    assert due._routes is None and due.stranded == 0
    assert ids(due.pop(5)) == [1, 2]
