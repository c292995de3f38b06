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

The streams that take every row take those redeliveries first, and the redelivery poll keeps
bringing them, so the fresh rows already cached may stay there (the cache does not fall to
half, and no pass reads on): a stream with a filter (msgtable.engine.routes) that drained
the rows it passes out of the cache would get nothing while its rows wait in the table. So
when a send finds nothing for such a stream with room while the pass lags, at most every
TIMED_POLL_GAP_NS, the **read for dry filters** goes on from the furthest the pass (or this
read) got to, past the rows cached already, ``over`` rows, and queues only those some dry
filter passes, up to twice ``over`` past the cache's size; the rows it passes over stay due
in the table, where the pass (which keeps its own cursor) reads them. The chaos run's filter
stall was this: a stream of ``bucket = 0`` got nothing for 3.7 s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from msgtable.core.rows import PollKey, Values, poll_key
from msgtable.core.tables import TableConfig
from msgtable.engine.cache import MessageCache
from msgtable.engine.due import lookahead_ns

if TYPE_CHECKING:
    from msgtable.store.protocol import Store

Accepts = Callable[[Values], bool]

# While a pass lags, the redelivery poll reads the rows given a time at most this often
TIMED_POLL_GAP_NS = 250_000_000


class Redeliveries:
    """One table's redelivery poll (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        cache: MessageCache,
        lock: threading.Lock,
        may: Callable[[], bool],
    ) -> None:
        self._store, self._cache, self._lock = store, cache, lock
        self._may = may  # (asked under the lock) whether it reads now: a subscriber, no floor
        self._at_ns = 0  # when it last read
        self._dry: list[Accepts] = []  # the filters the last send found nothing for
        self._dry_at_ns = 0  # when the read for dry filters last read
        self._dry_after: PollKey | None = None  # where it got to
        self.dry_reads = 0  # reads for dry filters made (msgtable_filter_reads_total)

    def poll(self, cfg: TableConfig, now: Callable[[], int], cursor: PollKey | None) -> int:
        """After a pass's poll (which left its cursor at ``cursor``): the redelivery poll,
        then the read for dry filters, each if it is time; returns how many rows are new.
        A pass that does not lag costs this one call (``now``: the clock, read only then)."""
        if not self._cache.due.pending:  # (a stale read: the next poll's look is soon)
            self._dry_after = None  # the pass caught up
            return 0
        now_ns = now()
        return self._poll_timed(cfg, now_ns) + self._poll_dry(cfg, now_ns, cursor)

    def _poll_timed(self, cfg: TableConfig, now_ns: int) -> int:
        """Read the due rows given a time into the cache if the pass lags; returns how many
        are new."""
        may = self._may
        with self._lock:
            due = self._cache.due
            if not due.pending or not may() or now_ns - self._at_ns < TIMED_POLL_GAP_NS:
                return 0
            self._at_ns = now_ns
            over = over_size(cfg)
            # rows sent and not postponed yet are still due in the table: read past them
            limit = over + min(self._cache.inflight.unclaimed, cfg.cache_size)
        with self._cache.poll() as poll:
            rows = self._store.poll_timed(cfg, now_ns + lookahead_ns(cfg), limit)
            with self._lock:
                if not may():
                    return 0
                added, _ = poll.add(rows, now_ns, created=True, over=over)
        return added

    def starved(self, dry: Sequence[Accepts], now_ns: int) -> bool:
        """A send found nothing for the streams with these filters and room (under the
        lock); returns whether to read for them now: the pass lags, and the last such read
        is TIMED_POLL_GAP_NS ago."""
        self._dry = list(dry) if self._cache.due.pending else []
        return bool(self._dry) and now_ns - self._dry_at_ns >= TIMED_POLL_GAP_NS

    def _poll_dry(self, cfg: TableConfig, now_ns: int, cursor: PollKey | None) -> int:
        """The read for dry filters (see the module docstring) on from the furthest the pass
        or this read got to; returns how many rows are new."""
        may = self._may
        with self._lock:
            dry, self._dry = self._dry, []
            # the furthest the pass or this read got to (a new pass begins at the head and
            # reads the rows cached already first); None once the pass caught up
            pending = self._cache.due.pending
            start = self._dry_after = _further(cursor, self._dry_after) if pending else None
            late = now_ns - self._dry_at_ns < TIMED_POLL_GAP_NS
            if not dry or not pending or late or not may():
                return 0
            self._dry_at_ns = now_ns
            self.dry_reads += 1
        over = over_size(cfg)
        with self._cache.poll() as poll:
            rows, _ = self._store.poll(cfg, now_ns + lookahead_ns(cfg), over, start, True)
            # (each row ends with its time_created; the rows no dry filter passes stay due)
            kept = [r for r in rows if any(f(tuple(r[3:-1])) for f in dry)]
            with self._lock:
                if not may() or not rows:
                    return 0
                added, taken = poll.add(kept, now_ns, created=True, over=2 * over)
                if taken == len(kept):  # (else the cache filled up: on after the last taken)
                    self._dry_after = poll_key(rows[-1])
                elif taken:
                    self._dry_after = poll_key(kept[taken - 1])
        return added


def _further(a: PollKey | None, b: PollKey | None) -> PollKey | None:
    """The later of two places in a pass (None: its head)."""
    if a is None or b is None:
        return a or b
    return a if (a[0], a[1] or 0, a[2]) >= (b[0], b[1] or 0, b[2]) else b


def over_size(cfg: TableConfig) -> int:
    """How many rows past the cache's size the redelivery poll may queue."""
    return max(cfg.batch_size, cfg.cache_size // 10)
