"""Server memory with a full cache: RSS of an idle server, RSS with every cache full, and the
bytes each cached message costs above the idle server.

A server of its own (``msgtable serve`` subprocess, so nothing else lives in it) serves
TABLES message tables with vt_cache_size CACHE_SIZE, each holding ROWS_PER_TABLE due rows.
The idle RSS (base) is taken once every table is loaded. Then one subscriber per table
subscribes and reads nothing, and ListTables is watched until the cached counts are steady;
then the RSS is taken again: bytes per cached message = (full - base) / cached messages
(about TABLES x CACHE_SIZE).

A subscriber that does not read does not keep the cache full by itself: the server's stream
hands batches to gRPC, which buffers them without limit, so the sender empties the cache into
the transport (measured: 12,000 of 12,000 rows sent to a subscriber that never read). So
before anyone subscribes the benchmark holds every row locked (SELECT ... FOR UPDATE in an
open transaction): the poller's plain SELECT still reads them into the cache, while the
sender's first claim waits on the row locks, and the cache stays full. The lock is released
(rolled back) once the RSS is taken.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from bench.database import bulk_insert, connect, create_table, message_comment
from bench.errors import BenchError
from bench.processes import ServerProcess, Workers, report

TABLES = 10
CACHE_SIZE = 10_000
ROWS_PER_TABLE = 12_000  # more than the cache holds: the cache fills, and more rows wait
BATCH_SIZE = 10
POLLER_INTERVAL_S = 30  # the documented default; a subscriber's arrival polls at once
STEADY_S = 1.5
FILL_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class MemoryResult:
    base_mb: float
    full_mb: float
    cached: int
    in_flight: int

    @property
    def bytes_per_message(self) -> float:
        return (self.full_mb - self.base_mb) * (1 << 20) / max(1, self.cached)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rss_base_mb": round(self.base_mb, 1),
            "rss_mb": round(self.full_mb, 1),
            "cached_messages": self.cached,
            "in_flight_messages": self.in_flight,
            "bytes_per_cached_msg": round(self.bytes_per_message),
        }


@dataclass(frozen=True)
class HolderSpec:
    address: str
    tables: tuple[str, ...]


def holder_worker(spec: HolderSpec, name: str, ready: Any, go: Any, results: Any) -> None:
    """Subscribe to every table and read nothing until ``go`` (here: leave) is set."""

    def work() -> dict[str, Any]:
        from msgtable.client import Client

        with Client(spec.address, timeout_s=30) as client:
            subs = [client.subscribe(t) for t in spec.tables]
            ready.put(name)
            go.wait()
            for sub in subs:
                sub.close()
        return {}

    report(name, results, work)


def run(
    dsn: str,
    *,
    postpone_after_s: float | None,
    tables: int = TABLES,
    cache_size: int = CACHE_SIZE,
    rows_per_table: int = ROWS_PER_TABLE,
) -> MemoryResult:
    """Measure on the (empty, dedicated) database ``dsn`` with ``tables`` tables of
    ``rows_per_table`` rows and vt_cache_size ``cache_size``; they get the run's
    ``postpone_after_s``."""
    from msgtable.client import Client

    names = tuple(f"mem_{i}" for i in range(tables))
    comment = message_comment(
        BATCH_SIZE, POLLER_INTERVAL_S, postpone_after_s=postpone_after_s, cache_size=cache_size
    )
    for t in names:
        create_table(dsn, t, comment)
        bulk_insert(dsn, t, rows_per_table)
    with ServerProcess(dsn) as server, Client(server.address, timeout_s=30) as client:
        deadline = time.monotonic() + FILL_TIMEOUT_S
        while sum(1 for t in client.list_tables() if t.name in names and t.loaded) < tables:
            if time.monotonic() > deadline:
                raise BenchError("memory: the server did not load the tables in time")
            time.sleep(0.2)
        time.sleep(0.5)
        base = server.rss_mb()
        lock = connect(dsn)
        try:
            with lock.cursor() as cur:
                cur.execute("begin")
                for t in names:
                    cur.execute(f"select count(*) from (select id from {t} for update) s")
            with Workers() as workers:
                workers.start("holder", holder_worker, HolderSpec(server.address, names))
                workers.wait_ready()
                cached, in_flight = _steady_cache(client, names, tables * cache_size // 2)
                full = server.rss_mb()
                lock.rollback()
                workers.go.set()
                workers.collect(30)
        finally:
            lock.close()
    return MemoryResult(base, full, cached, in_flight)


def _steady_cache(client: Any, tables: tuple[str, ...], at_least: int) -> tuple[int, int]:
    """Wait until the tables' cached counts stop moving (and hold ``at_least``: mostly full)."""
    deadline = time.monotonic() + FILL_TIMEOUT_S
    last: tuple[int, ...] = ()
    since = time.monotonic()
    while True:
        status = [t for t in client.list_tables() if t.name in tables]
        counts = tuple(t.cached for t in status)
        if counts != last:
            last, since = counts, time.monotonic()
        elif time.monotonic() - since >= STEADY_S and sum(counts) >= at_least:
            return sum(counts), sum(t.in_flight for t in status)
        if time.monotonic() > deadline:
            raise BenchError(f"memory: the caches did not settle (cached {counts})")
        time.sleep(0.1)
