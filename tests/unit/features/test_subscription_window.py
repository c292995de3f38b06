"""A subscription's window over its cursor (msgtable/features/subscriptions/design.md (c),
(d)): what was sent from the cursor's scan and not yet passed by the cursor; the cursor moves
over a prefix of settled (acked) or held (a state row written) messages only, so a crash,
which loses the window, never loses a message."""

from __future__ import annotations

import random

import pytest

from msgtable.features.subscriptions.window import Window


def send(w: Window, number: int, id: object, sent_ns: int = 0) -> None:
    assert w.read(number, id)
    assert w.sent(id, sent_ns)


def test_in_order_acks_move_the_cursor_once_a_flush():
    w = Window(cursor=10)
    for n in range(11, 21):
        send(w, n, f"m{n}")
    assert w.scan_after == 20  # the next scan reads above what was sent
    for n in range(11, 16):
        w.acked(f"m{n}")
    assert w.advance() == 15
    w.moved(15)
    assert (w.cursor, w.advance()) == (15, None), "nothing more settled: no write"
    for n in range(16, 21):
        w.acked(f"m{n}")
    assert w.advance() == 20
    w.moved(20)
    assert len(w) == 0


def test_an_ack_out_of_order_waits_for_the_earlier_one():
    w = Window(cursor=0)
    for n in (1, 2, 3):
        send(w, n, n)
    w.acked(2)
    w.acked(3)
    assert w.advance() is None, "1 is in flight with no state row: the cursor may not pass it"
    w.acked(1)
    assert w.advance() == 3


def test_a_message_read_and_not_sent_holds_the_cursor_back():
    """The scan read 1-3 into the cache; 2 waits there (a full stream, its key's turn): the
    cursor may pass 1 only, however 3 is acked; one the cache lets go is read again."""
    w = Window(cursor=0)
    for n in (1, 2, 3):
        assert w.read(n, n)
    assert not w.read(2, 2), "read twice"
    for n in (1, 3):
        assert w.sent(n, 0) and w.acked(n)
    assert not w.acked(2), "not sent: nothing to ack in the window"
    assert w.advance() == 1
    w.moved(1)
    w.unread(2)
    assert w.scan_after == 1, "the next scan reads 2 again"
    assert w.read(2, 2) and w.sent(2, 0) and w.acked(2)
    assert w.advance() == 3


def test_a_message_let_go_of_holds_the_cursor_until_it_is_read_sent_and_settled():
    """``unread`` keeps its message in the window, unsettled and unsent: the acks after it
    may not move the cursor over it before the scan reads it again (a crash meanwhile would
    lose it)."""
    w = Window(cursor=0)
    for n in (1, 2, 3):
        assert w.read(n, n) and w.sent(n, 0)
    w.unread(2)  # handed over and given back (its subscriber left before taking it)
    assert not w.acked(2), "not sent now: nothing to ack in the window"
    assert w.acked(1) and w.acked(3)
    assert w.advance() == 1, "2 holds the cursor"
    assert w.in_flight() == [], "2 is not in flight: no postpone is due for it"
    assert w.scan_after == 1 and w.read(2, 2), "the next scan reads it again"
    assert not w.read(2, 2), "once"
    assert w.sent(2, 0) and w.acked(2)
    assert w.advance() == 3


def test_a_scan_hands_out_what_is_neither_passed_nor_settled():
    """``read_scan``: a scan's rows (id fourth, their numbers last) read into the window in
    one pass; the stale ones (at or below the cursor, settled since the scan began) left
    out, the unsettled ones already in the window handed out again (the cache keeps one)."""
    w = Window(cursor=1)

    def row(n: int) -> tuple[object, ...]:
        return (0, None, 0, n, f"m{n}", 0)

    def scanned(n: int) -> tuple[object, ...]:
        return (*row(n), n)

    assert w.read_scan([scanned(n) for n in (1, 2, 3, 4)]) == [row(2), row(3), row(4)]
    assert w.scan_after == 4
    assert w.sent(2, 0) and w.acked(2)
    assert w.read_scan([scanned(n) for n in (2, 3, 4, 5)]) == [row(3), row(4), row(5)]
    w.unread(3)
    assert not w.read(4, 4), "4 is in the window"
    assert w.read_scan([scanned(3)]) == [row(3)] and not w.read(3, 3), "read again once"
    assert w.advance() == 2 and w.held_at == 3


def test_what_a_scan_no_longer_finds_stops_holding_the_cursor():
    """A message let go of (or, for a scan from the cursor, any not sent) that a scan over
    its number does not find (deleted, acked by the application's upsert, filtered out now)
    is settled, nothing to write; one beyond what a full scan covered, or in flight, is
    not."""
    w = Window(cursor=0)

    def row(n: int) -> tuple[object, ...]:
        return (0, None, 0, n, f"m{n}", 0)

    def scanned(n: int) -> tuple[object, ...]:
        return (*row(n), n)

    assert w.read_scan([scanned(n) for n in (1, 2, 3, 4, 5)]) == [row(n) for n in (1, 2, 3, 4, 5)]
    assert w.sent(5, 0)
    w.unread_all([1, 4])
    # a full scan (its limit reached) from 0 that covered up to 3: 1 is gone, 4 not known
    assert w.read_scan([scanned(n) for n in (2, 3)], after=0) == [row(2), row(3)]
    assert w.settled(1) and not w.settled(4)
    assert w.acked_only() == [], "nothing to write for it"
    # a scan from the cursor that read every row above it: 2 (read, never sent) and 4 are
    # gone; 5 is in flight (its ack or postpone settles it)
    assert w.read_scan([scanned(3)], after=0, complete=True, net=True) == [row(3)]
    assert w.settled(2) and w.settled(4) and not w.settled(5) and not w.settled(3)
    assert w.sent(3, 0) and w.acked(3) and w.advance() == 4 and w.held_at == 5


def test_the_acks_behind_a_held_cursor_are_named_until_written():
    """``held_at`` says where the settled prefix ends; ``acked_only`` the acks behind it that
    live in the window alone (not those held by a state row), until ``written``."""
    w = Window(cursor=0)
    for n in (1, 2, 3, 4):
        assert w.read(n, n)
    for n in (2, 3, 4):
        assert w.sent(n, 0)
    w.acked(2)
    w.held(3)  # its state row written (a release, say)
    w.acked(4)
    assert (w.advance(), w.held_at) == (None, 1), "1, read and not sent, holds the cursor"
    assert w.acked_only() == [2, 4]
    w.written([2, 4])
    assert w.acked_only() == [], "written: held from now on"
    assert w.settled_of([1, 2, 3, 4]) == {2, 3, 4}, "still the window's (a stale scan)"
    assert w.sent(1, 0) and w.acked(1)
    assert (w.advance(), w.held_at) == (4, None)


def test_a_message_with_a_state_row_is_passed_while_unsettled():
    """One not acked by vt_postpone_after gets its state row (the postpone): from then on it
    is the state table's, and the cursor may pass it."""
    w = Window(cursor=0)
    for n in (1, 2, 3):
        send(w, n, n, sent_ns=100 * n)
    assert w.overdue(now_ns=250, postpone_after_ns=100) == [1]  # sent at 100, 2 at 200: not yet
    w.acked(2)
    w.acked(3)
    w.held(1)
    assert w.advance() == 3
    w.moved(3)
    assert w.overdue(now_ns=10**6, postpone_after_ns=100) == []


def test_a_verb_on_a_message_no_longer_in_the_window_is_not_its():
    w = Window(cursor=0)
    send(w, 1, "a")
    w.acked("a")
    w.moved(w.advance() or 0)
    assert not w.acked("a"), "passed: its ack is the state table's business (or a late one)"
    assert not w.held("zzz")


def test_messages_read_out_of_sequence_order_are_passed_in_it():
    """The window keeps its numbers in sequence order however they were read (a scan reads
    in order; a message read late, or again, is put in its place): the cursor moves over the
    settled prefix in that order, and says what it passed."""
    w = Window(cursor=0)
    for n in (3, 1, 5):
        send(w, n, f"m{n}")
    assert w.read_all([(2, "m2"), (4, "m4")]) == ["m2", "m4"]
    assert w.sent_all(["m2", "m4"], 0) == ["m2", "m4"]
    assert w.in_flight() == ["m1", "m2", "m3", "m4", "m5"]
    for n in (1, 3, 5):
        assert w.acked(f"m{n}")
    assert (w.advance(), w.held_at) == (1, 2)
    assert w.moved(1) == ["m1"]
    assert w.held("m2") and w.acked("m4")
    assert w.advance() == 5
    assert w.moved(5) == ["m2", "m3", "m4", "m5"] and len(w) == 0


def test_the_cursor_moved_by_another_sender_drops_the_window():
    w = Window(cursor=5)
    send(w, 6, "x")
    w.lost(9)  # another sender's cursor: the window was not ours to flush
    assert (w.cursor, len(w), w.scan_after) == (9, 0, 9)


@pytest.mark.parametrize("seed", range(20))
def test_a_crash_anywhere_loses_no_unsettled_message(seed: int):
    """Random sends, acks in any order, postpones, flushes and a crash: every message the
    durable cursor passed was acked or has a state row."""
    rnd = random.Random(seed)
    w = Window(cursor=0)
    durable, acked, rows = 0, set(), set()
    number = 0
    waiting: list[int] = []  # read into the cache, not sent
    for _ in range(500):
        step, flying = rnd.random(), w.in_flight()
        if step < 0.3:
            number += 1
            assert w.read(number, number)
            waiting.append(number)
        elif step < 0.45 and waiting:
            n = waiting.pop(rnd.randrange(len(waiting)))
            if rnd.random() < 0.1:
                w.unread(n)  # let go of: the next scan reads it again (only it: the others
                rescan = range(w.scan_after + 1, number + 1)  # are in the window already)
                assert [m for m in rescan if w.read(m, m)] == [n]
                waiting.append(n)
            else:
                assert w.sent(n, 0)
        elif step < 0.75 and flying:
            n = rnd.choice(flying)
            assert w.acked(n)
            acked.add(n)
        elif step < 0.85 and flying:
            n = rnd.choice(flying)
            assert w.held(n)
            rows.add(n)
        else:
            new = w.advance()
            if new is not None:
                w.moved(new)
                durable = new
    for n in range(1, durable + 1):
        assert n in acked or n in rows, f"the cursor passed {n}, neither acked nor held"


def test_writes_per_settled_message_with_four_subscribers_round_robin():
    """Design.md's count: 4 subscribers take batches of 100 in turn and ack them, in order of
    their own batches but not of the table's; the cursor is flushed once per 100 acks: its
    writes per settled message are 1/100 or fewer."""
    w = Window(cursor=0)
    writes, settled = 0, 0
    batches = [list(range(1 + 100 * b, 101 + 100 * b)) for b in range(40)]
    for n in range(1, 4001):
        send(w, n, n)
    for turn in range(0, 40, 4):
        for b in reversed(batches[turn : turn + 4]):  # the 4th subscriber acks first
            for n in b:
                assert w.acked(n)
                settled += 1
            new = w.advance()
            if new is not None:
                w.moved(new)
                writes += 1
    assert w.cursor == 4000
    assert writes / settled <= 0.01, (writes, settled)
