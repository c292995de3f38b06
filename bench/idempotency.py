"""Issue 46's figures: enqueue with deduplication against without (``dedup``), and how late a
schedule's ticks are enqueued (``schedules``); beside dedup, what msgtable.enqueue costs a
transaction of one message against the application's own INSERT (``enqueue_ratio``).

dedup: msgtable.enqueue.enqueue_many into two tables of the same shape, one with vt_dedup (its
unique index on the key and its index on time_created, msgtable.core.dedup), the other
without, in transactions of BATCH messages each with a key of its own; rounds alternate which
table goes first, and ``dedup_ratio`` is the median round's rate with dedup / without (target
>= 0.8): what the database's two indexes cost an INSERT.

enqueue_ratio: transactions of one message each into the plain table, alternately through
msgtable.enqueue.enqueue and through the same INSERT written by hand (SQLAlchemy's
exec_driver_sql, the engine's columns set as enqueue sets them), on the dedup rounds' pool;
the median round's rate through enqueue / by hand (reported, no target: what the helper costs
beside the database's own work, its per-call checks and, once per connection, the
connection's database and the table's plan).

schedules: a msgtable server (msgtable.features.assembly, in this process) ticks SCHEDULES
schedules every second for SECONDS[mode] seconds; each message's lateness is its
``time_created`` (the database's clock at the INSERT) minus its ``schedule_tick``, and
``schedule_late_p99_ms`` is their 99th percentile (target <= 1,000 ms).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from bench import smoke
from bench.database import execute
from bench.measure import percentile
from msgtable.core.tables import current_layout_ddl
from msgtable.enqueue import enqueue, enqueue_many

BATCH = 100
DEDUP_MESSAGES = {"quick": 20_000, "full": 60_000, "smoke": smoke.DEDUP_MESSAGES}
DEDUP_ROUNDS = {"quick": 3, "full": 5, "smoke": 1}
ONE_MESSAGES = {"quick": 2_000, "full": 5_000, "smoke": smoke.DEDUP_MESSAGES // 10}
ONE_ROUNDS = {"quick": 5, "full": 7, "smoke": 1}
TARGET_DEDUP_RATIO = 0.8
SCHEDULES = 10
SECONDS = {"quick": 10.0, "full": 30.0, "smoke": smoke.SCHEDULE_SECONDS}
TARGET_LATE_P99_MS = 1_000.0
COMMENT = (
    "vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=100,"
    "vt_cache_size=10000,vt_poller_interval=1"
)
KEYED = (
    "  dedup_key varchar(128),\n  unique index dedup_idx(dedup_key),\n"
    "  index dedup_created_idx(time_created, dedup_key),\n  primary key(id)"
)


@dataclass(frozen=True)
class DedupResult:
    messages: int
    plain_msgs_s: list[float]
    dedup_msgs_s: list[float]
    # transactions of one message: through msgtable.enqueue / the same INSERT by hand
    one_msgs_s: list[float]
    by_hand_msgs_s: list[float]

    @property
    def ratios(self) -> list[float]:
        return [d / p for d, p in zip(self.dedup_msgs_s, self.plain_msgs_s, strict=True)]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    @property
    def enqueue_ratios(self) -> list[float]:
        return [e / h for e, h in zip(self.one_msgs_s, self.by_hand_msgs_s, strict=True)]

    @property
    def enqueue_ratio(self) -> float:
        return statistics.median(self.enqueue_ratios)

    def as_dict(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "batch_size": BATCH,
            "plain_msgs_s": [round(x) for x in self.plain_msgs_s],
            "dedup_msgs_s": [round(x) for x in self.dedup_msgs_s],
            "ratios": [round(x, 3) for x in self.ratios],
            "one_message_enqueue_msgs_s": [round(x) for x in self.one_msgs_s],
            "one_message_by_hand_msgs_s": [round(x) for x in self.by_hand_msgs_s],
            "enqueue_ratios": [round(x, 3) for x in self.enqueue_ratios],
            "targets": {"dedup_ratio": f">= {TARGET_DEDUP_RATIO:g}"},
        }


def run_dedup(dsn: str, mode: str) -> DedupResult:
    n = DEDUP_MESSAGES[mode] // BATCH * BATCH
    plain = current_layout_ddl("bench_plain", COMMENT)
    keyed = current_layout_ddl("bench_keyed", COMMENT + ",vt_dedup=dedup_key")
    keyed = keyed.replace("  primary key(id)", KEYED)
    db = sa.create_engine(dsn, pool_size=2)
    plain_s: list[float] = []
    dedup_s: list[float] = []
    try:
        for r in range(DEDUP_ROUNDS[mode]):
            execute(dsn, "drop table if exists bench_plain", "drop table if exists bench_keyed")
            execute(dsn, plain, keyed)
            order = ("bench_plain", "bench_keyed") if r % 2 == 0 else ("bench_keyed", "bench_plain")
            for table in order:
                rate = _enqueue(db, table, n, with_key=table == "bench_keyed", round_=r)
                (plain_s if table == "bench_plain" else dedup_s).append(rate)
        one_s, by_hand_s = _one_message_rounds(db, mode)
    finally:
        db.dispose()
        execute(dsn, "drop table if exists bench_plain", "drop table if exists bench_keyed")
    return DedupResult(n, plain_s, dedup_s, one_s, by_hand_s)


def _one_message_rounds(db: sa.Engine, mode: str) -> tuple[list[float], list[float]]:
    """Rounds of transactions of one message each into bench_plain, through enqueue and by
    hand, alternating which goes first; their rates."""
    n = ONE_MESSAGES[mode]
    insert = "INSERT INTO `bench_plain` (`id`, `message`, `priority`) VALUES (%s, %s, %s)"
    through: list[float] = []
    by_hand: list[float] = []
    next_id = 10**9  # above the dedup rounds' ids
    for r in range(ONE_ROUNDS[mode]):
        for helper in (True, False) if r % 2 == 0 else (False, True):
            began = time.perf_counter()
            for i in range(next_id, next_id + n):
                with db.begin() as conn:
                    if helper:
                        enqueue(conn, "bench_plain", {"id": i, "message": "m"})
                    else:
                        conn.exec_driver_sql(insert, (i, "m", 0))
            (through if helper else by_hand).append(n / (time.perf_counter() - began))
            next_id += n
    return through, by_hand


def _enqueue(db: sa.Engine, table: str, n: int, *, with_key: bool, round_: int) -> float:
    began = time.perf_counter()
    for start in range(0, n, BATCH):
        rows = [
            {"id": i, "message": "m", **({"dedup_key": f"r{round_}-k{i}"} if with_key else {})}
            for i in range(start, start + BATCH)
        ]
        with db.begin() as conn:
            enqueue_many(conn, table, rows)
    return n / (time.perf_counter() - began)


@dataclass(frozen=True)
class ScheduleResult:
    schedules: int
    seconds: float
    ticks: int
    late_ms: list[float]  # sorted

    @property
    def p50_ms(self) -> float:
        return percentile(self.late_ms, 50)

    @property
    def p99_ms(self) -> float:
        return percentile(self.late_ms, 99)

    def as_dict(self) -> dict[str, Any]:
        return {
            "schedules": self.schedules,
            "seconds": self.seconds,
            "ticks": self.ticks,
            "late_p50_ms": round(self.p50_ms, 2),
            "late_p99_ms": round(self.p99_ms, 2),
            "late_max_ms": round(self.late_ms[-1], 2) if self.late_ms else None,
            "targets": {"schedule_late_p99_ms": f"<= {TARGET_LATE_P99_MS:g} ms"},
        }


def run_schedules(dsn: str, mode: str) -> ScheduleResult:
    from msgtable.features.assembly import assemble_dsn

    seconds = SECONDS[mode]
    ddl = current_layout_ddl("bench_ticks", COMMENT).replace(
        "  primary key(id)", "  schedule_tick bigint,\n  primary key(id)"
    )
    execute(dsn, "drop table if exists bench_ticks", ddl)
    engine = assemble_dsn(dsn, discovery_interval_s=1.0)
    engine.open()
    try:
        assert engine.schedules is not None
        for k in range(SCHEDULES):
            engine.schedules.create_schedule(f"bench-{k}", "bench_ticks", "* * * * * *")
        time.sleep(seconds)
        for k in range(SCHEDULES):
            engine.schedules.drop_schedule(f"bench-{k}")
    finally:
        engine.close()
    rows = execute(dsn, "select time_created - schedule_tick from bench_ticks")
    execute(dsn, "drop table if exists bench_ticks", "drop table if exists msgtable_schedules")
    late = sorted(max(0, int(r[0])) / 1e6 for r in rows)
    return ScheduleResult(SCHEDULES, seconds, len(late), late)
