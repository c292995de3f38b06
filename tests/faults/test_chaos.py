"""The fault suite (`make chaos` runs it and shows the counts): 100,000 messages through two
real `msgtable serve` processes sharing one database (the lease), four subscribers (one of
them auto-renewing) and a producer, while, over and over: a subscriber is killed mid-batch,
the leading server is killed with SIGKILL, a subscriber acks after its ack wait ended, the
database restarts, a subscriber stalls without reading, and the leading server gets SIGTERM
under load.

The table has vt_max_attempts and a dead-letter table (vt_dead_letter, schema/dead_letter.sql)
and keeps last_error. About 1% of the messages are poison: released every time (or rejected),
they must end in the dead-letter table and nowhere else; others are released once, or held
by a slow handler that renews them, then acked (tests/faults/chaos.py says which).

The judge is tests/faults/checker.Checker, which sees only what a user sees and reads the
tables with its own SQL. Set MSGTABLE_CHAOS_MESSAGES for a longer (or quicker) run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from msgtable.devdb import LocalServer
from msgtable.tables import current_layout_ddl

from ..integration.helpers import comment
from ..waiting import wait_until
from .chaos import Producer, ServerProcess, Subscriber
from .checker import Checker, read_pending, read_tables

TOTAL = int(os.environ.get("MSGTABLE_CHAOS_MESSAGES", "100000"))
ACK_WAIT_S = 2.0
LEASE_PERIOD_S = 1.0
SUBSCRIBERS = 4
PRODUCE_FOR_S = 40.0  # the producer spreads its inserts over this long
CHUNK = 500
PAUSE_S = 2.0  # between faults
# After the faults, everything settles within seconds (the slowest: a slow handler's hold, a
# backoff); this bounds the wait so the verdict comes well before pytest's own time-out.
DRAIN_TIMEOUT_S = 90.0
# Poison dies after this many sends; an ordinary message takes one for its release (some) and
# one per fault that hits it (the faults above hit one at most three times so far).
MAX_ATTEMPTS = 5
TABLE, DEAD_TABLE = "chaos", "chaos_dead"
DEAD_COLUMNS = "time_dead bigint, attempts bigint, last_error varchar(1000)"


class Run:
    """The moving parts of one chaos run, and the faults it can inflict."""

    def __init__(self, database: LocalServer, tmp_path: Path) -> None:
        self.database = database
        self.dsn = database.dsn("app")
        self.checker = Checker(ACK_WAIT_S, MAX_ATTEMPTS)
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
        self.kills = 0

    # -- the parts ---------------------------------------------------------------------------
    def subscriber(self, auto_renew: bool = False) -> Subscriber:
        name = f"sub{next(self._names)}{'-auto' if auto_renew else ''}"
        s = Subscriber(name, self.targets, TABLE, self.checker, auto_renew)
        s.start()
        return s

    def keep_subscribers(self) -> None:
        """Replace subscribers that were killed or stalled out."""
        for i, s in enumerate(self.subscribers):
            if s.done.is_set():
                self.retired.append(s)
                self.subscribers[i] = self.subscriber(s.auto_renew)

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

    def live(self, auto_renew: bool = False) -> Subscriber:
        """A subscriber reading now (an auto-renewing one only if asked: its client renews
        what a stalled or late handler holds)."""
        ready = [
            s
            for s in self.subscribers
            if not s.done.is_set() and s.order is None and s.sub is not None
        ]
        for s in sorted(ready, key=lambda s: s.auto_renew != auto_renew):
            if auto_renew or not s.auto_renew:
                return s
        return self.subscribers[0]

    # -- the faults --------------------------------------------------------------------------
    def kill_subscriber(self) -> None:
        self.kills += 1  # every other kill is the auto-renewing subscriber's (its renewals end)
        self.live(auto_renew=self.kills % 2 == 0).order = "kill"
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


def rows_of(db: sa.Engine, ids: list[int]) -> list[tuple[object, ...]]:
    """What the tables say of ``ids`` (for a verdict): the table's row, else the dead letter."""
    if not ids:
        return []
    in_ids = ",".join(str(i) for i in ids)
    try:
        with db.connect() as conn:
            rows = conn.exec_driver_sql(
                f"select '{TABLE}', id, epoch, time_next, time_acked, last_error from {TABLE} "
                f"where id in ({in_ids}) union all select '{DEAD_TABLE}', id, attempts, "
                f"time_dead, time_acked, last_error from {DEAD_TABLE} where id in ({in_ids})"
            ).fetchall()
    except sa.exc.DBAPIError as exc:
        return [("the database does not answer", str(exc)[:200])]
    return [tuple(r) for r in rows]


def test_no_message_is_lost_or_in_flight_twice_and_poison_dies_under_faults(
    own_server: LocalServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = Run(own_server, tmp_path)
    fields = dict(
        vt_ack_wait=ACK_WAIT_S,
        vt_min_backoff=0.5,
        vt_max_backoff=2,
        vt_poller_interval=0.5,
        vt_batch_size=100,
        vt_cache_size=5000,
        vt_purge_after=3600,
    )
    dead_ddl = current_layout_ddl(DEAD_TABLE, comment(**fields))
    dead_ddl = dead_ddl.replace("  primary key(id)", f"  {DEAD_COLUMNS},\n  primary key(id)")
    ddl = current_layout_ddl(
        TABLE, comment(**fields, vt_max_attempts=MAX_ATTEMPTS, vt_dead_letter=DEAD_TABLE)
    )
    ddl = ddl.replace("  primary key(id)", "  last_error varchar(1000),\n  primary key(id)")
    db = sa.create_engine(run.dsn, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    with db.connect() as conn:
        conn.exec_driver_sql(dead_ddl)
        conn.exec_driver_sql(ddl)
    for server in run.servers:
        server.start()
    producer = Producer(
        run.dsn, TABLE, TOTAL, CHUNK, PRODUCE_FOR_S / max(1, TOTAL // CHUNK), run.checker
    )
    run.producer = producer
    pending: dict[str, list[int]] = {"everything": []}

    def unsettled() -> dict[str, list[int]]:
        try:
            unacked, dead = read_pending(db, TABLE, DEAD_TABLE)
        except sa.exc.DBAPIError as exc:
            return {f"the database ({exc.__class__.__name__})": []}
        return run.checker.unsettled(unacked, dead)

    try:
        run.subscribers = [run.subscriber(n == SUBSCRIBERS - 1) for n in range(SUBSCRIBERS)]
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
        while (pending := unsettled()) and time.monotonic() < deadline:
            run.keep_subscribers()
            time.sleep(0.5)
        took = time.monotonic() - began
    finally:
        for s in run.subscribers:
            s.finish()
        for server in run.servers:
            server.stop()
    everyone = run.subscribers + run.retired
    if pending:
        stuck = sorted({i for ids in pending.values() for i in ids[:3]})
        stories = [run.checker.history(i) for i in stuck]
        pytest.fail(
            f"not settled {DRAIN_TIMEOUT_S:g}s after the faults: "
            + "; ".join(f"{what}: {len(ids)} {ids[:10]}" for what, ids in pending.items())
            + f"\nin the tables: {rows_of(db, stuck)}\nsubscribers: "
            + "; ".join(s.state() for s in run.subscribers)
            + "\n"
            + "\n".join(stories),
            pytrace=False,
        )
    run.checker.auto_renewed(
        sum(s.sub.leaser.renewed for s in everyone if s.sub is not None and s.sub.leaser)
    )
    tables = read_tables(db, TABLE, DEAD_TABLE)
    db.dispose()
    report = run.checker.judge(tables)
    reconnects = sum(s.sub.reconnects for s in everyone if s.sub is not None)
    summary = (
        f"chaos: {report.summary()}; {cycles} fault cycles in {took:.0f}s; "
        f"{reconnects} stream reconnects; producer retries {producer.retries}; "
        f"other subscribers' acks during each stall {run.stall_progress}; "
        f"SIGTERM exit codes {run.graceful_exits}; takeovers after SIGKILL "
        f"{run.takeovers_s}s; late acks (acked, of) "
        f"{run.checker.late_acks}"
    )
    explained = [f"  {i}: {why}" for i, why in report.dead_explained]
    if explained:
        summary += "\nordinary messages dead, and why:\n" + "\n".join(explained)
    (tmp_path / "chaos-report.json").write_text(
        json.dumps(
            {
                "summary": summary,
                "reasons": dict(report.reasons),
                "dead_explained": report.dead_explained,
            },
            indent=2,
        )
    )
    with capsys.disabled():
        print(f"\n{summary}")

    assert report.inserted == TOTAL
    violations = report.violations()
    if violations:
        first = next(iter(violations.values()))[0]
        i = first[0] if isinstance(first, tuple) else first  # each finding names its id first
        assert isinstance(i, int)
        pytest.fail(
            "\n".join(f"{what}: {len(ids)} {ids[:10]}" for what, ids in violations.items())
            + f"\n{summary}\n"
            + run.checker.history(i),
            pytrace=False,
        )
    # the faults made redeliveries, and they said so
    assert max(report.attempts) > 1, summary
    # settlement happened: poison died both ways, renewals kept slow handlers' messages
    assert report.dead_poison == report.poison > 0, summary
    assert report.released > 0 and report.rejected > 0 and report.renewed > 0, summary
    assert report.attempts[MAX_ATTEMPTS] > 0, summary  # poison reached its last attempt
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
    assert [s.handler.error for s in everyone if s.handler.error is not None] == []
    assert reconnects > 0
    assert report.events["database restart"] >= 1 and report.events["msgtable SIGKILL"] >= 1
