"""The purger of one table: acked rows older than vt_purge_after leave, in bounded batches.

Every max(vt_poller_interval, PURGE_MIN_INTERVAL_S), with or without subscribers, it deletes
acked rows older than vt_purge_after, PURGE_BATCH_ROWS a statement, until a statement deletes
fewer. It is paced: after a statement that took t seconds it rests so that its deletes take at
most PURGE_DUTY_BUSY of the time while the table has subscribers (PURGE_DUTY_IDLE while it has
none). Purging is housekeeping (acked rows sit outside the poll's index range), so a million
old rows leave over minutes instead of starving delivery.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from msgtable.core.clock import Clock
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

    def wake(self) -> None:
        self._wake.set()

    def purge_once(self) -> int:
        """Delete acked rows older than vt_purge_after in paced batches, until none remain;
        returns how many."""
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
