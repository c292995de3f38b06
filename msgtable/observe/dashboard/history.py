"""The dashboard's rate history: what each table and subscription did over the last hour.

Nothing here runs per message. :class:`RateHistory` samples the engine's own counters
(msgtable.core.status.TableStatus: sent, acked, released, rejected, dead_lettered) every
``interval_s`` and keeps, per table and subscription, how many of each happened between two
samples, in fixed ring buffers of ``slots`` samples (one hour at the default 5 s: 720).

Invariants:
- memory is bounded and known up front: per key ``len(FIELDS) * slots`` doubles (5 * 720 * 8
  bytes = 28.8 KB at the defaults, about 2.9 MB for 100 tables), plus one shared ring of
  sample times; a key that no longer shows up is dropped at the next sample;
- a key's counters start at zero when its manager is opened here (metrics.py says the same),
  so its first sample counts everything since then, and a counter that went down (the table
  was reopened) counts from zero again: over a window that saw the key from its start, the
  sum of its deltas is its counter;
- sampling and reading take one short lock; no database call is made under it.
"""

from __future__ import annotations

import bisect
import logging
import threading
from array import array
from collections.abc import Callable, Iterable

from msgtable.core.status import TableStatus

log = logging.getLogger("msgtable.observe.dashboard")

FIELDS = ("sent", "acked", "released", "rejected", "dead_lettered")
DEFAULT_INTERVAL_S = 5.0
DEFAULT_SLOTS = 720  # one hour at 5 s

Key = tuple[str, str]  # (table, subscription; "" for the table's own group)
Deltas = dict[str, list[float]]  # field -> its deltas, oldest first


class _Series:
    """One key's ring of deltas, one array per field."""

    __slots__ = ("deltas", "last", "since")

    def __init__(self, slots: int, since: int) -> None:
        self.deltas = [array("d", bytes(8 * slots)) for _ in FIELDS]
        self.last = [0] * len(FIELDS)
        self.since = since  # the sample number this key was first seen at


class RateHistory:
    """Per table and subscription: how many messages were sent, acked, released, rejected
    and dead-lettered between two samples, over the last ``slots`` samples."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, slots: int = DEFAULT_SLOTS) -> None:
        if interval_s <= 0 or slots < 2:
            raise ValueError("a history needs a positive interval and at least two slots")
        self.interval_s = interval_s
        self.slots = slots
        self._lock = threading.Lock()
        self._times = array("d", bytes(8 * slots))  # unix seconds of each sample
        self._count = 0  # samples taken so far
        self._series: dict[Key, _Series] = {}

    def sample(self, now_s: float, statuses: Iterable[TableStatus]) -> None:
        """Record one sample of every key's counters (taken at ``now_s``)."""
        counts = {
            (s.name, s.subscription): [int(getattr(s, f)) for f in FIELDS]
            for s in statuses
            if s.config is not None
        }
        with self._lock:
            slot = self._count % self.slots
            self._times[slot] = now_s
            for key in [k for k in self._series if k not in counts]:
                del self._series[key]
            for key, now in counts.items():
                series = self._series.get(key)
                if series is None:
                    series = self._series[key] = _Series(self.slots, self._count)
                for i, value in enumerate(now):
                    before = series.last[i]
                    series.deltas[i][slot] = value - before if value >= before else value
                    series.last[i] = value
            self._count += 1

    def times(self) -> list[float]:
        """The sample times held, oldest first."""
        with self._lock:
            return self._ordered(self._times, self._count)

    def series(self, table: str, subscription: str = "") -> Deltas:
        """Each field's deltas at the sample times (``times()``), oldest first; a key seen
        only from a later sample has zeros before it, an unknown one zeros."""
        times, series = self.view()
        found = series.get((table, subscription))
        return found if found is not None else {f: [0.0] * len(times) for f in FIELDS}

    def view(self, after_s: float | None = None) -> tuple[list[float], dict[Key, Deltas]]:
        """The sample times after ``after_s`` (all held when None), oldest first, and each
        key's deltas at those times: one consistent cut, taken under the lock (a page that
        polls asks only for what it has not seen)."""
        with self._lock:
            times = self._ordered(self._times, self._count)
            skip = 0 if after_s is None else bisect.bisect_right(times, after_s)
            n = len(times)
            out: dict[Key, Deltas] = {}
            for key, s in self._series.items():
                zeros = min(n, max(0, s.since - (self._count - n)))  # before it was seen
                first = max(skip, zeros)
                pad = [0.0] * max(0, zeros - skip)
                out[key] = {
                    f: pad + self._ordered(s.deltas[i], self._count, first)
                    for i, f in enumerate(FIELDS)
                }
            return times[skip:], out

    def memory_bytes(self) -> int:
        """The bytes its arrays hold (the bound the module's docstring states)."""
        with self._lock:
            arrays = [self._times] + [d for s in self._series.values() for d in s.deltas]
            return sum(a.buffer_info()[1] * a.itemsize for a in arrays)

    def keys(self) -> list[Key]:
        with self._lock:
            return sorted(self._series)

    def _ordered(self, ring: array[float], count: int, first: int = 0) -> list[float]:
        """The ring's values oldest first, from the ``first``-th held on."""
        n = min(count, self.slots)
        length = n - first
        if length <= 0:
            return []
        a = (count - n + first) % self.slots
        if a + length <= self.slots:
            return ring[a : a + length].tolist()
        return ring[a:].tolist() + ring[: a + length - self.slots].tolist()


class Sampler:
    """Samples the engine into a :class:`RateHistory` every ``interval_s`` (the history's
    unless given) on its own thread (idempotent ``open()`` / ``close()``; ``close()`` wakes it
    at once). The dashboard's refresher (msgtable.observe.dashboard.api.REFRESH_S) is one too."""

    def __init__(
        self,
        history: RateHistory,
        sample: Callable[[], object],
        interval_s: float | None = None,
        what: str = "sampling the engine",
        name: str = "msgtable-dashboard-sampler",
    ) -> None:
        self.history = history
        self._sample = sample
        self.interval_s = history.interval_s if interval_s is None else interval_s
        self._what = what
        self._name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def open(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, daemon=True, name=self._name)
            self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self._sample()
            except Exception:  # a failed sample is a gap in the plot, not a dead dashboard
                log.exception("dashboard: %s failed", self._what)
            if self._stop.wait(self.interval_s):
                return

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
