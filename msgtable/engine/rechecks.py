"""Passes again soon after an INSERT the binlog showed, when the pass it asked for found
nothing.

The binlog shows a transaction a moment before other sessions see its rows: the server
writes (and sends to its replicas) the binlog, then the storage engine commits. A pass
that the follower's hint begins at once can read the table in that moment and find
nothing; the row would then wait for the poll interval (measured: about one long poll in a
hundred of the SQS bench took the interval, 1 s, not 3 ms). So a hinted pass that found
nothing is tried again after the first of RECHECK_S, and so on while each finds nothing:
a few cheap reads per such hint, never a loop (the waits run out, then the poll interval
is the wait again). Driven by the table's poll loop alone.

An ordered table (msgtable.engine.ordered) schedules its own passes: an INSERT brings its
next pass forward to a time (not sooner than a gap after the last began), and the hint
belongs to the first poll at or after that time, the one that begins that pass, not to
the polls before it. Its rechecks are new passes too: at most ``len(RECHECK_S)`` past the
gap per hint, and only while each finds nothing.
"""

from __future__ import annotations

RECHECK_S = (0.002, 0.01, 0.05)


class Rechecks:
    """The poll loop's next wait after a pass (see the module docstring). ``hint`` is
    called, under the manager's lock, when the binlog shows an INSERT."""

    def __init__(self, waits: tuple[float, ...] = RECHECK_S) -> None:
        self._hinted_ns: int | None = None  # a hint for the first poll from then on
        self._waits = waits
        self._done = 0  # rechecks since the last hinted pass (while none found anything)

    def hint(self, at_ns: int = 0) -> None:
        """The binlog showed an INSERT: the first poll at or after ``at_ns`` (0: the next
        poll; an ordered table's: when its next pass may begin) is hinted."""
        if self._hinted_ns is None or at_ns < self._hinted_ns:
            self._hinted_ns = at_ns

    def take(self, now_ns: int = 0) -> bool:
        """Whether the poll about to run at ``now_ns`` is hinted (under the manager's lock)."""
        if self._hinted_ns is None or now_ns < self._hinted_ns:
            return False
        self._hinted_ns = None
        return True

    def wait_s(self, hinted: bool, added: int, interval_s: float) -> float:
        """The wait after a pass that was ``hinted`` (or a recheck) and read ``added`` new
        rows: the next recheck's, or the poll interval."""
        if hinted:
            self._done = 0
        elif not self._done:
            return interval_s  # neither hinted nor a recheck
        if added or self._done >= len(self._waits):
            self._done = 0
            return interval_s
        self._done += 1
        return min(self._waits[self._done - 1], interval_s)
