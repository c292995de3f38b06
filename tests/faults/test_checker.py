"""The fault suite's checker judges what it was told, without a server: the attempt invariant."""

from __future__ import annotations

from .chaos import Checker


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
