"""The one error of the bench: a run that cannot go on or whose result is wrong.

A module of its own because the database helpers (bench.database) and the process helpers
(bench.processes) both raise it, and neither should import the other for it.
"""

from __future__ import annotations


class BenchError(Exception):
    """A benchmark could not run or its result is wrong (lost or duplicated messages)."""
