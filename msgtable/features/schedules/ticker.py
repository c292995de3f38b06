"""The ticker: the loop, on the server that sends the placement's SCHEDULES unit, that
enqueues each schedule's due ticks (msgtable.core.schedules.plan), one transaction a tick
(msgtable.store.schedules.ScheduleSQL.tick: the message and the move of next_tick together,
conditional on the next_tick read).

Each pass reads every schedule (one SELECT), does what is due, and sleeps until the soonest
next tick, at most RELOAD_S (a schedule made through another server shows within that long;
one made through this server wakes it at once). A tick is enqueued when its time comes, give
or take the wake-up's precision: ``late_ns`` keeps how late each of the last LATE_KEPT was
(msgtable.observe.metrics, bench's schedule_late_p99_ms).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from collections.abc import Callable

from msgtable.core.clock import Clock
from msgtable.core.retry import Backoff, Outage, Retry
from msgtable.core.schedules import Schedule, plan
from msgtable.core.tables import TableConfig
from msgtable.store.schedules import ScheduleStore

log = logging.getLogger(__name__)

RELOAD_S = 1.0
LATE_KEPT = 1_000
# a schedule behind by many ticks catches up at most this many a pass (then the others go)
CATCH_UP_PER_PASS = 100


class Ticker:
    """Enqueues due ticks while open (see the module docstring). ``table(name)`` is the
    loaded config of a message table (None: not loaded here); ``sends()`` whether this
    server holds the SCHEDULES unit now; ``enqueued(table)`` wakes the table's sender."""

    def __init__(
        self,
        store: ScheduleStore,
        table: Callable[[str], TableConfig | None],
        clock: Clock,
        sends: Callable[[], bool],
        enqueued: Callable[[str], None],
        outage: Outage | None = None,
    ) -> None:
        self._store = store
        self._table = table
        self._clock = clock
        self._sends = sends
        self._enqueued = enqueued
        self._outage = outage
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.late_ns: collections.deque[int] = collections.deque(maxlen=LATE_KEPT)
        self.ticks = 0  # messages this server enqueued
        self.skipped = 0  # passes that left missed ticks out
        self.problems: dict[str, str] = {}  # by schedule: why its ticks are not enqueued

    @property
    def running(self) -> bool:
        return self._thread is not None

    def open(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self.run, args=(self._stop,), daemon=True, name="msgtable-schedules"
            )
            self._thread.start()

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
            self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    def wake(self) -> None:
        self._wake.set()

    def tick_once(self) -> float:
        """One pass: every due tick enqueued; returns how long until the soonest next one."""
        now = self._clock.now_ns()
        soonest = now + round(RELOAD_S * 1e9)
        for s in self._store.schedules():
            if self._stop.is_set() or not self._sends():
                break
            after = self._due(s)
            if after is not None:
                soonest = min(soonest, after.next_tick_ns)
        return max(0.0, (soonest - self._clock.now_ns()) / 1e9)

    def _due(self, s: Schedule) -> Schedule | None:
        """Enqueue what of ``s`` is due; ``s`` as it is after (None: not known)."""
        if s.next_tick_ns == 0:  # made by plain SQL: it starts at its next tick
            first = s.after(self._clock.now_ns())
            self._store.start(s.name, first)
            return dataclasses.replace(s, next_tick_ns=first)
        cfg = self._table(s.table)
        if cfg is None:
            self.problems[s.name] = f"no message table {s.table!r} is loaded"
            return None
        for _ in range(CATCH_UP_PER_PASS):
            now = self._clock.now_ns()
            t = plan(s, now)
            if t is None:
                break
            if not self._sends():
                return None
            try:
                done = self._store.tick(s, cfg, t.enqueue, t.next_ns, now)
            except Exception as exc:
                self.problems[s.name] = f"{type(exc).__name__}: {exc}"[:300]
                raise
            if not done:  # another server moved it: read again next pass
                return None
            self.problems.pop(s.name, None)
            self.skipped += t.skipped
            if t.enqueue is not None:
                self.ticks += 1
                self.late_ns.append(max(0, now - t.enqueue))
                self._enqueued(s.table)
            s = dataclasses.replace(s, next_tick_ns=t.next_ns)
        return s

    def run(self, stop: threading.Event) -> None:
        retry = Retry("schedules: tick", log, Backoff(0.1, 5.0, jitter=True), outage=self._outage)
        while not stop.is_set():
            self._wake.clear()
            try:
                delay = self.tick_once()
                retry.succeeded()
            except Exception as exc:
                delay = retry.failed(exc)
            if delay > 0:
                self._wake.wait(min(delay, RELOAD_S))
