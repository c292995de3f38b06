"""What operators see of a push endpoint (ListTables; never its secret)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PushStatus:
    """What ListTables shows of an endpoint (never its secret)."""

    url: str
    state: str  # "pushing", "idle: ...", "not allowed: ...", "failing: ..."
    in_flight: int
    pushed: int
    failed: int
    max_in_flight: int
    timeout_s: float
