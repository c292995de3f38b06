"""Push to HTTP endpoints (msgtable.features.push) through ``msgtable serve`` (the ``push`` section
of
``python -m bench.run``).

Both runs use one server of their own (``--binlog``, ``--no-lease``, ``--push-allow
http://127.0.0.0/8``) and a real HTTP receiver on loopback in the bench's process
(tests/push_receiver.py: a threaded server that checks each request's Standard Webhooks
signature with its own HMAC code and parses every CloudEvents batch).

Throughput (``push_msgs_s``, target >= 10,000; ODPS's MessageService: 1-2k notifications/s):
a backlog of SIZES[mode] messages is committed, then the endpoint is set (4 batches in flight,
vt_batch_size 100); the clock runs from the SetEndpoint answer to the receipt of the last
distinct message. Then every row must be acked in the table (the ack follows each 2xx) and
every signature good, or the run fails.

Latency (``push_latency_p99_ms``, target <= 50): a paced producer process INSERTs single rows
at bench.latency.RATE_MSGS_S (1,000/s) for LATENCY_S seconds and notes each commit
(``time.monotonic()``, one clock for the machine); the receiver notes each message's arrival
on the same clock. Latency is arrival minus commit; the figures are its percentiles.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass
from typing import Any

from bench import smoke
from bench.database import bulk_insert, create_table, execute, message_comment
from bench.errors import BenchError
from bench.latency import RATE_MSGS_S, PacedSpec, paced_producer_worker
from bench.measure import percentile
from bench.processes import ServerProcess, Workers
from msgtable.client import Client
from tests.push_receiver import Receiver

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
ALLOW = ("--push-allow", "http://127.0.0.0/8")
BATCH = 100
IN_FLIGHT = 4
SIZES = {"quick": 30_000, "full": 100_000, "smoke": smoke.PUSH_MESSAGES}
LATENCY_S = {"quick": 5.0, "full": 15.0, "smoke": smoke.PUSH_LATENCY_S}
TARGET_MSGS_S = 10_000
TARGET_P99_MS = 50.0


@dataclass(frozen=True)
class PushResult:
    messages: int
    seconds: float
    requests: int
    latency_messages: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    @property
    def msgs_s(self) -> float:
        return self.messages / self.seconds

    def as_dict(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "seconds": round(self.seconds, 3),
            "msgs_s": round(self.msgs_s),
            "requests": self.requests,
            "batch_size": BATCH,
            "max_in_flight": IN_FLIGHT,
            "latency_messages": self.latency_messages,
            "latency_rate_msgs_s": RATE_MSGS_S,
            "p50_ms": round(self.p50_ms, 2),
            "p99_ms": round(self.p99_ms, 2),
            "max_ms": round(self.max_ms, 2),
        }


def _wait(cond: Any, timeout_s: float, what: Any) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise BenchError(f"push: timed out waiting for {what()}")
        time.sleep(0.002)


def _unacked(dsn: str, table: str) -> int:
    return int(execute(dsn, f"select count(*) from {table} where time_acked is null")[0][0])


def throughput(server: ServerProcess, dsn: str, n: int, postpone_after_s: float | None) -> Any:
    table = "push_tp"
    create_table(dsn, table, message_comment(BATCH, 0.5, postpone_after_s=postpone_after_s))
    bulk_insert(dsn, table, n)
    receiver = Receiver(SECRET).start()
    try:
        with Client(server.address, timeout_s=30) as client:
            began = time.monotonic()
            client.set_endpoint(
                table, receiver.url("/tp"), SECRET, max_in_flight=IN_FLIGHT, timeout_s=10
            )

            def distinct() -> int:
                return len(set(receiver.ids("/tp")))

            _wait(lambda: distinct() >= n, 120, lambda: f"{n} pushed, got {distinct()}")
            seconds = time.monotonic() - began
            _wait(lambda: _unacked(dsn, table) == 0, 60, lambda: "every row acked")
            if receiver.bad_signatures or receiver.bad_bodies:
                raise BenchError(f"push: bad requests {receiver.bad_signatures[:3]}")
            client.drop_endpoint(table)
        return seconds, receiver.requests
    finally:
        receiver.stop()
        execute(dsn, f"drop table if exists {table}")


def latency(
    server: ServerProcess, dsn: str, seconds: float, postpone_after_s: float | None
) -> array[float]:
    table = "push_lat"
    n = round(RATE_MSGS_S * seconds)
    create_table(dsn, table, message_comment(BATCH, 0.5, postpone_after_s=postpone_after_s))
    receiver = Receiver(SECRET).start()
    try:
        with Client(server.address, timeout_s=30) as client:
            client.set_endpoint(
                table, receiver.url("/lat"), SECRET, max_in_flight=IN_FLIGHT, timeout_s=10
            )
            with Workers() as workers:
                workers.start(
                    "producer", paced_producer_worker, PacedSpec(dsn, table, n, RATE_MSGS_S)
                )
                workers.wait_ready()
                workers.go.set()
                results = workers.collect(seconds * 3 + 60)

            def distinct() -> int:
                return len(set(receiver.ids("/lat")))

            _wait(lambda: distinct() >= n, 60, lambda: f"{n} pushed, got {distinct()}")
            client.drop_endpoint(table)
        committed = array("d")
        committed.frombytes(results["producer"]["committed"])
        first: dict[int, float] = {}
        for r in receiver.received():
            first.setdefault(int(r.event["data"]["id"]), r.at_mono)
        return array("d", sorted((first[i] - committed[i]) * 1000 for i in range(n)))
    finally:
        receiver.stop()
        execute(dsn, f"drop table if exists {table}")


def run(dsn: str, mode: str, postpone_after_s: float | None) -> PushResult:
    n = SIZES[mode]
    with ServerProcess(dsn, binlog=True, lease=False, extra=ALLOW) as server:
        time.sleep(1.0)  # its binlog follower connects after it serves
        seconds, requests = throughput(server, dsn, n, postpone_after_s)
        lat = latency(server, dsn, LATENCY_S[mode], postpone_after_s)
        server.check_alive()
    return PushResult(
        messages=n,
        seconds=seconds,
        requests=requests,
        latency_messages=len(lat),
        p50_ms=percentile(lat, 50),
        p99_ms=percentile(lat, 99),
        max_ms=lat[-1],
    )
