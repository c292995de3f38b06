"""The server process's GIL: how long a thread that wakes waits for one that runs Python.

CPython hands the GIL from a thread that keeps running Python to one that asks for it only
after the switch interval (``sys.getswitchinterval()``), 5 ms by default. A server's threads
mostly wait on sockets (the binlog, the database, gRPC); one woken by a binlog event or a
subscriber's call waits up to that long while the poller adds a burst of rows to the cache or
the sender checks a batch. That was the wait of a quiet tenant's message committed right
after a noisy tenant's burst (issue 45's ``fair_dwell_ratio``): the poll and the send of the
burst held the GIL for a few milliseconds at a time. :func:`tune` sets the interval to
SWITCH_INTERVAL_S for the ``msgtable serve`` process (not for a library user's process: a
MessageEngine embedded in an application leaves its interpreter alone).
"""

from __future__ import annotations

import sys

SWITCH_INTERVAL_S = 0.001  # bench.flow and bench.latency: see docs/performance.md


def tune() -> float:
    """Set the switch interval (see the module docstring); returns it as set."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    return sys.getswitchinterval()
