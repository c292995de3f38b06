"""The smoke plan: ``python -m bench.run --smoke`` runs every section, the full-only ones too,
at the smallest sizes that still go through its code paths (seconds each), so that a section
that no longer runs fails ``make test`` (tests/acceptance/test_bench_smoke.py). Its figures
mean nothing at these sizes and its targets are not judged.

This module is the one place that says the smoke sizes. Each section's quick and full sizes
stay where they were (its module's constants, ``bench.run.plan``); a section whose sizes go
by mode has a ``"smoke"`` entry that names the value here, and the others take theirs as
arguments from ``bench.run``.
"""

from __future__ import annotations

# raw and msgtable: messages per run by batch size (the quick grid: batch 100 and 10 at 4
# subscribers), one round of the headline cells
MESSAGES = {100: 2_000, 10: 500}
HEADLINE_ROUNDS = 1
# latency: seconds at bench.latency.RATE_MSGS_S; on time: messages and their spread (the lead,
# ON_TIME_LEAD_S, stays: the subscriber process must start within it)
LATENCY_S = 0.5
ON_TIME_MESSAGES = 200
ON_TIME_SPREAD_S = 0.5
# peer (kombu): messages, and the most seconds it may take
PEER_MESSAGES = 200
PEER_MAX_S = 10.0
# memory: tables, their vt_cache_size, rows each (more than the cache holds)
MEMORY_TABLES = 2
MEMORY_CACHE_SIZE = 500
MEMORY_ROWS_PER_TABLE = 600
# settlement and expiry (bench.settle): rows of each table; MessageRenew calls
SETTLE = {"release": 500, "reject": 500, "expire": 500}
RENEW_CALLS = 5
# fanout: rows of the baseline and fan-out tables; of the filter table (1 % match)
FANOUT = {"rows": 1_000, "filter": 2_000}
# redelivery: fresh rows of the lagging group's backlog; seconds it runs
REDELIVERY = {"backlog": 2_000, "seconds": 1.0}
# ordering: the same shape as quick mode's, at a fraction of it
ORDERING = {"rows": 2_000, "keys": 50, "hot": 500, "fair_rows": 1_000, "fair_keys": 20}
# push: backlog messages; seconds of the latency run
PUSH_MESSAGES = 1_000
PUSH_LATENCY_S = 1.0
# backlog (bench.scale): the small and large backlogs, the window drained of each, the
# sustained drain of the large one, rounds
BACKLOG = {"small": 500, "large": 3_000, "window": 300, "sustained": 1_000, "drains": 1}
# purge (bench.scale): acked rows to purge (enough that the purger is still at them when a
# run begins), rounds, messages a run (no minimum)
PURGE = {"rows": 50_000, "rounds": 1, "min_messages": 0}
PURGE_MESSAGES = 3_000
# spark: rows enqueued and archived
SPARK_ROWS = 1_000
# capture: source rows (2.5 changes each)
CAPTURE_ROWS = 1_000
# metrics: one round of the sides (each on a server of its own), at the throughput size
METRICS_ROUNDS = 1
# dashboard: requests of each page, scrapes, renders
DASHBOARD = {"requests": 10, "scrapes": 5, "renders": 2}
# servers and shards: messages a run, rounds
SERVERS_MESSAGES = 2_000
SHARDS_MESSAGES = 2_000
ROUNDS = 1
# sqs: messages through boto3 and the gRPC client (ten a time); long polls timed
SQS_MESSAGES = 200
SQS_LONGPOLLS = 5
# dedup: messages enqueued into each table; schedules: seconds the schedules tick
DEDUP_MESSAGES = 1_000
SCHEDULE_SECONDS = 2.0
# flow: seconds the rate is measured; backlogs of the caps, small-cap and fair-share drains
# (and their keys); seconds of each live fair-share run; rounds of the fair-share pairs
FLOW = {"rate_s": 1.0, "caps_rows": 1_000, "caps_keys": 50, "cap_rows": 200, "cap_keys": 5,
        "fair_rows": 1_000, "live_s": 1.0, "fair_rounds": 1}  # fmt: skip
