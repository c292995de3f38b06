"""The fan-out loop of one message table with subscriptions: new rows to every subscription.

While this server sends (it holds the lease), the loop hands the table's unseen rows
(``time_fanout IS NULL``) to its active subscriptions in batches of FANOUT_BATCH_ROWS, one
transaction each (msgtable.store.subscriptions), numbered by the table's fan-out sequence
(msgtable.store.sequences), until a batch comes back short; then it waits for the table's
poller interval, or less when woken (the binlog showed an insert, a subscription was
created). The pick skips rows another transaction holds locked (SKIP LOCKED): those of a
transaction still open come when its commit wakes the loop, but a committed row whose lock
ends without a binlog event (a locking read such as the default group's send check, or the
inserting transaction's commit still completing as the pick that its binlog event woke
ran) wakes nobody: while committed rows are left unseen, the loop looks again after
SOON_S, doubling up to the poller interval. It tells the subscriptions that got rows, so
their pollers read them at once. The database is the truth: a crash mid-batch leaves the
rows unseen, handed over by the next server; a definition the engine has not loaded yet
stops the batch until it is loaded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from msgtable.core.clock import Clock
from msgtable.core.retry import Backoff, Outage, Retry
from msgtable.core.subscriptions import LoadedSubscription
from msgtable.core.tables import TableConfig
from msgtable.store.protocol import SubscriptionStore

log = logging.getLogger(__name__)

FANOUT_BATCH_ROWS = 2_000
SOON_S = 0.05  # the first wait before looking again at committed rows a pick skipped
RETRY_MIN_S = 0.2
RETRY_MAX_S = 30.0


class Fanout:
    """Hands one table's new rows to its subscriptions (see the module docstring).

    ``subscriptions()`` gives the loaded ones by name; ``handed(names)`` is told which got
    rows; ``unknown(names)`` that the database has definitions not loaded yet (it loads
    them); ``may_send()`` whether this server sends now."""

    def __init__(
        self,
        store: SubscriptionStore,
        config: Callable[[], TableConfig],
        subscriptions: Callable[[], Mapping[str, LoadedSubscription]],
        clock: Clock,
        may_send: Callable[[], bool],
        handed: Callable[[list[str]], None],
        unknown: Callable[[set[str]], None],
        outage: Outage | None = None,
    ) -> None:
        self._store = store
        self._config = config
        self._subscriptions = subscriptions
        self._clock = clock
        self._may_send = may_send
        self._handed = handed
        self._unknown = unknown
        self._outage = outage
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._soon_s = 0.0  # the last wait for rows left unseen (0: none were)
        self.handed_total = 0

    def trigger(self) -> None:
        self._wake.set()

    def open(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, daemon=True, name=f"msgtable-fanout-{self._config().name}"
            )
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)

    def fanout_once(self) -> int:
        """Hand over batches until one comes back short; returns rows handed over."""
        total = 0
        while not self._stop.is_set() and self._may_send():
            cfg = self._config()
            loaded = self._subscriptions()
            got, unknown = self._store.fanout(cfg, loaded, self._clock.now_ns(), FANOUT_BATCH_ROWS)
            if unknown:
                self._unknown(unknown)
                if unknown - self._subscriptions().keys():
                    log.info(
                        "table %s: waiting for subscription %s to load",
                        cfg.name,
                        ", ".join(sorted(unknown)),
                    )
                    break
                continue
            rows = got.pop("", 0)
            total += rows
            names = [n for n, k in got.items() if k]
            if names:
                self._handed(names)
            if rows < FANOUT_BATCH_ROWS:
                break
        self.handed_total += total
        return total

    def _wait_s(self) -> float:
        """The wait after a fan-out, unless woken: the poller interval, or, while committed
        rows are left unseen (skipped as locked: module docstring), SOON_S doubling up to
        it (one plain read a fan-out; a row locked long costs one at each look)."""
        cfg = self._config()
        interval = cfg.poller_interval_s
        if self._may_send() and self._store.pending_fanout(cfg.name, 1):
            self._soon_s = min(interval, 2 * self._soon_s if self._soon_s else SOON_S)
            return self._soon_s
        self._soon_s = 0.0
        return interval

    def _run(self) -> None:
        retry = Retry(
            f"table {self._config().name}: fan-out",
            log,
            Backoff(RETRY_MIN_S, RETRY_MAX_S),
            outage=self._outage,
        )
        delay = 0.0
        while not self._stop.is_set():
            self._wake.wait(delay)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.fanout_once()
                delay = self._wait_s()
                retry.succeeded()
            except Exception as exc:
                delay = retry.failed(exc)
