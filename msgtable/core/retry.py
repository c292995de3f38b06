"""Retrying with backoff, and the one way a retrying loop reports it.

Every loop that talks to something that may be away for a while (a table's poller, sender and
purger; the engine's discovery; the binlog follower; the lease; the client's calls and
subscriptions) keeps a :class:`Retry`: ``failed(exc)`` counts a failure and says how long to
wait before the next attempt, ``succeeded()`` ends the run of failures. The log says what
happened once, not at every attempt: the first failure of a run at WARNING (at ERROR with the
traceback when the error is not a MsgtableError, which means a bug), the next ones at DEBUG,
and the recovery at INFO.

A database that does not answer makes every loop of a server fail at once; the user is told
once, by the database's :class:`Outage`: "waiting for the database at HOST:PORT: why" when it
goes, and "the database at HOST:PORT answers again after 12s" when it is back. A loop's own
lines about it are then DEBUG.

(A message's own backoff, when it is sent again, is another thing: msgtable.core.backoff.)
"""

from __future__ import annotations

import datetime
import logging
import random
import threading
import time

from msgtable.errors import DatabaseUnavailable, MsgtableError

_MAX_DOUBLINGS = 30  # beyond this every delay is at its ceiling anyway


class Backoff:
    """Exponential delays: ``min_s`` after the first failure, doubling with each one up to
    ``max_s``. With ``jitter`` each delay is drawn uniformly between half and all of that
    ceiling (full jitter), so that many clients retrying at once spread out."""

    def __init__(
        self, min_s: float, max_s: float, *, jitter: bool = False, rng: random.Random | None = None
    ) -> None:
        self.min_s = min_s
        self.max_s = max_s
        self.jitter = jitter
        self._rng = rng or random.Random()

    def delay_s(self, failures: int) -> float:
        """The wait after failure number ``failures`` (1, 2, ...)."""
        ceiling = min(self.max_s, self.min_s * 2.0 ** min(max(failures - 1, 0), _MAX_DOUBLINGS))
        return self.jittered(ceiling)

    def jittered(self, ceiling: float) -> float:
        """A wait of at most ``ceiling``: with ``jitter`` drawn between half and all of it."""
        return self._rng.uniform(ceiling / 2, ceiling) if self.jitter else ceiling


class Outage:
    """Whether a server's database answers, as every part of the server sees it (see the
    module docstring). ``down(error)`` whenever a statement found it away (the first time
    says so), ``up()`` whenever one went through (the first time after an outage says so);
    ``describe()`` what it is now, for ListTables. Thread-safe."""

    def __init__(self, where: str, log: logging.Logger, tell: bool = False) -> None:
        self.where = where  # "the database at HOST:PORT"
        self.reason = ""  # why it is away ("" while it answers)
        # Whether it logs its two lines: a server does (its engine sets it); a command that
        # runs a statement or two says what failed in its one error line instead.
        self.tell = tell
        self._log = log
        self._since: float | None = None  # monotonic, while away
        self._since_wall = 0.0
        self._lock = threading.Lock()

    @property
    def away(self) -> bool:
        return self._since is not None

    def down(self, error: BaseException) -> None:
        reason = str(error).removeprefix("database unavailable: ")
        with self._lock:
            self.reason = reason
            if self._since is not None:
                return
            self._since, self._since_wall = time.monotonic(), time.time()
        if self.tell:
            self._log.warning("waiting for %s: %s", self.where, reason)

    def up(self) -> None:
        if self._since is None:  # the usual case, on every statement: no lock
            return
        with self._lock:
            since, self._since, self.reason = self._since, None, ""
        if since is not None and self.tell:
            self._log.info("%s answers again after %.0fs", self.where, time.monotonic() - since)

    def describe(self) -> str:
        """Why the database is away and since when, or "" while it answers."""
        with self._lock:
            if self._since is None:
                return ""
            since = datetime.datetime.fromtimestamp(self._since_wall).strftime("%H:%M:%S")
            return f"waiting for {self.where} since {since}: {self.reason}"


class Retry:
    """One loop's run of failures (see the module docstring). ``what`` names the attempt in
    the log ("table jobs: poll"); ``level`` is the level of a run's first failure."""

    def __init__(
        self,
        what: str,
        log: logging.Logger,
        backoff: Backoff,
        *,
        level: int = logging.WARNING,
        outage: Outage | None = None,
    ) -> None:
        self.what = what
        self.backoff = backoff
        self.failures = 0
        self._log = log
        self._level = level
        self._outage = outage  # tells the user of a database that is away, once
        self._told = False  # the run's first failure was logged at INFO or above

    def failed(
        self,
        exc: BaseException,
        delay_s: float | None = None,
        *,
        what: str | None = None,
        level: int | None = None,
    ) -> float:
        """Count a failure; returns how long to wait before the next attempt (``delay_s``
        when the caller knows better, e.g. a redirect followed at once). ``what``: this
        attempt, when a loop makes several kinds; ``level``: of this first failure, when
        it is an expected one (a redirect)."""
        self.failures += 1
        what = what or self.what
        delay = self.backoff.delay_s(self.failures) if delay_s is None else delay_s
        if self._outage is not None and isinstance(exc, DatabaseUnavailable):
            self._outage.down(exc)
            level = logging.DEBUG
        if self.failures == 1:
            bug = not isinstance(exc, MsgtableError)
            first_level = logging.ERROR if bug else (level or self._level)
            self._told = first_level >= logging.INFO
            self._log.log(
                first_level,
                "%s failed: %s; retrying in %.1fs",
                what,
                exc if str(exc) else repr(exc),
                delay,
                exc_info=exc if bug else None,
            )
        else:
            self._log.debug(
                "%s failed (%d in a row): %s; retrying in %.1fs",
                what,
                self.failures,
                exc,
                delay,
            )
        return delay

    def succeeded(self) -> None:
        """The attempt worked: the run of failures, if there was one, is over."""
        if self.failures:
            level = logging.INFO if self._told else logging.DEBUG
            self._log.log(level, "%s works again (after %d failures)", self.what, self.failures)
            self.failures = 0
