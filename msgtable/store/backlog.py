"""How big and how old the backlog of each table and subscription is: one home for it.

The backlog of a table (its default group) or of a subscription (its state table) is its
unacked messages that are not dead: ``due`` ones (time_next <= now: ready to send) and
``scheduled`` ones (time_next > now: delayed, or backing off after a send), the oldest one's
age (now - time_created) and how many were created within each of :data:`AGE_BOUNDS_S`
(cumulative, like Prometheus's ``le``: the last bound, +inf, counts every unacked message,
one whose time_created is NULL included). A table without a time_created column has no ages:
``oldest_unacked_age_s`` None and ``by_age`` empty.

The store reads it with one aggregate statement per table (msgtable.store.statements.backlog_sql,
under a statement time-out); :class:`BacklogReader` (the engine's ``backlog()``) reads every table
at most once per ``max_age_s``, shares one read between concurrent callers without holding a
lock across it, and answers with the last read of a table whose read failed (the database
away, a time-out): what the metrics scrape and the dashboard read, never an exception. A
metrics scrape waits at most :data:`SCRAPE_WAIT_S` for a read (then answers with the last one
while the read goes on): a slow or silent database does not make the scrape late.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from msgtable.core.tables import TableConfig

log = logging.getLogger(__name__)

# Upper bounds (seconds) of the age buckets: a minute, 5 and 15 minutes, an hour, 6 hours, a day.
AGE_BOUNDS_S = (60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0, float("inf"))
DEFAULT_MAX_AGE_S = 5.0
# How long one table's backlog statement may run before the database ends it (MariaDB's
# max_statement_time, MySQL's MAX_EXECUTION_TIME hint): a scrape waits at most this per table.
STATEMENT_TIMEOUT_S = 2.0
# How long a metrics scrape waits for a backlog read before it answers with the last read: a
# healthy database answers in milliseconds; a slow or silent one does not hold the scrape.
SCRAPE_WAIT_S = 1.0


@dataclass(frozen=True)
class BacklogCounts:
    """What the store reads of one table or state table (msgtable.store.statements.backlog_sql)."""

    due: int
    scheduled: int
    oldest_created_ns: int | None  # None: no unacked message, or no time_created column
    # unacked messages created within each finite bound of AGE_BOUNDS_S (cumulative); ()
    # without a time_created column
    within: tuple[int, ...] = ()


@dataclass(frozen=True)
class Backlog:
    """The backlog of one table's default group or one subscription (module docstring)."""

    table: str
    subscription: str  # "" for the table's default group
    due: int  # unacked, time_next <= now (ready to send)
    scheduled: int  # unacked, time_next > now (delayed or backing off)
    oldest_unacked_age_s: float | None  # now - time_created of the oldest unacked, None if none
    # (upper bound in seconds, unacked messages created within it), AGE_BOUNDS_S, cumulative
    by_age: tuple[tuple[float, int], ...]


def backlog_of(cfg: TableConfig, counts: BacklogCounts, now_ns: int) -> Backlog:
    """A table's (or a state table's) counts as its Backlog, aged at ``now_ns``."""
    oldest = counts.oldest_created_ns
    age = None if oldest is None else max(0.0, (now_ns - oldest) / 1e9)
    by_age: tuple[tuple[float, int], ...] = ()
    if counts.within:
        total = counts.due + counts.scheduled
        by_age = (*zip(AGE_BOUNDS_S[:-1], counts.within, strict=True), (AGE_BOUNDS_S[-1], total))
    return Backlog(
        table=cfg.source or cfg.name,
        subscription=cfg.subscription,
        due=counts.due,
        scheduled=counts.scheduled,
        oldest_unacked_age_s=age,
        by_age=by_age,
    )


def has_backlog(cfg: TableConfig) -> bool:
    """Whether a loaded table or subscription has a backlog of its own: a subscription, or a
    table with a default group (vt_default_group=off: only its subscriptions consume it)."""
    return bool(cfg.source) or cfg.default_group


class BacklogStore(Protocol):
    """What the reader asks of the database (msgtable.store.mysqlstore.MySQLStore,
    InMemoryStore)."""

    def backlog(self, cfgs: Sequence[TableConfig], now_ns: int) -> dict[str, BacklogCounts]: ...


class BacklogReader:
    """Every table's backlog, read at most once per ``max_age_s`` (module docstring)."""

    def __init__(
        self,
        store: BacklogStore,
        configs: Callable[[], list[TableConfig]],
        now_ns: Callable[[], int],
        away: Callable[[], bool] = lambda: False,
    ) -> None:
        self._store = store
        self._configs = configs  # the loaded tables and subscriptions now
        self._now_ns = now_ns
        self._away = away  # the database is known to be away: do not wait for it
        self._lock = threading.Lock()
        self._last: dict[str, Backlog] = {}  # by table or state table, the last read of each
        self._answer: list[Backlog] = []
        self._read_at: float | None = None  # time.monotonic() of the last read
        self._reading: threading.Event | None = None
        self.reads = 0  # how many reads ran, and callers waiting for one (tests count them)
        self.waiting = 0

    def backlog(
        self, max_age_s: float = DEFAULT_MAX_AGE_S, wait_s: float | None = None
    ) -> list[Backlog]:
        """The backlogs, by (table, subscription): read now if the last read is older than
        ``max_age_s``; a caller that comes while another reads waits for that read.

        ``wait_s`` None: the caller waits for the read, however long the database takes (the
        dashboard's own thread, ``ListTables``). A number: the read runs on a thread of its
        own and the caller waits at most that long for it, then answers with the last read
        (``[]`` before the first), the read going on to serve later callers (a metrics
        scrape: a database that holds the statement, a slow or silent link, does not hold
        the scrape)."""
        with self._lock:
            fresh = self._read_at is not None and time.monotonic() - self._read_at < max_age_s
            if fresh:
                return self._answer
            reading = self._reading
            start = reading is None
            if reading is None:
                reading = self._reading = threading.Event()
            reads_itself = start and wait_s is None
            if not reads_itself:
                self.waiting += 1
        if reads_itself:
            return self._read_then_wake(reading)
        if start:
            threading.Thread(
                target=self._read_then_wake, args=(reading,), name="msgtable-backlog", daemon=True
            ).start()
        reading.wait(wait_s)
        with self._lock:
            self.waiting -= 1
            return self._answer

    def _read_then_wake(self, reading: threading.Event) -> list[Backlog]:
        try:
            answer = self._read()
        except Exception:  # never to the scraper: the last answer stands
            log.exception("reading the backlog failed")
            with self._lock:
                answer = self._answer
        finally:
            with self._lock:
                self._reading = None
            reading.set()
        return answer

    def _read(self) -> list[Backlog]:
        configs = [c for c in self._configs() if has_backlog(c)]
        counts: dict[str, BacklogCounts] = {}
        now = self._now_ns()
        if configs and not self._away():
            try:
                counts = self._store.backlog(configs, now)
            except Exception as exc:  # the database away: the last read of each table
                log.debug("backlog not read: %s", exc)
        with self._lock:
            self.reads += 1
            last = {c.name: backlog_of(c, n, now) for c in configs if (n := counts.get(c.name))}
            for c in configs:  # not read this time: the last read of it stands
                if c.name not in last and c.name in self._last:
                    last[c.name] = self._last[c.name]
            self._last = last
            self._answer = sorted(last.values(), key=lambda b: (b.table, b.subscription))
            self._read_at = time.monotonic()
            return self._answer
