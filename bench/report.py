"""The readable table, the targets and the closing JSON line of a benchmark run."""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.capture import TARGET_EVENTS_S, CaptureResult
from bench.dashboard import TARGET_MS as TARGET_DASHBOARD_MS
from bench.dashboard import TARGET_SPEEDUP as TARGET_EXPOSITION_SPEEDUP
from bench.dashboard import DashboardResult
from bench.database import PAYLOAD
from bench.fanout import FILTER, GROUPS, FanoutResult
from bench.flow import TARGETS as FLOW_TARGETS
from bench.flow import FlowResult
from bench.idempotency import (
    TARGET_DEDUP_RATIO,
    TARGET_LATE_P99_MS,
    DedupResult,
    ScheduleResult,
)
from bench.latency import LatencyResult, OnTimeResult
from bench.measure import Throughput
from bench.memory import MemoryResult
from bench.metrics import TARGET_RATIO as TARGET_METRICS_RATIO
from bench.metrics import MetricsCost
from bench.ordering import HOT_BATCH, FairnessResult, OrderingResult
from bench.producer import MIN_PRODUCER_ROWS
from bench.push import TARGET_MSGS_S, TARGET_P99_MS, PushResult
from bench.redelivery import TARGET_P99_MS as TARGET_REDELIVERY_P99_MS
from bench.redelivery import RedeliveryResult
from bench.scale import WINDOW, BacklogResult, PurgeResult
from bench.servers import PROCS, TABLES, ServersResult
from bench.servers import model as servers_model
from bench.settle import RELEASE_ROUNDS, SettleResult
from bench.shards import SHARDS, SUBSCRIBERS, ShardsResult
from bench.shards import TARGET_RATIO as TARGET_SHARDS_RATIO
from bench.shards import model as shards_model
from bench.spark import SparkResult
from bench.sqs import TARGET_LONGPOLL_P99_MS, SqsResult
from bench.sqs import TARGET_RATIO as TARGET_SQS_RATIO

# What each section of bench.run puts in the JSON line when it runs by itself (--only it, at
# the default batch sizes): keys of the document, or "targets.<key>" for a target's value.
# Each holds a figure (not null) once the section ran; the bench's smoke test
# (tests/acceptance/test_bench_smoke.py) runs every section and holds it to its keys.
SECTION_KEYS: dict[str, tuple[str, ...]] = {
    "raw": ("raw_msgs_s", "raw_msgs_s_b10"),
    "msgtable": ("msgtable_msgs_s", "msgtable_msgs_s_b10"),
    "latency": (
        "latency_p50_ms",
        "latency_p99_ms",
        "latency",
        "latency_binlog_p50_ms",
        "latency_binlog_p99_ms",
        "latency_binlog",
        "targets.latency_binlog_p99_ms",
    ),
    "ontime": ("on_time", "targets.on_time_p99_ms"),
    "peer": ("peer_msgs_s",),
    "memory": ("rss_mb", "rss_base_mb", "bytes_per_cached_msg", "memory"),
    "settlement": (
        "release_msgs_s",
        "dead_letter_msgs_s",
        "renew_1000_ms",
        "renew_1000_p99_ms",
        "settlement",
        "targets.release_msgs_s",
        "targets.dead_letter_msgs_s",
        "targets.renew_1000_ms",
    ),
    "fanout": (
        "fanout_groups",
        "fanout_ratio",
        "filter_ratio",
        "filter_rows_read_per_msg",
        "filter_table_rows_read_per_msg",
        "filter_handover_rows_read",
        "fanout",
        "fanout_cpu_ratio",
        "fanout_writes_per_msg",
        "fanout_aggregate_ratio",
        "filter_rows_ratio",
        "filter_lazy_rows_read_per_msg",
        "filter_lazy_rows_ratio",
        "fanout_lazy_cpu_ratio",
        "fanout_lazy_writes_per_msg",
        "fanout_lazy_aggregate_ratio",
        "targets.fanout_lazy_cpu_ratio",
        "targets.fanout_lazy_writes_per_msg",
        "targets.fanout_lazy_aggregate_ratio",
        "targets.filter_ratio",
        "targets.fanout_cpu_ratio",
        "targets.fanout_writes_per_msg",
        "targets.fanout_aggregate_ratio",
        "targets.filter_rows_ratio",
        "targets.filter_lazy_rows_ratio",
    ),
    "redelivery": (
        "redelivery_delay_p99_ms",
        "redelivery",
        "targets.redelivery_delay_p99_ms",
    ),
    "ordering": (
        "ordered_msgs_s",
        "unordered_msgs_s",
        "ordered_ratio",
        "hot_key_msgs_s",
        "fairness_p99_ms",
        "fairness_base_p99_ms",
        "fairness_ratio",
        "ordering",
        "targets.ordered_ratio",
        "targets.fairness_ratio",
    ),
    "push": ("push_msgs_s", "push_latency_p50_ms", "push_latency_p99_ms", "push"),
    "expiry": ("dead_letter_expired_msgs_s",),
    "backlog": ("backlog", "targets.backlog_1m_vs_10k"),
    "purge": ("purge", "targets.purge_keeps"),
    "spark": ("spark", "targets.spark_enqueue_rows_s", "targets.spark_archive_s"),
    "capture": ("capture_events_s", "capture"),
    "sqs": (
        "sqs_msgs_s",
        "sqs_ratio",
        "sqs_longpoll_p99_ms",
        "sqs",
        "targets.sqs_ratio",
        "targets.sqs_longpoll_p99_ms",
    ),
    "dedup": ("dedup_ratio", "enqueue_ratio", "dedup", "targets.dedup_ratio"),
    "schedules": ("schedule_late_p99_ms", "schedules", "targets.schedule_late_p99_ms"),
    "flow": (
        "rate_limit_error",
        "key_cap_violations",
        "caps_ratio",
        "fair_dwell_ratio",
        "fair_dwell_ratio_spread",
        "fair_ratio",
        "fair_ratio_spread",
        "fair_index_ratio",
        "flow",
        "targets.rate_limit_error",
        "targets.key_cap_violations",
        "targets.caps_ratio",
        "targets.fair_dwell_ratio",
        "targets.fair_ratio",
    ),
    "metrics": (
        "metrics_off_msgs_s",
        "metrics_on_msgs_s",
        "metrics_cost_ratio",
        "metrics_listening_ratio",
        "tracing_on_msgs_s",
        "tracing_cost_ratio",
        "tracing_cost_spread",
        "sampled_tracing_cost_ratio",
        "sampled_tracing_cost_spread",
        "metrics_control_ratio",
        "metrics_ratios_normalized",
        "metrics_cost_ratio_raw",
        "metrics",
    ),
    "dashboard": (
        "dashboard_page_ms",
        "dashboard_api_ms",
        "dashboard_api_hour_ms",
        "metrics_scrape_cpu_ms",
        "exposition_speedup",
        "dashboard",
    ),
    "servers": (
        "server_procs",
        "msgs_s_by_server_procs",
        "cpu_us_per_msg_by_part",
        "server_procs_ratio",
        "server_procs_model",
        "servers",
    ),
    "shards": (
        "shards",
        "msgs_s_by_shards",
        "shards_cpu_us_per_msg_by_part",
        "shards_ratio",
        "shards_model",
        "shards_runs",
        "targets.shards_2_ratio",
    ),
}
# The lazy fan-out's figures (bench.fanout: medians of its rounds): JSON key -> FanoutResult's
LAZY_FIGURES = {
    "fanout_lazy_cpu_ratio": "fanout_cpu_ratio",
    "fanout_lazy_writes_per_msg": "writes_per_msg",
    "fanout_lazy_aggregate_ratio": "aggregate_ratio",
}
# Figures of two sections side by side: they need both in the run (--only raw,msgtable,peer).
JOINT_KEYS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("raw", "msgtable"): (
        "ratio_vs_raw",
        "ratio_vs_raw_spread",
        "ratio_vs_raw_b10",
        "targets.ratio_vs_raw",
    ),
    ("msgtable", "peer"): ("ratio_vs_peer", "targets.ratio_vs_peer"),
}

LABELS = {
    "raw": "raw SQL lifecycle (PyMySQL, no engine)",
    "msgtable": "msgtable end to end (gRPC + MessageAck)",
    "kombu": "peer: kombu SQLAlchemy transport",
    "release": f"release each batch (delay 0), {RELEASE_ROUNDS} rounds",
    "dead_letter": "reject each batch to vt_dead_letter",
    "dead_letter_expired": "release once, die of vt_max_attempts=1",
    "fanout_base": "one table, no subscription (the baseline)",
    "fanout_group": f"one of {GROUPS} subscriptions of one table",
    "fanout_filter": f"subscription, filter {FILTER} (1 %)",
    "ordered": "ordered per key (vt_order_key)",
    "unordered": "the same table unordered",
    "hot_key": "one key holds the whole backlog",
    "fairness_base": "other keys alone",
    "fairness_hot": "other keys beside a 90 % hot key",
}


@dataclass(frozen=True)
class Target:
    """One goal the engine must eventually meet."""

    key: str
    text: str
    value: float | None  # None: not measured in this run
    threshold: float
    unit: str = ""
    at_most: bool = False  # the value must be <= threshold (else >=)
    why_unmeasured: str = ""
    # [min, max] of the rounds whose median is the value (None: measured once)
    spread: list[float] | None = None

    @property
    def met(self) -> bool | None:
        if self.value is None or math.isnan(self.value):
            return None
        return self.value <= self.threshold if self.at_most else self.value >= self.threshold

    def as_dict(self) -> dict[str, Any]:
        return {
            "value": None if self.value is None else round(self.value, 3),
            "target": f"{'<=' if self.at_most else '>='} {self.threshold:g}{self.unit}",
            "met": self.met,
            **({"spread": self.spread} if self.spread else {}),
        }


@dataclass
class Report:
    mode: str
    server: str
    subscribers: int
    batch_size: int
    low_batch_size: int
    poller_interval_s: float
    postpone_after_s: float | None = None  # None: the engine's default
    binlog: bool = True  # the throughput server follows the binlog (not --no-binlog)
    durable: bool = False  # the database flushes every commit (--durable, or its settings)
    runs: list[Throughput] = field(default_factory=list)
    # The headline cells' rounds (bench.run.headline_rounds): (batch, subscribers) -> each
    # round's msgtable / raw, run side by side, every other round msgtable first. Their
    # ratio is the median round's; ``runs`` holds that round's two runs.
    ratio_rounds: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    peer: Throughput | None = None
    peer_missing: str = ""
    latency: LatencyResult | None = None  # polling only
    latency_binlog: LatencyResult | None = None  # msgtable serve --binlog
    on_time: OnTimeResult | None = None
    memory: MemoryResult | None = None
    backlog: BacklogResult | None = None
    purge: PurgeResult | None = None
    spark: SparkResult | None = None
    spark_missing: str = ""
    settlement: SettleResult | None = None
    fanout: FanoutResult | None = None
    redelivery: RedeliveryResult | None = None  # bench.redelivery: behind a fresh backlog
    ordering: OrderingResult | None = None
    push: PushResult | None = None
    capture: CaptureResult | None = None
    sqs: SqsResult | None = None  # bench.sqs: the SQS API through boto3
    dedup: DedupResult | None = None  # bench.idempotency: enqueue with vt_dedup / without
    schedules: ScheduleResult | None = None  # bench.idempotency: how late ticks are
    flow: FlowResult | None = None  # bench.flow: rates, caps per key, fair share
    metrics: MetricsCost | None = None
    dashboard: DashboardResult | None = None
    servers: ServersResult | None = None  # bench.servers: 1 and 2 server processes
    shards: ShardsResult | None = None  # bench.shards: keyspaces of 1, 2 and 4 shards
    wall_s: float = 0.0

    def find(self, kind: str, batch: int, clients: int) -> Throughput | None:
        for r in self.runs:
            if (r.kind, r.batch_size, r.clients) == (kind, batch, clients):
                return r
        return None

    def ratio_vs_raw(self, batch: int, clients: int) -> float | None:
        rounds = self.ratio_rounds.get((batch, clients))
        if rounds:
            return statistics.median(rounds)
        raw, mt = self.find("raw", batch, clients), self.find("msgtable", batch, clients)
        return mt.msgs_s / raw.msgs_s if raw and mt else None

    def ratio_spread(self, batch: int, clients: int) -> list[float] | None:
        """[min, max] of the cell's rounds (None: measured once)."""
        rounds = self.ratio_rounds.get((batch, clients))
        return [round(min(rounds), 3), round(max(rounds), 3)] if rounds else None

    def ratio_vs_peer(self) -> float | None:
        mt = self.find("msgtable", self.batch_size, self.subscribers)
        return mt.msgs_s / self.peer.msgs_s if mt and self.peer else None

    def _flow_targets(self) -> list[Target]:
        """Flow control's (bench.flow)."""
        f, t = self.flow, FLOW_TARGETS
        return [
            Target(
                "rate_limit_error",
                "vt_rate=1000/s under a backlog: the rate measured, its error",
                f.rate_limit_error if f else None,
                t["rate_limit_error"],
                at_most=True,
            ),
            Target(
                "key_cap_violations",
                "keys over their vt_key_concurrency at any instant",
                f.key_cap_violations if f else None,
                t["key_cap_violations"],
                at_most=True,
            ),
            Target(
                "caps_ratio",
                "with a cap per key (none at it) / without, msgs/s",
                f.caps_ratio if f else None,
                t["caps_ratio"],
            ),
            Target(
                "fair_dwell_ratio",
                "quiet tenants' commit -> send p99: beside a 100x noisy one / alone",
                f.fair_dwell_ratio if f else None,
                t["fair_dwell_ratio"],
                at_most=True,
            ),
            Target(
                "fair_ratio",
                "with a fairness key / without, msgs/s",
                f.fair_ratio if f else None,
                t["fair_ratio"],
            ),
        ]

    def _flow_json(self) -> dict[str, Any]:
        f = self.flow
        if f is None:
            return {k: None for k in SECTION_KEYS["flow"] if "." not in k}
        return {**f.headline(), "flow": f.as_dict()}

    def targets(self) -> list[Target]:
        k, b, lo = self.subscribers, self.batch_size, self.low_batch_size
        full_only = "full mode only" if self.mode == "quick" else "not run"
        per_msg = self.memory.bytes_per_message if self.memory else None
        fair = self._fairness()
        return [
            Target(
                "ratio_vs_raw",
                f"msgtable / raw at batch {b}, {k} subscribers",
                self.ratio_vs_raw(b, k),
                1.2,  # issue 42's (it was 1.0 before)
                spread=self.ratio_spread(b, k),
            ),
            Target(
                f"ratio_vs_raw_b{lo}",
                f"msgtable / raw at batch {lo}, {k} subscribers",
                self.ratio_vs_raw(lo, k),
                1.0,  # issue 42's (it was 0.8 before)
                spread=self.ratio_spread(lo, k),
            ),
            Target(
                "ratio_vs_peer",
                "msgtable / kombu",
                self.ratio_vs_peer(),
                50,
                why_unmeasured=self.peer_missing,
            ),
            Target(
                "backlog_1m_vs_10k",
                f"drain rate at a 1M backlog / at 10k ({WINDOW:,} msgs)",
                self.backlog.ratio if self.backlog else None,
                0.8,
                why_unmeasured=full_only,
                spread=self.backlog.spread if self.backlog else None,
            ),
            Target(
                "purge_keeps",
                "delivery during a 1M-row purge / without",
                self.purge.ratio if self.purge else None,
                0.8,
                why_unmeasured=full_only,
                spread=self.purge.spread if self.purge else None,
            ),
            Target(
                "latency_binlog_p50_ms",
                "INSERT commit -> receive with the binlog, p50",
                self.latency_binlog.p50_ms if self.latency_binlog else None,
                5,
                unit=" ms",
                at_most=True,
            ),
            Target(
                "latency_binlog_p99_ms",
                "INSERT commit -> receive with the binlog, p99",
                self.latency_binlog.p99_ms if self.latency_binlog else None,
                20,
                unit=" ms",
                at_most=True,
            ),
            Target(
                "on_time_p99_ms",
                "future messages: arrival - time_next, p99",
                self.on_time.p99_ms if self.on_time else None,
                50,
                unit=" ms",
                at_most=True,
            ),
            Target(
                "spark_enqueue_rows_s",
                "Spark bulk enqueue of 1M rows, rows/s",
                self.spark.enqueue_rows_s if self.spark else None,
                100_000,
                why_unmeasured=self.spark_missing or full_only,
            ),
            Target(
                "spark_archive_s",
                "Spark archive + delete of 1M acked rows",
                self.spark.archive_s if self.spark else None,
                20,
                unit=" s",
                at_most=True,
                why_unmeasured=self.spark_missing or full_only,
            ),
            Target(
                "release_msgs_s",
                f"release, delay 0, batch {b}, {k} subscribers, msgs/s",
                self._settled("release"),
                5000,
            ),
            Target(
                "dead_letter_msgs_s",
                f"reject to a dead-letter table, batch {b}, {k} subs",
                self._settled("dead_letter"),
                5000,
            ),
            Target(
                "renew_1000_ms",
                "one MessageRenew of 1,000 in-flight ids, median",
                self.settlement.renew.p50_ms if self.settlement and self.settlement.renew else None,
                20,
                unit=" ms",
                at_most=True,
            ),
            Target(
                "fanout_cpu_ratio",
                "CPU of a subscription delivery / a default-group one",
                self.fanout.fanout_cpu_ratio if self.fanout else None,
                1.25,
                at_most=True,
            ),
            Target(
                "fanout_writes_per_msg",
                "rows written per message a subscription settles",
                self.fanout.writes_per_msg if self.fanout else None,
                1,
                at_most=True,
            ),
            Target(
                "fanout_aggregate_ratio",
                f"{GROUPS} subscriptions' rates summed / no subscription",
                self.fanout.aggregate_ratio if self.fanout else None,
                0.8,
            ),
            *self._lazy_targets(),
            Target(
                "filter_rows_ratio",
                "rows read a delivery: 1 % filter / unfiltered subscription",
                self.fanout.filter_rows_ratio if self.fanout else None,
                1.25,
                at_most=True,
            ),
            Target(
                "filter_lazy_rows_ratio",
                "lazy: rows read a delivery: 1 % filter / unfiltered",
                self._lazy_filter("filter_rows_ratio"),
                1.25,
                at_most=True,
            ),
            Target(
                "filter_ratio",
                "1 % filter: matches msgs/s / no subscription",
                self.fanout.filter_ratio if self.fanout else None,
                0.5,
            ),
            Target(
                "redelivery_delay_p99_ms",
                "a redelivery behind 100,000 fresh rows: after its due time, p99",
                self.redelivery.p99_ms if self.redelivery else None,
                TARGET_REDELIVERY_P99_MS,
                unit=" ms",
                at_most=True,
            ),
            Target(
                "ordered_ratio",
                "ordered per key / unordered, same backlog",
                self.ordering.ratio if self.ordering else None,
                0.5,
            ),
            Target(
                "hot_key_msgs_s",
                f"one hot key at batch {HOT_BATCH}, {k} subscribers, msgs/s",
                self.ordering.hot.msgs_s if self.ordering and self.ordering.hot else None,
                5000,
            ),
            Target(
                "fairness_ratio",
                "other keys' p99 wait: with a 90 % hot key / without",
                fair.ratio if fair else None,
                2,
                at_most=True,
            ),
            Target(
                "push_msgs_s",
                "push to a local HTTP receiver at batch 100, msgs/s",
                self.push.msgs_s if self.push else None,
                TARGET_MSGS_S,
            ),
            Target(
                "push_latency_p99_ms",
                "INSERT commit -> POST received at 1,000 msg/s (binlog), p99",
                self.push.p99_ms if self.push else None,
                TARGET_P99_MS,
                unit=" ms",
                at_most=True,
            ),
            Target(
                "sqs_ratio",
                "boto3 send/receive/delete / the gRPC client, batches of 10",
                self.sqs.ratio if self.sqs else None,
                TARGET_SQS_RATIO,
            ),
            Target(
                "sqs_longpoll_p99_ms",
                "INSERT commit -> SQS long-polling receive answers, p99",
                self.sqs.p99_ms if self.sqs else None,
                TARGET_LONGPOLL_P99_MS,
                unit=" ms",
                at_most=True,
            ),
            Target(
                "dedup_ratio",
                "msgtable.enqueue with vt_dedup / without, transactions of 100",
                self.dedup.ratio if self.dedup else None,
                TARGET_DEDUP_RATIO,
            ),
            Target(
                "schedule_late_p99_ms",
                "a schedule's tick -> its message INSERTed, p99",
                self.schedules.p99_ms if self.schedules else None,
                TARGET_LATE_P99_MS,
                unit=" ms",
                at_most=True,
            ),
            *self._flow_targets(),
            Target(
                "capture_events_s",
                "table events: source row changes captured a second",
                self.capture.events_s if self.capture else None,
                TARGET_EVENTS_S,
            ),
            Target(
                "metrics_cost_ratio",
                "msgtable with metrics scraped every 0.2 s / without, batch 100, 4 subscribers",
                self.metrics.ratio if self.metrics else None,
                TARGET_METRICS_RATIO,
                spread=_spread(self.metrics.ratio_runs if self.metrics else None),
            ),
            Target(
                "dashboard_page_ms",
                "the dashboard's page with 100 tables: GET /, median",
                self.dashboard.page_ms if self.dashboard else None,
                TARGET_DASHBOARD_MS,
                unit=" ms",
                at_most=True,
            ),
            Target(
                "dashboard_api_ms",
                "the dashboard's data with 100 tables: GET /api/state, median",
                self.dashboard.api_ms if self.dashboard else None,
                TARGET_DASHBOARD_MS,
                unit=" ms",
                at_most=True,
            ),
            Target(
                "dashboard_api_hour_ms",
                "the dashboard's first load with 100 tables and an hour of history, median",
                self.dashboard.hour_ms if self.dashboard else None,
                TARGET_DASHBOARD_MS,
                unit=" ms",
                at_most=True,
            ),
            Target(
                "exposition_speedup",
                "/metrics of 100 tables: prometheus_client's rendering / msgtable's, same families",
                self.dashboard.exposition_speedup if self.dashboard else None,
                TARGET_EXPOSITION_SPEEDUP,
            ),
            Target(
                "sampled_tracing_cost_ratio",
                "metrics and tracing, the default sampler (1 root span in 10, parent-based) / "
                "metrics alone, same rounds",
                self.metrics.sampled_ratio if self.metrics else None,
                TARGET_METRICS_RATIO,
                spread=_spread(self.metrics.sampled_ratio_runs if self.metrics else None),
            ),
            Target(
                "shards_2_ratio",
                "a keyspace of 2 shards / of 1, both through a gateway, on this one machine "
                "(what sharding costs where it cannot add cores)",
                self.shards.ratio(2) if self.shards else None,
                TARGET_SHARDS_RATIO,
                why_unmeasured=full_only,
            ),
            Target(
                "bytes_per_cached_msg",
                "server memory per cached message above idle",
                per_msg,
                1024,
                unit=" B",
                at_most=True,
            ),
        ]

    def _fairness(self) -> FairnessResult | None:
        return self.ordering.fairness if self.ordering else None

    def _settled(self, kind: str) -> float | None:
        """msgs/s of a settlement run (bench.settle), None if not run."""
        st = self.settlement
        run = {"release": st.release, "dead_letter": st.dead_letter}[kind] if st else None
        return run.msgs_s if run else None

    # -- output --------------------------------------------------------------------------
    def text(self) -> str:
        out: list[str] = []
        add = out.append
        add("")
        add(f"msgtable benchmark ({self.mode} mode) on {self.server}; {os.cpu_count()} CPUs")
        if self.mode == "smoke":
            add("smoke: each section at its smallest sizes (bench.smoke); the figures mean nothing")
        add(
            f"payload {len(PAYLOAD)} bytes of JSON; every client is a process of its own; "
            f"msgtable serve runs as a subprocess; vt_poller_interval {self.poller_interval_s:g}"
            " s for throughput; vt_postpone_after "
            + ("default" if self.postpone_after_s is None else f"{self.postpone_after_s:g} s")
            + ("; binlog followed" if self.binlog else "; polling only (--no-binlog)")
        )
        add("")
        add(
            f"{'throughput (first INSERT -> last ack)':<42}{'batch':>6}{'clients':>8}"
            f"{'messages':>10}{'seconds':>9}{'msgs/s':>9}{'vs raw':>8}"
        )
        for r in self._ordered_runs():
            ratio = self.ratio_vs_raw(r.batch_size, r.clients) if r.kind == "msgtable" else None
            batch = str(r.batch_size) if r.kind != "kombu" else "-"
            add(
                f"{LABELS.get(r.kind, r.kind):<42}{batch:>6}{r.clients:>8}{r.messages:>10,}"
                f"{r.seconds:>9.2f}{r.msgs_s:>9,.0f}{_num(ratio, '.2f'):>8}"
            )
        if self.peer_missing:
            add(f"{LABELS['kombu']:<42}  not measured: {self.peer_missing}")
        for (b, k), rounds in sorted(self.ratio_rounds.items()):
            each = ", ".join(f"{r:.3f}" for r in rounds)
            add(
                f"vs raw at batch {b}, {k} subscribers: median {statistics.median(rounds):.3f} "
                f"of {len(rounds)} rounds side by side (min {min(rounds):.3f}, max "
                f"{max(rounds):.3f}; each: {each}); the rows above are the median round's"
            )
        add("notes:")
        add("  raw: as many consumer connections as subscribers; consumer k owns the rows of")
        add("  priority k (INSERT number % consumers); poll, postpone, ack each autocommitted;")
        add(
            f"  producers of both insert max(batch, {MIN_PRODUCER_ROWS}) rows per INSERT "
            "(see bench/raw.py)"
        )
        for r in self._ordered_runs():
            if r.note or r.cpu_s:
                what = "peer" if r.kind == "kombu" else f"{r.kind} batch {r.batch_size}"
                add(f"  {what}, {r.clients} clients: {r.note}")
                if r.cpu_s:
                    add(f"    {r.cpu_note()}")
        if self.mode == "full":
            out.extend(self._grid_text())
        for lat in (self.latency, self.latency_binlog):
            if lat is None:
                continue
            add("")
            add(
                f"latency, INSERT commit -> subscriber has it, {lat.messages:,} single-row "
                f"INSERTs at {lat.rate_msgs_s:,.0f} msg/s, vt_poller_interval "
                f"{lat.poller_interval_s:g} s "
                + ("(msgtable serve --binlog):" if lat.binlog else "(polling only):")
            )
            add(f"  p50 {lat.p50_ms:.1f} ms   p99 {lat.p99_ms:.1f} ms   max {lat.max_ms:.1f} ms")
        if self.on_time:
            ot = self.on_time
            add("")
            add(
                f"on time: {ot.messages:,} messages with a future time_next, read ahead by one "
                f"poll (vt_poller_interval {ot.poller_interval_s:g} s); arrival - time_next:"
            )
            add(
                f"  p50 {ot.p50_ms:.1f} ms   p99 {ot.p99_ms:.1f} ms   max {ot.max_ms:.1f} ms   "
                f"earliest {ot.earliest_ms:.1f} ms"
            )
        if self.memory:
            m = self.memory
            add("")
            add(
                f"memory: idle server {m.base_mb:.1f} MB; with 10 full caches "
                f"({m.cached:,} cached messages, {m.in_flight:,} in flight) {m.full_mb:.1f} MB: "
                f"{m.bytes_per_message:,.0f} bytes per cached message"
            )
        if self.settlement:
            out.extend(self._settlement_text(self.settlement))
        if self.fanout:
            out.extend(self._fanout_text(self.fanout))
        if self.ordering:
            out.extend(self._ordering_text(self.ordering))
        if self.backlog:
            out.extend(self._backlog_text(self.backlog))
        if self.spark:
            sp = self.spark
            add("")
            add(
                f"spark: bulk enqueue of {sp.rows:,} rows ({sp.path}) in {sp.enqueue_s:.1f} s: "
                f"{sp.enqueue_rows_s:,.0f} rows/s; archive + delete of {sp.archived:,} acked "
                f"rows in {sp.archive_s:.1f} s"
            )
        if self.servers:
            out.extend(self._servers_text(self.servers))
        if self.shards:
            out.extend(self._shards_text(self.shards))
        if self.purge:
            p = self.purge
            first = p.without[0]
            add("")
            add(
                f"purge of 1M acked rows during delivery (batch {first.batch_size}, "
                f"{first.clients} subscribers, {first.messages:,} messages a run, "
                f"{len(p.without)} rounds of a run without and one during, alternating):"
            )
            add(
                f"  without purge {p.without_rate:,.0f} msgs/s; during purge "
                f"{p.during_rate:,.0f} msgs/s (medians); during / without: median "
                f"{p.ratio:.2f} (rounds {', '.join(f'{r:.2f}' for r in p.rounds)}); rows "
                f"purged in each run with it {', '.join(f'{n:,}' for n in p.purged)}, "
                f"{p.left_after:,} old rows left after them"
            )
        add("")
        add("targets")
        for t in self.targets():
            if t.met is None:
                verdict = f"not measured ({t.why_unmeasured or 'not run'})"
            else:
                verdict = "met" if t.met else "NOT MET"
            bound = f"{'<=' if t.at_most else '>='} {t.threshold:g}{t.unit}"
            add(f"  {t.text:<52}{_num(t.value, '.2f'):>10}  {bound:<10} {verdict}")
        add("")
        add(f"wall time {self.wall_s:.1f} s")
        return "\n".join(out)

    def _ordered_runs(self) -> list[Throughput]:
        order = {"raw": 0, "msgtable": 1}
        runs = sorted(
            self.runs,
            key=lambda r: (r.batch_size != self.batch_size, r.batch_size, r.clients, order[r.kind]),
        )
        return runs + ([self.peer] if self.peer else [])

    def _grid_text(self) -> list[str]:
        batches = sorted({r.batch_size for r in self.runs})
        clients = sorted({r.clients for r in self.runs})
        out = ["", "msgtable msgs/s (raw msgs/s, ratio) by batch size and subscribers"]
        out.append(f"{'batch':>6}" + "".join(f"{f'{k} subscribers':>30}" for k in clients))
        for b in batches:
            cells = []
            for k in clients:
                mt, raw = self.find("msgtable", b, k), self.find("raw", b, k)
                ratio = self.ratio_vs_raw(b, k)
                cell = (
                    f"{mt.msgs_s:,.0f} ({raw.msgs_s:,.0f}, {ratio:.2f})"
                    if mt and raw and ratio is not None
                    else "-"
                )
                cells.append(f"{cell:>30}")
            out.append(f"{b:>6}" + "".join(cells))
        return out

    def _settlement_text(self, st: SettleResult) -> list[str]:
        out = [
            "",
            "settlement through msgtable serve (each batch one call, waited for; "
            "go -> last answer)",
            f"{'':<42}{'batch':>6}{'clients':>8}{'messages':>10}{'seconds':>9}{'msgs/s':>9}",
        ]
        for r in st.runs():
            out.append(
                f"{LABELS.get(r.kind, r.kind):<42}{r.batch_size:>6}{r.clients:>8}"
                f"{r.messages:>10,}{r.seconds:>9.2f}{r.msgs_s:>9,.0f}"
            )
        for r in st.runs():
            out.append(f"  {r.kind}: {r.note}")
            if r.cpu_s:
                out.append(f"    {r.cpu_note()}")
        if st.renew:
            rn = st.renew
            out.append(
                f"renew: one MessageRenew of {rn.ids:,} in-flight ids, {rn.calls} calls back to "
                f"back: p50 {rn.p50_ms:.1f} ms   p99 {rn.p99_ms:.1f} ms   max {rn.max_ms:.1f} ms"
            )
        return out

    def _servers_text(self, sv: ServersResult) -> list[str]:
        out = [
            "",
            f"servers sharing one database's tables ({len(TABLES)} tables, a producer and a "
            f"subscriber each, batch 100; median of {len(sv.runs.get(1, []))} rounds, "
            "alternating):",
        ]
        out += _count_lines(sv.median, sv.spread, PROCS, "server process(es)")
        m = servers_model(sv, os.cpu_count() or 1)
        if m:
            out.append(
                f"  model from the parts: this machine's {os.cpu_count()} cores bound the whole "
                f"at {m['one_machine_bound_msgs_s']:,} msgs/s; a server process "
                f"{m['server_process_bound_msgs_s']:,}/s; a database core "
                f"{m['database_core_bound_msgs_s']:,}/s"
            )
        return out

    def _shards_text(self, sh: ShardsResult) -> list[str]:
        out = [
            "",
            f"a keyspace of shards (each a local database server and a msgtable serve; "
            f"{SUBSCRIBERS} subscribers through one msgtable gateway, a producer a shard, batch "
            f"100; median of {len(sh.runs.get(1, []))} rounds, alternating):",
        ]
        out += _count_lines(sh.median, sh.spread, SHARDS, "shard(s)")
        m = shards_model(sh, os.cpu_count() or 1)
        if m:
            out.append(
                f"  model from the parts at 1 shard: this machine's {os.cpu_count()} cores bound "
                f"the keyspace at {m['one_machine_bound_msgs_s']:,} msgs/s; a shard on machines "
                f"of its own {m['shard_bound_msgs_s']:,}/s; a gateway process "
                f"{m['gateway_process_bound_msgs_s']:,}/s"
            )
        return out

    def _fanout_text(self, f: FanoutResult) -> list[str]:
        out = [
            "",
            "subscriptions through msgtable serve (go -> the group's last ack answered)",
            f"{'':<42}{'batch':>6}{'clients':>8}{'messages':>10}{'seconds':>9}{'msgs/s':>9}",
        ]
        runs = [r for r in (f.baseline, *f.groups, f.filtered) if r is not None]
        for r in runs:
            out.append(
                f"{LABELS.get(r.kind, r.kind):<42}{r.batch_size:>6}{r.clients:>8}"
                f"{r.messages:>10,}{r.seconds:>9.2f}{r.msgs_s:>9,.0f}"
            )
        fo = f.as_dict()
        if f.slowest:
            out.append(
                f"  fan-out: backlog committed at go (COMMIT {f.commit_s * 1000:.0f} ms), handed "
                f"to the {GROUPS} subscriptions by the server's fan-out; all drained in "
                f"{f.drain_all_s:.2f} s; slowest {f.slowest.msgs_s:,.0f} msgs/s; "
                f"{fo['fanout_rows_read_per_msg']} rows read a delivery (baseline "
                f"{fo['baseline_rows_read_per_msg']})"
            )
        if f.filtered:
            out.append(
                f"  filter: from_start hand-over of {f.filter_rows:,} rows in {f.handover_s:.2f} s"
                f" read {f.handover_rows_read:,} rows; the drain read {f.drain_rows_read:,} "
                f"({_num(f.rows_read_per_msg, '.2f')} a message; of the message table "
                f"{_num(f.table_rows_read_per_msg, '.2f')} a message); idle "
                f"{f.idle_rows_read_s:,.0f} rows/s; counter {f.counter}"
            )
        for r in runs:
            out.append(f"  {r.kind}: {r.note}")
            if r.cpu_s:
                out.append(f"    {r.cpu_note()}")
        return out

    def _ordering_text(self, o: OrderingResult) -> list[str]:
        out = [
            "",
            "ordering per key through msgtable serve (backlog committed before go; go -> the "
            "last ack answered)",
            f"{'':<42}{'batch':>6}{'clients':>8}{'messages':>10}{'seconds':>9}{'msgs/s':>9}",
        ]
        runs = o.runs()
        for r in runs:
            out.append(
                f"{LABELS.get(r.kind, r.kind):<42}{r.batch_size:>6}{r.clients:>8}"
                f"{r.messages:>10,}{r.seconds:>9.2f}{r.msgs_s:>9,.0f}"
            )
        if o.ratio is not None:
            each = ", ".join(f"{v:.2f}" for v in o.as_dict()["round_ratios"])
            out.append(
                f"  ordered {_num(o.ordered_msgs_s, ',.0f')} vs unordered "
                f"{_num(o.unordered_msgs_s, ',.0f')} msgs/s (medians of {len(o.ordered)} "
                f"alternated drains): {o.ratio:.2f} (each round: {each})"
            )
        f = o.fairness
        if f is not None:
            out.append(
                f"  fairness: {f.others:,} messages over {f.keys:,} other keys, wait go -> first "
                f"delivery: with the hot key p50 {f.p50_ms:.0f} ms, p99 {f.p99_ms:.0f} ms, max "
                f"{f.max_ms:.0f} ms; without p50 {f.base_p50_ms:.0f} ms, p99 "
                f"{f.base_p99_ms:.0f} ms, max {f.base_max_ms:.0f} ms; p99 ratio {f.ratio:.2f}"
            )
        for r in runs:
            out.append(f"  {r.kind}: {r.note}")
            if r.cpu_s:
                out.append(f"    {r.cpu_note()}")
        return out

    def _backlog_text(self, b: BacklogResult) -> list[str]:
        each = ", ".join(f"{r:,.0f}" for r in b.small)
        each_large = ", ".join(f"{r:,.0f}" for r in b.large)
        s = b.sizes
        out = [
            "",
            f"backlog: drain rate over the first {s.window:,} messages after subscribing "
            f"(batch {self.batch_size}, {self.subscribers} subscribers; {s.drains} rounds of "
            "both side by side, alternating)",
            f"  {s.small:,} due rows {b.small_rate:,.0f} msgs/s ({each})",
            f"  {s.large:,} due rows {b.large_rate:,.0f} msgs/s ({each_large}): "
            f"median round {b.ratio:.2f} of the small backlog (rounds "
            + ", ".join(f"{r:.2f}" for r in b.rounds)
            + ")",
            f"  {s.sustained:,} messages from the {s.large:,} backlog: {b.sustained:,.0f} msgs/s",
            f"  {s.large:,} rows inserted in {b.insert_s:.1f} s; one poll of 10,000 rows took "
            f"{b.poll_ms[s.small]:.0f} ms at {s.small:,}, {b.poll_ms[s.large]:.0f} ms at "
            f"{s.large:,}",
            f"EXPLAIN of the poll query at the {s.large:,} backlog:",
        ]
        widths = [
            max(len(str(h)), *(len(str(r[i])) for r in b.explain_rows))
            for i, h in enumerate(b.explain_header)
        ]
        header = zip(b.explain_header, widths, strict=True)
        out.append("  " + "  ".join(f"{h:<{w}}" for h, w in header))
        for row in b.explain_rows:
            out.append("  " + "  ".join(f"{v!s:<{w}}" for v, w in zip(row, widths, strict=True)))
        return out

    def _raw_ratio(self, side: str) -> float | None:
        """bench.metrics: a side's median ratio of throughput, a tracing side's to on, any
        other's to off (None: not run)."""
        return self.metrics.raw_ratio(side) if self.metrics is not None else None

    def _lazy_targets(self) -> list[Target]:
        """Item 3's three targets for the lazy fan-out, on the medians of its rounds."""
        out = []
        for key, text, goal, at_most in (
            ("fanout_lazy_cpu_ratio", "lazy: CPU of a subscription delivery / default", 1.25, True),
            ("fanout_lazy_writes_per_msg", "lazy: rows written a message settled", 1, True),
            ("fanout_lazy_aggregate_ratio", f"lazy: {GROUPS} rates summed / none", 0.8, False),
        ):
            fo = self.fanout
            median, rounds = fo.lazy_figure(LAZY_FIGURES[key]) if fo else (None, [])
            spread = [round(min(rounds), 3), round(max(rounds), 3)] if len(rounds) > 1 else None
            out.append(Target(key, text, median, goal, at_most=at_most, spread=spread))
        return out

    def _lazy_filter(self, name: str) -> float | None:
        """A figure of the lazy filtered run (bench.fanout.filtered_lazy; None: not run)."""
        lazy = self.fanout.lazy if self.fanout else None
        return getattr(lazy, name) if lazy is not None else None

    def _lazy_figures(self) -> dict[str, Any]:
        """The lazy fan-out's figures: each the median of its rounds, with spread and rounds."""
        out: dict[str, Any] = {}
        for key, name in LAZY_FIGURES.items():
            median, rounds = self.fanout.lazy_figure(name) if self.fanout else (None, [])
            out[key] = rnd(median, 3)
            spread = [round(min(rounds), 3), round(max(rounds), 3)] if rounds else None
            out[f"{key}_spread"] = spread
            out[f"{key}_rounds"] = [round(r, 3) for r in rounds]
        return out

    def json_line(self) -> str:
        k, b, lo = self.subscribers, self.batch_size, self.low_batch_size
        head_raw, head_mt = self.find("raw", b, k), self.find("msgtable", b, k)
        low_raw, low_mt = self.find("raw", lo, k), self.find("msgtable", lo, k)
        st, fo, od, fair = self.settlement, self.fanout, self.ordering, self._fairness()
        doc: dict[str, Any] = {
            "raw_msgs_s": rnd(head_raw.msgs_s if head_raw else None, 0),
            "msgtable_msgs_s": rnd(head_mt.msgs_s if head_mt else None, 0),
            "ratio_vs_raw": rnd(self.ratio_vs_raw(b, k), 3),
            "peer_msgs_s": rnd(self.peer.msgs_s if self.peer else None, 0),
            "ratio_vs_peer": rnd(self.ratio_vs_peer(), 2),
            "batch_size": b,
            "subscribers": k,
            "durable": self.durable,
            "latency_p50_ms": rnd(self.latency.p50_ms if self.latency else None, 2),
            "latency_p99_ms": rnd(self.latency.p99_ms if self.latency else None, 2),
            "rss_mb": rnd(self.memory.full_mb if self.memory else None, 1),
            "rss_base_mb": rnd(self.memory.base_mb if self.memory else None, 1),
            "bytes_per_cached_msg": rnd(self.memory.bytes_per_message if self.memory else None, 0),
            f"raw_msgs_s_b{lo}": rnd(low_raw.msgs_s if low_raw else None, 0),
            f"msgtable_msgs_s_b{lo}": rnd(low_mt.msgs_s if low_mt else None, 0),
            f"ratio_vs_raw_b{lo}": rnd(self.ratio_vs_raw(lo, k), 3),
            "ratio_vs_raw_spread": self.ratio_spread(b, k),
            f"ratio_vs_raw_b{lo}_spread": self.ratio_spread(lo, k),
            "ratio_vs_raw_rounds": [round(r, 3) for r in self.ratio_rounds.get((b, k), [])],
            f"ratio_vs_raw_b{lo}_rounds": [round(r, 3) for r in self.ratio_rounds.get((lo, k), [])],
            "mode": self.mode,
            "server": self.server,
            "poller_interval_s": self.poller_interval_s,
            "postpone_after_s": self.postpone_after_s,
            "binlog": self.binlog,
            "latency": self.latency.as_dict() if self.latency else None,
            "latency_binlog": self.latency_binlog.as_dict() if self.latency_binlog else None,
            "latency_binlog_p50_ms": rnd(
                self.latency_binlog.p50_ms if self.latency_binlog else None, 2
            ),
            "latency_binlog_p99_ms": rnd(
                self.latency_binlog.p99_ms if self.latency_binlog else None, 2
            ),
            "release_msgs_s": rnd(self._settled("release"), 0),
            "dead_letter_msgs_s": rnd(self._settled("dead_letter"), 0),
            "dead_letter_expired_msgs_s": rnd(st.expired.msgs_s if st and st.expired else None, 0),
            "renew_1000_ms": rnd(st.renew.p50_ms if st and st.renew else None, 2),
            "renew_1000_p99_ms": rnd(st.renew.p99_ms if st and st.renew else None, 2),
            "settlement": st.as_dict() if st else None,
            "fanout_groups": GROUPS if fo else None,
            "fanout_ratio": rnd(fo.fanout_ratio if fo else None, 3),
            "filter_ratio": rnd(fo.filter_ratio if fo else None, 3),
            "filter_rows_read_per_msg": rnd(fo.rows_read_per_msg if fo else None, 2),
            "filter_table_rows_read_per_msg": rnd(fo.table_rows_read_per_msg if fo else None, 2),
            "filter_handover_rows_read": fo.handover_rows_read if fo else None,
            "fanout_cpu_ratio": rnd(fo.fanout_cpu_ratio if fo else None, 3),
            "fanout_writes_per_msg": rnd(fo.writes_per_msg if fo else None, 3),
            "fanout_aggregate_ratio": rnd(fo.aggregate_ratio if fo else None, 3),
            "filter_rows_ratio": rnd(fo.filter_rows_ratio if fo else None, 3),
            "filter_lazy_rows_read_per_msg": rnd(self._lazy_filter("rows_read_per_msg"), 2),
            "filter_lazy_rows_ratio": rnd(self._lazy_filter("filter_rows_ratio"), 3),
            **self._lazy_figures(),
            "fanout": fo.as_dict() if fo else None,
            "redelivery_delay_p99_ms": rnd(self.redelivery.p99_ms if self.redelivery else None, 1),
            "redelivery": self.redelivery.as_dict() if self.redelivery else None,
            "ordered_msgs_s": rnd(od.ordered_msgs_s if od else None, 0),
            "unordered_msgs_s": rnd(od.unordered_msgs_s if od else None, 0),
            "ordered_ratio": rnd(od.ratio if od else None, 3),
            "hot_key_msgs_s": rnd(od.hot.msgs_s if od and od.hot else None, 0),
            "fairness_p99_ms": rnd(fair.p99_ms if fair else None, 1),
            "fairness_base_p99_ms": rnd(fair.base_p99_ms if fair else None, 1),
            "fairness_ratio": rnd(fair.ratio if fair else None, 3),
            "ordering": od.as_dict() if od else None,
            "push_msgs_s": rnd(self.push.msgs_s if self.push else None, 0),
            "push_latency_p50_ms": rnd(self.push.p50_ms if self.push else None, 2),
            "push_latency_p99_ms": rnd(self.push.p99_ms if self.push else None, 2),
            "push": self.push.as_dict() if self.push else None,
            "capture_events_s": rnd(self.capture.events_s if self.capture else None, 0),
            "sqs_msgs_s": rnd(self.sqs.msgs_s if self.sqs else None, 0),
            "sqs_ratio": rnd(self.sqs.ratio if self.sqs else None, 3),
            "sqs_longpoll_p99_ms": rnd(self.sqs.p99_ms if self.sqs else None, 2),
            "sqs": self.sqs.as_dict() if self.sqs else None,
            "dedup_ratio": rnd(self.dedup.ratio if self.dedup else None, 3),
            "enqueue_ratio": rnd(self.dedup.enqueue_ratio if self.dedup else None, 3),
            "dedup": self.dedup.as_dict() if self.dedup else None,
            "schedule_late_p99_ms": rnd(self.schedules.p99_ms if self.schedules else None, 1),
            "schedules": self.schedules.as_dict() if self.schedules else None,
            **self._flow_json(),
            "capture": self.capture.as_dict() if self.capture else None,
            "metrics_off_msgs_s": rnd(self.metrics.off_msgs_s if self.metrics else None, 0),
            "metrics_on_msgs_s": rnd(self.metrics.on_msgs_s if self.metrics else None, 0),
            "metrics_cost_ratio": rnd(self.metrics.ratio if self.metrics else None, 3),
            "metrics_listening_ratio": rnd(
                self.metrics.listening_ratio if self.metrics else None, 3
            ),
            "tracing_on_msgs_s": rnd(self.metrics.traced_msgs_s if self.metrics else None, 0),
            # tracing / metrics alone, same rounds: every span (no target), the default sampler
            "tracing_cost_ratio": rnd(self.metrics.tracing_ratio if self.metrics else None, 3),
            "tracing_cost_spread": _spread(
                self.metrics.tracing_ratio_runs if self.metrics else None
            ),
            "sampled_tracing_cost_ratio": rnd(
                self.metrics.sampled_ratio if self.metrics else None, 3
            ),
            "sampled_tracing_cost_spread": _spread(
                self.metrics.sampled_ratio_runs if self.metrics else None
            ),
            # the off side run once more: what the method shows for no difference
            "metrics_control_ratio": rnd(self.metrics.control_ratio if self.metrics else None, 3),
            # the ratios above: of the database's busy time (true) or of throughput (bench.metrics)
            "metrics_ratios_normalized": self.metrics.normalized if self.metrics else None,
            **{
                f"{key}_raw": rnd(self._raw_ratio(side), 3)
                for key, side in (
                    ("metrics_cost_ratio", "on"),
                    ("metrics_listening_ratio", "listening"),
                    ("tracing_cost_ratio", "traced"),
                    ("sampled_tracing_cost_ratio", "sampled"),
                    ("metrics_control_ratio", "control"),
                )
            },
            "metrics": self.metrics.as_dict() if self.metrics else None,
            "dashboard_page_ms": rnd(self.dashboard.page_ms if self.dashboard else None, 2),
            "dashboard_page_p99_ms": rnd(self.dashboard.page_p99_ms if self.dashboard else None, 2),
            "dashboard_api_ms": rnd(self.dashboard.api_ms if self.dashboard else None, 2),
            "dashboard_api_p99_ms": rnd(self.dashboard.api_p99_ms if self.dashboard else None, 2),
            "dashboard_api_hour_ms": rnd(self.dashboard.hour_ms if self.dashboard else None, 2),
            "dashboard": self.dashboard.as_dict() if self.dashboard else None,
            "metrics_scrape_cpu_ms": rnd(
                self.dashboard.scrape_cpu_ms if self.dashboard else None, 2
            ),
            "exposition_ms": rnd(self.dashboard.exposition_ms if self.dashboard else None, 2),
            "exposition_baseline_ms": rnd(
                self.dashboard.exposition_baseline_ms if self.dashboard else None, 2
            ),
            "exposition_speedup": rnd(
                self.dashboard.exposition_speedup if self.dashboard else None, 2
            ),
            "server_procs": list(PROCS) if self.servers else None,
            "msgs_s_by_server_procs": self.servers.msgs_s_by_server_procs()
            if self.servers
            else None,
            "cpu_us_per_msg_by_part": self.servers.cpu_us_per_msg_by_part()
            if self.servers
            else None,
            "server_procs_ratio": rnd(self.servers.ratio() if self.servers else None, 3),
            "server_procs_model": servers_model(self.servers, os.cpu_count() or 1)
            if self.servers
            else None,
            "servers": self.servers.as_dict() if self.servers else None,
            "shards": list(SHARDS) if self.shards else None,
            "msgs_s_by_shards": self.shards.msgs_s_by_shards() if self.shards else None,
            "shards_cpu_us_per_msg_by_part": self.shards.cpu_us_per_msg_by_part()
            if self.shards
            else None,
            "shards_ratio": {str(n): rnd(self.shards.ratio(n), 3) for n in SHARDS[1:]}
            if self.shards
            else None,
            "shards_model": shards_model(self.shards, os.cpu_count() or 1) if self.shards else None,
            "shards_runs": self.shards.as_dict() if self.shards else None,
            "on_time": self.on_time.as_dict() if self.on_time else None,
            "memory": self.memory.as_dict() if self.memory else None,
            "runs": [r.as_dict() for r in self.runs] + ([self.peer.as_dict()] if self.peer else []),
            "targets": {t.key: t.as_dict() for t in self.targets()},
            "wall_s": round(self.wall_s, 1),
        }
        if self.backlog:
            doc["backlog"] = self.backlog.as_dict()
        if self.purge:
            doc["purge"] = self.purge.as_dict()
        if self.spark:
            doc["spark"] = self.spark.as_dict()
        return json.dumps(doc, separators=(",", ":"))


def rnd(value: float | None, digits: int) -> float | None:
    return None if value is None or math.isnan(value) else round(value, digits)


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, spec)


def _spread(rounds: list[float] | None) -> list[float] | None:
    """[min, max] of a median's rounds (None: none)."""
    return [round(min(rounds), 3), round(max(rounds), 3)] if rounds else None


def _count_lines(
    median: Callable[[int], Throughput | None],
    spread: Callable[[int], list[float]],
    counts: Sequence[int],
    what: str,
) -> list[str]:
    """A line for each count of a scaling section (bench.servers, bench.shards): its median
    run's msgs/s, every run's, and the parts' CPU per message."""
    out = []
    for n in counts:
        r = median(n)
        if r is None:
            continue
        us = r.cpu_per_msg()
        out.append(
            f"  {n} {what}: {r.msgs_s:,.0f} msgs/s (runs "
            f"{', '.join(f'{x:,}' for x in spread(n))}); CPU us/msg "
            + ", ".join(f"{k} {v:.0f}" for k, v in us.items())
            + f"; total {sum(us.values()):.0f}"
        )
    return out
