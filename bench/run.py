"""Run msgtable's benchmark suite: ``python -m bench.run [--quick | --full]``.

Quick mode (``make bench``, about a minute on a 2-core machine with the database on it):
raw-SQL limit and msgtable at batch 100 and batch 10 with 4 subscribers, kombu's SQLAlchemy
transport as the peer, latency at 1,000 msg/s, memory with 10 full caches, settlement
(release, dead letters and renew through the server: bench.settle), subscriptions (a table
fanned out to 4 of them, and a 1 % filter, against a table without: bench.fanout) and
redeliveries in a group that lags a 100,000-row backlog (bench.redelivery),
ordering per key (an ordered table against the same table unordered, one hot key, the other
keys' wait beside a hot key: bench.ordering; scaled down to 50,000 messages over 500 keys).
Full mode (``make bench-full``, minutes) runs batch sizes 10 / 100 / 500 with 1 / 4 / 16
subscribers, a 10k vs 1M backlog, a 1M-row purge during delivery, EXPLAIN of the poll at 1M,
messages dying of vt_max_attempts (expiry), and ordering at the issue's size (1M messages
over 10,000 keys). Smoke mode (``--smoke``, ``make bench-smoke``) runs every section, the
full-only ones too, at bench.smoke's sizes, seconds each: whether each still runs (``make
test`` runs each so); its figures mean nothing.

The database is ``MSGTABLE_TEST_DSN`` when set (an account that may create databases), else
a throwaway local mariadbd/mysqld, as for the tests. Each benchmark gets a database of its own
(dropped afterwards). Progress goes to stderr; stdout gets the table, the targets and, as its
last line, one JSON document (``raw_msgs_s``, ``msgtable_msgs_s``, ``ratio_vs_raw``: the
median of HEADLINE_ROUNDS rounds side by side, with ``ratio_vs_raw_spread`` [min, max] and
``ratio_vs_raw_rounds``, the same for batch 10,
``peer_msgs_s``, ``ratio_vs_peer``, ``batch_size``, ``subscribers``, ``latency_p50_ms``,
``latency_p99_ms``, ``rss_mb``, ``release_msgs_s``, ``dead_letter_msgs_s``,
``renew_1000_ms``, ``fanout_groups``, ``fanout_ratio``, ``filter_ratio``,
``filter_rows_read_per_msg``, ``filter_table_rows_read_per_msg``, ``fanout_cpu_ratio``,
``fanout_writes_per_msg``, ``fanout_aggregate_ratio``, ``filter_rows_ratio``,
``fanout_lazy_cpu_ratio``, ``fanout_lazy_writes_per_msg``, ``fanout_lazy_aggregate_ratio``,
``filter_lazy_rows_read_per_msg``, ``filter_lazy_rows_ratio``, ``redelivery_delay_p99_ms``,
``filter_handover_rows_read``, ``ordered_msgs_s``, ``unordered_msgs_s``, ``ordered_ratio``,
``hot_key_msgs_s``, ``fairness_p99_ms``, ``fairness_base_p99_ms``, ``fairness_ratio`` and
more). Targets not met do not fail the run; lost or duplicated messages, messages of a key
out of order, a dead server or a stuck run do (exit status 1).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import (
    capture,
    dashboard,
    engine,
    fanout,
    flow,
    idempotency,
    latency,
    memory,
    metrics,
    ordering,
    peer,
    push,
    raw,
    redelivery,
    scale,
    servers,
    settle,
    shards,
    smoke,
    spark,
    sqs,
)
from bench.database import Database, database_server, scratch_database
from bench.errors import BenchError
from bench.measure import Throughput
from bench.processes import ServerProcess
from bench.report import Report

SECTIONS = (
    "raw",
    "msgtable",
    "latency",
    "ontime",
    "peer",
    "memory",
    "settlement",
    "fanout",
    "redelivery",
    "ordering",
    "push",
    "flow",
    "sqs",
    "dedup",
    "schedules",
    "expiry",
    "backlog",
    "purge",
    "spark",
    "capture",
    "metrics",
    "dashboard",
    "servers",
    "shards",
)
FULL_ONLY = {
    "expiry",
    "backlog",
    "purge",
    "spark",
    "servers",
    "shards",
}  # quick mode runs them only when --only names them
# the sections run on the main msgtable server (run_engine)
ENGINE_SECTIONS = {
    "msgtable",
    "latency",
    "ontime",
    "settlement",
    "fanout",
    "redelivery",
    "ordering",
    "expiry",
    "flow",
    "backlog",
    "purge",
}


@dataclass(frozen=True)
class Plan:
    """A mode's sizes. The sections whose modules say theirs by mode (bench.fanout.SIZES, ...)
    look them up with ``mode``; the others take the fields below, whose defaults are their
    modules' constants (quick and full: the same); --smoke gives each bench.smoke's."""

    mode: str
    grid: tuple[tuple[int, int], ...]  # (batch size, subscribers) of the throughput runs
    messages: dict[int, int]  # batch size -> messages per throughput run
    latency_s: float
    peer_messages: int
    peer_max_s: float
    purge_messages: int
    on_time: dict[str, Any] = field(default_factory=dict)  # latency.on_time's sizes
    memory: dict[str, int] = field(default_factory=dict)  # memory.run's sizes
    backlog: scale.BacklogSizes = field(default_factory=scale.BacklogSizes)
    purge: scale.PurgeSizes = field(default_factory=scale.PurgeSizes)
    spark_rows: int = spark.ROWS
    metrics_rounds: int = metrics.ROUNDS


def plan(mode: str, batch: int, low_batch: int, subscribers: int, messages: int | None) -> Plan:
    if mode == "smoke":
        return smoke_plan(batch, low_batch, subscribers, messages)
    if mode == "quick":
        sizes = {batch: 60_000, low_batch: 20_000}
        grid: tuple[tuple[int, int], ...] = ((batch, subscribers), (low_batch, subscribers))
        latency_s, peer_n, peer_s = 3.0, 1_500, 8.0
    else:
        sizes = {10: 20_000, 100: 50_000, 500: 100_000}
        batches = sorted({10, 100, 500, batch, low_batch})
        grid = tuple((b, k) for b in batches for k in sorted({1, 4, 16, subscribers}))
        latency_s, peer_n, peer_s = 10.0, 4_000, 20.0
    n = {b: messages or sizes.get(b, 30_000) for b, _ in grid}
    rounds = metrics.FULL_ROUNDS if mode == "full" else metrics.ROUNDS
    return Plan(mode, grid, n, latency_s, peer_n, peer_s, messages or 50_000, metrics_rounds=rounds)


def smoke_plan(batch: int, low_batch: int, subscribers: int, messages: int | None) -> Plan:
    """--smoke: quick mode's grid, every section at bench.smoke's sizes."""
    grid = ((batch, subscribers), (low_batch, subscribers))
    most = max(smoke.MESSAGES.values())
    return Plan(
        "smoke",
        grid,
        {b: messages or smoke.MESSAGES.get(b, most) for b, _ in grid},
        smoke.LATENCY_S,
        smoke.PEER_MESSAGES,
        smoke.PEER_MAX_S,
        messages or smoke.PURGE_MESSAGES,
        on_time={"n": smoke.ON_TIME_MESSAGES, "spread_s": smoke.ON_TIME_SPREAD_S},
        memory={
            "tables": smoke.MEMORY_TABLES,
            "cache_size": smoke.MEMORY_CACHE_SIZE,
            "rows_per_table": smoke.MEMORY_ROWS_PER_TABLE,
        },
        backlog=scale.BacklogSizes(**smoke.BACKLOG),
        purge=scale.PurgeSizes(**smoke.PURGE),
        spark_rows=smoke.SPARK_ROWS,
        metrics_rounds=smoke.METRICS_ROUNDS,
    )


def progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def py_spy(pid: int, output: Path | None) -> Iterator[None]:
    """``py-spy record`` the server while the block runs (raw, collapsed stacks), if asked."""
    if output is None:
        yield
        return
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    command = [
        exe,
        "record",
        "--gil",
        "--rate",
        "250",
        "--pid",
        str(pid),
        "--format",
        "raw",
        "--output",
        str(output),
    ]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        progress(f"py-spy profile of the server: {output}")


def run(args: argparse.Namespace) -> Report:
    began = time.monotonic()
    p = plan(args.mode, args.batch_size, args.low_batch_size, args.subscribers, args.messages)
    if args.only:
        only = set(args.only.split(","))
        unknown = only - set(SECTIONS)
        if unknown:
            raise BenchError(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    else:  # smoke runs every section, as full does
        only = set(SECTIONS) - (FULL_ONLY if p.mode == "quick" else set())
    if args.postpone_after is not None and args.postpone_after < 0:
        raise BenchError("--postpone-after must be 0 or more")
    progress(f"{p.mode} mode; starting or reaching the database server")
    with database_server(args.durable) as db:
        report = Report(
            mode=p.mode,
            server=db.description,
            durable=db.durable,
            subscribers=args.subscribers,
            batch_size=args.batch_size,
            low_batch_size=args.low_batch_size,
            poller_interval_s=args.poller_interval,
            postpone_after_s=args.postpone_after,
            binlog=not args.no_binlog,
        )
        with scratch_database(db.handle, "bench_raw") as raw_dsn:
            if only & ENGINE_SECTIONS:
                run_engine(args, p, db, only, report, raw_dsn if "raw" in only else None)
            elif "raw" in only:
                for b, k in p.grid:
                    run_raw(p, db, raw_dsn, b, k, report)
        if "peer" in only:
            if not peer.kombu_available():
                report.peer_missing = "kombu is not installed (pip install -e '.[bench]')"
                progress(f"peer: {report.peer_missing}")
            else:
                with scratch_database(db.handle, "bench_peer") as dsn:
                    report.peer = peer.run(dsn, p.peer_messages, p.peer_max_s)
                progress(f"peer (kombu): {report.peer.msgs_s:,.0f} msgs/s")
        if "metrics" in only:
            with scratch_database(db.handle, "bench_metrics") as dsn:
                report.metrics = metrics.run(
                    dsn,
                    metrics.FULL_MESSAGES if p.mode == "full" else p.messages[args.batch_size],
                    args.batch_size,
                    args.subscribers,
                    args.poller_interval,
                    args.postpone_after,
                    progress,
                    p.metrics_rounds,
                    db_pid=db.pid,
                )
            mc = report.metrics
            of = "the database's busy time" if mc.normalized else "throughput"
            progress(
                f"metrics ({mc.scrapes} scrapes), ratios to off of {of}, the median of "
                f"the rounds (throughput's in brackets): "
                + "; ".join(
                    f"{metrics.SIDES[name]} {side.ratio:.3f} ({side.raw:.3f}; rounds "
                    f"{', '.join(f'{r:.3f}' for r in side.runs)})"
                    for name, side in mc.sides.items()
                    if name != "off"
                )
            )
        if "dashboard" in only:
            with scratch_database(db.handle, "bench_dashboard") as dsn:
                report.dashboard = dashboard.run(dsn, p.mode, progress)
        if "servers" in only:  # servers of its own, sharing the database's tables
            with scratch_database(db.handle, "bench_servers") as dsn:
                report.servers = servers.run(
                    dsn,
                    p.mode,
                    args.poller_interval,
                    postpone_after_s=args.postpone_after,
                    db_pid=db.pid,
                    progress=progress,
                )
        if "shards" in only:  # local database servers of its own, one a shard
            report.shards = shards.run(
                p.mode,
                args.poller_interval,
                postpone_after_s=args.postpone_after,
                progress=progress,
            )
        if "capture" in only:
            with scratch_database(db.handle, "bench_capture") as dsn:
                report.capture = capture.run(dsn, capture.ROWS[p.mode])
            c = report.capture
            progress(
                f"capture: {c.events_s:,.0f} row changes/s captured "
                f"(the producer committed {c.producer_changes_s:,.0f}/s)"
            )
        if "spark" in only:
            if importlib.util.find_spec("pyspark") is None:
                report.spark_missing = "pyspark is not installed (pip install -e '.[spark]')"
                progress(f"spark: {report.spark_missing}")
            else:
                with scratch_database(db.handle, "bench_spark") as dsn:
                    report.spark = spark.run(
                        dsn, p.spark_rows, postpone_after_s=args.postpone_after
                    )
                sp = report.spark
                progress(
                    f"spark: enqueue {sp.enqueue_rows_s:,.0f} rows/s, archive {sp.archive_s:.1f} s"
                )
        if "push" in only:  # a server of its own, with --push-allow (bench.push)
            with scratch_database(db.handle, "bench_push") as dsn:
                report.push = push.run(dsn, p.mode, args.postpone_after)
            pu = report.push
            progress(
                f"push: {pu.msgs_s:,.0f} msgs/s at batch {push.BATCH}; INSERT -> POST p50 "
                f"{pu.p50_ms:.1f} ms, p99 {pu.p99_ms:.1f} ms"
            )
        if "sqs" in only:  # a server of its own, with --sqs-listen (bench.sqs)
            with scratch_database(db.handle, "bench_sqs") as dsn:
                report.sqs = sqs.run(dsn, p.mode, args.postpone_after)
            q = report.sqs
            progress(
                f"sqs: boto3 {q.msgs_s:,.0f} msgs/s, the gRPC client {q.grpc_msgs_s:,.0f} "
                f"({q.ratio:.2f}) at batch {sqs.BATCH}; long poll p50 {q.p50_ms:.1f} ms, "
                f"p99 {q.p99_ms:.1f} ms"
            )
        if "dedup" in only:  # enqueue alone (bench.idempotency)
            with scratch_database(db.handle, "bench_dedup") as dsn:
                report.dedup = idempotency.run_dedup(dsn, p.mode)
            progress(
                f"dedup: enqueue with vt_dedup / without {report.dedup.ratio:.3f}; one "
                f"message a transaction, enqueue / by hand {report.dedup.enqueue_ratio:.3f}"
            )
        if "schedules" in only:  # a server in this process ticking (bench.idempotency)
            with scratch_database(db.handle, "bench_schedules") as dsn:
                report.schedules = idempotency.run_schedules(dsn, p.mode)
            sc = report.schedules
            progress(
                f"schedules: {sc.ticks} ticks of {sc.schedules} schedules, late p50 "
                f"{sc.p50_ms:.1f} ms, p99 {sc.p99_ms:.1f} ms"
            )
        if "memory" in only:
            with scratch_database(db.handle, "bench_memory") as dsn:
                report.memory = memory.run(dsn, postpone_after_s=args.postpone_after, **p.memory)
            m = report.memory
            progress(f"memory: {m.base_mb:.1f} -> {m.full_mb:.1f} MB, {m.cached:,} cached")
    report.wall_s = time.monotonic() - began
    return report


# The headline cells (--batch-size and --low-batch-size at --subscribers) run this many
# rounds of raw and msgtable side by side, every other round msgtable first; their ratio is
# the median round's, with its spread (a machine busy with other work moves single runs
# 10-20 %). Odd: the median is a round that ran.
HEADLINE_ROUNDS = {"quick": 3, "full": 5, "smoke": smoke.HEADLINE_ROUNDS}


def run_raw(p: Plan, db: Database, dsn: str, b: int, k: int, report: Report | None) -> Throughput:
    r = raw.run(dsn, p.messages[b], b, k, db_pid=db.pid)
    progress(f"raw batch {b}, {k} consumers: {r.msgs_s:,.0f} msgs/s")
    if report is not None:
        report.runs.append(r)
    return r


def run_engine(
    args: argparse.Namespace,
    p: Plan,
    db: Database,
    only: set[str],
    report: Report,
    raw_dsn: str | None,
) -> None:
    """The msgtable sections. With ``raw_dsn``, each grid cell's raw run goes right before
    its msgtable run: the machine's speed drifts over minutes (every process's CPU per
    message, the same work, has been seen to rise by a third for a while), so a ratio is
    only fair between runs made side by side."""
    postpone = args.postpone_after  # of every message table; None: the engine's default
    with (
        scratch_database(db.handle, "bench_msgtable") as dsn,
        ServerProcess(dsn, binlog=not args.no_binlog) as server,
    ):
        progress(f"msgtable server {server.address} (pid {server.pid})")

        def run_msgtable(b: int, k: int) -> Throughput:
            r = engine.run(
                server,
                dsn,
                p.messages[b],
                b,
                k,
                args.poller_interval,
                postpone_after_s=postpone,
                db_pid=db.pid,
            )
            progress(f"msgtable batch {b}, {k} subscribers: {r.msgs_s:,.0f} msgs/s")
            return r

        headline = {(args.batch_size, args.subscribers), (args.low_batch_size, args.subscribers)}
        with py_spy(server.pid, args.py_spy):  # the server idles through the raw runs
            for b, k in p.grid:
                if raw_dsn is not None and "msgtable" in only and (b, k) in headline:
                    rounds: list[tuple[float, Throughput, Throughput]] = []
                    for n in range(HEADLINE_ROUNDS[p.mode]):
                        if n % 2 == 0:
                            rr = run_raw(p, db, raw_dsn, b, k, None)
                            mr = run_msgtable(b, k)
                        else:
                            mr = run_msgtable(b, k)
                            rr = run_raw(p, db, raw_dsn, b, k, None)
                        rounds.append((mr.msgs_s / rr.msgs_s, rr, mr))
                    report.ratio_rounds[(b, k)] = [r for r, _, _ in rounds]
                    _, rr, mr = sorted(rounds, key=lambda x: x[0])[len(rounds) // 2]
                    report.runs += [rr, mr]
                    continue
                if raw_dsn is not None:
                    run_raw(p, db, raw_dsn, b, k, report)
                if "msgtable" in only:
                    report.runs.append(run_msgtable(b, k))
        if "latency" in only:  # each on a fresh server: polling only, then the default
            for binlog in (False, True):
                # beside the main server, which holds the lease: without one of its own
                with ServerProcess(dsn, binlog=binlog, lease=False) as fresh:
                    if binlog:
                        time.sleep(1.0)  # its follower connects to the binlog after it serves
                    lat = latency.run(
                        fresh,
                        dsn,
                        p.latency_s,
                        args.latency_poller_interval,
                        binlog=binlog,
                        postpone_after_s=postpone,
                    )
                if binlog:
                    report.latency_binlog = lat
                else:
                    report.latency = lat
                how = "binlog" if binlog else "polling"
                progress(f"latency, {how}: p50 {lat.p50_ms:.1f} ms, p99 {lat.p99_ms:.1f} ms")
        if "ontime" in only:
            report.on_time = latency.on_time(server, dsn, postpone_after_s=postpone, **p.on_time)
            ot = report.on_time
            progress(f"on time: late p50 {ot.p50_ms:.1f} ms, p99 {ot.p99_ms:.1f} ms")
        k, b = args.subscribers, args.batch_size
        if only & {"settlement", "expiry"}:
            report.settlement = run_settlement(args, p, db, server, dsn, only)
        if "fanout" in only:
            report.fanout = run_fanout(args, p, db, server, dsn)
        if "redelivery" in only:
            report.redelivery = redelivery.run(
                server, dsn, p.mode, args.poller_interval, postpone_after_s=postpone
            )
            rd = report.redelivery
            progress(
                f"redelivery behind {rd.backlog:,} fresh rows: p99 {rd.p99_ms or 0:.0f} ms after "
                f"its due time ({rd.released} released, {rd.not_back} not back)"
            )
        if "ordering" in only:
            report.ordering = run_ordering(args, p, db, server, dsn)
        if "flow" in only:  # flow control (bench.flow)
            report.flow = flow.run(
                server, dsn, p.mode, args.poller_interval, postpone_after_s=postpone
            )
            progress(flow.summary(report.flow))
        if "backlog" in only:
            report.backlog = scale.backlog(
                server, dsn, b, k, args.poller_interval, postpone_after_s=postpone, sizes=p.backlog
            )
            s = p.backlog
            progress(f"backlog: {s.large:,} vs {s.small:,} rows {report.backlog.ratio:.2f}")
        if "purge" in only:
            report.purge = scale.purge(
                server,
                dsn,
                p.purge_messages,
                b,
                k,
                args.poller_interval,
                postpone_after_s=postpone,
                sizes=p.purge,
            )
            progress(f"purge: during / without {report.purge.ratio:.2f}")
        server.check_alive()


def run_settlement(
    args: argparse.Namespace,
    p: Plan,
    db: Database,
    server: ServerProcess,
    dsn: str,
    only: set[str],
) -> settle.SettleResult:
    """Release, dead letters (rejected; with ``expiry``, also dead of vt_max_attempts) and
    renew, at the headline batch size and subscribers, on the main server (bench.settle)."""
    k, b, postpone = args.subscribers, args.batch_size, args.postpone_after
    sizes = settle.SIZES[p.mode]
    out = settle.SettleResult()
    interval, pid = args.poller_interval, db.pid
    if "settlement" in only:
        out.release = settle.release(
            server, dsn, sizes["release"], b, k, interval, postpone_after_s=postpone, db_pid=pid
        )
        progress(f"release, batch {b}, {k} subscribers: {out.release.msgs_s:,.0f} msgs/s")
        out.dead_letter = settle.dead_letter(
            server, dsn, sizes["reject"], b, k, interval, postpone_after_s=postpone, db_pid=pid
        )
        progress(f"dead letters (reject): {out.dead_letter.msgs_s:,.0f} msgs/s")
        out.renew = settle.renew(server, dsn, settle.RENEW_CALLS[p.mode], postpone_after_s=postpone)
        r = out.renew
        progress(f"renew of {r.ids:,} ids: p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms")
    if "expiry" in only:
        out.expired = settle.expired(
            server, dsn, sizes["expire"], b, k, interval, postpone_after_s=postpone, db_pid=pid
        )
        progress(f"dead letters (vt_max_attempts=1): {out.expired.msgs_s:,.0f} msgs/s")
    return out


def run_fanout(
    args: argparse.Namespace, p: Plan, db: Database, server: ServerProcess, dsn: str
) -> fanout.FanoutResult:
    """Subscriptions on the main server (bench.fanout): a baseline drain, the fan-out to 4
    subscriptions and a 1 % filter, each at batch 100 with 2 subscribers a group."""
    out = fanout.run(
        server,
        dsn,
        p.mode,
        args.poller_interval,
        postpone_after_s=args.postpone_after,
        db_pid=db.pid,
    )
    base, slowest, f = out.baseline, out.slowest, out.filtered
    if base and slowest and f:
        progress(
            f"fan-out: baseline {base.msgs_s:,.0f} msgs/s; {fanout.GROUPS} subscriptions, "
            f"slowest {slowest.msgs_s:,.0f} msgs/s ({out.fanout_ratio:.2f}), all drained in "
            f"{out.drain_all_s:.2f} s"
        )
        progress(
            f"filter: {f.msgs_s:,.0f} msgs/s ({out.filter_ratio:.2f}), "
            f"{out.rows_read_per_msg:.1f} rows read a message; from_start hand-over "
            f"{out.handover_s:.2f} s, {out.handover_rows_read:,} rows read"
        )
    return out


def run_ordering(
    args: argparse.Namespace, p: Plan, db: Database, server: ServerProcess, dsn: str
) -> ordering.OrderingResult:
    """Ordering per key on the main server (bench.ordering): ordered vs unordered at the
    headline batch size and subscribers, one hot key at batch 100, and fairness."""
    began = time.monotonic()
    out = ordering.run(
        server,
        dsn,
        p.mode,
        args.batch_size,
        args.subscribers,
        args.poller_interval,
        postpone_after_s=args.postpone_after,
        db_pid=db.pid,
        progress=progress,
    )
    if out.ratio is not None:
        progress(
            f"ordering: ordered {out.ordered_msgs_s:,.0f} vs unordered "
            f"{out.unordered_msgs_s:,.0f} msgs/s ({out.ratio:.2f})"
        )
    fair = out.fairness
    if fair is not None:
        progress(
            f"fairness: other keys' p99 wait {fair.p99_ms:.0f} ms with the hot key, "
            f"{fair.base_p99_ms:.0f} ms without ({fair.ratio:.2f}); section "
            f"{time.monotonic() - began:.0f} s"
        )
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick")
    mode.add_argument("--full", dest="mode", action="store_const", const="full")
    mode.add_argument(
        "--smoke",
        dest="mode",
        action="store_const",
        const="smoke",
        help="every section, the full-only ones too, at the smallest sizes that run its code "
        "(bench.smoke; seconds each): whether each still runs, its figures mean nothing",
    )
    parser.set_defaults(mode="quick")
    parser.add_argument("--subscribers", type=int, default=4, help="headline K (default 4)")
    parser.add_argument("--batch-size", type=int, default=100, help="headline batch (100)")
    parser.add_argument("--low-batch-size", type=int, default=10, help="second batch (10)")
    parser.add_argument("--messages", type=int, default=None, help="messages per run")
    parser.add_argument(
        "--poller-interval",
        type=float,
        default=0.1,
        help="vt_poller_interval of the throughput tables (default 0.1 s)",
    )
    parser.add_argument(
        "--latency-poller-interval",
        type=float,
        default=0.02,
        help="vt_poller_interval of the latency table (default 0.02 s)",
    )
    parser.add_argument(
        "--postpone-after",
        type=float,
        default=None,
        help="vt_postpone_after of every table (default: the engine's, 1 s; 0 postpones "
        "before each send, as Vitess does)",
    )
    parser.add_argument(
        "--no-binlog",
        action="store_true",
        help="the throughput, backlog and purge runs' server polls only (msgtable serve "
        "--no-binlog); the latency section measures both either way",
    )
    parser.add_argument(
        "--durable",
        action="store_true",
        help="the throwaway database with a production server's durability "
        "(innodb_flush_log_at_trx_commit=1, sync_binlog=1, doublewrite on); every figure, "
        "the raw-SQL limit's included, is measured on it (JSON: durable)",
    )
    parser.add_argument("--only", default="", help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument(
        "--py-spy", type=Path, default=None, help="record the server with py-spy to this file"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = run(args)
    except BenchError as exc:
        print(f"bench: FAILED: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print(report.text())
    print(report.json_line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
