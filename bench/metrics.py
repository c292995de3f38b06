"""The cost of Prometheus metrics (msgtable.metrics): msgtable at batch 100 with 4
subscribers on a server with ``--metrics-listen``, scraped every SCRAPE_INTERVAL_S over
HTTP, against the same run on a server without (the ``metrics`` section of
``python -m bench.run``; JSON keys ``metrics_off_msgs_s``, ``metrics_on_msgs_s`` and
``metrics_cost_ratio`` = on / off, target >= TARGET_RATIO). And the cost of tracing on top:
the same server with metrics and an SDK tracer provider (BatchSpanProcessor, an exporter that
drops the spans: bench.traced) on both the server and the subscribers' side (JSON keys
``tracing_on_msgs_s`` and ``tracing_cost_ratio`` = metrics and tracing on / off, target >=
TARGET_RATIO). A fourth side listens (``--metrics-listen``) and is never scraped: what the
metrics cost by themselves, without the scrapes (JSON ``metrics_listening_ratio``). A fifth
traces one root span in ten (``ParentBased(TraceIdRatioBased(SAMPLE))`` in the server and the
subscribers, as a production deployment would sample; JSON ``sampled_tracing_cost_ratio``).
With --full each run delivers FULL_MESSAGES messages.

All are measured in the same run, in rounds of the sides (SIDES), on fresh servers (no lease
of their own: one at a time). Round r runs the sides rotated by r places, so over ROUNDS
(FULL_ROUNDS with --full; multiples of the number of sides) each side runs in each place of
a round equally often: a run's place (after a run that left the database purging, or first
after a pause) weighs alike on every side. A sixth side, ``control``, is the off side once
more: its ratio to off (JSON ``control_ratio``, and its rounds) is what the method itself
shows for no difference at all, the yardstick for the others' distance from 1. Each ratio is
the median over the rounds of that round's ratio (on / off, traced / off of the same round):
the machine's speed drifts over minutes, a round's runs follow each other, and the median
leaves out a round that other work on the machine disturbed; ``ratio_runs`` and
``tracing_ratio_runs`` keep each round's, the spread. The ``*_msgs_s`` figures are each side's
best run. The scrapes are checked: every one answered 200 with the server's families, and some
had the run's table (a scrape before the server discovered it has none).
"""

from __future__ import annotations

import contextlib
import json
import socket
import statistics
import tempfile
import threading
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import engine
from bench.errors import BenchError
from bench.processes import ServerProcess

ROUNDS = 6  # a multiple of len(SIDES): each side in each place of a round equally often
FULL_ROUNDS = 12
SAMPLE = 0.1  # the sampled side's ParentBased(TraceIdRatioBased(SAMPLE)), both processes
# The sides of a round: no metrics; --metrics-listen and nobody scrapes (what metrics cost
# by themselves: the counters, the binlog's row counting); scraped every SCRAPE_INTERVAL_S;
# scraped, and tracing on (server and subscribers)
SIDES = {
    "off": "off",
    "listening": "on, not scraped",
    "on": "on",
    "traced": "metrics and tracing on",
    "sampled": f"metrics and tracing on, {SAMPLE:.0%} sampled",
    "control": "off, again",  # the same as off: what the method shows for no difference
}
# With --full each run delivers this many messages (quick: the throughput runs' size): runs
# of several seconds, at the rate the engine keeps up, not its first second.
FULL_MESSAGES = 200_000
SCRAPE_INTERVAL_S = 0.2  # Prometheus scrapes every 15 s to 1 min: this is far harsher
TARGET_RATIO = 0.97


@dataclass
class MetricsCost:
    off_msgs_s: float
    on_msgs_s: float
    ratio: float  # the median of the rounds' on / off
    scrapes: int
    off_runs: list[float]
    on_runs: list[float]
    listening_msgs_s: float = 0.0  # --metrics-listen, never scraped
    listening_ratio: float = 0.0  # the median of the rounds' listening / off
    listening_ratio_runs: list[float] = field(default_factory=list)
    sampled_ratio: float = 0.0  # the median of the rounds' sampled / off
    sampled_ratio_runs: list[float] = field(default_factory=list)
    control_ratio: float = 0.0  # the median of the rounds' control (off again) / off
    control_ratio_runs: list[float] = field(default_factory=list)
    traced_msgs_s: float = 0.0  # metrics and tracing on
    tracing_ratio: float = 0.0  # the median of the rounds' traced / off
    ratio_runs: list[float] = field(default_factory=list)  # each round's on / off
    tracing_ratio_runs: list[float] = field(default_factory=list)  # each round's traced / off
    traced_runs: list[float] = field(default_factory=list)
    server_spans: dict[str, int] = field(default_factory=dict)  # by operation, traced runs
    client_spans: int = 0  # consumer spans of the traced runs
    traced_messages: int = 0  # messages of the traced runs
    # CPU microseconds a message by process class (server, subscribers, ...) per side (off,
    # on, traced): the median of its runs. What tracing costs shows here even when the
    # machine's other work moves the throughput of single runs far more.
    cpu_us_per_msg: dict[str, dict[str, float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Scraper:
    """GET /metrics every SCRAPE_INTERVAL_S on a thread until stopped; counts the answers
    and remembers the first failure."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.scrapes = 0
        self.with_table = 0
        self.failure = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-scraper")

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SCRAPE_INTERVAL_S):
            try:
                with urllib.request.urlopen(self.url, timeout=10) as answer:
                    text = answer.read().decode()
                if "msgtable_lease_holder{" not in text:
                    raise BenchError("no msgtable_lease_holder sample")
                self.scrapes += 1
                # the run's table, once the server discovered it
                self.with_table += "msgtable_messages_sent_total{" in text
            except Exception as exc:
                self.failure = self.failure or f"{type(exc).__name__}: {exc}"


def run(
    dsn: str,
    n: int,
    batch_size: int,
    subscribers: int,
    poller_interval_s: float,
    postpone_after_s: float | None,
    progress: Any,
    rounds: int = ROUNDS,
) -> MetricsCost:
    runs: dict[str, list[float]] = {side: [] for side in SIDES}
    server_spans: Counter[str] = Counter()
    client_spans = traced_messages = 0
    spans_dir = tempfile.TemporaryDirectory(prefix="msgtable-bench-spans-")
    scrapes = with_table = 0
    cpu: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for round_ in range(rounds):
        for side in rotated(list(SIDES), round_):
            metrics, scraped = side not in ("off", "control"), side in ("on", "traced", "sampled")
            tracing, sample = side in ("traced", "sampled"), SAMPLE if side == "sampled" else None
            port = free_port()
            extra = ("--metrics-listen", f"127.0.0.1:{port}") if metrics else ()
            module = "bench.traced" if tracing else "msgtable"
            spans_file = Path(spans_dir.name) / f"spans-{side}-{round_}.json"
            if tracing:
                extra = (*extra, "--spans-file", str(spans_file))
            if sample is not None:
                extra = (*extra, "--sample", str(sample))
            with ServerProcess(dsn, lease=False, extra=extra, module=module) as server:
                scraper = Scraper(f"http://127.0.0.1:{port}/metrics") if scraped else None
                with scraper or contextlib.nullcontext():
                    r = engine.run(
                        server, dsn, n, batch_size, subscribers, poller_interval_s,
                        postpone_after_s=postpone_after_s, traced=tracing, sample=sample,
                    )  # fmt: skip
                if scraper is not None:
                    if scraper.failure:
                        raise BenchError(f"metrics: a scrape failed: {scraper.failure}")
                    scrapes += scraper.scrapes
                    with_table += scraper.with_table
            runs[side].append(r.msgs_s)
            if side == "traced":  # the server wrote its spans as it stopped
                server_spans.update(json.loads(spans_file.read_text()))
                client_spans += r.spans
                traced_messages += r.messages
            cpu[side].append(r.cpu_per_msg())
            progress(f"metrics {SIDES[side]}: {r.msgs_s:,.0f} msgs/s ({r.cpu_note()})")
    if not with_table:
        raise BenchError(f"metrics: none of {scrapes} scrapes showed the run's table")
    spans_dir.cleanup()
    if not (server_spans["send"] and server_spans["ack"] and client_spans):
        raise BenchError(
            f"metrics: tracing on but spans missing (server {dict(server_spans)}, "
            f"subscribers {client_spans})"
        )
    off, on, traced = runs["off"], runs["on"], runs["traced"]
    listening_ratios = [a / b for a, b in zip(runs["listening"], off, strict=True)]
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    tracing_ratios = [a / b for a, b in zip(traced, off, strict=True)]
    sampled_ratios = [a / b for a, b in zip(runs["sampled"], off, strict=True)]
    control_ratios = [a / b for a, b in zip(runs["control"], off, strict=True)]
    return MetricsCost(
        off_msgs_s=max(off),
        on_msgs_s=max(on),
        ratio=statistics.median(ratios),
        scrapes=scrapes,
        off_runs=off,
        on_runs=on,
        listening_msgs_s=max(runs["listening"]),
        listening_ratio=statistics.median(listening_ratios),
        listening_ratio_runs=listening_ratios,
        traced_msgs_s=max(traced),
        tracing_ratio=statistics.median(tracing_ratios),
        sampled_ratio=statistics.median(sampled_ratios),
        sampled_ratio_runs=sampled_ratios,
        control_ratio=statistics.median(control_ratios),
        control_ratio_runs=control_ratios,
        ratio_runs=ratios,
        tracing_ratio_runs=tracing_ratios,
        traced_runs=traced,
        server_spans=dict(server_spans),
        client_spans=client_spans,
        traced_messages=traced_messages,
        cpu_us_per_msg={side: _median(runs) for side, runs in cpu.items()},
    )


def rotated(sides: list[str], round_: int) -> list[str]:
    """The order of a round's runs: ``sides`` rotated by ``round_`` places (over as many
    rounds as sides, each side runs in each place once)."""
    k = round_ % len(sides)
    return sides[k:] + sides[:k]


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per process class, the median CPU microseconds a message of these runs took."""
    return {k: statistics.median(r[k] for r in runs if k in r) for k in runs[0]} if runs else {}
