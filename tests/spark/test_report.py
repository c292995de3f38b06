"""msgtable report on known data, on a real local Spark session: the known percentiles, epoch
histogram, backlog and throughput per minute; the same from an archive; the HTML has its plots;
a table whose time_created is its default; the page as a browser shows it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from msgtable.core.tables import current_layout_ddl
from msgtable.spark.archive import archive
from msgtable.spark.report import build_report
from msgtable.spark.report_html import write_html

from ..integration.helpers import comment

HOUR_NS = 3600 * 10**9
MS = 10**6
T0_S = 1_767_225_600  # 2026-01-01 00:00:00 UTC
T0 = T0_S * 10**9
NOW = T0 + 50 * HOUR_NS


def known(sql) -> None:
    """100 acked messages whose latency is 1..100 ms (epochs 1, 2, 3 for 70/20/10 of them;
    60 acked in the first hour, 40 in the second), and 5 unacked ones of known ages."""
    sql.execute(current_layout_ddl("known", comment()))  # it has time_created
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
    # an hour of acks: per minute, one a minute and then 40 in one minute
    assert report.per == "minute"
    assert report.throughput == [(T0_S + 60 * k, 1) for k in range(60)] + [(T0_S + 3600, 40)]
    assert report.latency_histogram[0] == (1.0, 1)  # 1 ms: the first bin, 1.0 to 1.26 ms
    assert sum(n for _, n in report.latency_histogram) == 100


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
    assert "p50 50.5 ms" in text and "p99 99.0 ms" in text
    assert "peak 40 at 2026-01-01 01:00" in text
    assert "\ndead letters: none\n" in text  # one line, no empty table


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
    assert "msgtable: Spark local[1]" in done.stdout
    page = html.read_text()
    assert page.count("data:image/png;base64,") == 3  # latency, throughput, redeliveries
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
    assert "msgtable: Spark Connect at local[1]" in done.stdout
    assert "105 rows (100 acked, 5 unacked) from table known" in done.stdout
    assert "p50 50.5 ms" in done.stdout


def test_the_report_of_a_table_whose_time_created_is_its_default(spark, sql, db_dsn):
    """The demo table's layout: time_created (unix ns) defaults to now, so an application's
    plain INSERT gives every message one, and the report measures its latency."""
    sql.execute(current_layout_ddl("demo", comment()))
    before = time.time_ns()
    sql.execute(
        "insert into demo(id, message) values " + ",".join(f"({i}, 'm')" for i in range(10))
    )
    sql.execute("update demo set epoch = 1, time_acked = time_created + (id + 1) * 1000000 "
                "where id < 8")  # fmt: skip
    report = build_report(spark, "demo", dsn=db_dsn)
    assert report.rows == 10 and report.acked == 8
    assert report.latency_ms is not None
    assert report.latency_ms["max"] == pytest.approx(8.0)  # 1..8 ms after time_created
    assert report.latency_ms["p50"] == pytest.approx(4.5)
    assert report.backlog == [("< 1 min", 0, 2)]  # created just now
    assert report.per == "minute" and len(report.throughput) == 1
    ((start_s, acked),) = report.throughput
    assert acked == 8 and before // 10**9 - 60 <= start_s <= time.time_ns() // 10**9


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip
PLOT_BLUE = (0x44, 0x77, 0xAA)  # report_html.BLUE: the bars of the plots


def near(rgb: tuple[int, int, int], colour: tuple[int, int, int]) -> bool:
    return max(abs(a - b) for a, b in zip(rgb, colour, strict=True)) <= 8


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.glob('chromium-profile-*')))}"
    return subprocess.run(
        [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="no /usr/bin/chromium (make test installs it: apt-get install chromium)",
)
def test_the_html_report_as_a_browser_shows_it(spark, sql, db_dsn, tmp_path):
    """The page of the known data, rendered by headless Chromium: it loads, with every plot,
    from nothing but itself; the screenshot (its path is printed) is a page, not a blank."""
    known(sql)
    page = tmp_path / "known-report.html"
    write_html(build_report(spark, "known", dsn=db_dsn, now_ns=NOW), page)
    text = page.read_text()
    without_plots = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", text)
    assert not re.search(r"(?i)https?:|//\w|url\(", without_plots)  # loads nothing
    assert "<script" not in text and "<link" not in text and "@import" not in text
    assert text.count('src="data:image/png;base64,') == 4  # latency, throughput, epochs, backlog

    dom = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr
    assert "<h1>known</h1>" in dom.stdout and "Source: <b>table known</b>" in dom.stdout
    assert "Generated <b>2026-01-03 02:00:00 UTC</b>" in dom.stdout  # NOW, the report's time

    shot = tmp_path / "known-report.png"
    done = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,3200", page.as_uri())
    assert done.returncode == 0 and shot.is_file(), done.stderr
    print(f"the report as Chromium shows it: {shot}")
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 3200)
    colours = image.getcolors(maxcolors=1 << 24) or []
    total = image.size[0] * image.size[1]
    background = max(colours)[0]
    inked = 1 - background / total
    assert inked > 0.2, f"the page is mostly blank ({inked:.0%} not background): {shot}"
    blue = sum(n for n, rgb in colours if near(rgb, PLOT_BLUE))
    assert blue > 20_000, f"the plots' bars are not on the page ({blue} blue pixels): {shot}"
