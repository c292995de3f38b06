"""``msgtable report NAME``: how a message table (or its archive) is being delivered.

* delivery latency, created -> acked, percentiles (where rows have a ``time_created``);
* redeliveries: acked messages by ``epoch`` (the number of sends);
* backlog: unacked messages by age (since ``time_created``, else since due) and priority;
* throughput: messages acked per hour (UTC).

Spark computes every figure (exact percentiles); the terminal gets tables and an HTML file
the same tables and plots (PNG, embedded).
"""

from __future__ import annotations

import base64
import html
import io
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from msgtable.errors import InvalidArgument

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
    hourly: list[tuple[str, int]] = field(default_factory=list)  # (hour, acked)

    def text(self) -> str:
        out = [f"{self.title}: {self.rows:,} rows ({self.acked:,} acked) from {self.source}", ""]
        if self.latency_ms is None:
            out.append("delivery latency: the rows have no time_created column")
        else:
            figures = ", ".join(f"{k} {v:,.1f} ms" for k, v in self.latency_ms.items())
            out.append(f"delivery latency (created -> acked): {figures}")
        out += ["", _table(("epoch (sends)", "acked"), self.epochs)]
        out += ["", _table(("age", "priority", "unacked"), self.backlog) or "backlog: none"]
        out += ["", _table(("hour (UTC)", "acked"), self.hourly)]
        return "\n".join(out) + "\n"


def _table(headers: tuple[str, ...], rows: list[Any]) -> str:
    if not rows:
        return ""
    cells = [headers, *[tuple(f"{v:,}" if isinstance(v, int) else str(v) for v in r) for r in rows]]
    widths = [max(len(c[i]) for c in cells) for i in range(len(headers))]
    lines = ["  ".join(c[i].rjust(widths[i]) for i in range(len(headers))) for c in cells]
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

    df = load(spark, name, dsn, archive).cache()
    now_ns = now_ns if now_ns is not None else time.time_ns()
    columns = set(df.columns)
    acked = df.where(F.col("time_acked").isNotNull())
    totals = df.agg(F.count(F.lit(1)), F.count("time_acked")).first()
    rows, n_acked = (int(totals[0]), int(totals[1])) if totals else (0, 0)

    latency = None
    if "time_created" in columns:
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

    epochs = [
        (int(r[0] or 0), int(r[1]))
        for r in acked.groupBy("epoch").count().orderBy("epoch").collect()
    ]

    backlog: list[tuple[str, int, int]] = []
    unacked = df.where(F.col("time_acked").isNull())
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
    backlog = sorted(
        ((r["age"], int(r["priority"] or 0), int(r["count"])) for r in grouped),
        key=lambda t: (order[t[0]], t[1]),
    )

    day_ns, hour_ns = 86_400 * 10**9, 3_600 * 10**9
    days = F.floor(F.col("time_acked") / F.lit(day_ns)).cast("int")
    hours = F.floor(F.pmod(F.col("time_acked"), F.lit(day_ns)) / F.lit(hour_ns)).cast("int")
    hour = F.concat(  # UTC, whatever the session's time zone
        F.date_add(F.lit("1970-01-01").cast("date"), days).cast("string"),
        F.lit(" "),
        F.lpad(hours.cast("string"), 2, "0"),
        F.lit(":00"),
    )
    hourly = [
        (str(r[0]), int(r[1]))
        for r in acked.groupBy(hour.alias("hour")).count().orderBy("hour").collect()
    ]
    df.unpersist()
    source = f"archive {archive}" if archive else f"table {name}"
    return Report(name, source, rows, n_acked, latency, epochs, backlog, hourly)


# -- HTML ----------------------------------------------------------------------------------
def _png(fig: Any) -> str:
    """A figure as a base64 PNG; the figure is closed (pyplot keeps each open one alive)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def plots(report: Report) -> list[tuple[str, str]]:
    """(title, base64 PNG) of each plot with data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: list[tuple[str, str]] = []
    if report.latency_ms:
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.bar(list(report.latency_ms), list(report.latency_ms.values()), color="#4477aa")
        ax.set_ylabel("ms")
        out.append(("Delivery latency, created -> acked", _png(fig)))
    if report.epochs:
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.bar([str(e) for e, _ in report.epochs], [n for _, n in report.epochs], color="#228833")
        ax.set_xlabel("epoch (sends)")
        ax.set_ylabel("acked messages")
        out.append(("Redeliveries", _png(fig)))
    if report.backlog:
        fig, ax = plt.subplots(figsize=(6, 3))
        labels = [label for label, _ in AGE_BUCKETS]
        bottom = [0] * len(labels)
        for prio in sorted({p for _, p, _ in report.backlog}):
            counts = [
                sum(n for a, p, n in report.backlog if a == lb and p == prio) for lb in labels
            ]
            ax.bar(labels, counts, bottom=bottom, label=f"priority {prio}")
            bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
        ax.set_ylabel("unacked messages")
        ax.legend()
        out.append(("Backlog by age and priority", _png(fig)))
    if report.hourly:
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.plot([h for h, _ in report.hourly], [n for _, n in report.hourly], marker="o")
        ax.set_ylabel("acked per hour")
        ax.tick_params(axis="x", labelrotation=45)
        out.append(("Throughput per hour (UTC)", _png(fig)))
    return out


def write_html(report: Report, path: Path) -> None:
    figures = "".join(
        f'<h2>{html.escape(t)}</h2><img alt="{html.escape(t)}" src="data:image/png;base64,{b}">'
        for t, b in plots(report)
    )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>msgtable report: {html.escape(report.title)}</title></head><body>"
        f"<h1>msgtable report: {html.escape(report.title)}</h1>"
        f"<pre>{html.escape(report.text())}</pre>{figures}</body></html>"
    )
    path.write_text(page, encoding="utf-8")
