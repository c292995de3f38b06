"""The parts of the fault suite: an independent checker, msgtable servers as real processes,
subscribers as threads of this process, and the faults.

The checker knows nothing of the engine's bookkeeping. It records every id the producer
committed, every delivery (id, subscriber, time it came off the stream) and every ack call
(ids, and when it returned: by then the ack was committed), all on this process's monotonic
clock, and judges at the end:

- every inserted id was delivered and acked;
- no id was delivered after an ack of it had returned (a slack covers the wire);
- two deliveries of one id are at least vt_ack_wait apart: a message is never in flight to
  two subscribers at once, whatever was killed (at-least-once duplicates come only after
  the first delivery's ack wait ended: a subscriber killed, stalled or too late, an ack lost);
- an id's deliveries never count back: each says which delivery it is (``attempt``, at least
  1), and a later delivery's attempt is never below an earlier one's (equal is allowed: a
  server killed between the send and the epoch's write sends the same attempt again);
- duplicates are counted, each with the reason its first delivery was not acked in time.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from msgtable.client import Client, Message, Subscription
from msgtable.devdb import free_port
from msgtable.errors import MsgtableError

from ..acceptance.helpers import health_status
from ..waiting import wait_until

WIRE_SLACK_S = 0.5  # a delivery this soon after an ack returned was on the wire already
# How long a late subscriber holds a batch before it acks: past its ack wait (vt_ack_wait), the
# backoff (vt_max_backoff) and a poll, so the batch went to another subscriber meanwhile.
LATE_BY_S = 6.0


class Checker:
    """Records what happened, from the outside, and judges it at the end."""

    def __init__(self, ack_wait_s: float) -> None:
        self.ack_wait_s = ack_wait_s
        self._lock = threading.Lock()
        self.inserted: set[int] = set()
        # id -> (when it came off the stream, subscriber, the attempt the message said)
        self.deliveries: dict[int, list[tuple[float, str, int]]] = defaultdict(list)
        self.first_ack: dict[int, float] = {}  # id -> when the first ack naming it returned
        self.unacked_on_purpose: dict[tuple[int, str], str] = {}  # (id, sub) -> why
        self.failed_acks: set[int] = set()
        self.late_acks: list[tuple[int, int]] = []  # (acked by the late call, ids in it)
        self.ack_calls = 0
        self.events: list[tuple[float, str]] = []

    def event(self, what: str) -> None:
        with self._lock:
            self.events.append((time.monotonic(), what))

    def insert(self, ids: Sequence[int]) -> None:
        with self._lock:
            self.inserted.update(ids)

    def delivered(self, batch: Sequence[tuple[int, int]], sub: str) -> None:
        """A batch came off the stream: (id, attempt) of each message."""
        now = time.monotonic()
        with self._lock:
            for i, attempt in batch:
                self.deliveries[i].append((now, sub, attempt))

    def dropped(self, ids: Sequence[int], sub: str, why: str) -> None:
        """The subscriber will not ack these (it is killed, stalled, or acks too late)."""
        with self._lock:
            for i in ids:
                self.unacked_on_purpose[(i, sub)] = why

    def acked(self, ids: Sequence[int]) -> None:
        now = time.monotonic()
        with self._lock:
            self.ack_calls += 1
            for i in ids:
                self.first_ack.setdefault(i, now)

    def ack_failed(self, ids: Sequence[int]) -> None:
        with self._lock:
            self.failed_acks.update(ids)

    def all_acked(self) -> bool:
        with self._lock:
            return bool(self.inserted) and self.inserted <= self.first_ack.keys()

    def missing(self) -> int:
        with self._lock:
            return len(self.inserted - self.first_ack.keys())

    def history(self, i: int) -> str:
        """One id's story, with the faults around it, for a failure message."""
        with self._lock:
            ds = sorted(self.deliveries.get(i, []))
            acked = self.first_ack.get(i)
            times = [t for t, _, _ in ds] + ([acked] if acked is not None else [])
            lo, hi = min(times) - 5, max(times) + 5
            lines = [f"{t:.3f} delivered to {sub} (attempt {a})" for t, sub, a in ds]
            if acked is not None:
                lines.append(f"{acked:.3f} first ack returned")
            lines += [f"{t:.3f} fault: {e}" for t, e in self.events if lo <= t <= hi]
            why = {s: w for (j, s), w in self.unacked_on_purpose.items() if j == i}
        return f"id {i}: " + "; ".join(sorted(lines)) + f"; not acked on purpose by {why}"

    def judge(self) -> Report:
        r = Report(inserted=len(self.inserted), events=Counter(e for _, e in self.events))
        with self._lock:
            r.never_delivered = sorted(self.inserted - self.deliveries.keys())[:20]
            r.never_acked = sorted(self.inserted - self.first_ack.keys())[:20]
            r.unknown = sorted(self.deliveries.keys() - self.inserted)[:20]
            for i, ds in self.deliveries.items():
                ds.sort()
                r.deliveries += len(ds)
                acked_at = self.first_ack.get(i)
                for t, sub, attempt in ds:
                    r.attempts[attempt] += 1
                    if acked_at is not None and t > acked_at + WIRE_SLACK_S:
                        r.after_ack.append((i, sub, round(t - acked_at, 3)))
                if ds[0][2] < 1:
                    r.attempts_back.append((i, 1, ds[0][2]))
                for (t1, s1, a1), (t2, _, a2) in itertools.pairwise(ds):
                    if a2 < a1:
                        r.attempts_back.append((i, a1, a2))
                    r.duplicates += 1
                    gap = t2 - t1
                    if gap < self.ack_wait_s - WIRE_SLACK_S:
                        r.in_flight_twice.append((i, round(gap, 3)))
                    why = self.unacked_on_purpose.get((i, s1))
                    if why is None:
                        why = "ack failed" if i in self.failed_acks else "ack lost in a fault"
                    r.reasons[why] += 1
        return r


@dataclass
class Report:
    inserted: int
    events: Counter[str]
    deliveries: int = 0
    duplicates: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    never_delivered: list[int] = field(default_factory=list)
    never_acked: list[int] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)
    after_ack: list[tuple[int, str, float]] = field(default_factory=list)
    in_flight_twice: list[tuple[int, float]] = field(default_factory=list)
    attempts: Counter[int] = field(default_factory=Counter)  # attempt -> deliveries saying it
    # (id, the attempt it had reached, the lower attempt a later delivery said)
    attempts_back: list[tuple[int, int, int]] = field(default_factory=list)

    def summary(self) -> str:
        faults = ", ".join(f"{n} {what}" for what, n in sorted(self.events.items()))
        reasons = ", ".join(f"{n} {why}" for why, n in self.reasons.most_common())
        return (
            f"{self.inserted:,} messages inserted, {self.deliveries:,} deliveries, "
            f"{self.duplicates:,} duplicates ({reasons or 'none'}); faults: {faults}; "
            f"never delivered {len(self.never_delivered)}, never acked "
            f"{len(self.never_acked)}, delivered after their ack {len(self.after_ack)}, "
            f"in flight to two subscribers at once {len(self.in_flight_twice)}, "
            f"attempts counting back {len(self.attempts_back)}; deliveries by attempt "
            f"{dict(sorted(self.attempts.items()))}"
        )


class ServerProcess:
    """One `msgtable serve` process on a fixed port, killed or stopped and started again."""

    def __init__(self, dsn: str, log_dir: Path, name: str, lease_period_s: float) -> None:
        self.dsn = dsn
        self.name = name
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.lease_period_s = lease_period_s
        self.log = log_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.exit_codes: list[int] = []

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MSGTABLE_")}
        command = [
            sys.executable,
            "-m",
            "msgtable",
            "serve",
            "--dsn",
            self.dsn,
            "--listen",
            self.address,
            "--lease-period",
            str(self.lease_period_s),
            "--discovery-interval",
            "1",
            "--grace-s",
            "3",
        ]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        wait_until(
            lambda: health_status(self.address) is not None,
            timeout_s=30,
            what=f"{self.name} answering",
        )

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.exit_codes.append(self.process.wait(10))

    def terminate(self) -> int:
        """SIGTERM: a graceful shutdown (returns the exit status)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(30)
        self.exit_codes.append(code)
        return code

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Subscriber(threading.Thread):
    """A worker: reads batches, records them, acks each in one call (unless told not to)."""

    def __init__(self, name: str, targets: str, table: str, checker: Checker) -> None:
        super().__init__(name=name, daemon=True)
        self.targets = targets
        self.table = table
        self.checker = checker
        self.order: str | None = None  # "kill", "stall", "late": what to do with the next batch
        self.stall_s = 0.0
        self.done = threading.Event()
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.client = Client(targets, timeout_s=10, retry_for_s=120)
        self.sub: Subscription | None = None

    def run(self) -> None:
        try:
            self.sub = self.client.subscribe(self.table, max_in_flight=400)
            for batch in self.sub.batches():
                ids = [int(m.id) for m in batch]  # type: ignore[call-overload]
                self.checker.delivered(
                    [(i, m.attempt) for i, m in zip(ids, batch, strict=True)], self.name
                )
                order, self.order = self.order, None
                if order == "kill":  # mid-batch: received, never acked
                    self.checker.dropped(ids, self.name, "subscriber killed")
                    self.client.close()
                    return
                if order == "stall":  # stops reading: the stream backs up to its window
                    self.checker.dropped(ids, self.name, "subscriber stalled")
                    time.sleep(self.stall_s)
                    self.client.close()
                    return
                if order == "late":  # acks after its ack wait ended: redelivered meanwhile
                    self.checker.dropped(ids, self.name, "ack too late")
                    late = threading.Timer(LATE_BY_S, self._ack, (batch, ids, True))
                    late.daemon = True
                    late.start()
                    continue
                self._ack(batch, ids, False)
                if self.stop_event.is_set():
                    break
        except MsgtableError as exc:
            if not self.stop_event.is_set():
                self.error = exc
        finally:
            self.done.set()

    def _ack(self, batch: list[Message], ids: list[int], late: bool) -> None:
        """Queue the batch's ack; the stream is read on, never held up by an ack call (so a
        delivery's time is when it came off the wire); the ack counts once its call
        returned."""
        assert self.sub is not None
        if late:  # one call of its own, its count kept
            try:
                count = self.sub.ack(batch)
            except MsgtableError:
                self.checker.ack_failed(ids)
                return
            self.checker.acked(ids)
            self.checker.late_acks.append((count, len(ids)))
            return
        try:
            future = self.sub.ack_async(batch)
        except MsgtableError:  # the subscription is closed
            self.checker.ack_failed(ids)
            return

        def done(f: Future[None]) -> None:
            if f.exception() is None:
                self.checker.acked(ids)
            else:
                self.checker.ack_failed(ids)

        future.add_done_callback(done)

    def finish(self) -> None:
        self.stop_event.set()
        if self.sub is not None:
            self.sub.close()
        self.client.close()


class Producer(threading.Thread):
    """Inserts ids 1..total in transactions of `chunk` rows, riding out database restarts:
    a chunk whose commit is in doubt is inserted again with INSERT IGNORE."""

    def __init__(
        self, dsn: str, table: str, total: int, chunk: int, pace_s: float, checker: Checker
    ):
        super().__init__(name="producer", daemon=True)
        self.db = sa.create_engine(dsn, pool_pre_ping=True)
        self.table, self.total, self.chunk, self.pace_s = table, total, chunk, pace_s
        self.checker = checker
        self.retries = 0
        self.done = threading.Event()

    def run(self) -> None:
        try:
            for start in range(1, self.total + 1, self.chunk):
                ids = list(range(start, min(start + self.chunk, self.total + 1)))
                rows = ",".join(f"({i}, 'm{i}')" for i in ids)
                sql = f"insert ignore into {self.table}(id, message) values {rows}"
                while True:
                    try:
                        with self.db.begin() as conn:
                            conn.exec_driver_sql(sql)
                        break
                    except sa.exc.DBAPIError:
                        self.retries += 1
                        time.sleep(0.5)
                self.checker.insert(ids)
                time.sleep(self.pace_s * random.uniform(0.5, 1.5))
        finally:
            self.done.set()
            self.db.dispose()
