"""The flow checker (tests/flowcheck.py) judges what it should: an excess is found, a
settlement followed at once by a send is not one, an unsettled delivery stays in flight for
its ack wait, and a rate's bound is the token bucket's."""

from __future__ import annotations

from ..flowcheck import (
    Delivery,
    GroupLimits,
    cap_violations,
    group_violations,
    most_in_flight,
    rate_overshoots,
)

S = 10**9


def d(i: int, key: str | None, sent_s: float, end_s: float | None) -> Delivery:
    return Delivery(i, key, round(sent_s * S), 1, "w", None if end_s is None else round(end_s * S))


def test_overlaps_beyond_a_cap_are_found_per_key_and_in_all():
    ds = [d(1, "a", 0, 2), d(2, "a", 1, 3), d(3, "b", 1.5, 2.5)]
    assert cap_violations(ds, 1, 30, by_key=True) == [f"key 'a': 2 in flight at {S} (cap 1)"]
    assert cap_violations(ds, 3, 30) == []
    assert cap_violations(ds, 2, 30) == [f"the group: 3 in flight at {int(1.5 * S)} (cap 2)"]


def test_a_send_at_the_instant_of_a_settlement_is_no_overlap():
    ds = [d(1, "a", 0, 1), d(2, "a", 1, 2)]
    assert most_in_flight(ds, 30, by_key=True) == {"a": (1, 0)}


def test_an_unsettled_delivery_is_in_flight_until_its_ack_wait_ends():
    ds = [d(1, "a", 0, None), d(2, "a", 5, 6)]
    assert cap_violations(ds, 1, 30, by_key=True) != []
    assert cap_violations(ds, 1, 4, by_key=True) == []


def test_a_rate_window_is_judged_against_burst_plus_rate_times_its_length():
    steady = [d(i, None, i / 10, i / 10) for i in range(50)]  # 10/s
    assert rate_overshoots(steady, 10, 1) == []
    packed = [*steady, d(99, None, 0.0, 0.0), d(98, None, 0.0, 0.0)]
    assert rate_overshoots(packed, 10, 2) != []
    assert rate_overshoots(packed, 10, 3) == []


def own(i: int, key: str, sent_s: float, end_s: float, group: str) -> Delivery:
    return Delivery(i, key, round(sent_s * S), 1, "w", round(end_s * S), group)


def test_each_group_is_judged_by_its_own_limits_not_its_tables():
    table = GroupLimits(rate_per_s=100, burst=10, max_in_flight=8, key_concurrency=2)
    mine = GroupLimits(rate_per_s=2, burst=1, max_in_flight=3, key_concurrency=1)
    limits = {"": table, "own": mine}
    # two of key 'a' at once: within the table's cap of 2 per key, over the subscription's 1
    pair = [own(1, "a", 0, 2, "own"), own(2, "a", 1, 3, "own")]
    assert group_violations(pair, limits, 30) == [
        f"subscription 'own': key 'a': 2 in flight at {S} (cap 1)"
    ]
    default = [own(1, "a", 0, 2, ""), own(2, "a", 1, 3, "")]
    assert group_violations(default, limits, 30) == []


def test_a_subscriptions_own_rate_and_cap_in_all_are_judged():
    limits = {"own": GroupLimits(rate_per_s=2, burst=1, max_in_flight=3)}
    burst = [own(i, f"k{i}", 0.1 * i, 0.1 * i + 0.01, "own") for i in range(4)]  # 4 in 0.3 s
    found = group_violations(burst, limits, 30)
    assert found and all(p.startswith("subscription 'own': the group: ") for p in found), found
    flying = [own(i, f"k{i}", i, 10, "own") for i in range(4)]  # 1/s, 4 in flight at 3 s
    assert group_violations(flying, limits, 30) == [
        f"subscription 'own': the group: 4 in flight at {3 * S} (cap 3)"
    ]


def test_a_group_without_limits_to_judge_it_by_is_a_problem():
    ds = [own(1, "a", 0, 1, "stray")]
    assert group_violations(ds, {"": GroupLimits()}, 30) == [
        "subscription 'stray': 1 deliveries, but no limits to judge them by"
    ]
