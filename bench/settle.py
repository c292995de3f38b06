"""Settlement besides ack (msgtable.core.settlement): release, dead letters and renew, end to end
through ``msgtable serve`` and the Python client, at the run's batch size and subscribers.

Release: a table holds SIZES rows, all due, inserted before anyone subscribes; K subscriber
processes subscribe at go and release every batch they receive (``Subscriber.release``, one
MessageRelease a batch, waited for, delay 0), so each message is due again at once and goes
round again, until RELEASE_ROUNDS x rows were released in all. The figure (``release_msgs_s``)
is the messages the server says it released, over the time from go to the last
MessageRelease's answer: the whole loop (poll, send, receive, release) at a steady state.
Every release must count its whole batch (a message in flight and unacked is released), and
afterwards every row is still in the table, unacked, with at least as many sends counted
(epoch) as releases.

Dead letters: a table with ``vt_dead_letter`` holds SIZES rows; K subscribers reject every
batch (one MessageReject a batch: one transaction copies the rows to the dead-letter table and
deletes them). The figure (``dead_letter_msgs_s``) is the messages moved, over the time from
go to the last MessageReject's answer. Each message must be received and rejected exactly
once; then the table is empty and the dead-letter table holds every row, with 1 attempt and
the reason.

Expiry (the ``expiry`` section, full mode; ``dead_letter_expired_msgs_s``, no target): the
other way to die. On a table with vt_max_attempts=1 and a dead-letter table, K subscribers
release every batch once; each released message dies when the poller reads it due again (the
engine's burial by epoch, msgtable.engine.manager). The subscribers stay subscribed until the table
is empty (a table is polled only while it has subscribers); the clock stops when the bench
sees it empty. No message may come twice.

Renew: one subscriber holds RENEW_IDS messages in flight (max_in_flight RENEW_IDS) and renews
all of them in one MessageRenew (``Subscriber.renew``, extension 0: the table's ack wait),
RENEW_CALLS times back to back, after one call that is not counted (it counts the messages'
send, which the later ones find counted). Every timed call moves the 1,000 rows' time_next
(its deadline, now + ack wait, is later than the last call's), so each is a real write of
1,000 rows and their binlog events, as a heartbeat is; a renew whose deadline is not later
than the rows' own changes nothing and costs about a quarter as much in the database. Each
call is timed in the subscriber, from the call to its answer; ``renew_1000_ms`` is the
median (as ``latency_p50_ms`` is the headline of the latencies), reported with the p99 and
the max. Every call must renew all RENEW_IDS, and afterwards each message has its one send
counted once (epoch 1).
"""

from __future__ import annotations

import statistics
import threading
import time
from array import array
from dataclasses import dataclass
from typing import Any

from bench import smoke
from bench.database import bulk_insert, count_rows, create_table, execute, message_comment
from bench.errors import BenchError
from bench.measure import Throughput, cpu_meter, percentile, run_timeout_s
from bench.processes import CTX, Flag, ServerProcess, Workers, report
from msgtable.core.deadletters import exhausted_reason

CLIENT_TIMEOUT_S = 30.0
LEAVE_POLL_S = 0.01  # how often an idle subscriber checks whether the run is over
REASON = "bench: rejected"
DEAD_COLUMNS = "time_dead bigint not null, attempts bigint not null, last_error varchar(1000)"
RENEW_IDS = 1_000
RENEW_BATCH = 100  # vt_batch_size of the renew table: the messages come in 10 batches
RENEW_CALLS = {"quick": 50, "full": 200, "smoke": smoke.RENEW_CALLS}
RELEASE_ROUNDS = 3  # each message is released about this many times
SIZES = {  # rows of the release, reject and expiry tables
    "quick": {"release": 10_000, "reject": 20_000, "expire": 10_000},
    "full": {"release": 30_000, "reject": 50_000, "expire": 30_000},
    "smoke": smoke.SETTLE,
}
EXPIRE_POLL_S = 0.005  # how often the bench counts what is left of the expiry table


@dataclass(frozen=True)
class RenewResult:
    ids: int  # ids in each MessageRenew
    calls: int  # timed calls
    p50_ms: float
    p99_ms: float
    max_ms: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "ids": self.ids,
            "calls": self.calls,
            "p50_ms": round(self.p50_ms, 2),
            "p99_ms": round(self.p99_ms, 2),
            "max_ms": round(self.max_ms, 2),
        }


@dataclass
class SettleResult:
    release: Throughput | None = None
    dead_letter: Throughput | None = None
    expired: Throughput | None = None  # died of vt_max_attempts=1
    renew: RenewResult | None = None

    def runs(self) -> list[Throughput]:
        return [r for r in (self.release, self.dead_letter, self.expired) if r is not None]

    def as_dict(self) -> dict[str, Any]:
        return {
            "release": self.release.as_dict() if self.release else None,
            "dead_letter": self.dead_letter.as_dict() if self.dead_letter else None,
            "dead_letter_expired": self.expired.as_dict() if self.expired else None,
            "renew": self.renew.as_dict() if self.renew else None,
        }


# -- release and reject ------------------------------------------------------------------------
@dataclass(frozen=True)
class SettlerSpec:
    address: str
    table: str
    verb: str  # "release" or "reject"
    target: int  # stop once this many were settled by all subscribers together
    # True: stay subscribed after the target, until the bench says the run is over (a
    # message dies of vt_max_attempts when a poll reads it, and a table is polled only
    # while it has subscribers)
    stay: bool = False


@dataclass
class Shared:
    """Cross-process state of one run's subscribers."""

    settled: Any  # messages settled (the server's counts), all subscribers together
    done: Flag  # set once the target is reached: every subscriber leaves

    @classmethod
    def new(cls) -> Shared:
        return cls(CTX.Value("q", 0), Flag())


def settler_worker(
    spec: SettlerSpec, shared: Shared, name: str, ready: Any, go: Any, results: Any
) -> None:
    """Subscribe at go; release (delay 0) or reject every batch until the target is reached."""

    def work() -> dict[str, Any]:
        from msgtable.client import Client

        ids = array("q")
        received = settled = calls = 0
        last = 0.0
        with Client(spec.address, timeout_s=CLIENT_TIMEOUT_S) as client:
            client.list_tables()  # connected before the clock starts
            ready.put(name)
            go.wait()
            with client.subscribe(spec.table) as sub:

                def leave() -> None:
                    shared.done.wait(LEAVE_POLL_S)
                    sub.close()

                threading.Thread(target=leave, daemon=True).start()
                # a release gives no reason (delay 0), a reject REASON
                settle, reason = (
                    (sub.release, None) if spec.verb == "release" else (sub.reject, REASON)
                )
                for batch in sub.batches():
                    n = settle(batch, reason=reason)
                    last = time.monotonic()
                    if n != len(batch):
                        raise BenchError(f"a {spec.verb} of {len(batch)} messages counted {n}")
                    ids.extend(int(m.id) for m in batch)  # type: ignore[call-overload]
                    received += len(batch)
                    settled += n
                    calls += 1
                    with shared.settled.get_lock():
                        shared.settled.value += n
                        reached = shared.settled.value >= spec.target
                    if reached and not spec.stay:
                        shared.done.set()
                        break
                if not shared.done.is_set():
                    raise BenchError(
                        f"the server ended the stream of {spec.table} after {received} "
                        f"messages here, {shared.settled.value} of {spec.target} settled in all"
                    )
        return {
            "ids": ids.tobytes(),
            "received": received,
            "settled": settled,
            "calls": calls,
            "last": last,
        }

    report(name, results, work)


def _settle_run(
    server: ServerProcess,
    table: str,
    verb: str,
    target: int,
    subscribers: int,
    db_pid: int | None,
    until_empty: str = "",
) -> tuple[dict[str, Any], float, dict[str, float]]:
    """K settlers on ``table`` until ``target`` were settled; returns the workers' results,
    the seconds from go to the end, and the CPU seconds by process class. The end is the last
    settle call's answer; with ``until_empty`` (the table's DSN) the subscribers stay until
    the table was seen empty, and the end is that moment."""
    shared = Shared.new()
    with Workers() as workers:
        for k in range(subscribers):
            spec = SettlerSpec(server.address, table, verb, target, stay=bool(until_empty))
            workers.start(f"sub{k}", settler_worker, spec, shared)
        workers.wait_ready()
        with cpu_meter(database=db_pid, server=server.pid) as cpu:
            start = time.monotonic()
            workers.go.set()
            deadline = start + run_timeout_s(target)
            try:
                if until_empty:
                    emptied = _wait_empty(until_empty, table, shared, deadline)
                    shared.done.set()
                results = workers.collect(deadline - time.monotonic())
                end = emptied if until_empty else max(r["last"] for r in results.values())
            except BenchError:
                server.check_alive()
                raise
    cpu["subscribers"] = sum(r["cpu_s"] for r in results.values())
    if not db_pid:
        del cpu["database"]
    return results, end - start, cpu


def _wait_empty(dsn: str, table: str, shared: Shared, deadline: float) -> float:
    """The moment ``table`` was seen holding no row (counted every EXPIRE_POLL_S)."""
    while (left := count_rows(dsn, table)) > 0:
        if time.monotonic() > deadline:
            raise BenchError(
                f"{left} messages of {table} never died (vt_max_attempts=1); "
                f"{shared.settled.value} were released"
            )
        time.sleep(EXPIRE_POLL_S)
    return time.monotonic()


def _totals(results: dict[str, Any]) -> tuple[array[int], int, int]:
    ids = array("q")
    settled = calls = 0
    for r in results.values():
        ids.frombytes(r["ids"])
        settled += r["settled"]
        calls += r["calls"]
    return ids, settled, calls


def release(
    server: ServerProcess,
    dsn: str,
    rows: int,
    batch_size: int,
    subscribers: int,
    poller_interval_s: float,
    *,
    postpone_after_s: float | None,
    db_pid: int | None = None,
) -> Throughput:
    """Release every batch (delay 0) until RELEASE_ROUNDS x ``rows`` were released."""
    table = f"release_b{batch_size}_s{subscribers}"
    comment = message_comment(batch_size, poller_interval_s, postpone_after_s=postpone_after_s)
    create_table(dsn, table, comment)
    try:
        bulk_insert(dsn, table, rows)
        target = RELEASE_ROUNDS * rows
        results, seconds, cpu = _settle_run(server, table, "release", target, subscribers, db_pid)
        ids, released, calls = _totals(results)
        if released < target:
            raise BenchError(f"{released} messages released of {target}")
        total, unacked, sends = execute(
            dsn,
            f"select count(*), coalesce(sum(time_acked is null), 0), coalesce(sum(epoch), 0) "
            f"from {table}",
        )[0]
        if (int(total), int(unacked)) != (rows, rows) or int(sends) < released:
            raise BenchError(
                f"table {table}: {total} rows of {rows}, {unacked} unacked, {sends} sends "
                f"counted for {released} releases"
            )
        distinct = len(set(ids))
        return Throughput(
            "release",
            batch_size,
            subscribers,
            released,
            seconds,
            note=f"{rows:,} messages released {released / rows:.1f} times each on average "
            f"({distinct:,} distinct), delay 0; {released / calls:.1f} messages a MessageRelease",
            cpu_s=cpu,
        )
    finally:
        execute(dsn, f"drop table if exists {table}")


def dead_letter(
    server: ServerProcess,
    dsn: str,
    rows: int,
    batch_size: int,
    subscribers: int,
    poller_interval_s: float,
    *,
    postpone_after_s: float | None,
    db_pid: int | None = None,
) -> Throughput:
    """Reject every message once, each batch moved to the dead-letter table."""
    table, dead = (
        f"reject_b{batch_size}_s{subscribers}",
        f"reject_b{batch_size}_s{subscribers}_dead",
    )
    comment = message_comment(batch_size, poller_interval_s, postpone_after_s=postpone_after_s)
    _create_pair(dsn, table, dead, comment)
    try:
        bulk_insert(dsn, table, rows)
        results, seconds, cpu = _settle_run(server, table, "reject", rows, subscribers, db_pid)
        ids, rejected, calls = _totals(results)
        if len(ids) != len(set(ids)) or set(ids) != set(range(rows)):
            raise BenchError(
                f"{len(ids)} messages rejected, {len(set(ids))} distinct, of {rows} expected"
            )
        _check_dead(dsn, table, dead, rows, 1, REASON)
        return Throughput(
            "dead_letter",
            batch_size,
            subscribers,
            rejected,
            seconds,
            note=f"every message rejected once, moved to {dead}; "
            f"{rejected / calls:.1f} messages a MessageReject",
            cpu_s=cpu,
        )
    finally:
        execute(dsn, f"drop table if exists {table}", f"drop table if exists {dead}")


def expired(
    server: ServerProcess,
    dsn: str,
    rows: int,
    batch_size: int,
    subscribers: int,
    poller_interval_s: float,
    *,
    postpone_after_s: float | None,
    db_pid: int | None = None,
) -> Throughput:
    """Release every message once on a vt_max_attempts=1 table: each dies when due again."""
    table, dead = (
        f"expire_b{batch_size}_s{subscribers}",
        f"expire_b{batch_size}_s{subscribers}_dead",
    )
    comment = message_comment(batch_size, poller_interval_s, postpone_after_s=postpone_after_s)
    _create_pair(dsn, table, dead, comment, ",vt_max_attempts=1")
    try:
        bulk_insert(dsn, table, rows)
        results, seconds, cpu = _settle_run(
            server, table, "release", rows, subscribers, db_pid, until_empty=dsn
        )
        ids, released, calls = _totals(results)
        if len(ids) != len(set(ids)) or set(ids) != set(range(rows)):
            raise BenchError(
                f"{len(ids)} messages released, {len(set(ids))} distinct, of {rows} expected "
                "(vt_max_attempts=1: none may come twice)"
            )
        _check_dead(dsn, table, dead, rows, 1, exhausted_reason(1))
        return Throughput(
            "dead_letter_expired",
            batch_size,
            subscribers,
            rows,
            seconds,
            note=f"every message released once on vt_max_attempts=1, buried by the poller "
            f"into {dead}; {released / calls:.1f} messages a MessageRelease",
            cpu_s=cpu,
        )
    finally:
        execute(dsn, f"drop table if exists {table}", f"drop table if exists {dead}")


def _create_pair(dsn: str, table: str, dead: str, comment: str, extra: str = "") -> None:
    """A message table (``comment`` + ``extra`` fields + vt_dead_letter) and its dead-letter
    table (schema/dead_letter.sql), the latter first: the table loads only once its
    vt_dead_letter table is there."""
    create_table(dsn, dead, comment)
    execute(dsn, f"alter table {dead} add column ({DEAD_COLUMNS})")
    create_table(dsn, table, f"{comment}{extra},vt_dead_letter={dead}")


def _check_dead(dsn: str, table: str, dead: str, rows: int, attempts: int, reason: str) -> None:
    """``table`` is empty; ``dead`` holds its ``rows`` rows, each with ``attempts`` and
    ``reason`` (a constant of the bench: no quote in it) as its last error."""
    left = count_rows(dsn, table)
    n, bad_attempts, bad_reason = execute(
        dsn,
        f"select count(*), coalesce(sum(attempts <> {attempts}), 0), "
        f"coalesce(sum(not (last_error <=> '{reason}')), 0) from {dead}",
    )[0]
    if (left, int(n), int(bad_attempts), int(bad_reason)) != (0, rows, 0, 0):
        raise BenchError(
            f"{left} rows left in {table}; {n} of {rows} in {dead}, {bad_attempts} with "
            f"attempts other than {attempts}, {bad_reason} without the expected last_error"
        )


# -- renew -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RenewSpec:
    address: str
    table: str
    ids: int
    calls: int


def renewer_worker(spec: RenewSpec, name: str, ready: Any, go: Any, results: Any) -> None:
    """Hold ``ids`` messages in flight, then renew them all, ``calls`` + 1 times."""

    def work() -> dict[str, Any]:
        from msgtable.client import Client

        held: list[Any] = []
        with (
            Client(spec.address, timeout_s=CLIENT_TIMEOUT_S) as client,
            client.subscribe(spec.table, max_in_flight=spec.ids) as sub,
        ):
            ready.put(name)
            for batch in sub.batches():
                held.extend(batch)
                if len(held) >= spec.ids:
                    break
            go.wait()
            times = array("d")
            for i in range(spec.calls + 1):  # the first warms up, not counted
                began = time.perf_counter()
                n = sub.renew(held)
                took = time.perf_counter() - began
                if n != len(held):
                    raise BenchError(f"a renew of {len(held)} in-flight messages counted {n}")
                if i:
                    times.append(took * 1000)
        return {"times": times.tobytes(), "held": len(held)}

    report(name, results, work)


def renew(
    server: ServerProcess,
    dsn: str,
    calls: int,
    *,
    postpone_after_s: float | None,
) -> RenewResult:
    """RENEW_CALLS renews of RENEW_IDS in-flight messages (see the module docstring)."""
    table = "renew"
    comment = message_comment(RENEW_BATCH, 1.0, postpone_after_s=postpone_after_s)
    create_table(dsn, table, comment)
    try:
        bulk_insert(dsn, table, RENEW_IDS)
        with Workers() as workers:
            workers.start(
                "renewer", renewer_worker, RenewSpec(server.address, table, RENEW_IDS, calls)
            )
            workers.wait_ready()
            workers.go.set()
            try:
                result = workers.collect(60 + calls)["renewer"]
            except BenchError:
                server.check_alive()
                raise
        renewed = execute(dsn, f"select count(*), coalesce(sum(epoch <> 1), 0) from {table}")[0]
    finally:
        execute(dsn, f"drop table if exists {table}")
    if tuple(int(v) for v in renewed) != (RENEW_IDS, 0):
        raise BenchError(
            f"after the renews, {renewed[1]} of {renewed[0]} messages have their one send "
            "counted other than once (epoch <> 1)"
        )
    if result["held"] != RENEW_IDS:
        raise BenchError(f"the renewer held {result['held']} messages, not {RENEW_IDS}")
    times = array("d")
    times.frombytes(result["times"])
    ms = sorted(times)
    return RenewResult(
        ids=RENEW_IDS,
        calls=len(ms),
        p50_ms=statistics.median(ms),
        p99_ms=percentile(ms, 99),
        max_ms=ms[-1],
    )
