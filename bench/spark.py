"""The Spark pipeline's figures (full mode; quick mode when ``--only spark`` names it): bulk
enqueue of ROWS rows from a DataFrame (msgtable.spark.jdbc.enqueue: Spark's JDBC writer with
MariaDB Connector/J, each partition one transaction), and msgtable archive of ROWS acked rows
(copy to Parquet, count, delete exactly those rows). One local Spark session (local[*]),
started before the clocks run. Targets: >= 100k rows/s; the archive in <= 20 s.
"""

from __future__ import annotations

import io
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.database import count_rows, create_table, execute, message_comment

ROWS = 1_000_000
PARTITIONS = 4


@dataclass
class SparkResult:
    rows: int
    enqueue_s: float
    archive_s: float
    archived: int
    path: str  # the enqueue's path: jdbc or msgtable

    @property
    def enqueue_rows_s(self) -> float:
        return self.rows / self.enqueue_s

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "enqueue_s": round(self.enqueue_s, 2),
            "enqueue_rows_s": round(self.enqueue_rows_s),
            "enqueue_path": self.path,
            "archive_s": round(self.archive_s, 2),
            "archived": self.archived,
        }


def run(dsn: str, rows: int = ROWS, *, postpone_after_s: float | None) -> SparkResult:
    from msgtable.spark.archive import Progress, archive
    from msgtable.spark.jdbc import enqueue
    from msgtable.spark.session import session

    comment = message_comment(100, 30, postpone_after_s=postpone_after_s)
    spark = session("local[*]", "msgtable-bench")
    try:
        create_table(dsn, "spark_enqueue", comment)
        df = spark.range(rows).selectExpr("id", "concat('{\"order\": ', id, '}') as message")
        df = df.repartition(PARTITIONS).cache()
        df.count()  # the frame is made before the clock runs
        began = time.monotonic()
        path = enqueue(df, dsn, "spark_enqueue")
        enqueue_s = time.monotonic() - began
        if count_rows(dsn, "spark_enqueue") != rows:
            raise RuntimeError("the bulk enqueue lost rows")
        execute(dsn, "drop table spark_enqueue")

        create_table(dsn, "spark_archive", comment)
        acked = time.time_ns() - 7 * 86_400 * 10**9
        old = df.selectExpr("id", "message", f"{acked} + id as time_acked", "1 as epoch")
        enqueue(old, dsn, "spark_archive")
        with tempfile.TemporaryDirectory(prefix="msgtable-bench-archive-") as tmp:
            quiet = Progress(io.StringIO())
            began = time.monotonic()
            result = archive(spark, dsn, "spark_archive", Path(tmp) / "a", 86_400, quiet)
            archive_s = time.monotonic() - began
        if result.copied != rows or count_rows(dsn, "spark_archive") != 0:
            raise RuntimeError(f"the archive took {result.copied:,} of {rows:,} rows")
        execute(dsn, "drop table spark_archive")
        return SparkResult(rows, enqueue_s, archive_s, result.copied, path)
    finally:
        spark.stop()
