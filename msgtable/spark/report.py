"""``msgtable report NAME``: how a message table (or its archive) is being delivered.

* delivery latency, created -> acked: exact percentiles and a histogram (where rows have a
  ``time_created``);
* redeliveries: acked messages by ``epoch`` (the number of sends);
* backlog: unacked messages by age (since ``time_created``, else since due) and priority,
  the dead ones left out (they wait for nothing);
* dead letters: the messages no poll sends again, in place and in the table's dead-letter
  table, by reason and by attempts (msgtable.spark.report_dead);
* throughput: messages acked per minute, hour or day (UTC), whichever suits the time the
  acks span (THROUGHPUT_BUCKETS), with the buckets without an ack as zeros.

Spark computes every figure; the terminal gets tables (``Report.text``), and
msgtable.spark.report_html a page with the same figures and their plots.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from msgtable.core.tables import DEAD_TIME_NEXT, TableConfig
from msgtable.errors import InvalidArgument
from msgtable.spark.report_dead import REASON_TEXT_WIDTH, DeadLetters, dead_letters

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

PERCENTILES = (0.5, 0.9, 0.99)
AGE_BUCKETS = (  # (label, upper bound in seconds)
    ("< 1 min", 60),
    ("1-10 min", 600),
    ("10-60 min", 3600),
    ("1-24 h", 86400),
    (">= 1 day", None),
)
# (bucket, its length in seconds, the longest span of acks it is used for): an hour of acks
# per minute (60 points), a week per hour (168), a year per day (365).
THROUGHPUT_BUCKETS = (
    ("minute", 60, 3 * 3600),
    ("hour", 3600, 60 * 86400),
    ("day", 86400, None),
)
LATENCY_BINS_PER_DECADE = 10  # the latency histogram's bins: log-spaced, 10 per factor of 10
LATENCY_FLOOR_MS = 0.1  # latencies below (or a clock that went back) count in the first bin
TEXT_THROUGHPUT_ROWS = 24  # more buckets than this: the terminal gets a summary line


@dataclass
class Report:
    """The figures of one report."""

    title: str
    source: str
    rows: int
    acked: int
    latency_ms: dict[str, float] | None  # p50, p90, p99, max; None without time_created
    epochs: list[tuple[int, int]] = field(default_factory=list)  # (epoch, acked messages)
    backlog: list[tuple[str, int, int]] = field(default_factory=list)  # (age, priority, n)
    throughput: list[tuple[int, int]] = field(default_factory=list)  # (bucket start s, acked)
    per: str = "hour"  # the throughput's bucket: minute, hour or day (THROUGHPUT_BUCKETS)
    latency_histogram: list[tuple[float, int]] = field(default_factory=list)  # (from ms, n)
    generated_ns: int = 0
    has_time_created: bool = True
    dead: DeadLetters = field(default_factory=DeadLetters)

    @property
    def unacked(self) -> int:
        """Rows not acked, the dead ones too (``dead.here`` of them)."""
        return self.rows - self.acked

    def text(self) -> str:
        of_them = f", {self.dead.here:,} of them dead" if self.dead.here else ""
        out = [
            f"{self.title}: {self.rows:,} rows ({self.acked:,} acked, {self.unacked:,} unacked"
            f"{of_them}) from {self.source}",
            "",
        ]
        if self.latency_ms is None:
            why = "no acked rows" if self.has_time_created else "the rows have no time_created"
            out.append(f"delivery latency: {why}")
        else:
            figures = ", ".join(f"{k} {format_ms(v)}" for k, v in self.latency_ms.items())
            out.append(f"delivery latency (created -> acked): {figures}")
        if self.epochs:
            out += ["", _table(("epoch (sends)", "acked"), self.epochs)]
        out += ["", _table(("age", "priority", "unacked"), self.backlog) or "backlog: none"]
        out += ["", self.dead_text(), "", self.throughput_text()]
        return "\n".join(out) + "\n"

    def dead_text(self) -> str:
        """The dead letters: one line, and with any, a table by reason and one by attempts."""
        dead = self.dead
        out = [f"dead letters: {dead.summary()}"]
        if dead.total:
            out += ["", _table(dead.headers("last error"), dead.reason_rows(REASON_TEXT_WIDTH))]
            out += ["", _table(dead.headers("attempts"), dead.attempt_rows())]
        return "\n".join(out)

    def throughput_text(self) -> str:
        if not self.throughput:
            return "throughput: no acked rows"
        if len(self.throughput) <= TEXT_THROUGHPUT_ROWS:
            rows = [(bucket_label(s, self.per), n) for s, n in self.throughput]
            return _table((f"{self.per} (UTC)", "acked"), rows)
        return "throughput: " + self.throughput_summary()

    def throughput_summary(self) -> str:
        """One line: the span, the mean and the peak per bucket."""
        first, last = self.throughput[0][0], self.throughput[-1][0]
        total = sum(n for _, n in self.throughput)
        peak_s, peak = max(self.throughput, key=lambda t: t[1])
        mean = total / len(self.throughput)
        return (
            f"{total:,} acked from {bucket_label(first, self.per)} to "
            f"{bucket_label(last, self.per)} UTC; per {self.per}: mean {mean:,.1f}, "
            f"peak {peak:,} at {bucket_label(peak_s, self.per)}"
        )


def in_units(ms: float) -> tuple[float, str]:
    """A latency in the unit people say it in: ms, s, min or h."""
    for below, per, unit in ((1000, 1, "ms"), (60_000, 1000, "s"), (3_600_000, 60_000, "min")):
        if ms < below:
            return ms / per, unit
    return ms / 3_600_000, "h"


def format_ms(ms: float) -> str:
    """A latency as people say it: 850.0 ms, 12.3 s, 4.5 min, 2.0 h."""
    value, unit = in_units(ms)
    return f"{value:,.1f} {unit}"


def bucket_label(start_s: int, per: str) -> str:
    """A throughput bucket's start, UTC: 2026-01-01 00:05 (minute, hour) or 2026-01-01."""
    moment = datetime.fromtimestamp(start_s, UTC)
    return moment.strftime("%Y-%m-%d" if per == "day" else "%Y-%m-%d %H:%M")


def throughput_bucket(span_s: float) -> tuple[str, int]:
    """The bucket (name, seconds) of the throughput of acks that span ``span_s`` seconds."""
    for name, seconds, longest in THROUGHPUT_BUCKETS:
        if longest is None or span_s < longest:
            return name, seconds
    raise AssertionError("the last bucket takes any span")


def fill_gaps(counts: dict[int, int], seconds: int) -> list[tuple[int, int]]:
    """Every bucket from the first to the last (``seconds`` apart), zero where none acked."""
    if not counts:
        return []
    first, last = min(counts), max(counts)
    return [(s, counts.get(s, 0)) for s in range(first, last + seconds, seconds)]


def _table(headers: tuple[str, ...], rows: list[Any]) -> str:
    """A terminal table: numbers to the right, a column of text (an age, a reason) to the left."""
    if not rows:
        return ""
    cells = [headers, *[tuple(f"{v:,}" if isinstance(v, int) else str(v) for v in r) for r in rows]]
    widths = [max(len(c[i]) for c in cells) for i in range(len(headers))]
    text = [any(not isinstance(r[i], int) for r in rows) for i in range(len(headers))]
    lines = [
        "  ".join(
            (str.ljust if text[i] else str.rjust)(c[i], widths[i]) for i in range(len(c))
        ).rstrip()
        for c in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def load(spark: SparkSession, name: str, dsn: str | None, archive: str | None) -> DataFrame:
    if archive:
        return spark.read.parquet(archive)
    if not dsn:
        raise InvalidArgument("a report needs a database URL or an archive path")
    return spark.read.format("msgtable").option("dsn", dsn).load(name)


def build_report(
    spark: SparkSession,
    name: str,
    dsn: str | None = None,
    archive: str | None = None,
    now_ns: int | None = None,
) -> Report:
    from pyspark.sql import functions as F

    cfg: TableConfig | None = None
    if dsn and not archive:
        from msgtable.spark.database import describe

        cfg = describe(dsn, name)
    df = load(spark, name, dsn, archive).cache()
    now_ns = now_ns if now_ns is not None else time.time_ns()
    columns = set(df.columns)
    acked = df.where(F.col("time_acked").isNotNull())
    totals = df.agg(
        F.count(F.lit(1)), F.count("time_acked"), F.min("time_acked"), F.max("time_acked")
    ).first()
    rows, n_acked = (int(totals[0]), int(totals[1])) if totals else (0, 0)
    first_ack, last_ack = (totals[2], totals[3]) if totals else (None, None)

    latency, histogram = _latency(acked) if "time_created" in columns else (None, [])

    epochs = [
        (int(r[0] or 0), int(r[1]))
        for r in acked.groupBy("epoch").count().orderBy("epoch").collect()
    ]

    backlog = _backlog(df, columns, now_ns)

    span_s = 0.0 if first_ack is None or last_ack is None else (last_ack - first_ack) / 1e9
    per, seconds = throughput_bucket(span_s)
    start = F.floor(F.col("time_acked") / F.lit(seconds * 10**9)) * F.lit(seconds)  # UTC
    counts = {int(r[0]): int(r[1]) for r in acked.groupBy(start.alias("start")).count().collect()}
    dead = dead_letters(spark, df, name, dsn=dsn if cfg else None, cfg=cfg)
    df.unpersist()
    source = f"archive {archive}" if archive else f"table {name}"
    return Report(
        title=name,
        source=source,
        rows=rows,
        acked=n_acked,
        latency_ms=latency,
        epochs=epochs,
        backlog=backlog,
        throughput=fill_gaps(counts, seconds),
        per=per,
        latency_histogram=histogram,
        generated_ns=now_ns,
        has_time_created="time_created" in columns,
        dead=dead,
    )


def _latency(acked: DataFrame) -> tuple[dict[str, float] | None, list[tuple[float, int]]]:
    """The acked rows' created -> acked latency: its percentiles and max (ms; None without
    a timed row) and its histogram (LATENCY_BINS_PER_DECADE bins a decade, from
    LATENCY_FLOOR_MS)."""
    from pyspark.sql import functions as F

    latency: dict[str, float] | None = None
    histogram: list[tuple[float, int]] = []
    ms = (F.col("time_acked") - F.col("time_created")) / F.lit(1e6)
    timed = acked.where(F.col("time_created").isNotNull()).select(ms.alias("ms"))
    r = timed.agg(
        F.percentile("ms", F.array(*[F.lit(p) for p in PERCENTILES])).alias("p"),
        F.max("ms").alias("max"),
    ).first()
    if r is not None and r["p"] is not None:
        pairs = zip(PERCENTILES, r["p"], strict=True)
        latency = {f"p{round(p * 100):d}": float(v) for p, v in pairs}
        latency["max"] = float(r["max"])
        log_ms = F.log10(F.greatest(F.col("ms"), F.lit(LATENCY_FLOOR_MS)))
        bins = timed.groupBy(F.floor(log_ms * LATENCY_BINS_PER_DECADE).alias("bin")).count()
        histogram = [
            (10 ** (int(b["bin"]) / LATENCY_BINS_PER_DECADE), int(b["count"]))
            for b in bins.orderBy("bin").collect()
        ]
    return latency, histogram


def _backlog(df: DataFrame, columns: set[str], now_ns: int) -> list[tuple[str, int, int]]:
    """The unacked, live rows by age bucket (AGE_BUCKETS, by time_created or else time_next)
    and priority: (age, priority, count), youngest first."""
    from pyspark.sql import functions as F

    alive = ~F.col("time_next").eqNullSafe(F.lit(DEAD_TIME_NEXT))  # a dead row waits for nothing
    unacked = df.where(F.col("time_acked").isNull() & alive)
    if "time_created" in columns:
        since = F.col("time_created")
    else:
        since = F.coalesce(F.col("time_next"), F.lit(now_ns))
    age_s = (F.lit(now_ns) - since) / F.lit(1e9)
    bucket = None
    for label, bound in reversed(AGE_BUCKETS):
        bucket = (
            F.lit(label)
            if bucket is None
            else F.when(age_s < F.lit(bound), F.lit(label)).otherwise(bucket)
        )
    assert bucket is not None
    priority = F.col("priority") if "priority" in columns else F.lit(0)
    order = {label: i for i, (label, _) in enumerate(AGE_BUCKETS)}
    grouped = unacked.groupBy(bucket.alias("age"), priority.alias("priority")).count().collect()
    return sorted(
        ((r["age"], int(r["priority"] or 0), int(r["count"])) for r in grouped),
        key=lambda t: (order[t[0]], t[1]),
    )
