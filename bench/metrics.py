"""The cost of Prometheus metrics (msgtable.observe.metrics): msgtable at batch 100 with 4
subscribers on a server with ``--metrics-listen``, scraped every SCRAPE_INTERVAL_S over
HTTP, against the same run on a server without (the ``metrics`` section of
``python -m bench.run``; JSON keys ``metrics_off_msgs_s``, ``metrics_on_msgs_s`` and
``metrics_cost_ratio`` = on / off, target >= TARGET_RATIO). And the cost of tracing on top of
the metrics, each tracing side against the ``on`` side of the same round (metrics scraped, no
tracing): an SDK tracer provider (BatchSpanProcessor, an exporter that drops the spans:
bench.traced) in the server and in the subscribers' processes, sampling with the documented
default, ``msgtable.core.tracing.default_sampler()`` (one root span in ten, parent-based), the
configuration whose cost is judged (JSON ``sampled_tracing_cost_ratio`` = sampled / on,
target >= TARGET_RATIO, with ``sampled_tracing_cost_spread``; the rounds in
``metrics.tracing_vs_on``); the same with
every span recorded, reported without a target (``tracing_cost_ratio`` = traced / on). A
fourth side listens (``--metrics-listen``) and is never scraped: what the metrics cost by
themselves, without the scrapes (JSON ``metrics_listening_ratio``).
With --full each run delivers FULL_MESSAGES messages.

All are measured in the same run, in rounds of the sides (SIDES), on fresh servers (no lease
of their own: one at a time). Round r runs the sides rotated by r places, so over ROUNDS
(FULL_ROUNDS with --full; multiples of the number of sides) each side runs in each place of
a round equally often: a run's place (after a run that left the database purging, or first
after a pause) weighs alike on every side. A sixth side, ``control``, is the off side once
more: its ratio to off (JSON ``control_ratio``, and its rounds) is what the method itself
shows for no difference at all, the yardstick for the others' distance from 1. Each ratio is
the median over the rounds of that round's ratio (on / off, sampled / on of the same round):
a round's runs follow each other, and the median leaves out a round that other work on the
machine disturbed; ``ratio_runs``, ``tracing_ratio_runs`` and ``sampled_ratio_runs`` keep
each round's, the spread.
The ``*_msgs_s`` figures are each side's best run. The scrapes are checked: every one answered
200 with the server's families, and some had the run's table (a scrape before the server
discovered it has none).

The ratios are of the database's busy time (its CPU seconds a second of the run, read from
/proc), not of the messages a second: on this project's machine (a 2-core virtual machine)
the speed of the cores drifts by 20 % and more within minutes, and every process's CPU per
message rises and falls with it, so one run's throughput says as much about the minute it ran
in as about its side (the control's rounds spread 0.8 to 1.2). The database does the same
work for each message on every side (the same INSERTs, polls, claims and acks: no side
changes a statement), so its CPU per message is the speed of that minute, and its busy time
is the throughput in units of that speed: what a side's own extra CPU takes from the database
on a machine whose cores are all busy. The control shows what is left of the noise (its
rounds within a few per cent). The throughput ratios stay in the JSON (``*_raw``); without
the database's CPU (a database on another machine, MSGTABLE_TEST_DSN) the ratios are those.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import engine
from bench.errors import BenchError
from bench.measure import Throughput
from bench.processes import ServerProcess
from msgtable.core.tracing import DEFAULT_SAMPLE_RATIO

ROUNDS = 6  # a multiple of len(SIDES): each side in each place of a round equally often
FULL_ROUNDS = 18
SAMPLE = DEFAULT_SAMPLE_RATIO  # the sampled side: tracing.default_sampler(), both processes
# The sides of a round: no metrics; --metrics-listen and nobody scrapes (what metrics cost
# by themselves: the counters, the binlog's row counting); scraped every SCRAPE_INTERVAL_S;
# scraped, and tracing on (server and subscribers)
SIDES = {
    "off": "off",
    "listening": "on, not scraped",
    "on": "on",
    "traced": "metrics and tracing on",
    "sampled": f"metrics and tracing on, the default sampler ({SAMPLE:.0%} of roots)",
    "control": "off, again",  # the same as off: what the method shows for no difference
}
TRACING_SIDES = ("traced", "sampled")  # each against on (metrics, no tracing)
# With --full each run delivers this many messages (quick: the throughput runs' size): runs
# of several seconds, at the rate the engine keeps up, not its first second.
FULL_MESSAGES = 200_000
SCRAPE_INTERVAL_S = 0.2  # Prometheus scrapes every 15 s to 1 min: this is far harsher
TARGET_RATIO = 0.97


@dataclass
class Side:
    """One side's runs: messages a second, and each round's ratio to the off side of the same
    round, of throughput (raw) and of the database's busy time (db; see the docstring)."""

    msgs_s: list[float] = field(default_factory=list)
    raw_runs: list[float] = field(default_factory=list)
    db_runs: list[float] = field(default_factory=list)  # [] when the database is elsewhere

    @property
    def raw(self) -> float:
        return statistics.median(self.raw_runs) if self.raw_runs else float("nan")

    @property
    def db(self) -> float | None:
        return statistics.median(self.db_runs) if self.db_runs else None

    @property
    def ratio(self) -> float:
        """The figure judged: the database's busy time's when measured, else throughput's."""
        db = self.db
        return db if db is not None else self.raw

    @property
    def runs(self) -> list[float]:
        return self.db_runs or self.raw_runs

    def as_dict(self) -> dict[str, Any]:
        return {
            "ratio": round(self.ratio, 3),
            "runs": [round(r, 3) for r in self.runs],
            "raw": round(self.raw, 3),
            "raw_runs": [round(r, 3) for r in self.raw_runs],
            "msgs_s": [round(r) for r in self.msgs_s],
        }


@dataclass
class MetricsCost:
    sides: dict[str, Side]  # each against off
    scrapes: int
    normalized: bool  # ratios of the database's busy time (else of throughput)
    server_spans: dict[str, int] = field(default_factory=dict)  # by operation, traced runs
    client_spans: int = 0  # consumer spans of the traced runs
    traced_messages: int = 0  # messages of the traced runs
    # CPU microseconds a message by process class (database, server, subscribers, ...) per
    # side: the median of its runs (each moves with the machine's speed, see the docstring)
    cpu_us_per_msg: dict[str, dict[str, float]] = field(default_factory=dict)
    # the tracing sides (traced, sampled) against the on side of the same rounds: tracing's
    # own cost, beside the metrics
    tracing: dict[str, Side] = field(default_factory=dict)

    def _side(self, name: str) -> Side:
        return self.sides.get(name) or Side()

    def _tracing(self, name: str) -> Side:
        return self.tracing.get(name) or Side()

    # the figures the report names: each side's ratio to off (judged), its rounds, its best run
    @property
    def off_msgs_s(self) -> float:
        return max(self._side("off").msgs_s, default=0.0)

    @property
    def on_msgs_s(self) -> float:
        return max(self._side("on").msgs_s, default=0.0)

    @property
    def traced_msgs_s(self) -> float:
        return max(self._side("traced").msgs_s, default=0.0)

    @property
    def ratio(self) -> float:  # metrics on, scraped
        return self._side("on").ratio

    @property
    def ratio_runs(self) -> list[float]:
        return self._side("on").runs

    @property
    def listening_ratio(self) -> float:
        return self._side("listening").ratio

    @property
    def tracing_ratio(self) -> float:  # every span recorded / metrics alone (no target)
        return self._tracing("traced").ratio

    @property
    def tracing_ratio_runs(self) -> list[float]:
        return self._tracing("traced").runs

    @property
    def sampled_ratio(self) -> float:  # the default sampler / metrics alone (judged)
        return self._tracing("sampled").ratio

    @property
    def sampled_ratio_runs(self) -> list[float]:
        return self._tracing("sampled").runs

    def raw_ratio(self, name: str) -> float | None:
        """A side's median ratio of throughput: a tracing side's to on, another's to off."""
        side = self.tracing.get(name) or self.sides.get(name)
        return side.raw if side is not None else None

    @property
    def control_ratio(self) -> float:
        return self._side("control").ratio

    def as_dict(self) -> dict[str, Any]:
        return {
            "normalized": self.normalized,
            "scrapes": self.scrapes,
            "sides": {name: side.as_dict() for name, side in self.sides.items()},
            "tracing_vs_on": {name: side.as_dict() for name, side in self.tracing.items()},
            "server_spans": self.server_spans,
            "client_spans": self.client_spans,
            "traced_messages": self.traced_messages,
            "cpu_us_per_msg": self.cpu_us_per_msg,
        }


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
    db_pid: int | None = None,
) -> MetricsCost:
    """The sides in ``rounds`` rotated rounds; ``db_pid``: the database server's process
    (None: elsewhere; the ratios are then of throughput only)."""
    runs: dict[str, list[Throughput]] = {side: [] for side in SIDES}
    server_spans: Counter[str] = Counter()
    client_spans = traced_messages = 0
    spans_dir = tempfile.TemporaryDirectory(prefix="msgtable-bench-spans-")
    scrapes = with_table = 0
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
                        db_pid=db_pid,
                    )  # fmt: skip
                if scraper is not None:
                    if scraper.failure:
                        raise BenchError(f"metrics: a scrape failed: {scraper.failure}")
                    scrapes += scraper.scrapes
                    with_table += scraper.with_table
            runs[side].append(r)
            if side == "traced":  # the server wrote its spans as it stopped
                server_spans.update(json.loads(spans_file.read_text()))
                client_spans += r.spans
                traced_messages += r.messages
            progress(f"metrics {SIDES[side]}: {r.msgs_s:,.0f} msgs/s ({r.cpu_note()})")
    if not with_table:
        raise BenchError(f"metrics: none of {scrapes} scrapes showed the run's table")
    spans_dir.cleanup()
    if not (server_spans["send"] and server_spans["ack"] and client_spans):
        raise BenchError(
            f"metrics: tracing on but spans missing (server {dict(server_spans)}, "
            f"subscribers {client_spans})"
        )
    normalized = all(db_busy(r) is not None for side in runs.values() for r in side)
    cost = MetricsCost(
        sides={
            side: compared(side_runs, runs["off"], normalized) for side, side_runs in runs.items()
        },
        scrapes=scrapes,
        normalized=normalized,
        server_spans=dict(server_spans),
        client_spans=client_spans,
        traced_messages=traced_messages,
        cpu_us_per_msg={side: _median([r.cpu_per_msg() for r in rs]) for side, rs in runs.items()},
        tracing={side: compared(runs[side], runs["on"], normalized) for side in TRACING_SIDES},
    )
    for side, what in (("sampled", f"target >= {TARGET_RATIO}"), ("traced", "no target")):
        t = cost.tracing[side]
        progress(
            f"metrics: {SIDES[side]} / metrics alone: median {t.ratio:.3f} "
            f"(rounds {min(t.runs):.3f} to {max(t.runs):.3f}; throughput {t.raw:.3f}), {what}"
        )
    return cost


def db_busy(r: Throughput) -> float | None:
    """The database's busy time in a run: its CPU seconds a second (None: not measured)."""
    cpu = r.cpu_s.get("database")
    return cpu / r.seconds if cpu and r.seconds > 0 else None


def compared(side: list[Throughput], off: list[Throughput], normalized: bool) -> Side:
    """A side's runs against the off side's of the same rounds."""
    out = Side(msgs_s=[r.msgs_s for r in side])
    for a, b in zip(side, off, strict=True):
        out.raw_runs.append(a.msgs_s / b.msgs_s)
        busy_a, busy_b = db_busy(a), db_busy(b)
        if normalized and busy_a is not None and busy_b is not None:
            out.db_runs.append(busy_a / busy_b)
    return out


def rotated(sides: list[str], round_: int) -> list[str]:
    """The order of a round's runs: ``sides`` rotated by ``round_`` places (over as many
    rounds as sides, each side runs in each place once)."""
    k = round_ % len(sides)
    return sides[k:] + sides[:k]


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per process class, the median CPU microseconds a message of these runs took."""
    return {k: statistics.median(r[k] for r in runs if k in r) for k in runs[0]} if runs else {}
