"""The fault suite's drain: when it gives up (tests/faults/drain.py)."""

from __future__ import annotations

from .drain import Drain


def pending(n: int, part: str = "subscription all") -> dict[str, list[int]]:
    return {f"{part}: ordinary ids unacked in the table": list(range(n))}


def test_a_drain_that_settles_nothing_gives_up_at_its_time_out() -> None:
    d = Drain(1000.0, timeout_s=90, progress_s=30, cap_s=240)
    assert all(d.goes_on(1000.0 + t, pending(5)) for t in range(0, 90, 1))
    assert not d.goes_on(1090.0, pending(5))
    assert d.why == "90s after the faults, none of it in the last 30s"


def test_a_drain_still_settling_at_its_time_out_goes_on_until_it_stops_settling() -> None:
    """A busy machine: the count falls past the time-out; once it stays flat for the
    progress window, the drain gives up."""
    d = Drain(0.0, timeout_s=90, progress_s=30, cap_s=240)
    for t in range(0, 120):
        assert d.goes_on(float(t), pending(200 - t)), t
    for t in range(120, 150):
        assert d.goes_on(float(t), pending(80)), t  # flat, for less than the window
    assert not d.goes_on(150.0, pending(80))
    assert d.why.startswith("90s after the faults, none of it in the last 30s")


def test_a_drain_gives_up_at_its_cap_even_while_settling() -> None:
    d = Drain(0.0, timeout_s=90, progress_s=30, cap_s=240)
    assert all(d.goes_on(float(t), pending(1000 - t)) for t in range(0, 240))
    assert not d.goes_on(240.0, pending(1))
    assert d.why == "240s after the faults (the drain's cap)"


def test_the_drain_samples_each_parts_pending_ids_every_sample_period() -> None:
    d = Drain(0.0, sample_s=10)
    for t in range(0, 25):
        both = {**pending(30 - t), **pending(3, "the default group")}
        d.goes_on(float(t), both)
    assert d.samples == [
        {"subscription all": 30, "the default group": 3},
        {"subscription all": 20, "the default group": 3},
        {"subscription all": 10, "the default group": 3},
    ]
