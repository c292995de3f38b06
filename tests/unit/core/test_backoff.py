from __future__ import annotations

import random

from msgtable.core.backoff import JITTER_HIGH, JITTER_LOW, backoff_s, draw_jitter, next_delivery_ns
from msgtable.core.tables import BACKOFF_CEILING_S


def test_first_send_waits_ack_wait_plus_min_backoff():
    assert next_delivery_ns(0, 0, 30, 30, 0, 1.0) == 60 * 10**9


def test_backoff_doubles_with_each_epoch():
    assert [backoff_s(e, 1, 0, 1.0) for e in range(5)] == [1, 2, 4, 8, 16]


def test_backoff_is_bounded_by_min_and_max():
    assert backoff_s(0, 10, 0, JITTER_LOW) == 10  # never below min_backoff
    assert backoff_s(10, 1, 60, 1.0) == 60
    assert backoff_s(10_000, 1, 0, 1.0) == BACKOFF_CEILING_S  # "unbounded" still fits a bigint


def test_negative_epoch_counts_as_zero():
    assert backoff_s(-3, 2, 0, 1.0) == 2


def test_jitter_stays_in_its_range_and_scales_the_backoff():
    rng = random.Random(7)
    draws = [draw_jitter(rng) for _ in range(2000)]
    assert min(draws) >= JITTER_LOW and max(draws) < JITTER_HIGH
    assert backoff_s(3, 1, 0, 1.25) == 10.0


def test_huge_epoch_does_not_overflow_time_next():
    assert next_delivery_ns(2**62, 10**9, 30, 30, 0, 1.3) < 2**63
