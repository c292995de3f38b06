"""The fault suite's checker judges what it was told, without a server: the attempt invariant,
and where each id ended (acked, dead, and why)."""

from __future__ import annotations

import time

from .checker import Checker, DeadRow, Settled, Tables


def judged(*deliveries: tuple[int, int]) -> Checker:
    """One id (7), delivered once per (attempt) given, an ack wait apart in recorded time."""
    c = Checker(ack_wait_s=0.0)
    c.insert([7])
    for n, (_, attempt) in enumerate(deliveries):
        c.delivered([(7, attempt)], f"s{n}")
    return c


def test_attempts_that_only_climb_or_repeat_pass() -> None:
    report = judged((7, 1), (7, 1), (7, 2), (7, 3)).judge()
    assert report.attempts_back == []
    assert report.attempts == {1: 2, 2: 1, 3: 1}


def test_an_attempt_that_counts_back_is_reported() -> None:
    c = judged((7, 1), (7, 3), (7, 2))
    report = c.judge()
    assert report.attempts_back == [(7, 3, 2)]
    assert "attempts counting back 1" in report.summary()
    assert "(attempt 3)" in c.history(7)


def test_a_first_delivery_below_attempt_one_is_reported() -> None:
    assert judged((7, 0)).judge().attempts_back == [(7, 1, 0)]


# -- where ids end: the message table and its dead-letter table ------------------------------
MAX = 3  # vt_max_attempts of these cases


def now_ns() -> int:
    """time_acked of a row acked just now."""
    return time.time_ns()


def settling(ack_wait_s: float = 0.0) -> Checker:
    """Ids 7 (poison) and 8 (ordinary) inserted, with vt_max_attempts=MAX."""
    c = Checker(ack_wait_s=ack_wait_s, max_attempts=MAX)
    c.insert([7, 8], poison=[7])
    return c


def dead(i: int, attempts: int = MAX, error: str | None = "no ack", ago_s: float = 0.0) -> DeadRow:
    """A dead letter of ``i``, dead ``ago_s`` ago."""
    return DeadRow(i, attempts, error, time.time_ns() - round(ago_s * 1e9))


def poison_released_to_death(c: Checker) -> None:
    """Poison 7 sent MAX times, released each time; ordinary 8 sent once and acked."""
    for attempt in range(1, MAX + 1):
        c.delivered([(7, attempt)], "s1")
        c.settled("release", [7], "s1", time.monotonic(), 1, 0.0, "poison")
    c.delivered([(8, 1)], "s2")
    c.acked([8])


def test_poison_dead_and_the_rest_acked_pass() -> None:
    c = settling()
    poison_released_to_death(c)
    report = c.judge(Tables({8: now_ns()}, [dead(7, error="poison")]))
    assert report.violations() == {}
    assert (report.dead_poison, report.released, report.dead_explained) == (1, MAX, [])
    assert "dead: 1 poison, 0 other (explained)" in report.summary()


def test_a_poison_id_acked_instead_of_dead_is_reported() -> None:
    c = settling()
    c.delivered([(7, 1), (8, 1)], "s1")
    c.acked([7, 8])
    report = c.judge(Tables({7: now_ns(), 8: now_ns()}, []))
    assert report.poison_not_dead == [(7, "acked")]
    assert report.poison_acked == [7]
    assert set(report.violations()) == {
        "poison acked",
        "poison not in the dead-letter table (id, state)",
    }


def test_an_id_in_both_tables_is_reported() -> None:
    c = settling()
    poison_released_to_death(c)
    report = c.judge(Tables({7: None, 8: now_ns()}, [dead(7, error="poison")]))
    assert report.in_both == [7]
    assert "in both tables" in report.violations()


def test_an_id_in_neither_table_or_dead_twice_is_reported() -> None:
    c = settling()
    poison_released_to_death(c)
    report = c.judge(Tables({}, [dead(7, error="poison"), dead(7, error="poison")]))
    assert report.in_neither == [8]
    assert report.dead_twice == [7]


def test_an_ordinary_id_dead_without_explanation_is_reported() -> None:
    """Seen once, at attempt 1, and nothing says why it was not acked: no fault, no drop."""
    c = settling()
    poison_released_to_death(c)
    c.delivered([(9, 1)], "s3")
    c.insert([9])
    report = c.judge(Tables({8: now_ns()}, [dead(7, error="poison"), dead(9)]))
    assert report.dead_unexplained == [9]
    assert report.dead_explained == []
    assert report.violations() == {"ordinary ids dead without explanation": [9]}
    assert "1 other unexplained" in report.summary()


def test_an_ordinary_id_acked_in_time_at_its_last_attempt_yet_dead_is_unexplained() -> None:
    c = settling(ack_wait_s=2.0)
    c.delivered([(8, MAX)], "s1")
    c.acked([8])
    assert c.judge(Tables({}, [dead(8)])).dead_unexplained == [8]


def test_an_ordinary_id_unacked_at_its_last_attempt_dies_explained() -> None:
    c = settling()
    c.delivered([(8, 1)], "s1")
    c.dropped([8], "s1", "subscriber killed")
    c.delivered([(8, MAX)], "s2")
    c.dropped([8], "s2", "subscriber stalled")
    report = c.judge(Tables({}, [dead(8)]))
    assert report.dead_explained == [(8, f"attempt {MAX} of {MAX} to s2: subscriber stalled")]
    assert "ordinary ids dead without explanation" not in report.violations()


def test_an_ordinary_id_whose_last_sends_went_unseen_dies_explained_only_amid_faults() -> None:
    """Seen at attempt 1 only, dropped; the other sends never reached a subscriber: as many
    faults as sends unseen explain it, fewer do not."""
    c = settling()
    c.delivered([(8, 1)], "s1")
    c.dropped([8], "s1", "subscriber killed")
    assert c.judge(Tables({}, [dead(8)])).dead_unexplained == [8]
    for _ in range(MAX - 1):
        c.event("msgtable SIGKILL")
    (explained,) = c.judge(Tables({}, [dead(8)])).dead_explained
    assert explained[0] == 8 and f"{MAX - 1} sends unseen" in explained[1]


def test_a_delivery_after_death_is_reported() -> None:
    c = settling()
    poison_released_to_death(c)
    report = c.judge(Tables({8: now_ns()}, [dead(7, error="poison", ago_s=10)]))
    assert [(i, sub) for i, sub, _ in report.after_dead] == [(7, "s1")] * MAX


def test_a_delivery_after_a_reject_that_answered_one_is_reported() -> None:
    c = settling()
    now = time.monotonic()
    c.deliveries[7] = [(now - 11, "s1", 1)]
    c.settlements[7] = [Settled("reject", "s1", now - 10, now - 9.9, True, 0.0)]
    c.delivered([(7, 2)], "s2")
    assert [(i, sub) for i, sub, _ in c.judge().after_dead] == [(7, "s2")]


def test_a_delivery_past_max_attempts_is_reported() -> None:
    c = settling()
    c.delivered([(7, MAX + 1)], "s1")
    assert c.judge().beyond_max == [(7, MAX + 1)]


def test_a_delivery_within_a_release_delay_or_a_renewal_is_reported() -> None:
    c = settling()
    now = time.monotonic()
    c.settlements[8] = [
        Settled("release", "s1", now - 3, now - 2.9, True, 10.0),
        Settled("renew", "s1", now - 3, now - 2.9, None, 10.0),  # not known to be renewed
    ]
    c.delivered([(8, 2)], "s2")
    assert [(i, verb) for i, verb, _ in c.judge().early] == [(8, "release")]


def test_a_quick_redelivery_after_a_release_is_not_in_flight_twice() -> None:
    c = settling(ack_wait_s=30.0)
    c.delivered([(7, 1)], "s1")
    c.settled("release", [7], "s1", time.monotonic(), 1, 0.0, "poison")
    c.delivered([(7, 2)], "s2")
    c.delivered([(7, 2)], "s3")  # no release between: in flight twice
    report = c.judge()
    assert [i for i, _ in report.in_flight_twice] == [7]
    assert report.reasons["released by its subscriber"] == 1


def test_dead_letter_attempts_and_last_error_are_judged() -> None:
    c = settling()
    poison_released_to_death(c)
    report = c.judge(Tables({8: now_ns()}, [dead(7, attempts=MAX - 1, error="other")]))
    assert report.attempts_short == [(7, MAX - 1, MAX)]
    assert report.bad_reason == [(7, "other")]
    c = settling()
    c.delivered([(7, 1)], "s1")
    report = c.judge(Tables({}, [dead(7, attempts=1, error=None)]))
    # nobody rejected it: it died of its attempts, all MAX of them; and some error is kept
    assert report.attempts_off == [(7, 1, MAX)]
    assert report.bad_reason == [(7, None)]


def test_an_ack_in_doubt_that_committed_counts_as_acked_and_one_never_sent_does_not() -> None:
    """8's ack call failed (the answer lost in a fault) but the table has it acked: acked.
    9 is acked in the table though no ack call ever named it: reported."""
    c = settling()
    poison_released_to_death(c)
    c.first_ack.pop(8)
    c.ack_failed([8])
    c.insert([9])
    c.delivered([(9, 1)], "s3")
    report = c.judge(Tables({8: now_ns(), 9: now_ns()}, [dead(7, error="poison")]))
    assert report.acks_in_doubt_committed == 1
    assert report.never_acked == [9]


def test_a_delivery_after_the_tables_time_acked_is_after_its_ack() -> None:
    c = settling()
    poison_released_to_death(c)
    c.first_ack.pop(8)
    c.ack_failed([8])
    acked_ns = time.time_ns() - 10 * 10**9  # committed 10 s ago; its answer was lost
    c.delivered([(8, 2)], "s3")
    report = c.judge(Tables({8: acked_ns}, [dead(7, error="poison")]))
    assert [(i, sub) for i, sub, _ in report.after_ack] == [(8, "s2"), (8, "s3")]
