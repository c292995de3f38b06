"""How fast the dashboard answers (msgtable.observe.dashboard) with TABLES message tables: a server
started as a user starts it (``msgtable serve --http``), each table with a few messages
sent and some in flight to one subscriber, then REQUESTS GETs of the page (``/``) and of
its data (``/api/state``, what the page polls every 2 s) one after another over keep-alive
connections (the ``dashboard`` section of ``python -m bench.run``; JSON keys
``dashboard_page_ms`` and ``dashboard_api_ms``, the median, and their p99s; target: at
most TARGET_MS each). Those polls carry the samples since the page's last one; the first
load of a page carries the whole hour: ``dashboard_api_hour_ms`` times that, in this process
(a dashboard on its own engine, its history filled with a full hour of samples of the
TABLES tables), over HTTP too, with the history's memory (``history_bytes``).

The same server serves ``/metrics`` (``--metrics-listen``): SCRAPES GETs of it as
Prometheus makes them (a keep-alive connection, gzip accepted), each checked (200, every
table labelled): the server's CPU a scrape from /proc (JSON ``metrics_scrape_cpu_ms``) and
the answer's time. And in this process, on the same engine as the first loads: the families
rendered by msgtable.observe.exposition against prometheus_client's generate_latest over the same
families, alternating (``exposition_ms``, ``exposition_baseline_ms``; target
``exposition_speedup`` = baseline / msgtable's >= TARGET_SPEEDUP).

Every answer is checked: 200, and the state lists all TABLES tables.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import urllib3

from bench import smoke
from bench.database import create_table, execute, message_comment
from bench.errors import BenchError
from bench.measure import cpu_seconds
from bench.metrics import free_port
from bench.processes import ServerProcess

TABLES = 100
ROWS_PER_TABLE = 20
REQUESTS = {"quick": 100, "full": 400, "smoke": smoke.DASHBOARD["requests"]}
TARGET_MS = 300.0
SCRAPES = {"quick": 30, "full": 100, "smoke": smoke.DASHBOARD["scrapes"]}
RENDERS = {"quick": 10, "full": 30, "smoke": smoke.DASHBOARD["renders"]}
TARGET_SPEEDUP = 3.0


@dataclass
class DashboardResult:
    tables: int
    requests: int
    page_ms: float  # median
    page_p99_ms: float
    api_ms: float
    api_p99_ms: float
    state_bytes: int
    hour_ms: float  # median GET /api/state with a full hour of history (the first load)
    hour_p99_ms: float
    hour_bytes: int
    history_bytes: int  # the history's arrays for TABLES tables over the hour
    scrapes: int = 0
    scrape_cpu_ms: float = 0.0  # the server's CPU a GET /metrics (keep-alive, gzip)
    scrape_ms: float = 0.0  # median answer time
    scrape_bytes: int = 0  # the text, before gzip
    exposition_ms: float = 0.0  # median: the families rendered by msgtable.observe.exposition
    exposition_baseline_ms: float = 0.0  # median: the same by prometheus_client

    @property
    def exposition_speedup(self) -> float:
        """prometheus_client's rendering time / msgtable.observe.exposition's, the same families."""
        return self.exposition_baseline_ms / self.exposition_ms if self.exposition_ms else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()}
        out["exposition_speedup"] = round(self.exposition_speedup, 2)
        return out


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def run(dsn: str, mode: str, progress: Any) -> DashboardResult:
    comment = message_comment(10, 30, postpone_after_s=None)
    for i in range(TABLES):
        create_table(dsn, f"dash_{i:03d}", comment)
    rows = ",".join(f"({j}, 'm')" for j in range(ROWS_PER_TABLE))
    execute(dsn, *(f"insert into dash_{i:03d}(id, message) values {rows}" for i in range(TABLES)))
    port = free_port()
    n = REQUESTS[mode]
    metrics_port = free_port()
    extra = ("--http", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}")
    with ServerProcess(dsn, lease=False, extra=extra) as server:
        base = f"http://127.0.0.1:{port}"
        http = urllib3.PoolManager(maxsize=1, retries=False, timeout=30)
        from msgtable.client import Client

        client = Client(server.address)
        try:
            subscription = client.subscribe("dash_000")
            batch = next(iter(subscription.batches()))  # some in flight, for a real page
            if not batch:
                raise BenchError("dashboard: no message sent to the subscriber")
            deadline = time.monotonic() + 60
            while True:
                answer = http.request("GET", base + "/api/state")
                if answer.status == 200 and len(answer.json()["tables"]) >= TABLES:
                    break
                if time.monotonic() > deadline:
                    raise BenchError(f"dashboard: the state never listed {TABLES} tables")
                time.sleep(0.2)
            page, api = [], []
            size = 0
            for _ in range(n):
                began = time.perf_counter()
                answer = http.request("GET", base + "/")
                page.append((time.perf_counter() - began) * 1000)
                if answer.status != 200 or b"dashboard.js" not in answer.data:
                    raise BenchError(f"dashboard: GET / answered {answer.status}")
                began = time.perf_counter()
                answer = http.request("GET", base + "/api/state")
                api.append((time.perf_counter() - began) * 1000)
                state = json.loads(answer.data)
                if answer.status != 200 or len(state["tables"]) != TABLES:
                    raise BenchError(f"dashboard: GET /api/state answered {answer.status}")
                size = len(answer.data)
            scrape = _scrapes(server.pid, f"http://127.0.0.1:{metrics_port}/metrics", mode)
            subscription.close()
        finally:
            client.close()
            http.clear()
    hour, hour_bytes, history_bytes, renders = _first_loads(dsn, max(10, n // 5), mode)
    result = DashboardResult(
        TABLES,
        n,
        statistics.median(page),
        _p99(page),
        statistics.median(api),
        _p99(api),
        size,
        statistics.median(hour),
        _p99(hour),
        hour_bytes,
        history_bytes,
        *scrape,
        *renders,
    )
    progress(
        f"dashboard ({TABLES} tables): page {result.page_ms:.1f} ms (p99 "
        f"{result.page_p99_ms:.1f}), state {result.api_ms:.1f} ms (p99 {result.api_p99_ms:.1f}), "
        f"{size:,} bytes; first load with an hour of history {result.hour_ms:.1f} ms (p99 "
        f"{result.hour_p99_ms:.1f}), {hour_bytes:,} bytes; history {history_bytes:,} bytes; "
        f"/metrics {result.scrape_cpu_ms:.1f} ms of the server's CPU a scrape "
        f"({result.scrape_ms:.1f} ms, {result.scrape_bytes:,} bytes); the families "
        f"rendered in {result.exposition_ms:.1f} ms, by prometheus_client in "
        f"{result.exposition_baseline_ms:.1f} ms ({result.exposition_speedup:.1f}x)"
    )
    return result


def _scrapes(pid: int, url: str, mode: str) -> tuple[int, float, float, int]:
    """SCRAPES GETs of /metrics as Prometheus makes them: (how many, the server's CPU ms a
    scrape, the median answer ms, the text's bytes)."""
    import gzip

    http = urllib3.PoolManager(maxsize=1, retries=False, timeout=30)
    n = SCRAPES[mode]
    try:
        http.request("GET", url, headers={"Accept-Encoding": "gzip"})  # connected
        times, text = [], b""
        cpu = cpu_seconds(pid)
        for _ in range(n):
            began = time.perf_counter()
            answer = http.request(
                "GET", url, headers={"Accept-Encoding": "gzip"}, decode_content=False
            )
            times.append((time.perf_counter() - began) * 1000)
            if answer.status != 200 or answer.headers.get("Content-Encoding") != "gzip":
                raise BenchError(f"dashboard: GET /metrics answered {answer.status}")
            text = gzip.decompress(answer.data)
        cpu = cpu_seconds(pid) - cpu
    finally:
        http.clear()
    labelled = {f"dash_{i:03d}" for i in range(TABLES)}
    missing = [t for t in sorted(labelled) if f'table="{t}"'.encode() not in text]
    if missing:
        raise BenchError(f"dashboard: /metrics has no samples of {len(missing)} tables")
    return n, cpu / n * 1000, statistics.median(times), len(text)


def _first_loads(dsn: str, n: int, mode: str) -> tuple[list[float], int, int, tuple[float, float]]:
    """GET /api/state without ``after`` ``n`` times from a dashboard whose history holds a
    full hour of samples of every table; (the times in ms, the answer's size, the history's
    bytes, and the families' rendering: msgtable's and prometheus_client's median ms)."""
    import dataclasses

    from msgtable.features.assembly import assemble_dsn
    from msgtable.observe.dashboard import DashboardApi, DashboardServer, RateHistory

    engine = assemble_dsn(dsn, capture=False)
    engine.open()
    history = RateHistory()
    try:
        statuses = [s for s, _ in engine.live_statuses()]
        if len(statuses) < TABLES:
            raise BenchError(f"dashboard: the engine loaded {len(statuses)} of {TABLES} tables")
        began = time.time() - history.interval_s * history.slots
        for i in range(history.slots):
            history.sample(
                began + i * history.interval_s,
                [dataclasses.replace(s, sent=7 * i, acked=5 * i, released=i) for s in statuses],
            )
        history_bytes = history.memory_bytes()
        d = DashboardServer(DashboardApi(engine, history), "127.0.0.1:0")
        d.open()
        http = urllib3.PoolManager(maxsize=1, retries=False, timeout=30)
        try:
            times, size = [], 0
            for _ in range(n):
                began_s = time.perf_counter()
                answer = http.request("GET", d.url + "api/state")
                times.append((time.perf_counter() - began_s) * 1000)
                state = json.loads(answer.data)
                if answer.status != 200 or len(state["history"]["times"]) < history.slots:
                    raise BenchError(f"dashboard: a first load answered {answer.status}")
                size = len(answer.data)
        finally:
            http.clear()
            d.close()
        return times, size, history_bytes, _renders(engine, RENDERS[mode])
    finally:
        engine.close()


def _renders(engine: Any, n: int) -> tuple[float, float]:
    """The engine's families as /metrics renders them (msgtable.observe.exposition) and as
    prometheus_client's generate_latest does, alternating ``n`` times: the median ms of
    each; the two texts must be the same."""
    from prometheus_client import generate_latest

    from msgtable.observe.metrics import EngineCollector, registry_for

    collector, registry = EngineCollector(engine), registry_for(engine)
    ours, theirs = [], []
    for _ in range(n):
        began = time.perf_counter()
        text = collector.exposition()
        ours.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        baseline = generate_latest(registry)
        theirs.append((time.perf_counter() - began) * 1000)
    if text.count(b"\n") != baseline.count(b"\n") or text.count(b"table=") < TABLES:
        raise BenchError("dashboard: the families rendered two ways differ")
    return statistics.median(ours), statistics.median(theirs)
