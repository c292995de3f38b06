"""Retrying with backoff, and the one way a retrying loop reports it.

Every loop that talks to something that may be away for a while (a table's poller, sender and
purger; the engine's discovery; the binlog follower; the lease; the client's calls and
subscriptions) keeps a :class:`Retry`: ``failed(exc)`` counts a failure and says how long to
wait before the next attempt, ``succeeded()`` ends the run of failures. The log says what
happened once, not at every attempt: the first failure of a run at WARNING (at ERROR with the
traceback when the error is not a MsgtableError, which means a bug), the next ones at DEBUG,
and the recovery at INFO.

(A message's own backoff, when it is sent again, is another thing: msgtable.backoff.)
"""

from __future__ import annotations

import logging
import random

from msgtable.errors import MsgtableError

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
        return self._rng.uniform(ceiling / 2, ceiling) if self.jitter else ceiling


class Retry:
    """One loop's run of failures (see the module docstring). ``what`` names the attempt in
    the log ("table jobs: poll"); ``level`` is the level of a run's first failure."""

    def __init__(
        self, what: str, log: logging.Logger, backoff: Backoff, *, level: int = logging.WARNING
    ) -> None:
        self.what = what
        self.backoff = backoff
        self.failures = 0
        self._log = log
        self._level = level

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
        if self.failures == 1:
            bug = not isinstance(exc, MsgtableError)
            self._log.log(
                logging.ERROR if bug else (level or self._level),
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
            self._log.info("%s works again (after %d failures)", self.what, self.failures)
            self.failures = 0
