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


def test_the_server_processes_figures_are_median_runs_with_each_parts_cpu():
    """bench.servers: the JSON keys the issue names, each count's median run, its parts' CPU
    per message, and the model the README quotes (bounds from those parts)."""
    from bench.servers import ServersResult, model

    def one(procs: int, msgs_s: float, servers_cpu_s: float) -> Throughput:
        cpu_s = {"database": 2.0, "servers": servers_cpu_s, "producers": 0.1, "subscribers": 0.9}
        return Throughput("msgtable", 100, 4, 100_000, 100_000 / msgs_s, cpu_s=cpu_s)

    sv = ServersResult(
        {1: [one(1, 20_000, 2.0), one(1, 30_000, 2.0), one(1, 22_000, 2.0)],
         2: [one(2, 35_000, 2.2), one(2, 30_000, 2.2), one(2, 40_000, 2.2)]}
    )  # fmt: skip
    assert sv.msgs_s_by_server_procs() == {"1": 22_000, "2": 35_000}
    assert sv.cpu_us_per_msg_by_part()["1"] == {
        "database": 20.0,
        "servers": 20.0,
        "producers": 1.0,
        "subscribers": 9.0,
    }
    assert round(sv.ratio() or 0, 3) == round(35_000 / 22_000, 3)
    assert sv.spread(2) == [30_000, 35_000, 40_000]
    assert model(sv, 2) == {
        "one_machine_bound_msgs_s": 40_000,  # 2 cores / 50 us a message
        "server_process_bound_msgs_s": 50_000,
        "database_core_bound_msgs_s": 50_000,
    }
    r = Report("full", "mariadb", 4, 100, 10, poller_interval_s=0.02)
    r.servers = sv
    doc = json.loads(r.json_line())
    assert doc["server_procs"] == [1, 2]
    assert doc["msgs_s_by_server_procs"] == {"1": 22_000, "2": 35_000}
    assert doc["cpu_us_per_msg_by_part"]["2"]["servers"] == 22.0
    assert "2 server process(es): 35,000 msgs/s" in r.text()


def test_the_shards_figures_are_median_runs_with_each_parts_cpu_and_a_model():
    """bench.shards: the JSON keys the issue names (shards, msgs_s_by_shards), each count's
    median run, its parts' CPU per message, the 2-shard target, and the model's bounds."""
    from bench.shards import ShardsResult, model

    def one(msgs_s: float, servers_cpu_s: float) -> Throughput:
        cpu_s = {
            "databases": 2.0,
            "servers": servers_cpu_s,
            "gateway": 1.0,
            "producers": 0.1,
            "subscribers": 0.9,
        }
        return Throughput("msgtable", 100, 2, 100_000, 100_000 / msgs_s, cpu_s=cpu_s)

    sh = ShardsResult(
        {1: [one(20_000, 2.0), one(22_000, 2.0), one(21_000, 2.0)],
         2: [one(19_000, 2.5), one(20_000, 2.5), one(18_000, 2.5)],
         4: [one(15_000, 4.0), one(14_000, 4.0), one(16_000, 4.0)]}
    )  # fmt: skip
    assert sh.msgs_s_by_shards() == {"1": 21_000, "2": 19_000, "4": 15_000}
    assert sh.cpu_us_per_msg_by_part()["4"]["servers"] == 40.0
    assert round(sh.ratio(2) or 0, 3) == round(19_000 / 21_000, 3)
    assert model(sh, 2) == {
        "one_machine_bound_msgs_s": 33_333,  # 2 cores / 60 us a message
        "shard_bound_msgs_s": 50_000,  # its server's 20 us and its database's 20 us
        "gateway_process_bound_msgs_s": 100_000,
        "measured_msgs_s": {"1": 21_000, "2": 19_000, "4": 15_000},
    }
    r = Report("full", "mariadb", 4, 100, 10, poller_interval_s=0.02)
    r.shards = sh
    doc = json.loads(r.json_line())
    assert doc["shards"] == [1, 2, 4]
    assert doc["msgs_s_by_shards"] == {"1": 21_000, "2": 19_000, "4": 15_000}
    assert doc["shards_cpu_us_per_msg_by_part"]["1"]["gateway"] == 10.0
    assert doc["targets"]["shards_2_ratio"]["met"] is True
    assert "4 shard(s): 15,000 msgs/s (runs 14,000, 15,000, 16,000)" in r.text()


def test_the_metrics_rounds_put_each_side_in_each_place_equally_often():
    from collections import Counter

    from bench import metrics

    sides = list(metrics.SIDES)
    assert "control" in sides and "off" in sides
    for rounds in (metrics.ROUNDS, metrics.FULL_ROUNDS):
        assert rounds % len(sides) == 0, rounds
        places = Counter(
            (side, place)
            for r in range(rounds)
            for place, side in enumerate(metrics.rotated(sides, r))
        )
        assert set(places.values()) == {rounds // len(sides)}
        assert len(places) == len(sides) ** 2


def test_the_exposition_speedup_is_the_baselines_median_over_msgtables_with_a_target():
    from bench.dashboard import DashboardResult

    d = DashboardResult(100, 10, 2.0, 3.0, 15.0, 20.0, 60_000, 120.0, 300.0, 1_500_000, 2_900_000)
    d.scrapes, d.scrape_cpu_ms, d.exposition_ms, d.exposition_baseline_ms = 30, 33.0, 20.0, 110.0
    assert d.exposition_speedup == 5.5 and d.as_dict()["exposition_speedup"] == 5.5
    r = Report("quick", "mariadb", 4, 100, 10, poller_interval_s=0.1)
    r.dashboard = d
    (t,) = [t for t in r.targets() if t.key == "exposition_speedup"]
    assert t.value == 5.5 and t.met is True
    doc = json.loads(r.json_line())
    assert doc["metrics_scrape_cpu_ms"] == 33.0 and doc["exposition_speedup"] == 5.5


def test_the_metrics_ratios_are_of_the_databases_busy_time_when_it_was_measured():
    """A round the machine ran slow in (every process's CPU a message up, the throughput
    down) leaves the database's busy time as it was: that ratio says 1, throughput's 0.8; a
    side whose own CPU took from the database shows in both."""
    from bench import metrics

    def measured(msgs_s: float, db_busy: float) -> Throughput:
        t = run(msgs_s)
        t.cpu_s = {"database": db_busy * t.seconds, "server": 1.0}
        return t

    off = [measured(20_000, 0.9), measured(20_000, 0.9), measured(20_000, 0.9)]
    slow = [measured(16_000, 0.9), measured(20_000, 0.9), measured(16_000, 0.9)]
    costly = [measured(19_000, 0.855), measured(19_000, 0.855), measured(19_000, 0.855)]
    s = metrics.compared(slow, off, normalized=True)
    assert [round(r, 3) for r in s.raw_runs] == [0.8, 1.0, 0.8] and round(s.raw, 3) == 0.8
    assert [round(r, 3) for r in s.db_runs] == [1.0] * 3 and round(s.ratio, 3) == 1.0
    c = metrics.compared(costly, off, normalized=True)
    assert round(c.ratio, 3) == 0.95 and round(c.raw, 3) == 0.95
    # without the database's CPU (a database elsewhere): throughput's ratios are judged
    elsewhere = metrics.compared([run(16_000)] * 3, [run(20_000)] * 3, normalized=False)
    assert elsewhere.db is None and round(elsewhere.ratio, 3) == 0.8

    # tracing against metrics alone (on), same rounds: the default sampler judged, every
    # span reported without a target
    on, sampled, traced = costly, [measured(19_000, 0.855)] * 3, [measured(18_000, 0.81)] * 3
    sides = {"off": off, "on": on, "traced": traced, "sampled": sampled}
    mc = metrics.MetricsCost(
        sides={k: metrics.compared(v, off, True) for k, v in sides.items()},
        scrapes=10,
        normalized=True,
        tracing={k: metrics.compared(sides[k], on, True) for k in metrics.TRACING_SIDES},
    )
    assert round(mc.tracing_ratio, 3) == 0.947 and mc.tracing_ratio_runs == [0.81 / 0.855] * 3
    assert round(mc.sampled_ratio, 3) == 1.0 and round(mc.ratio, 3) == 0.95
    r = Report("quick", "mariadb", 4, 100, 10, poller_interval_s=0.1)
    r.metrics = mc
    targets = {t.key: t for t in r.targets()}
    assert "tracing_cost_ratio" not in targets
    assert targets["sampled_tracing_cost_ratio"].met is True
    assert targets["sampled_tracing_cost_ratio"].spread == [1.0, 1.0]
    doc = json.loads(r.json_line())
    assert doc["tracing_cost_ratio"] == 0.947 and doc["sampled_tracing_cost_ratio"] == 1.0
    assert doc["sampled_tracing_cost_spread"] == [1.0, 1.0]
    assert doc["tracing_cost_spread"] == [0.947, 0.947]
    assert doc["sampled_tracing_cost_ratio_raw"] == 1.0 and doc["metrics_ratios_normalized"]
    assert doc["tracing_cost_ratio_raw"] == round(18_000 / 19_000, 3)
    assert doc["metrics"]["tracing_vs_on"]["sampled"]["raw_runs"] == [1.0, 1.0, 1.0]


def test_every_bench_section_says_the_figures_it_fills():
    """The smoke test (tests/acceptance/test_bench_smoke.py) holds each section to these."""
    from bench.report import JOINT_KEYS, SECTION_KEYS
    from bench.run import SECTIONS

    assert sorted(SECTION_KEYS) == sorted(SECTIONS)
    assert all(keys for keys in SECTION_KEYS.values())
    assert {s for joint in JOINT_KEYS for s in joint} <= set(SECTIONS)


def test_the_smoke_plan_leaves_quick_and_full_as_they_were():
    from bench import metrics, scale, smoke, spark
    from bench.run import plan

    quick = plan("quick", 100, 10, 4, None)
    assert quick.messages == {100: 60_000, 10: 20_000} and quick.metrics_rounds == metrics.ROUNDS
    assert (quick.latency_s, quick.peer_messages, quick.purge_messages) == (3.0, 1_500, 50_000)
    full = plan("full", 100, 10, 4, None)
    assert full.metrics_rounds == metrics.FULL_ROUNDS and full.spark_rows == spark.ROWS
    for p in (quick, full):
        assert (p.on_time, p.memory) == ({}, {})  # the modules' own sizes
        assert (p.backlog, p.purge) == (scale.BacklogSizes(), scale.PurgeSizes())
    s = plan("smoke", 100, 10, 4, None)
    assert s.grid == quick.grid and s.messages == smoke.MESSAGES
    assert s.backlog.large == smoke.BACKLOG["large"] and s.spark_rows == smoke.SPARK_ROWS


def test_the_lazy_fanout_figures_are_the_median_rounds_with_their_spread():
    """bench.fanout: each lazy round against its own baseline; the three fanout_lazy_* are
    medians of the rounds (not of one pooled run), with spread and rounds, and their targets
    carry the spread."""
    from bench.fanout import GROUPS, FanoutResult

    def one(base_msgs_s: float, group_msgs_s: float) -> FanoutResult:
        base = Throughput("fanout_base", 100, 2, 20_000, 20_000 / base_msgs_s)
        base.cpu_s = {"server": 0.2}  # 10 us a delivery
        r = FanoutResult(baseline=base, fanout_rows_written=5_000)
        for _ in range(GROUPS):
            g = Throughput("fanout_group", 100, 2, 20_000, 20_000 / group_msgs_s)
            g.cpu_s = {"server": 0.2 * group_msgs_s / base_msgs_s * 4 / GROUPS}
            r.groups.append(g)
        return r

    result = FanoutResult()
    result.lazy_rounds = [one(40_000, 10_000), one(40_000, 5_000), one(40_000, 8_000)]
    result.lazy = result.lazy_rounds[0]
    median, rounds = result.lazy_figure("aggregate_ratio")
    assert [round(x, 3) for x in rounds] == [1.0, 0.5, 0.8] and round(median or 0, 3) == 0.8
    r = Report("quick", "mariadb", 4, 100, 10, poller_interval_s=0.1)
    r.fanout = result
    doc = json.loads(r.json_line())
    assert doc["fanout_lazy_aggregate_ratio"] == 0.8
    assert doc["fanout_lazy_aggregate_ratio_spread"] == [0.5, 1.0]
    assert doc["fanout_lazy_aggregate_ratio_rounds"] == [1.0, 0.5, 0.8]
    assert doc["fanout_lazy_writes_per_msg"] == round(5_000 / (GROUPS * 20_000), 3)
    (t,) = [t for t in r.targets() if t.key == "fanout_lazy_aggregate_ratio"]
    assert t.met and t.spread == [0.5, 1.0]


def test_the_lazy_filter_figure_is_its_drain_over_the_first_lazy_rounds_fanout():
    """bench.fanout.filtered_lazy: filter_lazy_rows_ratio is the lazy filtered drain's rows
    read a delivered message over the first lazy round's fan-out's rows read a delivery, and
    its target is <= 1.25; absent (None, not met or missed) when the run did not happen."""
    from bench.fanout import GROUPS, FanoutResult

    lazy = FanoutResult(fanout_rows_read=4 * GROUPS * 20_000, drain_rows_read=5_000)
    for _ in range(GROUPS):
        lazy.groups.append(Throughput("fanout_group", 100, 2, 20_000, 1.0))
    lazy.filtered = Throughput("fanout_filter_lazy", 100, 2, 1_000, 0.05)
    r = Report("quick", "mariadb", 4, 100, 10, poller_interval_s=0.1)
    r.fanout = FanoutResult(lazy=lazy)
    doc = json.loads(r.json_line())
    assert doc["filter_lazy_rows_read_per_msg"] == 5.0
    assert doc["filter_lazy_rows_ratio"] == 1.25
    (t,) = [t for t in r.targets() if t.key == "filter_lazy_rows_ratio"]
    assert t.met and doc["targets"]["filter_lazy_rows_ratio"]["target"] == "<= 1.25"
    r.fanout = FanoutResult()
    doc = json.loads(r.json_line())
    assert doc["filter_lazy_rows_ratio"] is None
    (t,) = [t for t in r.targets() if t.key == "filter_lazy_rows_ratio"]
    assert t.met is None
