"""msgtable report on known data, on a real local Spark session: the known percentiles, epoch
histogram, backlog and hourly throughput; the same from an archive; the HTML has its plots."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from msgtable.spark.archive import archive
from msgtable.spark.report import build_report
from msgtable.tables import current_layout_ddl

from ..integration.helpers import comment

HOUR_NS = 3600 * 10**9
MS = 10**6
T0 = 1_767_225_600 * 10**9  # 2026-01-01 00:00:00 UTC
NOW = T0 + 50 * HOUR_NS


def known(sql) -> None:
    """100 acked messages whose latency is 1..100 ms (epochs 1, 2, 3 for 70/20/10 of them;
    60 acked in the first hour, 40 in the second), and 5 unacked ones of known ages."""
    ddl = current_layout_ddl("known", comment())
    sql.execute(ddl.replace("  primary key(id)", "  time_created bigint,\n  primary key(id)"))
    rows = []
    for i in range(1, 101):
        created = T0 + (i - 1) * 60 * 10**9 if i <= 60 else T0 + HOUR_NS + (i - 61) * 10**9
        epoch = 1 if i <= 70 else 2 if i <= 90 else 3
        rows.append(f"({i}, 0, null, {epoch}, {created + i * MS}, {created}, 'm')")
    for j, age_s in enumerate((30, 30, 300, 7200, 200_000)):
        prio = 1 if j == 1 else 0
        rows.append(f"({1000 + j}, {prio}, 0, 0, null, {NOW - age_s * 10**9}, 'w')")
    sql.execute(
        "insert into known(id, priority, time_next, epoch, time_acked, time_created, message) "
        "values " + ",".join(rows)
    )


def check(report, rows: int) -> None:
    assert report.rows == rows and report.acked == 100
    # exact percentiles of 1..100 (linear interpolation)
    assert report.latency_ms == pytest.approx({"p50": 50.5, "p90": 90.1, "p99": 99.01, "max": 100})
    assert report.epochs == [(1, 70), (2, 20), (3, 10)]
    assert report.hourly == [("2026-01-01 00:00", 60), ("2026-01-01 01:00", 40)]


def test_the_report_of_known_data_has_the_known_figures(spark, sql, db_dsn, tmp_path):
    known(sql)
    report = build_report(spark, "known", dsn=db_dsn, now_ns=NOW)
    check(report, rows=105)
    assert report.backlog == [
        ("< 1 min", 0, 1),
        ("< 1 min", 1, 1),
        ("1-10 min", 0, 1),
        ("1-24 h", 0, 1),
        (">= 1 day", 0, 1),
    ]
    text = report.text()
    assert "p50 50.5 ms" in text and "p99 99.0 ms" in text and "2026-01-01 01:00" in text


def test_the_report_of_an_archive_and_the_command(spark, sql, db_dsn, tmp_path):
    known(sql)
    archive(spark, db_dsn, "known", tmp_path / "arch", older_than_s=3600)
    report = build_report(spark, "known", archive=str(tmp_path / "arch"), now_ns=NOW)
    assert report.backlog == []  # an archive holds acked rows only
    check(report, rows=100)

    html = tmp_path / "r.html"
    done = subprocess.run(
        [sys.executable, "-m", "msgtable", "report", "known", "--archive", str(tmp_path / "arch"),
         "--html", str(html), "--master", "local[1]"],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "p50 50.5 ms" in done.stdout and f"HTML report: {html}" in done.stdout
    assert "msgtable: Spark local[1]" in done.stderr
    page = html.read_text()
    assert page.count("data:image/png;base64,") == 3  # latency, redeliveries, hourly
    assert "Redeliveries" in page


def test_the_report_command_runs_on_spark_connect(sql, db_dsn, tmp_path):
    """SPARK_REMOTE: the same command through a Spark Connect session (a local one here)."""
    known(sql)
    env = {**os.environ, "SPARK_REMOTE": "local[1]"}
    done = subprocess.run(
        [sys.executable, "-m", "msgtable", "report", "known", "--dsn", db_dsn,
         "--html", str(tmp_path / "c.html")],
        capture_output=True, text=True, timeout=240, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "msgtable: Spark Connect at local[1]" in done.stderr
    assert "105 rows (100 acked) from table known" in done.stdout
    assert "p50 50.5 ms" in done.stdout
