"""The bench's headline figures: medians of rounds run side by side, with their spread."""

from __future__ import annotations

import json

from bench.measure import Throughput
from bench.report import Report, Target
from bench.scale import PurgeResult


def run(msgs_s: float) -> Throughput:
    return Throughput("msgtable", 100, 4, 100_000, 100_000 / msgs_s)


def test_the_purge_ratio_is_the_median_rounds_with_its_spread():
    # round ratios 0.5, 0.9, 1.0: the mean of the rates would say 0.8, the median round 0.9
    p = PurgeResult(
        without=[run(40_000), run(30_000), run(30_000)],
        during=[run(20_000), run(27_000), run(30_000)],
        purged=[50_000, 40_000, 45_000],
        left_after=865_000,
    )
    assert [round(r, 3) for r in p.rounds] == [0.5, 0.9, 1.0]
    assert round(p.ratio, 3) == 0.9
    assert p.spread == [0.5, 1.0]
    d = p.as_dict()
    assert d["ratio"] == 0.9 and d["ratio_spread"] == [0.5, 1.0]
    assert d["purged_during_runs"] == 135_000 and d["purged_each_run"] == [50_000, 40_000, 45_000]


def test_a_target_with_rounds_carries_their_spread_in_the_json_line():
    t = Target("purge_keeps", "delivery during purge / without", 0.9, 0.8, spread=[0.5, 1.0])
    assert t.as_dict() == {"value": 0.9, "target": ">= 0.8", "met": True, "spread": [0.5, 1.0]}
    assert "spread" not in Target("x", "once", 1.0, 0.8).as_dict()


def test_the_report_puts_the_purge_rounds_spread_on_its_target():
    r = Report("full", "mariadb", 4, 100, 10, poller_interval_s=0.02)
    r.purge = PurgeResult([run(30_000)] * 3, [run(15_000), run(27_000), run(30_000)], [1, 2, 3], 0)
    (t,) = [t for t in r.targets() if t.key == "purge_keeps"]
    assert round(t.value or 0, 3) == 0.9 and t.spread == [0.5, 1.0]
    assert json.dumps(t.as_dict())


def test_the_backlog_ratio_is_the_median_round_with_its_spread():
    from bench.scale import BacklogResult

    b = BacklogResult(small=[30_000, 20_000, 25_000], large=[15_000, 19_000, 25_000])
    assert [round(r, 3) for r in b.rounds] == [0.5, 0.95, 1.0]
    assert round(b.ratio, 3) == 0.95 and b.spread == [0.5, 1.0]
    r = Report("full", "mariadb", 4, 100, 10, poller_interval_s=0.02)
    r.backlog = b
    (t,) = [t for t in r.targets() if t.key == "backlog_1m_vs_10k"]
    assert t.spread == [0.5, 1.0]
