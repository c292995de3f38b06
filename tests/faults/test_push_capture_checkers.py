"""The fault suite's push and table-event checkers (tests/faults/pushcheck.py,
tests/faults/capturecheck.py) on made-up histories: each invariant they judge is broken once
and must be named, and a clean history passes. No database, no server."""

from __future__ import annotations

from collections import Counter

from .capturecheck import SOURCE, SOURCE_T, CaptureChecker, DrainLog, Event, SourceProducer
from .pushcheck import DEAD_NEXT, POISON_STATUS, ChaosReceiver, PushChecker, PushRow, Receipt

S = 1_000_000_000  # ns
FAULTS = Counter({"500": 1, "away": 1, "hang": 1})


def key_of(i: int) -> str:
    return f"key{(i - 1) // 2}"  # ids 1, 2: key0; 3, 4: key1


def receipt(i: int, at_s: float, status: int | None = 200, attempt: int = 1) -> Receipt:
    return Receipt(
        [i],
        [attempt],
        [key_of(i)],
        f"msg_{i}_{attempt}",
        int(at_s * S),
        status,
        True,
        status == POISON_STATUS,
    )


def push_checker(*receipts: Receipt) -> PushChecker:
    receiver = ChaosReceiver()
    receiver.receipts = list(receipts)
    c = PushChecker(receiver, key_of)
    c.insert([1, 2, 3, 4], poison=[4])
    return c


def acked(at_s: float) -> PushRow:
    return PushRow(int(at_s * S), None, None, None, 1)


DEAD = PushRow(None, DEAD_NEXT, 5 * S, f"HTTP {POISON_STATUS}: poison [4]", 1)
CLEAN = [receipt(1, 1), receipt(2, 2), receipt(3, 1.5), receipt(4, 3, POISON_STATUS)]
CLEAN_ROWS = {1: acked(1.1), 2: acked(2.1), 3: acked(1.6), 4: DEAD}


def test_a_clean_push_history_passes_and_an_answer_lost_before_the_ack_is_counted():
    again = receipt(1, 1.05, attempt=2)  # the 2xx of the first was lost: before the ack
    r = push_checker(*CLEAN, again).judge_rows(CLEAN_ROWS, FAULTS)
    assert r.findings == {}
    assert r.again_after_2xx == 1 and r.max_attempt == 2


def test_a_message_received_after_its_ack_committed_is_named():
    late = receipt(2, 3.0, attempt=2)  # its ack at 2.1 s, the slack 0.5 s
    r = push_checker(*CLEAN, late).judge_rows(CLEAN_ROWS, FAULTS)
    assert [i for i, _ in r.findings["received after its ack committed"]] == [2]


def test_a_message_never_answered_2xx_or_not_acked_is_named():
    r = push_checker(receipt(1, 1, 500), *CLEAN[1:]).judge_rows(
        {**CLEAN_ROWS, 1: PushRow(None, 0, None, "HTTP 500", 1)}, FAULTS
    )
    assert r.findings == {"never answered 2xx": [1], "not acked": [1]}


def test_poison_acked_or_alive_or_without_its_status_is_named():
    rows = {**CLEAN_ROWS, 4: acked(3.1)}
    assert push_checker(*CLEAN).judge_rows(rows, FAULTS).findings == {
        "poison acked or answered 2xx": [4],
        "poison not dead": [4],
    }
    rows = {**CLEAN_ROWS, 4: PushRow(None, DEAD_NEXT, 5 * S, "rejected", 1)}
    found = push_checker(*CLEAN).judge_rows(rows, FAULTS).findings
    assert list(found) == ["poison dead without its status in the reason"]


def test_a_key_s_second_message_before_its_first_left_breaks_the_order():
    # 2 arrives at 0.5 s, before 1 (key0) arrived at all
    out_of_order = [receipt(1, 1), receipt(2, 0.5), *CLEAN[2:]]
    found = push_checker(*out_of_order).judge_rows(CLEAN_ROWS, FAULTS).findings
    assert found == {
        "order per key broken (a message before the one before it left)": [(2, 1, "key0")]
    }


def test_a_bad_signature_is_named():
    c = push_checker(*CLEAN)
    c.receiver.bad_signatures.append("msg_x")
    assert c.judge_rows(CLEAN_ROWS, FAULTS).findings == {"requests with a bad signature": ["msg_x"]}


# -- table events ---------------------------------------------------------------------------
LOG = [
    (SOURCE, "insert", 1, None, 1),
    (SOURCE, "update", 1, 1, 2),
    (SOURCE_T, "insert", 2, None, 3),
    (SOURCE, "alter", None, None, None),
    (SOURCE, "delete", 1, 2, None),
]


def event(n: int, change: tuple[str, str, int | None, int | None, int | None]) -> Event:
    table, kind, i, before, after = change
    if i is None:
        return Event(n, table, kind, None, table, None, "alter table ...", n * S)
    values = [None if v is None else {"id": i, "v": v, "note": f"n{v}"} for v in (before, after)]
    return Event(n, table, kind, {"id": i}, f'{table}:{{"id": {i}}}', *values, n * S)


def capture_checker(failed: set[int] = frozenset()) -> tuple[CaptureChecker, DrainLog]:  # type: ignore[assignment]
    producer = SourceProducer("sqlite://", len(LOG), 1.0)
    producer.log = list(LOG)
    producer.failed = set(failed)
    drained = DrainLog()
    return CaptureChecker(producer, drained), drained


def delivered(drained: DrainLog, events: list[Event]) -> None:
    for e in events:  # each a moment before its ack
        drained.deliveries[e.id] = [(e.time_acked - S // 10, "drain1")]  # type: ignore[operator]


def test_every_committed_change_once_in_order_passes():
    c, drained = capture_checker()
    events = [event(n, ch) for n, ch in enumerate(LOG, 1)]
    delivered(drained, events)
    assert c.judge_events(events).findings == {}


def test_a_lost_a_repeated_and_a_rolled_back_change_are_named():
    c, drained = capture_checker(failed={9})
    events = [event(n, ch) for n, ch in enumerate(LOG[1:], 1)]  # the first insert lost
    events.append(event(5, LOG[2]))  # written twice
    events.append(event(6, (SOURCE, "insert", 7, None, 9)))  # of a rolled-back transaction
    delivered(drained, events)
    found = c.judge_events(events).findings
    assert set(found) == {
        "committed change without its event",
        "change written more than once",
        "event of a change that did not commit",
    }
    assert "chaos_src id 1" in found["committed change without its event"][0]


def test_a_row_s_events_out_of_commit_order_and_wrong_values_are_named():
    c, drained = capture_checker()
    order = [LOG[1], LOG[0], *LOG[2:]]  # the update written before the insert
    events = [event(n, ch) for n, ch in enumerate(order, 1)]
    events[2].after["note"] = "wrong"
    delivered(drained, events)
    found = c.judge_events(events).findings
    assert set(found) == {"a row's events out of commit order", "event with wrong values"}


def test_an_event_delivered_after_its_ack_or_never_or_unacked_is_named():
    c, drained = capture_checker()
    events = [event(n, ch) for n, ch in enumerate(LOG, 1)]
    delivered(drained, events)
    drained.deliveries[2].append((events[1].time_acked + S, "drain2"))  # type: ignore[operator]
    del drained.deliveries[3]
    events[3].time_acked = None
    found = c.judge_events(events).findings
    assert [f[0] for f in found["event delivered after its ack committed"]] == [2]
    assert found["event never delivered"] == [3]
    assert found["event not acked"] == [4]


def test_a_delivery_during_an_ack_call_that_was_in_flight_at_time_acked_is_not_after_it():
    """time_acked is the ack's stamp as its call began; the UPDATE may wait for the row that a
    send of the same event holds locked (its redelivery to another drainer), and commits
    after that send: the call's return bounds the commit. A delivery after the return is
    still named. (A fault-suite failure fits this story: an event delivered 0.537 s after its
    time_acked, while its first drainer's late ack was under way.)"""
    c, drained = capture_checker()
    events = [event(n, ch) for n, ch in enumerate(LOG, 1)]
    delivered(drained, events)
    acked = events[1].time_acked
    assert acked is not None
    drained.deliveries[2].append((acked + 8 * S // 10, "drain3"))  # 0.8 s after its stamp
    found = c.judge_events(events).findings  # (no ack call on record: the stamp it is)
    assert [f[0] for f in found["event delivered after its ack committed"]] == [2]
    drained.deliveries[2].pop()
    drained.acked([2], acked - S // 100, acked + S)  # the ack call: from just before to 1 s on
    drained.deliveries[2].append((acked + 8 * S // 10, "drain3"))  # 0.8 s into the call
    assert "event delivered after its ack committed" not in c.judge_events(events).findings
    drained.deliveries[2].append((acked + 2 * S, "drain2"))  # 1 s after the call returned
    found = c.judge_events(events).findings
    assert [f[0] for f in found["event delivered after its ack committed"]] == [2]
