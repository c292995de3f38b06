"""The soak's resource judge (tests/faults/soak.py) on made-up samples: flat use with
transient spikes passes, steady growth of any resource fails and says which."""

from __future__ import annotations

import os

from .soak import Sample, growth, sample


def flat(minutes: int = 30) -> list[Sample]:
    # a spike now and then (a pool refilling after a database restart), no trend
    return [
        Sample(m, 180.0 + (6.0 if m % 7 == 0 else 0.0), 40 + (2 if m % 5 == 0 else 0), 60, 4)
        for m in range(1, minutes + 1)
    ]


def test_flat_use_with_spikes_is_flat():
    assert growth(flat(), warmup=5) == []


def test_memory_that_keeps_growing_is_growth():
    leaking = [Sample(s.minute, 180.0 + 3.0 * s.minute, s.threads, s.fds, 4) for s in flat()]
    (said,) = growth(leaking, warmup=5)
    assert said.startswith("rss_mb grew from 201 (minutes 5-9) to 264 (minutes 26-30)")


def test_threads_fds_and_connections_that_pile_up_are_growth():
    piling = [
        Sample(s.minute, 180.0, 40 + s.minute, 60 + s.minute, 4 + s.minute // 3) for s in flat()
    ]
    said = growth(piling, warmup=5)
    assert [line.split()[0] for line in said] == ["threads", "fds", "db_connections"]


def test_too_short_a_run_is_not_judged_flat():
    assert growth(flat(8), warmup=5) == ["too few samples to judge: 4 after the warm-up, need 10"]


def test_a_sample_of_this_process_reads_real_figures():
    s = sample(os.getpid(), database_port=1, minute=0)
    assert s.rss_mb > 10 and s.threads >= 1 and s.fds >= 3 and s.db_connections == 0
