"""Delivery latency: an INSERT's commit -> a subscriber holds the message; and how late
messages with a future time_next arrive after it (on time).

A paced producer process inserts single rows (one autocommit INSERT each) at a steady
RATE_MSGS_S and notes each row's commit time (when the INSERT returned); one subscriber
process notes when each message arrives (and acks every batch, as a worker would). Latency is
arrival minus commit, per message; the figures are its 50th and 99th percentiles.

It runs twice in one bench: on a server that only polls (a row waits for the next poll, every
vt_poller_interval; the table here uses a short one, reported with the figures), and on a
second `msgtable serve --binlog`, which polls the same way but is told of each INSERT by the
binlog at once. The receiver acks with ack_async, as a latency-minded worker would: with one
waited-for MessageAck per message, the binlog path's one-message batches would leave it
behind the producer.

On time: one subscriber process starts and connects; then ON_TIME_MESSAGES rows are inserted
with time_next spread over ON_TIME_SPREAD_S, starting ON_TIME_LEAD_S from now, on a table
polled only every ON_TIME_POLLER_S; then the subscriber subscribes. Its first poll reads them
all ahead (they fall due before the next poll), so each must go out at its own time_next.
(The lead counts from the INSERT, not from the process's start: a process takes seconds to
start on a busy machine.) Lateness is arrival minus time_next (wall
clock, one machine); the target is a p99 of at most 50 ms.
"""

from __future__ import annotations

import contextlib
import time
from array import array
from dataclasses import dataclass
from typing import Any

import pymysql

from bench.database import PAYLOAD, connect, create_table, execute, message_comment
from bench.errors import BenchError
from bench.measure import percentile
from bench.processes import ServerProcess, Workers, report

RATE_MSGS_S = 1000
BATCH_SIZE = 100
ON_TIME_MESSAGES = 2000
ON_TIME_LEAD_S = 3.0  # the started subscriber must subscribe before the first is due
ON_TIME_SPREAD_S = 2.0
ON_TIME_POLLER_S = 10.0  # longer than lead + spread: only the first poll reads the rows


@dataclass(frozen=True)
class LatencyResult:
    messages: int
    rate_msgs_s: float  # the rate the producer achieved
    poller_interval_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    binlog: bool = False  # the server followed the binlog

    def as_dict(self) -> dict[str, Any]:
        return {
            "binlog": self.binlog,
            "messages": self.messages,
            "rate_msgs_s": round(self.rate_msgs_s),
            "poller_interval_s": self.poller_interval_s,
            "p50_ms": round(self.p50_ms, 2),
            "p99_ms": round(self.p99_ms, 2),
            "max_ms": round(self.max_ms, 2),
        }


@dataclass(frozen=True)
class OnTimeResult:
    messages: int
    poller_interval_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    earliest_ms: float  # the smallest lateness; below 0 a message went out early

    def as_dict(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "poller_interval_s": self.poller_interval_s,
            "late_p50_ms": round(self.p50_ms, 2),
            "late_p99_ms": round(self.p99_ms, 2),
            "late_max_ms": round(self.max_ms, 2),
            "earliest_ms": round(self.earliest_ms, 2),
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
    wall_clock: bool = False  # note arrivals in Unix time (else monotonic)
    ack_async: bool = False  # ack with ack_async (else a MessageAck per batch, waited for)
    subscribe_at_go: bool = False  # ready once connected; subscribe at go (else ready after)


def receiver_worker(spec: ReceiverSpec, name: str, ready: Any, go: Any, results: Any) -> None:
    """Subscribe, note each message's arrival, ack each batch, until all ``n`` arrived."""

    def work() -> dict[str, Any]:
        from msgtable.client import Client

        arrived = array("d", bytes(8 * spec.n))
        seen = 0
        with Client(spec.address, timeout_s=30) as client:
            if spec.subscribe_at_go:
                client.list_tables()  # connected: the subscribe at go takes one call
                ready.put(name)
                go.wait()
            # retry=False: a subscriber redirected to another server (the lease holder)
            # would measure that server, not the one under test
            with client.subscribe(spec.table, retry=False) as sub:
                subscribed = time.time()
                if not spec.subscribe_at_go:
                    ready.put(name)
                seen = _receive(spec, sub, arrived)
        return {"arrived": arrived.tobytes(), "seen": seen, "subscribed": subscribed}

    report(name, results, work)


def _receive(spec: ReceiverSpec, sub: Any, arrived: array[float]) -> int:
    """Note each message's arrival and ack each batch until all ``spec.n`` arrived."""
    seen = 0
    for batch in sub.batches():
        now = time.time() if spec.wall_clock else time.monotonic()
        for m in batch:
            arrived[int(m.id)] = now  # type: ignore[call-overload]
        seen += len(batch)
        if spec.ack_async:
            sub.ack_async(batch)
        else:
            sub.ack(batch)
        if seen >= spec.n:
            break
    sub.flush_acks(30)
    return seen


def arrivals(receiver: dict[str, Any], n: int, what: str) -> array[float]:
    """The receiver's arrival time of each message, by id; every one of ``n`` must be there."""
    arrived = array("d")
    arrived.frombytes(receiver["arrived"])
    if receiver["seen"] != n or any(t == 0 for t in arrived):
        raise BenchError(f"{what}: {receiver['seen']} of {n} messages arrived")
    return arrived


def run(
    server: ServerProcess,
    dsn: str,
    seconds: float,
    poller_interval_s: float,
    binlog: bool = False,
    *,
    postpone_after_s: float | None,
) -> LatencyResult:
    """Latency at RATE_MSGS_S for ``seconds``, on a table polled every poller_interval_s
    (``binlog``: the server follows the binlog, as the report says)."""
    table = "latency_binlog" if binlog else "latency"
    n = round(RATE_MSGS_S * seconds)
    comment = message_comment(BATCH_SIZE, poller_interval_s, postpone_after_s=postpone_after_s)
    create_table(dsn, table, comment)
    try:
        with Workers() as workers:
            spec = ReceiverSpec(server.address, table, n, ack_async=True)
            workers.start("receiver", receiver_worker, spec)
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
    arrived = arrivals(results["receiver"], n, "latency")
    latencies = sorted((a - c) * 1000 for a, c in zip(arrived, committed, strict=True))
    producer = results["producer"]
    return LatencyResult(
        messages=n,
        rate_msgs_s=n / (producer["end"] - producer["start"]),
        poller_interval_s=poller_interval_s,
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        max_ms=latencies[-1],
        binlog=binlog,
    )


def on_time(
    server: ServerProcess,
    dsn: str,
    *,
    postpone_after_s: float | None,
    n: int = ON_TIME_MESSAGES,
    spread_s: float = ON_TIME_SPREAD_S,
) -> OnTimeResult:
    """How late ``n`` messages with a future time_next, spread over ``spread_s``, arrive (see
    the module docstring)."""
    table = "on_time"
    comment = message_comment(BATCH_SIZE, ON_TIME_POLLER_S, postpone_after_s=postpone_after_s)
    create_table(dsn, table, comment)
    literal = "'" + pymysql.converters.escape_string(PAYLOAD) + "'"
    try:
        with Workers() as workers:
            spec = ReceiverSpec(
                server.address, table, n, wall_clock=True, ack_async=True, subscribe_at_go=True
            )
            workers.start("receiver", receiver_worker, spec)
            workers.wait_ready()  # started and connected: it subscribes at go
            first = time.time_ns() + round(ON_TIME_LEAD_S * 1e9)
            step = round(spread_s * 1e9 / n)
            due = [first + i * step for i in range(n)]
            rows = [f"({i}, {due[i]}, {literal})" for i in range(n)]
            execute(
                dsn,
                *(
                    f"insert into {table}(id, time_next, message) values "
                    + ",".join(rows[k : k + 500])
                    for k in range(0, n, 500)
                ),
            )
            workers.go.set()
            try:
                results = workers.collect(ON_TIME_LEAD_S + spread_s + 60)
            except BenchError:
                server.check_alive()
                raise
    finally:
        execute(dsn, f"drop table if exists {table}")
    if results["receiver"]["subscribed"] * 1e9 >= first:
        raise BenchError("on time: the subscriber subscribed after the first message was due")
    arrived = arrivals(results["receiver"], n, "on time")
    late = sorted(a * 1000 - d / 1e6 for a, d in zip(arrived, due, strict=True))
    return OnTimeResult(
        messages=n,
        poller_interval_s=ON_TIME_POLLER_S,
        p50_ms=percentile(late, 50),
        p99_ms=percentile(late, 99),
        max_ms=late[-1],
        earliest_ms=late[0],
    )
