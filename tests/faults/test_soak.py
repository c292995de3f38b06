"""The soak (`make soak`, MSGTABLE_SOAK_MINUTES long, 30 by default; skipped without it, so
not part of `make test`): two real `msgtable serve` processes on one durable database, a
producer at a steady rate (MSGTABLE_SOAK_RATE messages a second, 200 by default), two
subscribers that ack every batch, and a fault every FAULT_EVERY_S, in turn: a subscriber
killed, the other server SIGKILLed and started again, the database restarted, the database
SIGKILLed (crash recovery), the other server stopped with SIGTERM and started again.

One server (``steady``) is never signalled: once a minute the soak prints what it holds
(memory, threads, file descriptors, connections to the database: tests/faults/soak.py) with
the run's counts, and at the end fails if any of those grew (soak.growth), or if a message
inserted was never acked, after a drain.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from msgtable.client import Client
from msgtable.core.tables import current_layout_ddl
from msgtable.testing.devdb import LocalServer

from ..integration.helpers import comment
from ..waiting import wait_until
from . import soak
from .chaos import ServerProcess

MINUTES = float(os.environ.get("MSGTABLE_SOAK_MINUTES", "0") or 0)
RATE = int(os.environ.get("MSGTABLE_SOAK_RATE", "200") or 200)
FAULT_EVERY_S = 60.0
SAMPLE_EVERY_S = 60.0
DATABASE_DOWN_S = 3.0
DRAIN_S = 180.0  # after the last fault: every message acked by then
TABLE = "soak"
ACK_WAIT_S = 5

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(not MINUTES, reason="the soak runs with make soak (MSGTABLE_SOAK_MINUTES)"),
    pytest.mark.timeout(int(MINUTES * 60 + DRAIN_S + 600)),
]


class Producer(threading.Thread):
    """Inserts RATE messages a second in chunks of a tenth, riding out database outages
    (a chunk whose commit is in doubt goes again with INSERT IGNORE)."""

    def __init__(self, dsn: str) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.db = sa.create_engine(dsn, pool_pre_ping=True)
        self.inserted = 0
        self.retries = 0
        self.stop = threading.Event()

    def run(self) -> None:
        chunk = max(1, RATE // 10)
        next_at = time.monotonic()
        while not self.stop.is_set():
            first = self.inserted + 1
            rows = ",".join(f"({i}, 'm{i}')" for i in range(first, first + chunk))
            try:
                with self.db.begin() as conn:
                    conn.exec_driver_sql(f"insert ignore into {TABLE}(id, message) values {rows}")
            except sa.exc.DBAPIError:
                self.retries += 1
                self.stop.wait(0.5)
                continue
            self.inserted += chunk
            next_at += chunk / RATE
            self.stop.wait(max(0.0, next_at - time.monotonic()))
        self.db.dispose()


class Subscriber(threading.Thread):
    """Acks every batch it gets (a waited-for call); the ids of the acks that went through.
    ``kill()`` closes its client at once, as a process dying would end its streams."""

    def __init__(
        self, name: str, targets: str, acked: set[int], doubt: set[int], lock: threading.Lock
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.client = Client(targets, timeout_s=10)
        self.acked, self.doubt, self.lock = acked, doubt, lock
        self.errors = 0

    def run(self) -> None:
        try:
            with self.client.subscribe(TABLE) as sub:
                for batch in sub.batches():
                    ids = [int(m.id) for m in batch]
                    try:
                        sub.ack(batch)
                    except Exception:
                        # written or not: unwritten, the messages come back after their ack
                        # wait; written (its answer lost), the table says so at the end
                        self.errors += 1
                        with self.lock:
                            self.doubt.update(ids)
                        continue
                    with self.lock:
                        self.acked.update(ids)
        except Exception:
            pass  # killed (its client closed)

    def kill(self) -> None:
        self.client.close()
        self.join(30)


def test_a_long_run_with_faults_keeps_every_message_and_the_servers_resources_flat(
    own_durable_server: LocalServer, tmp_path: Path
) -> None:
    database = own_durable_server
    dsn = database.dsn("app")
    db = sa.create_engine(dsn, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    with db.connect() as conn:
        conn.exec_driver_sql(
            current_layout_ddl(
                TABLE,
                comment(
                    vt_ack_wait=ACK_WAIT_S,
                    vt_purge_after=60,
                    vt_batch_size=50,
                    vt_poller_interval=1,
                    vt_min_backoff=0.5,
                    vt_max_backoff=5,
                ),
            )
        )
    steady = ServerProcess(dsn, tmp_path, "steady", lease_period_s=2.0)
    other = ServerProcess(dsn, tmp_path, "other", lease_period_s=2.0)
    steady.start()
    other.start()
    targets = f"{steady.address},{other.address}"
    acked: set[int] = set()
    doubt: set[int] = set()  # acks whose call failed: written or not
    lock = threading.Lock()
    subscribers = [Subscriber(f"sub{k}", targets, acked, doubt, lock) for k in range(2)]
    for s in subscribers:
        s.start()
    producer = Producer(dsn)
    producer.start()

    def kill_subscriber() -> None:
        s = subscribers.pop(0)
        s.kill()
        fresh = Subscriber(f"sub{len(injected) + 10}", targets, acked, doubt, lock)
        fresh.start()
        subscribers.append(fresh)

    def sigkill_other() -> None:
        other.kill()
        other.start()

    def sigterm_other() -> None:
        other.terminate()
        other.start()

    def restart_database() -> None:
        database.stop()
        time.sleep(DATABASE_DOWN_S)
        database.start()

    def crash_database() -> None:
        database.kill()
        time.sleep(DATABASE_DOWN_S)
        database.start()

    faults = [
        ("subscriber killed", kill_subscriber),
        ("other server SIGKILL", sigkill_other),
        ("database restart", restart_database),
        ("database SIGKILL", crash_database),
        ("other server SIGTERM", sigterm_other),
    ]
    samples: list[soak.Sample] = []
    injected: list[str] = []
    began = time.monotonic()
    next_fault, next_sample = began + FAULT_EVERY_S / 2, began + SAMPLE_EVERY_S
    try:
        while (now := time.monotonic()) < began + MINUTES * 60:
            if now >= next_sample:
                minute = round((now - began) / 60)
                s = soak.sample(steady.process.pid, database.port, minute)  # type: ignore[union-attr]
                samples.append(s)
                with lock:
                    done = len(acked)
                print(
                    f"soak minute {minute}: inserted {producer.inserted:,}, acked {done:,}; "
                    f"steady server: {s.line()}; faults so far {len(injected)}",
                    flush=True,
                )
                next_sample += SAMPLE_EVERY_S
            if now >= next_fault:
                what, fault = faults[len(injected) % len(faults)]
                fault()
                injected.append(what)
                next_fault += FAULT_EVERY_S
            time.sleep(0.5)
        producer.stop.set()
        producer.join(30)
        total = producer.inserted

        def unacked() -> list[int]:
            """Rows the table still has unacked (acked ones are purged after a minute)."""
            with db.connect() as conn:
                rows = conn.exec_driver_sql(
                    f"select id from {TABLE} where time_acked is null order by id"
                ).all()
            return [int(r[0]) for r in rows]

        wait_until(
            lambda: not unacked(),
            timeout_s=DRAIN_S,
            what=lambda: (
                f"every message acked: {len(u := unacked())} of {total:,} not, e.g. {u[:10]}"
            ),
        )
        with lock:
            # not acked by a call that went through, and no failed call named it: lost
            lost = set(range(1, total + 1)) - acked - doubt
        assert not lost, f"{len(lost)} messages never acked, e.g. {sorted(lost)[:10]}"
    finally:
        producer.stop.set()
        for s in subscribers:
            s.kill()
        other.stop()
        steady.stop()
        db.dispose()
    warmup = min(5, max(1, int(MINUTES / 4)))
    grown = soak.growth(samples, warmup)
    print(
        f"soak: {MINUTES:g} minutes, {total:,} messages at {RATE}/s, all acked; faults "
        f"{len(injected)} ({', '.join(sorted(set(injected)))}); producer retries "
        f"{producer.retries}; steady server first {samples[0].line() if samples else '-'}, "
        f"last {samples[-1].line() if samples else '-'}"
    )
    assert not grown, "the steady server's resources grew:\n" + "\n".join(grown)
