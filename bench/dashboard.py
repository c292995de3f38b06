"""How fast the dashboard answers (msgtable.dashboard) with TABLES message tables: a server
started as a user starts it (``msgtable serve --http``), each table with a few messages
sent and some in flight to one subscriber, then REQUESTS GETs of the page (``/``) and of
its data (``/api/state``, what the page polls every 2 s) one after another over keep-alive
connections (the ``dashboard`` section of ``python -m bench.run``; JSON keys
``dashboard_page_ms`` and ``dashboard_api_ms``, the median, and their p99s; target: at
most TARGET_MS each). Those polls carry the samples since the page's last one; the first
load of a page carries the whole hour: ``dashboard_api_hour_ms`` times that, in this process
(a dashboard on its own engine, its history filled with a full hour of samples of the
TABLES tables), over HTTP too, with the history's memory (``history_bytes``).

Every answer is checked: 200, and the state lists all TABLES tables.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import urllib3

from bench.database import create_table, execute, message_comment
from bench.errors import BenchError
from bench.metrics import free_port
from bench.processes import ServerProcess

TABLES = 100
ROWS_PER_TABLE = 20
REQUESTS = {"quick": 100, "full": 400}
TARGET_MS = 300.0


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

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()}


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
    with ServerProcess(dsn, lease=False, extra=("--http", f"127.0.0.1:{port}")) as server:
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
            subscription.close()
        finally:
            client.close()
            http.clear()
    hour, hour_bytes, history_bytes = _first_loads(dsn, max(10, n // 5))
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
    )
    progress(
        f"dashboard ({TABLES} tables): page {result.page_ms:.1f} ms (p99 "
        f"{result.page_p99_ms:.1f}), state {result.api_ms:.1f} ms (p99 {result.api_p99_ms:.1f}), "
        f"{size:,} bytes; first load with an hour of history {result.hour_ms:.1f} ms (p99 "
        f"{result.hour_p99_ms:.1f}), {hour_bytes:,} bytes; history {history_bytes:,} bytes"
    )
    return result


def _first_loads(dsn: str, n: int) -> tuple[list[float], int, int]:
    """GET /api/state without ``after`` ``n`` times from a dashboard whose history holds a
    full hour of samples of every table; (the times in ms, the answer's size, the history's
    bytes)."""
    import dataclasses

    from msgtable.dashboard import DashboardApi, DashboardServer, RateHistory
    from msgtable.engine import MessageEngine

    engine = MessageEngine.from_dsn(dsn, capture=False)
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
        return times, size, history_bytes
    finally:
        engine.close()
