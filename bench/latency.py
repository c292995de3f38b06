"""Delivery latency: an INSERT's commit -> a subscriber holds the message.

A paced producer process inserts single rows (one autocommit INSERT each) at a steady
RATE_MSGS_S and notes each row's commit time (when the INSERT returned); one subscriber
process notes when each message arrives (and acks every batch, as a worker would). Latency is
arrival minus commit, per message; the figures are its 50th and 99th percentiles.

The engine only polls today: a row waits for the next poll (every vt_poller_interval; the
table here uses a short one, reported with the figures), then for its claim and the stream.
Binlog-based instant delivery is a later issue and should bring p50 down to a few ms.
"""

from __future__ import annotations

import contextlib
import time
from array import array
from dataclasses import dataclass
from typing import Any

import pymysql

from bench.common import (
    PAYLOAD,
    BenchError,
    ServerProcess,
    Workers,
    connect,
    create_table,
    execute,
    message_comment,
    percentile,
    report,
)

RATE_MSGS_S = 1000
BATCH_SIZE = 100


@dataclass(frozen=True)
class LatencyResult:
    messages: int
    rate_msgs_s: float  # the rate the producer achieved
    poller_interval_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "rate_msgs_s": round(self.rate_msgs_s),
            "poller_interval_s": self.poller_interval_s,
            "p50_ms": round(self.p50_ms, 2),
            "p99_ms": round(self.p99_ms, 2),
            "max_ms": round(self.max_ms, 2),
        }


@dataclass(frozen=True)
class PacedSpec:
    dsn: str
    table: str
    n: int
    rate_msgs_s: float


def paced_producer_worker(spec: PacedSpec, name: str, ready: Any, go: Any, results: Any) -> None:
    """Insert one row at a time, on schedule; note when each INSERT committed."""

    def work() -> dict[str, Any]:
        literal = "'" + pymysql.converters.escape_string(PAYLOAD) + "'"
        committed = array("d", bytes(8 * spec.n))
        with contextlib.closing(connect(spec.dsn)) as conn, conn.cursor() as cur:
            ready.put(name)
            go.wait()
            start = time.monotonic()
            for i in range(spec.n):
                due = start + i / spec.rate_msgs_s
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                cur.execute(f"insert into {spec.table}(id, message) values ({i}, {literal})")
                committed[i] = time.monotonic()
            end = time.monotonic()
        return {"committed": committed.tobytes(), "start": start, "end": end}

    report(name, results, work)


@dataclass(frozen=True)
class ReceiverSpec:
    address: str
    table: str
    n: int


def receiver_worker(spec: ReceiverSpec, name: str, ready: Any, go: Any, results: Any) -> None:
    """Subscribe, note each message's arrival, ack each batch, until all ``n`` arrived."""

    def work() -> dict[str, Any]:
        from msgtable.client import Client

        arrived = array("d", bytes(8 * spec.n))
        seen = 0
        with Client(spec.address, timeout_s=30) as client, client.subscribe(spec.table) as sub:
            ready.put(name)
            for batch in sub.batches():
                now = time.monotonic()
                for m in batch:
                    arrived[int(m.id)] = now  # type: ignore[call-overload]
                seen += len(batch)
                sub.ack(batch)
                if seen >= spec.n:
                    break
        return {"arrived": arrived.tobytes(), "seen": seen}

    report(name, results, work)


def run(server: ServerProcess, dsn: str, seconds: float, poller_interval_s: float) -> LatencyResult:
    """Latency at RATE_MSGS_S for ``seconds``, on a table polled every poller_interval_s."""
    table = "latency"
    n = round(RATE_MSGS_S * seconds)
    create_table(dsn, table, message_comment(BATCH_SIZE, poller_interval_s))
    try:
        with Workers() as workers:
            workers.start("receiver", receiver_worker, ReceiverSpec(server.address, table, n))
            workers.start("producer", paced_producer_worker, PacedSpec(dsn, table, n, RATE_MSGS_S))
            workers.wait_ready()
            workers.go.set()
            try:
                results = workers.collect(seconds * 3 + 60)
            except BenchError:
                server.check_alive()
                raise
    finally:
        execute(dsn, f"drop table if exists {table}")
    committed = array("d")
    committed.frombytes(results["producer"]["committed"])
    arrived = array("d")
    arrived.frombytes(results["receiver"]["arrived"])
    if results["receiver"]["seen"] != n or any(t == 0 for t in arrived):
        raise BenchError(f"latency: {results['receiver']['seen']} of {n} messages arrived")
    latencies = sorted((a - c) * 1000 for a, c in zip(arrived, committed, strict=True))
    producer = results["producer"]
    return LatencyResult(
        messages=n,
        rate_msgs_s=n / (producer["end"] - producer["start"]),
        poller_interval_s=poller_interval_s,
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        max_ms=latencies[-1],
    )
