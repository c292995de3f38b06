"""Waiting for a condition in tests: poll it, never sleep a fixed time as synchronisation."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

POLL_S = 0.02


def wait_until(
    predicate: Callable[[], Any],
    timeout_s: float = 10.0,
    what: str | Callable[[], str] = "the condition",
) -> Any:
    """Poll `predicate` until it returns something true, and return that; fail on time-out
    saying `what` (a callable is asked only then, so it can describe the latest state)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            pytest.fail(f"timed out after {timeout_s:g}s waiting for {described}", pytrace=False)
        time.sleep(POLL_S)
