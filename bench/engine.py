"""msgtable end to end: SQL INSERT -> poll -> claim -> MessageStream -> MessageAck.

The real server runs as a subprocess (``python -m msgtable serve``, bench.processes.ServerProcess)
on loopback; a producer process inserts the rows with the same multi-row INSERTs as the raw
run while K subscriber processes (one Client each) stream the table and ack every batch with
MessageAck. The figure is the number of messages over the time from the first INSERT to the
ack that completes the count. Every message must arrive exactly once and be acked: the ids
received are checked (no duplicate, none missing), the acks' counts must add up, and in the
table every row must be acked with epoch 1 (claimed once). Anything else fails the run.

``drain`` is the same without a producer, for a backlog inserted beforehand (bench.scale).
"""

from __future__ import annotations

import threading
import time
from array import array
from dataclasses import dataclass
from typing import Any

from bench.database import check_lifecycle, create_table, execute, message_comment
from bench.errors import BenchError
from bench.measure import Throughput, cpu_meter, run_timeout_s
from bench.processes import CTX, Flag, ServerProcess, Workers, report
from bench.producer import ProducerSpec, producer_rows, producer_worker

CLIENT_TIMEOUT_S = 30.0
LEAVE_POLL_S = 0.01  # how often an idle subscriber checks whether the run is over


@dataclass(frozen=True)
class SubscriberSpec:
    address: str
    table: str
    target: int  # stop once this many messages were received by all subscribers together
    marks: tuple[int, ...] = ()  # counts at which to note the time (e.g. 10,000 of 100,000)
    subscribe_after_go: bool = False  # True: the clock starts at go, before subscribing
    traced: bool = False  # True: consumer spans to an SDK provider (bench.traced)
    sample: float | None = None  # with traced: the share of batches traced (None: all)


@dataclass
class Shared:
    """Cross-process state of one run's subscribers."""

    counter: Any  # messages received, all subscribers together
    marks_at: Any  # monotonic time each mark was reached
    done: Flag  # set once the target is reached: every subscriber leaves

    @classmethod
    def new(cls, marks: int) -> Shared:
        return cls(CTX.Value("q", 0), CTX.Array("d", max(1, marks)), Flag())


def subscriber_worker(
    spec: SubscriberSpec, shared: Shared, name: str, ready: Any, go: Any, results: Any
) -> None:
    """Receive batches and ack each with MessageAck until the run's target is reached."""

    def work() -> dict[str, Any]:
        from msgtable.client import Client

        tracer = None
        if spec.traced:
            from bench.traced import install

            tracer = install(spec.sample)
        ids = array("q")
        acked = batches = ack_calls = 0
        last = 0.0
        with Client(spec.address, timeout_s=CLIENT_TIMEOUT_S) as client:
            client.list_tables()  # connected before the clock starts
            if spec.subscribe_after_go:
                ready.put(name)
                go.wait()
                sub = client.subscribe(spec.table)
            else:
                sub = client.subscribe(spec.table)
                ready.put(name)
                go.wait()  # nothing arrives before the producer starts at go
            with sub:

                def leave() -> None:
                    shared.done.wait(LEAVE_POLL_S)
                    sub.close()

                threading.Thread(target=leave, daemon=True).start()
                answered = [0.0]  # when the last ack call returned (set on the ack thread)

                def note_answer(_: object) -> None:
                    answered[0] = time.monotonic()

                for batch in sub.batches():
                    # acks go asynchronously: the client merges those queued while a
                    # MessageAck is on the wire into its next call (Subscription.ack_async)
                    sub.ack_async(batch).add_done_callback(note_answer)
                    now = time.monotonic()
                    ids.extend(int(m.id) for m in batch)  # type: ignore[call-overload]
                    batches += 1
                    with shared.counter.get_lock():
                        before = shared.counter.value
                        after = shared.counter.value = before + len(batch)
                    for i, mark in enumerate(spec.marks):
                        if before < mark <= after:
                            shared.marks_at[i] = now
                    if after >= spec.target:
                        shared.done.set()
                        break
                sub.flush_acks(CLIENT_TIMEOUT_S)  # every ack answered: the clock stops here
                acked, last, ack_calls = sub.acked, answered[0], sub.ack_calls
                if not shared.done.is_set():
                    raise BenchError(
                        f"the server ended the stream of {spec.table} after {len(ids)} messages "
                        f"here, {shared.counter.value} of {spec.target} in all"
                    )
        spans = 0
        if tracer is not None:  # what the consumer spans came to (bench.metrics checks some)
            provider, exporter = tracer
            provider.force_flush()
            spans = sum(exporter.spans.values())
        return {
            "ids": ids.tobytes(),
            "acked": acked,
            "batches": batches,
            "ack_calls": ack_calls,
            "last": last,
            "spans": spans,
        }

    report(name, results, work)


def diagnose(server: ServerProcess, dsn: str, table: str, shared: Shared) -> str:
    """Where the messages of a stuck run are: the table's rows and the server's counters."""
    from msgtable.client import Client

    lines = [f"{shared.counter.value} messages received by the subscribers"]
    rows = execute(
        dsn,
        f"select epoch, time_acked is not null, count(*), "
        f"sum(time_next is not null and time_next > {time.time_ns()}) "
        f"from {table} group by 1, 2 order by 1, 2",
    )
    for epoch, acked, count, future in rows:
        state = "acked" if acked else f"unacked ({future} not due yet)"
        lines.append(f"  rows with epoch {epoch}, {state}: {count}")
    with Client(server.address, timeout_s=10) as client:
        for t in client.list_tables():
            if t.name == table:
                lines.append(
                    f"  server: cached {t.cached}, in flight {t.in_flight}, subscribers "
                    f"{t.subscribers}, sent {t.sent}, acked {t.acked}"
                )
    return "\n".join(lines)


def check_deliveries(results: dict[str, Any], expected: range | None, delivered: int) -> int:
    """Ids received exactly once (all of ``expected`` if given) and every one acked.

    Returns the number of messages received.
    """
    ids = array("q")
    acked = 0
    for name, r in results.items():
        if name.startswith("sub"):
            ids.frombytes(r["ids"])
            acked += r["acked"]
    distinct = set(ids)
    if len(distinct) != len(ids):
        raise BenchError(f"{len(ids) - len(distinct)} messages were received more than once")
    if acked != len(ids):
        raise BenchError(f"{len(ids)} messages received but {acked} acked")
    if expected is not None and distinct != set(expected):
        missing = len(set(expected) - distinct)
        raise BenchError(f"{missing} of {len(expected)} messages never arrived")
    if len(ids) < delivered:
        raise BenchError(f"{len(ids)} messages received, {delivered} expected")
    return len(ids)


def run(
    server: ServerProcess,
    dsn: str,
    n: int,
    batch_size: int,
    subscribers: int,
    poller_interval_s: float,
    *,
    postpone_after_s: float | None,
    table: str | None = None,
    first_id: int = 0,
    db_pid: int | None = None,
    traced: bool = False,
    sample: float | None = None,
) -> Throughput:
    """One end-to-end run: a producer of ``n`` messages and ``subscribers`` subscribers.

    Without ``table`` the run makes a fresh message table (with the run's
    ``postpone_after_s``) and drops it afterwards; with one, the table exists already
    (bench.scale) and only the ids it inserts are checked.
    """
    fresh = table is None
    table = table or f"mt_b{batch_size}_s{subscribers}"
    if fresh:
        comment = message_comment(batch_size, poller_interval_s, postpone_after_s=postpone_after_s)
        create_table(dsn, table, comment)
    try:
        shared = Shared.new(0)
        with Workers() as workers:
            for k in range(subscribers):
                spec = SubscriberSpec(server.address, table, n, traced=traced, sample=sample)
                workers.start(f"sub{k}", subscriber_worker, spec, shared)
            producer = ProducerSpec(dsn, table, first_id, n, producer_rows(batch_size), subscribers)
            workers.start("producer", producer_worker, producer)
            workers.wait_ready()
            with cpu_meter(database=db_pid, server=server.pid) as cpu:
                workers.go.set()
                try:
                    results = workers.collect(run_timeout_s(n))
                except BenchError as exc:
                    server.check_alive()
                    raise BenchError(f"{exc}\n{diagnose(server, dsn, table, shared)}") from None
        start = results["producer"]["start"]
        end = max(r["last"] for name, r in results.items() if name.startswith("sub"))
        check_deliveries(results, range(first_id, first_id + n), n)
        if fresh:
            check_lifecycle(dsn, table, n)
        insert_s = results["producer"]["end"] - start
        batches = sum(r["batches"] for name, r in results.items() if name.startswith("sub"))
        calls = sum(r["ack_calls"] for name, r in results.items() if name.startswith("sub"))
        cpu["producer"] = results["producer"]["cpu_s"]
        cpu["subscribers"] = sum(r["cpu_s"] for name, r in results.items() if name != "producer")
        if not db_pid:
            del cpu["database"]
        return Throughput(
            "msgtable",
            batch_size,
            subscribers,
            n,
            end - start,
            note=f"producer inserted at {n / insert_s:,.0f} rows/s; "
            f"{n / batches:.1f} messages a batch, {batches / max(calls, 1):.1f} batches a "
            "MessageAck",
            cpu_s=cpu,
            spans=sum(r.get("spans", 0) for name, r in results.items() if name.startswith("sub")),
        )
    finally:
        if fresh:
            execute(dsn, f"drop table if exists {table}")


def drain(
    server: ServerProcess, table: str, marks: tuple[int, ...], subscribers: int
) -> tuple[list[float], int]:
    """Subscribe ``subscribers`` to a table that already holds due rows; receive and ack until
    ``marks[-1]`` messages arrived. Returns the seconds at which each mark was reached,
    counted from the moment the subscribers were told to subscribe, and how many arrived."""
    shared = Shared.new(len(marks))
    with Workers() as workers:
        for k in range(subscribers):
            spec = SubscriberSpec(server.address, table, marks[-1], marks, subscribe_after_go=True)
            workers.start(f"sub{k}", subscriber_worker, spec, shared)
        workers.wait_ready()
        start = time.monotonic()
        workers.go.set()
        try:
            results = workers.collect(run_timeout_s(marks[-1]))
        except BenchError:
            server.check_alive()
            raise
    received = check_deliveries(results, None, marks[-1])
    return [shared.marks_at[i] - start for i in range(len(marks))], received
