"""Time as a dependency: the engine reads wall-clock nanoseconds only through a Clock."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Unix time in nanoseconds (the unit of time_next, time_acked, ...)."""

    def now_ns(self) -> int: ...


class SystemClock:
    """The real wall clock."""

    def now_ns(self) -> int:
        return time.time_ns()


class FakeClock:
    """A clock that moves only when told to; for unit tests."""

    def __init__(self, start_ns: int = 1_700_000_000 * 10**9) -> None:
        self._now = start_ns
        self._lock = threading.Lock()

    def now_ns(self) -> int:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += int(seconds * 1e9)
