"""Fixtures of the acceptance tests (the helpers they use are in helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import Cli


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    """Runs `msgtable` commands as subprocesses; stops those still running after the test."""
    runner = Cli(tmp_path)
    try:
        yield runner
    finally:
        runner.stop_all()
