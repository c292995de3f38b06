"""A latency histogram a table's manager fills per batch, and msgtable.observe.metrics reads: send
->
ack per ack batch, time_created -> first send per send batch, a statement's duration.

Fixed buckets (seconds, Prometheus's ``le`` bounds: a value falls in the first bucket whose
bound it does not exceed), counts and a sum: observing a batch is a bisect and an increment
per value, under the manager's lock it already holds (not thread-safe on its own). No
prometheus import here: the engine runs the same without the metrics server.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_left
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

# From 5 ms (a busy server's send -> ack) to 5 minutes (a slow consumer, a long ack wait).
# Cumulative (``le`` bound, count) pairs ending with ``+Inf``, and the sum in seconds
LatencySnapshot = tuple[list[tuple[str, int]], float]
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

# A message's time_created -> its first send: from 5 ms (a busy server) to an hour (a message
# enqueued with a delay, a backlog worked off slowly).
DELAY_BUCKETS_S = (*BUCKETS_S, 900.0, 3600.0)

# A database statement's (msgtable.store.mysqlstore, by kind): from half a millisecond to 10 s.
STATEMENT_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 10.0)


# How a component with a connection of its own (the lease, the capture follower) has its
# statements timed by kind and failures counted (msgtable.store.mysqlstore.MySQLStore.timed)
Timed = Callable[[str], AbstractContextManager[None]]


def untimed(kind: str) -> AbstractContextManager[None]:
    """A Timed that times nothing (no store to tell: unit tests, tools)."""
    return contextlib.nullcontext()


class LatencyHistogram:
    """Counts of durations by bucket, and their sum (see the module docstring)."""

    __slots__ = ("_bounds_ns", "bounds_s", "counts", "sum_ns")

    def __init__(self, bounds_s: tuple[float, ...] = BUCKETS_S) -> None:
        self.bounds_s = bounds_s
        self._bounds_ns = [round(b * 1e9) for b in bounds_s]
        self.counts = [0] * (len(bounds_s) + 1)  # the last: above every bound
        self.sum_ns = 0

    def observe_since(self, now_ns: int, began_ns: Iterable[int]) -> None:
        """One duration per start time: ``now_ns - began`` (never below 0)."""
        bounds, counts, total = self._bounds_ns, self.counts, 0
        for began in began_ns:
            d = now_ns - began if now_ns > began else 0
            counts[bisect_left(bounds, d)] += 1
            total += d
        self.sum_ns += total

    def snapshot(self) -> LatencySnapshot:
        """Cumulative (``le`` bound, count) pairs ending with ``+Inf``, and the sum in seconds."""
        out, running = [], 0
        for bound, n in zip((*self.bounds_s, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return out, self.sum_ns / 1e9
