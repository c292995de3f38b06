"""The report's figures as text and as a page (msgtable.spark.report, .report_html), from
reports made by hand: the throughput's bucket suits the time the acks span, its gaps are
zeros, counts have whole-number axes, dead letters are one line when none and tables (and
plots) when some, and the page loads nothing from anywhere. Needs no
Spark (tests/spark/test_report.py builds reports with it, and looks at the page in a
browser)."""

from __future__ import annotations

import re

import pytest

from msgtable.spark.report import Report, fill_gaps, format_ms, throughput_bucket
from msgtable.spark.report_dead import DeadLetters, Place
from msgtable.spark.report_html import _count_axis, page

T0_S = 1_767_225_600  # 2026-01-01 00:00:00 UTC


def report(**changes) -> Report:
    fields = dict(
        title="my_message",
        source="table my_message",
        rows=12,
        acked=10,
        latency_ms={"p50": 12.0, "p90": 80.0, "p99": 1500.0, "max": 2000.0},
        epochs=[(1, 9), (2, 1)],
        backlog=[("< 1 min", 0, 2)],
        throughput=[(T0_S, 4), (T0_S + 60, 0), (T0_S + 120, 6)],
        per="minute",
        latency_histogram=[(10.0, 5), (79.4, 4), (1584.9, 1)],
        generated_ns=(T0_S + 3600) * 10**9,
    )
    fields.update(changes)
    return Report(**fields)


@pytest.mark.parametrize(
    ("span_s", "bucket"),
    [
        (0, ("minute", 60)),  # one ack, or all in one instant
        (3600, ("minute", 60)),  # the first hour: 60 points
        (3 * 3600 - 1, ("minute", 60)),
        (3 * 3600, ("hour", 3600)),
        (7 * 86400, ("hour", 3600)),
        (60 * 86400, ("day", 86400)),
        (400 * 86400, ("day", 86400)),
    ],
)
def test_the_throughput_is_per_minute_for_hours_of_acks_per_hour_for_weeks(span_s, bucket):
    assert throughput_bucket(span_s) == bucket


def test_a_throughput_bucket_without_acks_is_a_zero_not_a_gap():
    assert fill_gaps({T0_S: 1, T0_S + 180: 2}, 60) == [
        (T0_S, 1),
        (T0_S + 60, 0),
        (T0_S + 120, 0),
        (T0_S + 180, 2),
    ]
    assert fill_gaps({}, 60) == []


def test_the_text_lists_a_few_buckets_and_sums_up_many():
    text = report().text()
    assert "my_message: 12 rows (10 acked, 2 unacked) from table my_message" in text
    assert "p50 12.0 ms, p90 80.0 ms, p99 1.5 s, max 2.0 s" in text
    assert "minute (UTC)" in text and "2026-01-01 00:01      0" in text
    many = [(T0_S + 60 * k, k % 7) for k in range(90)]
    text = report(throughput=many).text()
    assert "throughput: 267 acked from 2026-01-01 00:00 to 2026-01-01 01:29 UTC; per minute: " \
        "mean 3.0, peak 6 at 2026-01-01 00:06" in text  # fmt: skip


def test_latencies_read_as_people_say_them():
    assert [format_ms(ms) for ms in (0.25, 850, 12_300, 270_000, 7_200_000)] == [
        "0.2 ms",
        "850.0 ms",
        "12.3 s",
        "4.5 min",
        "2.0 h",
    ]


def test_the_page_has_a_title_its_source_its_time_cards_tables_and_four_plots():
    html = page(report())
    assert "<title>msgtable report: my_message</title>" in html
    assert "<h1>my_message</h1>" in html
    assert "Source: <b>table my_message</b>" in html
    assert "Generated <b>2026-01-01 01:00:00 UTC</b>" in html
    assert html.count('src="data:image/png;base64,') == 4
    for heading in ("Delivery latency", "Throughput: messages acked per minute", "Redeliveries",
                    "Backlog"):  # fmt: skip
        assert f"<h2>{heading}" in html
    assert "<td>p99</td><td>1.5 s</td>" in html
    assert '<div class="value">10.0 %' not in html  # a share is a card's note, not its figure
    assert "10.0 % sent more than once" in html


def test_the_page_loads_nothing_from_anywhere():
    html = page(report())
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", html)
    assert not re.search(r"(?i)https?:|//\w|url\(|<script|<link|@import", text)


def test_a_table_without_time_created_is_told_how_to_measure_latency():
    html = page(report(latency_ms=None, latency_histogram=[], has_time_created=False))
    assert "no <code>time_created</code> column" in html
    assert html.count("data:image/png;base64,") == 3
    assert "Latency p50" not in html
    text = report(latency_ms=None, has_time_created=False).text()
    assert "delivery latency: the rows have no time_created" in text


def test_an_empty_source_is_a_page_that_says_so():
    html = page(
        report(rows=0, acked=0, latency_ms=None, epochs=[], backlog=[], throughput=[],
               latency_histogram=[])
    )  # fmt: skip
    assert "data:image/png" not in html
    assert html.count('class="empty"') == 5  # dead letters too: "Dead letters: none."


def test_a_count_axis_has_whole_numbers_only():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    try:
        ax.bar(["a", "b"], [1, 2])
        _count_axis(ax, "messages")
        fig.canvas.draw()
        ticks = [t for t in ax.get_yticks() if 0 <= t <= 2]
        assert ticks and all(t == int(t) for t in ticks), ticks
        assert ax.get_ylim()[0] == 0
    finally:
        plt.close(fig)


EXHAUSTED = "no ack after 5 attempts (vt_max_attempts=5)"


def dead_letters(**changes) -> DeadLetters:
    fields = dict(
        places=[Place("my_message", moved=False, dead=2), Place("my_message_dead", True, 3)],
        by_reason=[
            (EXHAUSTED, "in my_message_dead", 3),
            ("bad payload: " + "x" * 80, "in place", 2),
        ],
        by_attempts=[(1, "in place", 2), (5, "in my_message_dead", 3)],
        first_ns=T0_S * 10**9,
        last_ns=(T0_S + 90) * 10**9,
        max_attempts=5,
    )
    fields.update(changes)
    return DeadLetters(**fields)


def test_no_dead_letters_is_one_line_in_the_text_and_on_the_page():
    none = DeadLetters(places=[Place("my_message", False), Place("my_message_dead", True)])
    text = report(dead=none).text()
    assert "\ndead letters: none (in place or in my_message_dead)\n\n" in text
    assert "last error" not in text
    html = page(report(dead=none))
    assert '<p class="empty">Dead letters: none (in place or in my_message_dead).</p>' in html
    assert html.count('src="data:image/png;base64,') == 4
    assert "dead letters: none\n" in report(dead=DeadLetters([Place("t", False)])).text()


def test_dead_letters_are_counted_by_reason_and_attempts_in_each_place():
    dead = dead_letters()
    text = report(dead=dead, rows=14, acked=10).text()
    assert "my_message: 14 rows (10 acked, 4 unacked, 2 of them dead)" in text
    reason = "bad payload: " + "x" * 44 + "..."  # cut to 60 characters in the terminal
    assert (
        "dead letters: 5 (2 in place, 3 in my_message_dead); died 2026-01-01 00:00:00 to "
        "2026-01-01 00:01:30 UTC; vt_max_attempts=5\n"
        "\n"
        f"{'last error':60}  in place  in my_message_dead  all\n"
        f"{'-' * 60}  --------  ------------------  ---\n"
        f"{EXHAUSTED:60}         0                   3    3\n"
        f"{reason}         2                   0    2\n"
        "\n"
        "attempts  in place  in my_message_dead  all\n"
        "--------  --------  ------------------  ---\n"
        "       1         2                   0    2\n"
        "       5         0                   3    3\n"
    ) in text
    html = page(report(dead=dead, rows=14, acked=10))
    assert html.count('src="data:image/png;base64,') == 6  # by reason, by attempts
    assert f"<td>bad payload: {'x' * 80}</td><td>2</td><td>0</td><td>2</td>" in html  # whole
    assert '<div class="sub">2 in place, 3 in my_message_dead</div>' in html
    assert '<div class="sub">2 waiting, 2 dead</div>' in html


def test_one_place_of_dead_letters_has_one_count_column():
    dead = dead_letters(
        places=[Place("my_message_dead", True, 3)],
        by_reason=[(EXHAUSTED, "in my_message_dead", 3)],
        by_attempts=[(5, "in my_message_dead", 3)],
        first_ns=None,
        last_ns=None,
        max_attempts=0,
    )
    assert dead.summary() == "3 in my_message_dead"
    assert dead.reason_rows() == [(EXHAUSTED, 3)] and dead.attempt_rows() == [(5, 3)]
    assert dead.headers("attempts") == ("attempts", "dead")
    problem = dead_letters(places=[Place("t", False, 1)], problem="vt_dead_letter=gone not read")
    assert problem.summary().endswith("; vt_max_attempts=5; vt_dead_letter=gone not read")
