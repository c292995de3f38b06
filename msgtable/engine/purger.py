"""The purger of one table: acked rows older than vt_purge_after leave, in bounded batches.

Every max(vt_poller_interval, PURGE_MIN_INTERVAL_S), with or without subscribers, it deletes
acked rows older than vt_purge_after, PURGE_BATCH_ROWS a statement, until a statement deletes
fewer. It is paced: after a statement that took t seconds it rests so that its deletes take at
most PURGE_DUTY_BUSY of the time while the table has subscribers (PURGE_DUTY_IDLE while it has
none). Purging is housekeeping (acked rows sit outside the poll's index range), so a million
old rows leave over minutes instead of starving delivery.

A table with vt_dedup (msgtable.core.dedup) has its keys past the window cleared first, in the
same pass and the same paced batches: the rows created in [floor, now - window), where the
floor trails the last cutoff by DEDUP_LATE_COMMIT_S (a row committed that late after its
INSERT is still found) and drops to 0 at the start and every DEDUP_FULL_SWEEP_S (a later one).
Its purge then deletes acked rows whose key is cleared, so a row refuses duplicates for its
whole window however short vt_purge_after.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from msgtable.core.clock import Clock
from msgtable.core.dedup import DEDUP_FULL_SWEEP_S, DEDUP_LATE_COMMIT_S
from msgtable.core.retry import Backoff, Outage, Retry
from msgtable.core.tables import TableConfig
from msgtable.limits import PURGE_BATCH_ROWS

if TYPE_CHECKING:
    from msgtable.store.protocol import Store

log = logging.getLogger("msgtable.engine.manager")

PURGE_MIN_INTERVAL_S = 1.0
# The share of wall time the purger may spend in its DELETEs: after a batch that took t
# seconds it rests t * (1 / duty - 1).
PURGE_DUTY_BUSY = 0.25
PURGE_DUTY_IDLE = 0.5


class Purger:
    """Deletes one table's old acked rows (see the module docstring). ``config`` gives the
    table's current settings, ``busy`` whether it has subscribers now; ``stop`` ends it."""

    def __init__(
        self,
        store: Store,
        config: Callable[[], TableConfig],
        clock: Clock,
        stop: threading.Event,
        busy: Callable[[], bool],
        backoff: Backoff,
        outage: Outage | None = None,
    ) -> None:
        self._store = store
        self._config = config
        self._clock = clock
        self._stop = stop
        self._busy = busy
        self._backoff = backoff
        self._outage = outage
        self._wake = threading.Event()
        self.timer: Callable[[], float] = time.monotonic  # the pacing's clock (tests swap)
        self.rest: Callable[[float], object] = stop.wait
        # vt_dedup: where the next pass's clearing of keys starts, and when the last full
        # sweep began (its clock: self.timer)
        self._dedup_floor_ns = 0
        self._dedup_swept: float | None = None

    def wake(self) -> None:
        self._wake.set()

    def purge_once(self) -> int:
        """Delete acked rows older than vt_purge_after in paced batches, until none remain;
        returns how many."""
        if self._config().dedup:
            self.expire_dedup_once()
        total = 0
        while not self._stop.is_set():
            cfg = self._config()
            cutoff = self._clock.now_ns() - round(cfg.purge_after_s * 1e9)
            began = self.timer()
            n = self._store.purge(cfg, cutoff, PURGE_BATCH_ROWS)
            took = self.timer() - began
            total += n
            if n < PURGE_BATCH_ROWS:
                break
            duty = PURGE_DUTY_BUSY if self._busy() else PURGE_DUTY_IDLE
            self.rest(took * (1 / duty - 1))
        return total

    def expire_dedup_once(self) -> int:
        """Clear the vt_dedup keys whose window has passed, in paced batches; returns how
        many (see the module docstring)."""
        now = self.timer()
        if self._dedup_swept is None or now - self._dedup_swept >= DEDUP_FULL_SWEEP_S:
            self._dedup_floor_ns, self._dedup_swept = 0, now
        total = 0
        cfg = self._config()
        cutoff = self._clock.now_ns() - round(cfg.dedup_window_s * 1e9)
        while not self._stop.is_set():
            began = self.timer()
            n = self._store.expire_dedup(cfg, self._dedup_floor_ns, cutoff, PURGE_BATCH_ROWS)
            took = self.timer() - began
            total += n
            if n < PURGE_BATCH_ROWS:
                break
            duty = PURGE_DUTY_BUSY if self._busy() else PURGE_DUTY_IDLE
            self.rest(took * (1 / duty - 1))
        else:
            return total
        late = round(DEDUP_LATE_COMMIT_S * 1e9)
        self._dedup_floor_ns = max(self._dedup_floor_ns, cutoff - late)
        return total

    def run(self) -> None:
        """The loop: a pass every interval (sooner when woken) until stopped."""
        retry = Retry(
            f"table {self._config().name}: purge", log, self._backoff, outage=self._outage
        )
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.purge_once()
                retry.succeeded()
                delay = max(self._config().poller_interval_s, PURGE_MIN_INTERVAL_S)
            except Exception as exc:
                delay = retry.failed(exc)
            self._wake.wait(delay)
