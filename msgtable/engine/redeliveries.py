"""The redelivery poll: the due rows given a time, read apart while a pass lags.

A pass reads a priority's fresh rows (time_next 0 or NULL) before its rows given a time (a
redelivery after its backoff, a release, a delayed message: time_next > 0), so in a group
that lags its producer a due redelivery would wait until every fresh row before it was sent.
While the pass lags (its last poll left due rows in the table), at most every
TIMED_POLL_GAP_NS, this reads those rows apart (Store.poll_timed: one range of poller_idx per
priority, so it reads them alone), due now or before the next poll, into the cache even when
fresh rows fill it (up to ``over`` past its size), where they go before the fresh ones
(msgtable.engine.due). The read is a poll like any other (msgtable.engine.cache.Poll): rows
sent and not postponed yet, held or changed since the read began are skipped. Not during a
takeover's floor (the rows it holds back wait for its end) nor for an ordered table
(msgtable.engine.ordered).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from msgtable.core.tables import TableConfig
from msgtable.engine.cache import MessageCache
from msgtable.engine.due import lookahead_ns

if TYPE_CHECKING:
    from msgtable.store.protocol import Store

# While a pass lags, the redelivery poll reads the rows given a time at most this often
TIMED_POLL_GAP_NS = 250_000_000


class Redeliveries:
    """One table's redelivery poll (see the module docstring)."""

    def __init__(
        self, store: Store, cache: MessageCache, lock: threading.Lock, may: Callable[[], bool]
    ) -> None:
        self._store, self._cache, self._lock = store, cache, lock
        self._may = may  # (asked under the lock) whether it reads now: a subscriber, no floor
        self._at_ns = 0  # when it last read

    def poll(self, cfg: TableConfig, now_ns: int) -> int:
        """Read the due rows given a time into the cache if the pass lags; returns how many
        are new."""
        may = self._may
        with self._lock:
            due = self._cache.due
            if not due.pending or not may() or now_ns - self._at_ns < TIMED_POLL_GAP_NS:
                return 0
            self._at_ns = now_ns
            over = max(cfg.batch_size, cfg.cache_size // 10)
            # rows sent and not postponed yet are still due in the table: read past them
            limit = over + min(self._cache.inflight.unclaimed, cfg.cache_size)
        with self._cache.poll() as poll:
            rows = self._store.poll_timed(cfg, now_ns + lookahead_ns(cfg), limit)
            with self._lock:
                if not may():
                    return 0
                added, _ = poll.add(rows, now_ns, created=True, over=over)
        return added
