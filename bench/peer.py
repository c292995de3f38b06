"""The peer: kombu's SQLAlchemy transport (Celery's SQL broker) on the same server.

A publisher process publishes N messages with the same payload through kombu
(``sqla+mysql+pymysql://...``, one message per INSERT and commit, as kombu does) while one
consumer process takes them (kombu's SELECT ... FOR UPDATE of the oldest visible row, then an
UPDATE) and acks each. The figure is N over the time from the first publish to the last ack.

One consumer, because more only queue on the row lock of the same oldest row (measured here:
4 consumers were slower than 1). kombu's virtual transport sleeps ``polling_interval`` (1 s
by default) whenever the queue is empty; the consumer sets it to POLLING_INTERVAL_S so an
empty moment does not stall the run. kombu is slow, so N is small and the run has a
deadline: if it passes, the figure is what was acked by then (and says so).
"""

from __future__ import annotations

import importlib
import queue
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import make_url

from bench.database import PAYLOAD
from bench.measure import Throughput
from bench.processes import Workers, report

POLLING_INTERVAL_S = 0.01
QUEUE = "bench"


def kombu_available() -> bool:
    try:
        import kombu  # noqa: F401
    except ImportError:
        return False
    return True


def kombu_connection() -> Any:
    """kombu.Connection (kombu ships no type hints)."""
    return importlib.import_module("kombu").Connection


def kombu_url(dsn: str) -> str:
    """The kombu transport URL for a SQLAlchemy DSN: sqla+mysql+pymysql://..."""
    url = make_url(dsn)
    if url.drivername in ("mysql", "mariadb"):
        url = url.set(drivername=f"{url.drivername}+pymysql")
    return "sqla+" + url.render_as_string(hide_password=False)


@dataclass(frozen=True)
class PeerSpec:
    url: str
    n: int
    max_seconds: float  # counted from go


def publisher_worker(spec: PeerSpec, name: str, ready: Any, go: Any, results: Any) -> None:
    def work() -> dict[str, Any]:
        Connection = kombu_connection()

        with Connection(spec.url) as conn:
            q = conn.SimpleQueue(QUEUE)
            ready.put(name)
            go.wait()
            start = time.monotonic()
            deadline = start + spec.max_seconds
            published = 0
            for _ in range(spec.n):
                if time.monotonic() > deadline:
                    break
                q.put(PAYLOAD)
                published += 1
            end = time.monotonic()
            q.close()
        return {"start": start, "end": end, "published": published}

    report(name, results, work)


def consumer_worker(spec: PeerSpec, name: str, ready: Any, go: Any, results: Any) -> None:
    def work() -> dict[str, Any]:
        Connection = kombu_connection()

        acked = 0
        last = 0.0
        with Connection(spec.url) as conn:
            conn.transport.polling_interval = POLLING_INTERVAL_S
            q = conn.SimpleQueue(QUEUE)
            ready.put(name)
            go.wait()
            deadline = time.monotonic() + spec.max_seconds
            while acked < spec.n and time.monotonic() < deadline:
                try:
                    message = q.get(timeout=0.2)
                except queue.Empty:
                    continue
                body = message.payload
                if (body.decode() if isinstance(body, bytes) else body) != PAYLOAD:
                    raise AssertionError(f"unexpected body {body!r}")
                message.ack()
                acked += 1
                last = time.monotonic()
            q.close()
        return {"acked": acked, "last": last}

    report(name, results, work)


def run(dsn: str, n: int, max_seconds: float) -> Throughput:
    """Publish, consume and ack ``n`` messages through kombu on the database ``dsn``."""
    Connection = kombu_connection()

    url = kombu_url(dsn)
    with Connection(url) as conn:  # kombu creates its tables here, not racing in two workers
        q = conn.SimpleQueue(QUEUE)
        q.clear()
        q.close()
    with Workers() as workers:
        spec = PeerSpec(url, n, max_seconds)
        workers.start("consumer", consumer_worker, spec)
        workers.start("publisher", publisher_worker, spec)
        workers.wait_ready()
        workers.go.set()
        results = workers.collect(max_seconds + 60)
    start = results["publisher"]["start"]
    acked = results["consumer"]["acked"]
    seconds = results["consumer"]["last"] - start
    note = "1 publisher, 1 consumer"
    if acked < n:
        note += f"; deadline: {acked} of {n} acked"
    return Throughput("kombu", 1, 1, acked, seconds, note=note)
