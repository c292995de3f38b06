"""The HTML page of a msgtable report (msgtable.spark.report): one file that needs nothing
else, to be read offline or mailed. Its CSS is inline and its plots are PNGs in data: URLs;
it loads nothing from anywhere.

The page: a header (the table, the source, when it was made), the headline figures as cards,
then one section per figure, each a plot the width of the page and its table: delivery
latency (a histogram with the percentiles marked), throughput, redeliveries, backlog, and
dead letters (by reason and by attempts, stacked by where they are; one line when none).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from msgtable import __version__
from msgtable.spark.report import AGE_BUCKETS, Report, bucket_label, format_ms, in_units
from msgtable.spark.report_dead import DeadLetters, cut

# Paul Tol's colour-blind safe palette.
BLUE, CYAN, GREEN, YELLOW, RED, PURPLE, GREY = (
    "#4477aa", "#66ccee", "#228833", "#ccbb44", "#ee6677", "#aa3377", "#bbbbbb",
)  # fmt: skip
PRIORITY_COLOURS = (BLUE, YELLOW, GREEN, RED, PURPLE, CYAN, GREY)
PLACE_COLOURS = (RED, PURPLE)  # dead letters in place, in the dead-letter table
FIGURE_SIZE = (10.0, 3.3)  # inches: shown the page's width, about 1,000 CSS pixels
DPI = 160  # sharp on high-density screens
BARS_AT_MOST = 120  # throughput buckets drawn as bars; more are a line
REASON_LABEL_WIDTH = 48  # a reason longer than this is cut on the plot's axis (whole in its table)

CSS = """
:root { color-scheme: light; --ink: #1f2933; --muted: #5f6b7a; --line: #e3e7ec;
  --accent: #4477aa; --paper: #ffffff; --wash: #f5f7fa; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--wash); color: var(--ink);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
main { max-width: 1080px; margin: 0 auto; padding: 32px 24px 48px; }
header { border-bottom: 3px solid var(--accent); padding-bottom: 14px; margin-bottom: 24px; }
.eyebrow { margin: 0; color: var(--accent); font-weight: 600; letter-spacing: .08em;
  text-transform: uppercase; font-size: 12px; }
h1 { margin: 2px 0 6px; font-size: 30px; }
.meta { margin: 0; color: var(--muted); }
.meta b { color: var(--ink); font-weight: 600; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(150px, 1fr));
  gap: 12px; margin-bottom: 24px; }
.card { background: var(--paper); border: 1px solid var(--line); border-radius: 8px;
  padding: 12px 14px; }
.card .label { color: var(--muted); font-size: 12px; text-transform: uppercase;
  letter-spacing: .05em; }
.card .value { font-size: 24px; font-weight: 650; font-variant-numeric: tabular-nums; }
.card .sub { color: var(--muted); font-size: 12px; }
section { background: var(--paper); border: 1px solid var(--line); border-radius: 8px;
  padding: 18px 20px 16px; margin-bottom: 20px; }
h2 { margin: 0 0 4px; font-size: 19px; }
.note { margin: 0 0 10px; color: var(--muted); }
figure { margin: 6px 0 12px; }
figure img { display: block; width: 100%; height: auto; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; margin-top: 4px; }
th, td { padding: 4px 14px 4px 0; border-bottom: 1px solid var(--line); text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { color: var(--muted); font-weight: 600; font-size: 13px; }
details summary { cursor: pointer; color: var(--accent); margin-top: 4px; }
.empty { color: var(--muted); font-style: italic; margin: 6px 0; }
code { background: var(--wash); padding: 1px 4px; border-radius: 4px; }
footer { color: var(--muted); font-size: 12px; text-align: center; margin-top: 28px; }
"""


def write_html(report: Report, path: Path) -> None:
    """Write the report's page to ``path``."""
    path.write_text(page(report), encoding="utf-8")


def page(report: Report) -> str:
    """The report's page (see the module docstring)."""
    e = html.escape
    generated = datetime.fromtimestamp(report.generated_ns / 1e9, UTC)
    sections = [
        _latency(report),
        _throughput(report),
        _redeliveries(report),
        _backlog(report),
        _dead_letters(report.dead),
    ]
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>msgtable report: {e(report.title)}</title><style>{CSS}</style></head>"
        "<body><main><header>"
        '<p class="eyebrow">msgtable report</p>'
        f"<h1>{e(report.title)}</h1>"
        f'<p class="meta">Source: <b>{e(report.source)}</b> &middot; Generated '
        f"<b>{generated:%Y-%m-%d %H:%M:%S} UTC</b></p></header>"
        f"{_cards(report)}{''.join(sections)}"
        f"<footer>msgtable {e(__version__)} &middot; every figure computed by Spark"
        "</footer></main></body></html>\n"
    )


# -- the parts of the page -----------------------------------------------------------------
def _cards(report: Report) -> str:
    redelivered = sum(n for epoch, n in report.epochs if epoch > 1)
    cards = [
        ("Messages", f"{report.rows:,}", "rows in the source"),
        ("Acked", f"{report.acked:,}", _share(report.acked, report.rows, "of the messages")),
        ("Unacked", f"{report.unacked:,}", _unacked_note(report)),
    ]
    if report.latency_ms:
        cards += [
            ("Latency p50", format_ms(report.latency_ms["p50"]), "created \u2192 acked"),
            ("Latency p99", format_ms(report.latency_ms["p99"]), "created \u2192 acked"),
        ]
    again = _share(redelivered, report.acked, "sent more than once")
    cards.append(("Redelivered", f"{redelivered:,}", again))
    where = [f"{p.dead:,} {p.label}" for p in report.dead.places if p.dead]
    dead_note = ", ".join(where) if len(where) > 1 else "never sent again"
    cards.append(("Dead letters", f"{report.dead.total:,}", dead_note))
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card"><div class="label">{html.escape(label)}</div>'
            f'<div class="value">{html.escape(value)}</div>'
            f'<div class="sub">{html.escape(sub)}</div></div>'
            for label, value, sub in cards
        )
        + "</div>"
    )


def _unacked_note(report: Report) -> str:
    here = report.dead.here
    return f"{report.unacked - here:,} waiting, {here:,} dead" if here else "the backlog"


def _share(part: int, whole: int, what: str) -> str:
    return f"{100 * part / whole:.1f} % {what}" if whole else what


def _section(title: str, note: str, body: str) -> str:
    note_html = f'<p class="note">{note}</p>' if note else ""
    return f"<section><h2>{html.escape(title)}</h2>{note_html}{body}</section>"


def _figure(
    title: str, draw: Callable[[Any], None], size: tuple[float, float] = FIGURE_SIZE
) -> str:
    png = _png(draw, size)
    return f'<figure><img alt="{html.escape(title)}" src="data:image/png;base64,{png}"></figure>'


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _latency(report: Report) -> str:
    title = "Delivery latency, created \u2192 acked"
    if report.latency_ms is None:
        if report.has_time_created:
            return _section(title, "", '<p class="empty">No acked messages yet.</p>')
        return _section(
            title,
            "",
            '<p class="empty">The rows have no <code>time_created</code> column, so how long '
            "a message waited cannot be measured. A <code>time_created bigint</code> "
            "(unix nanoseconds, set when the message is enqueued) makes it measurable.</p>",
        )
    lat = report.latency_ms
    note = (
        f"How long acked messages took from their <code>time_created</code> to their ack: "
        f"half within {html.escape(format_ms(lat['p50']))}, 99 % within "
        f"{html.escape(format_ms(lat['p99']))}. Exact percentiles; the histogram's bins are "
        "log-spaced."
    )
    rows = [(name, format_ms(ms)) for name, ms in lat.items()]
    return _section(title, note, _figure(title, lambda ax: _draw_latency(ax, report)) +
                    _table(("percentile", "latency"), rows))  # fmt: skip


def _throughput(report: Report) -> str:
    title = f"Throughput: messages acked per {report.per} (UTC)"
    if not report.throughput:
        return _section(title, "", '<p class="empty">No acked messages.</p>')
    rows = [(bucket_label(s, report.per), n) for s, n in report.throughput]
    details = (
        f"<details><summary>Every {report.per} ({len(rows):,})</summary>"
        f"{_table((f'{report.per} (UTC)', 'acked'), rows)}</details>"
    )
    summary = report.throughput_summary()
    note = html.escape(summary[:1].upper() + summary[1:] + ".")
    return _section(title, note, _figure(title, lambda ax: _draw_throughput(ax, report)) + details)


def _redeliveries(report: Report) -> str:
    title = "Redeliveries: acked messages by sends"
    if not report.epochs:
        return _section(title, "", '<p class="empty">No acked messages.</p>')
    note = (
        "How many times each acked message was sent (its <code>epoch</code>) before its ack; "
        "0: acked before it was ever sent. More than 1 means a subscriber did not ack in time."
    )
    return _section(title, note, _figure(title, lambda ax: _draw_epochs(ax, report)) +
                    _table(("sends (epoch)", "acked"), report.epochs))  # fmt: skip


def _backlog(report: Report) -> str:
    title = "Backlog: unacked messages by age"
    if not report.backlog:
        return _section(title, "", '<p class="empty">No unacked messages: no backlog.</p>')
    priorities = sorted({p for _, p, _ in report.backlog})
    rows = [
        (label, *[_count(report, label, p) for p in priorities], _count(report, label))
        for label, _ in AGE_BUCKETS
    ]
    headers = ("age", *[f"priority {p}" for p in priorities], "all")
    note = (
        "Unacked messages by how long ago they were created (or, without "
        "<code>time_created</code>, since they were due), stacked by priority."
    )
    return _section(title, note, _figure(title, lambda ax: _draw_backlog(ax, report)) +
                    _table(headers, rows))  # fmt: skip


def _dead_letters(dead: DeadLetters) -> str:
    title = "Dead letters: messages never sent again"
    summary = html.escape(dead.summary())
    if not dead.total:
        return _section(title, "", f'<p class="empty">Dead letters: {summary}.</p>')
    note = (
        f"Dead letters: {summary}. A message dies when a subscriber rejects it or when it was sent "
        "<code>vt_max_attempts</code> times without an ack. Dead in place, it stays in its "
        "table (<code>time_next</code> the largest BIGINT; its <code>epoch</code> the "
        "sends); with <code>vt_dead_letter</code> it is moved to that table (its "
        "<code>attempts</code>, <code>time_dead</code>, <code>last_error</code>)."
    )
    reasons = _figure("dead letters by reason", lambda ax: _draw_dead_reasons(ax, dead),
                      (FIGURE_SIZE[0], 1.0 + 0.4 * len(dead.reasons)))  # fmt: skip
    attempts = _figure("dead letters by attempts", lambda ax: _draw_dead_attempts(ax, dead))
    return _section(
        title,
        note,
        reasons
        + _table(dead.headers("last error"), dead.reason_rows())
        + attempts
        + _table(dead.headers("attempts"), dead.attempt_rows()),
    )


def _count(report: Report, age: str, priority: int | None = None) -> int:
    return sum(n for a, p, n in report.backlog if a == age and priority in (None, p))


# -- the plots -----------------------------------------------------------------------------
def _png(draw: Callable[[Any], None], size: tuple[float, float] = FIGURE_SIZE) -> str:
    """A plot as a base64 PNG: ``draw`` fills its axes; the figure is closed (pyplot keeps each
    open one alive)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=size, layout="constrained")
        try:
            draw(ax)
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
        finally:
            plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


_STYLE: Any = {  # rcParams (Any: matplotlib types their names as one long Literal)
    "font.family": "DejaVu Sans",
    "font.size": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.edgecolor": "#9aa5b1",
    "axes.grid": True,
    "axes.grid.axis": "y",
    "grid.color": "#e3e7ec",
    "axes.axisbelow": True,
    "axes.labelcolor": "#3e4c59",
    "xtick.color": "#3e4c59",
    "ytick.color": "#3e4c59",
}


def _count_axis(ax: Any, label: str) -> None:
    """A y axis of counts: whole numbers only, with thousands separators, from zero."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_ylim(bottom=0)
    ax.set_ylabel(label)


def _draw_latency(ax: Any, report: Report) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from msgtable.spark.report import LATENCY_BINS_PER_DECADE

    step = 10 ** (1 / LATENCY_BINS_PER_DECADE)
    lows = [low for low, _ in report.latency_histogram]
    counts = [n for _, n in report.latency_histogram]
    ax.bar(lows, counts, width=[low * (step - 1) for low in lows], align="edge", color=BLUE)
    ax.set_xscale("log")
    ax.set_xlim(min(lows) / step, max(lows) * step * step)
    ax.xaxis.set_major_locator(LogLocator(base=10))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _short_ms(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("latency, created \u2192 acked (log scale)")
    _count_axis(ax, "acked messages")
    assert report.latency_ms is not None
    marks = zip(("p50", "p90", "p99"), (GREEN, YELLOW, RED), (":", "--", "-."), strict=True)
    for name, colour, style in marks:
        ms = report.latency_ms[name]
        ax.axvline(ms, color=colour, linestyle=style, linewidth=2, label=f"{name} {format_ms(ms)}")
    ax.set_ylim(top=max(counts) * 1.12)
    ax.legend(frameon=False, loc="lower right", bbox_to_anchor=(1, 1), ncols=3)


def _short_ms(ms: float) -> str:
    """An axis label of a latency: 10 ms, 1 s, 2 min."""
    value, unit = in_units(ms)
    return f"{value:g} {unit}" if unit in ("ms", "s") else f"{value:.3g} {unit}"


def _draw_throughput(ax: Any, report: Report) -> None:
    import matplotlib.dates as mdates

    times = [datetime.fromtimestamp(s, UTC) for s, _ in report.throughput]
    counts = [n for _, n in report.throughput]
    seconds = {"minute": 60, "hour": 3600, "day": 86400}[report.per]
    if len(times) <= BARS_AT_MOST:
        ax.bar(times, counts, width=seconds / 86400 * 0.85, align="edge", color=BLUE)
    else:
        ax.plot(times, counts, color=BLUE, linewidth=1.4)
        ax.fill_between(times, counts, color=BLUE, alpha=0.15, linewidth=0)
    locator = mdates.AutoDateLocator(tz=UTC)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    concise = mdates.ConciseDateFormatter(locator, tz=UTC)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_formatter(concise)
    ax.set_xlabel("UTC")
    _count_axis(ax, f"acked per {report.per}")


def _draw_epochs(ax: Any, report: Report) -> None:
    labels = [str(e) for e, _ in report.epochs]
    counts = [n for _, n in report.epochs]
    colours = [GREEN if e <= 1 else YELLOW if e == 2 else RED for e, _ in report.epochs]
    bars = ax.bar(labels, counts, color=colours, width=0.6)
    ax.bar_label(bars, labels=[f"{n:,}" for n in counts], padding=2, color="#3e4c59")
    ax.set_xlabel("sends before the ack (epoch)")
    _count_axis(ax, "acked messages")
    ax.set_ylim(top=max(counts) * 1.15)


def _draw_backlog(ax: Any, report: Report) -> None:
    labels = [label for label, _ in AGE_BUCKETS]
    bottom = [0] * len(labels)
    priorities = sorted({p for _, p, _ in report.backlog})
    for i, priority in enumerate(priorities):
        counts = [_count(report, label, priority) for label in labels]
        colour = PRIORITY_COLOURS[i % len(PRIORITY_COLOURS)]
        ax.bar(labels, counts, bottom=bottom, label=f"priority {priority}", color=colour, width=0.6)
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    ax.set_xlabel("age (since created, else since due)")
    _count_axis(ax, "unacked messages")
    ax.set_ylim(top=max(bottom) * 1.12)
    ax.legend(frameon=False, loc="lower left", bbox_to_anchor=(0, 1), ncols=min(len(priorities), 6))


def _draw_dead_reasons(ax: Any, dead: DeadLetters) -> None:
    """Horizontal bars, the most common reason on top, stacked by place."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    reasons = dead.reasons
    rows = range(len(reasons))  # positions, not labels: two reasons may be cut alike
    left = [0] * len(reasons)
    for i, place in enumerate(dead.labels):
        counts = [dead.count(dead.by_reason, r, place) for r in reasons]
        colour = PLACE_COLOURS[i % len(PLACE_COLOURS)]
        ax.barh(rows, counts, left=left, color=colour, height=0.6, label=place)
        left = [a + b for a, b in zip(left, counts, strict=True)]
    ax.set_yticks(rows, [cut(r, REASON_LABEL_WIDTH) for r in reasons])
    ax.invert_yaxis()
    ax.grid(axis="x")
    ax.grid(axis="y", visible=False)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_xlim(0, max(left) * 1.1)
    ax.set_xlabel("dead letters")
    if len(dead.labels) > 1:
        ax.legend(frameon=False, loc="lower right", bbox_to_anchor=(1, 1), ncols=2)


def _draw_dead_attempts(ax: Any, dead: DeadLetters) -> None:
    """Bars by attempts (sends before it died), stacked by place."""
    attempts = dead.attempts
    labels = [str(a) for a in attempts]
    bottom = [0] * len(attempts)
    for i, place in enumerate(dead.labels):
        counts = [dead.count(dead.by_attempts, a, place) for a in attempts]
        colour = PLACE_COLOURS[i % len(PLACE_COLOURS)]
        ax.bar(labels, counts, bottom=bottom, color=colour, width=0.6, label=place)
        bottom = [a + b for a, b in zip(bottom, counts, strict=True)]
    ax.set_xlabel("attempts: sends before it died")
    _count_axis(ax, "dead letters")
    ax.set_ylim(top=max(bottom) * 1.15)
    if len(dead.labels) > 1:
        ax.legend(frameon=False, loc="lower left", bbox_to_anchor=(0, 1), ncols=2)
