"""The fault suite (`make chaos` runs it and shows the counts): 100,000 messages through two
real `msgtable serve` processes sharing one database (the lease), four subscribers and a
producer, while, over and over: a subscriber is killed mid-batch, the leading server is
killed with SIGKILL, a subscriber acks after its ack wait ended, the database restarts, a
subscriber stalls without reading, and the leading server gets SIGTERM under load.

The judge is tests/faults/chaos.Checker, which sees only what a user sees. Set
MSGTABLE_CHAOS_MESSAGES for a longer (or quicker) run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from msgtable.devdb import LocalServer
from msgtable.tables import current_layout_ddl

from ..integration.helpers import comment
from ..waiting import wait_until
from .chaos import Checker, Producer, ServerProcess, Subscriber

TOTAL = int(os.environ.get("MSGTABLE_CHAOS_MESSAGES", "100000"))
ACK_WAIT_S = 2.0
LEASE_PERIOD_S = 1.0
SUBSCRIBERS = 4
PRODUCE_FOR_S = 40.0  # the producer spreads its inserts over this long
CHUNK = 500
PAUSE_S = 2.0  # between faults
DRAIN_TIMEOUT_S = 300.0


class Run:
    """The moving parts of one chaos run, and the faults it can inflict."""

    def __init__(self, database: LocalServer, tmp_path: Path) -> None:
        self.database = database
        self.dsn = database.dsn("app")
        self.checker = Checker(ACK_WAIT_S)
        self.servers = [
            ServerProcess(self.dsn, tmp_path, f"server{n}", LEASE_PERIOD_S) for n in (1, 2)
        ]
        self.targets = ",".join(s.address for s in self.servers)
        self.subscribers: list[Subscriber] = []
        self.retired: list[Subscriber] = []
        self.stall_progress: list[int] = []  # acks by the others during stalls under load
        self.producer: Producer | None = None
        self.graceful_exits: list[int] = []
        self.takeovers_s: list[float] = []  # SIGKILL of the leader -> the other holds the lease
        self._names = iter(range(1, 1_000_000))

    # -- the parts ---------------------------------------------------------------------------
    def subscriber(self) -> Subscriber:
        s = Subscriber(f"sub{next(self._names)}", self.targets, "chaos", self.checker)
        s.start()
        return s

    def keep_subscribers(self) -> None:
        """Replace subscribers that were killed or stalled out."""
        for i, s in enumerate(self.subscribers):
            if s.done.is_set():
                self.retired.append(s)
                self.subscribers[i] = self.subscriber()

    def _lease(self) -> tuple[str, str] | None:
        """(holder, address) of the unexpired lease, if any (None also while the database
        does not answer)."""
        db = sa.create_engine(self.dsn)
        try:
            with db.connect() as conn:
                row = conn.exec_driver_sql(
                    "select holder, address from msgtable_lease where expires > utc_timestamp(6)"
                ).first()
        except sa.exc.DBAPIError:
            return None
        finally:
            db.dispose()
        return (str(row[0]), str(row[1])) if row is not None else None

    def leader(self) -> ServerProcess:
        """The server the lease table names (waiting for one to hold it)."""
        found: list[ServerProcess] = []

        def named() -> bool:
            lease = self._lease()
            found[:] = [s for s in self.servers if lease is not None and s.address == lease[1]]
            return bool(found)

        wait_until(named, timeout_s=30, what="a leader")
        return found[0]

    def live(self) -> Subscriber:
        for s in self.subscribers:
            if not s.done.is_set() and s.order is None and s.sub is not None:
                return s
        return self.subscribers[0]

    # -- the faults --------------------------------------------------------------------------
    def kill_subscriber(self) -> None:
        self.live().order = "kill"
        self.checker.event("subscriber killed mid-batch")

    def kill_leader(self) -> None:
        server = self.leader()
        before = self._lease()
        server.kill()
        killed_at = time.monotonic()
        self.checker.event("msgtable SIGKILL")

        def taken_over() -> bool:
            lease = self._lease()
            return lease is not None and lease != before

        wait_until(taken_over, timeout_s=30, what="the other server taking the lease over")
        self.takeovers_s.append(round(time.monotonic() - killed_at, 2))
        server.start()

    def late_ack(self) -> None:
        self.live().order = "late"
        self.checker.event("ack after its ack wait")

    def restart_database(self) -> None:
        self.database.stop()
        self.checker.event("database restart")
        time.sleep(1.0)
        self.database.start()

    def stall_subscriber(self) -> None:
        stalled = self.live()
        stalled.stall_s = 2 * ACK_WAIT_S + 1
        stalled.order = "stall"
        self.checker.event("subscriber stalled")
        busy = self.producer is not None and not self.producer.done.is_set()
        before = self.checker.ack_calls
        time.sleep(ACK_WAIT_S + 1)
        if busy:  # messages keep coming: the others must go on acking
            self.stall_progress.append(self.checker.ack_calls - before)

    def terminate_leader(self) -> None:
        server = self.leader()
        self.graceful_exits.append(server.terminate())
        self.checker.event("msgtable SIGTERM under load")
        server.start()

    def faults(self) -> list[Callable[[], None]]:
        return [
            self.kill_subscriber,
            self.kill_leader,
            self.late_ack,
            self.restart_database,
            self.stall_subscriber,
            self.terminate_leader,
        ]


def test_no_message_is_lost_or_in_flight_twice_under_faults(own_server, tmp_path, capsys):
    run = Run(own_server, tmp_path)
    ddl = current_layout_ddl(
        "chaos",
        comment(
            vt_ack_wait=ACK_WAIT_S,
            vt_min_backoff=0.5,
            vt_max_backoff=2,
            vt_poller_interval=0.5,
            vt_batch_size=100,
            vt_cache_size=5000,
            vt_purge_after=3600,
        ),
    )
    db = sa.create_engine(run.dsn, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    with db.connect() as conn:
        conn.exec_driver_sql(ddl)
    for server in run.servers:
        server.start()
    producer = Producer(
        run.dsn, "chaos", TOTAL, CHUNK, PRODUCE_FOR_S / max(1, TOTAL // CHUNK), run.checker
    )
    run.producer = producer
    try:
        run.subscribers = [run.subscriber() for _ in range(SUBSCRIBERS)]
        producer.start()
        began = time.monotonic()
        cycles = 0
        while not producer.done.is_set() or cycles < 1:
            for fault in run.faults():
                time.sleep(PAUSE_S)
                run.keep_subscribers()
                fault()
            cycles += 1
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while not run.checker.all_acked() and time.monotonic() < deadline:
            run.keep_subscribers()
            time.sleep(0.5)
        took = time.monotonic() - began
    finally:
        for s in run.subscribers:
            s.finish()
        for server in run.servers:
            server.stop()
    report = run.checker.judge()
    everyone = run.subscribers + run.retired
    reconnects = sum(s.sub.reconnects for s in everyone if s.sub is not None)
    with db.connect() as conn:
        unacked = conn.exec_driver_sql("select count(*) from chaos where time_acked is null")
        left = unacked.scalar()
    db.dispose()
    summary = (
        f"chaos: {report.summary()}; {cycles} fault cycles in {took:.0f}s; "
        f"{reconnects} stream reconnects; producer retries {producer.retries}; "
        f"other subscribers' acks during each stall {run.stall_progress}; "
        f"SIGTERM exit codes {run.graceful_exits}; takeovers after SIGKILL "
        f"{run.takeovers_s}s; late acks (acked, of) "
        f"{run.checker.late_acks}"
    )
    (tmp_path / "chaos-report.json").write_text(
        json.dumps({"summary": summary, "reasons": dict(report.reasons)}, indent=2)
    )
    with capsys.disabled():
        print(f"\n{summary}")

    assert report.inserted == TOTAL
    assert report.never_delivered == [] and report.never_acked == [], summary
    assert left == 0, f"{left} rows unacked in the table"
    assert report.unknown == []
    assert report.after_ack == [], (
        f"delivered after their ack: {report.after_ack[:10]}\n"
        + run.checker.history(report.after_ack[0][0])
    )
    assert report.in_flight_twice == [], (
        f"in flight twice: {report.in_flight_twice[:10]}\n"
        + run.checker.history(report.in_flight_twice[0][0])
    )
    assert report.attempts_back == [], (
        f"attempts counting back (id, reached, then): {report.attempts_back[:10]}\n"
        + run.checker.history(report.attempts_back[0][0])
    )
    # the faults made redeliveries, and they said so
    assert max(report.attempts) > 1, summary
    assert all(code == 0 for code in run.graceful_exits), run.graceful_exits
    # within two lease periods (and a poll of the lease table); the database restart
    # counts no takeover: the kill does not overlap it
    assert run.takeovers_s and max(run.takeovers_s) <= 2 * LEASE_PERIOD_S + 0.5, summary
    assert run.stall_progress and all(p > 0 for p in run.stall_progress), (
        "a stalled stream held the others up"
    )
    # the late acks came for messages another subscriber had been sent and acked by then
    assert report.reasons["ack too late"] > 0
    assert any(acked < of for acked, of in run.checker.late_acks)
    assert [s.error for s in everyone if s.error is not None] == []
    assert reconnects > 0
    assert report.events["database restart"] >= 1 and report.events["msgtable SIGKILL"] >= 1
