"""The Makefile's set-up targets, read with `make -n` (what they would run, nothing run): every
apt-get goes through .ci/apt-install, `make spark` installs the spark extra into the clone's
virtualenv, and `make test` installs Chromium for the browser tests."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
# apt-get run as a command (not named in a message or looked up with `command -v`).
DIRECT_APT_GET = re.compile(r"(^|[;&|(]|\bthen|\belse)\s*apt-get\s")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def dry_run(tmp_path: Path, *targets: str) -> str:
    """What `make TARGETS` would run in a fresh clone (a virtualenv not made yet)."""
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", f"VENV={tmp_path / 'venv'}", *targets],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_apt_get_of_the_set_up_goes_through_the_helper(tmp_path: Path) -> None:
    commands = dry_run(tmp_path, "test", "run", "spark", "bench")
    assert "bash .ci/apt-install" in commands
    direct = [line for line in commands.splitlines() if DIRECT_APT_GET.search(line)]
    assert direct == []


def test_make_spark_installs_the_spark_extra_and_what_spark_needs(tmp_path: Path) -> None:
    commands = dry_run(tmp_path, "spark")
    assert "-m pip install -e '.[spark]'" in commands
    assert "touch " + str(tmp_path / "venv" / ".stamp-install-spark") in commands
    assert "bash .ci/apt-install --for Spark $missing" in commands  # Java, the JDBC jar


def test_make_test_installs_chromium_and_its_driver_when_they_are_missing(tmp_path: Path) -> None:
    commands = dry_run(tmp_path, "test")
    assert 'command -v chromium >/dev/null 2>&1 || missing="$missing chromium"' in commands
    assert (
        'command -v chromedriver >/dev/null 2>&1 || missing="$missing chromium-driver"' in commands
    )
    assert 'bash .ci/apt-install --for "the browser tests" $missing' in commands
