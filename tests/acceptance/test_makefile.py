"""The Makefile's set-up targets, read with `make -n` (what they would run, nothing run): every
apt-get goes through .ci/apt-install, `make spark` installs the spark extra into the clone's
virtualenv, and `make test` installs Chromium for the browser tests. And run with a stand-in
for pip (as chatty as pip): each step is one line naming its log, pip runs once."""

from __future__ import annotations

import os
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


# pip as chatty as the real one (143 lines for msgtable's install), recording how it was called;
# it fails for the extras named in FAKE_PIP_FAILS (a comma-less word of them: "fast", "server").
FAKE_PIP = """#!/usr/bin/env bash
echo "$*" >> "$FAKE_PIP_CALLS"
for i in $(seq 1 143); do echo "Collecting package-$i (from msgtable)"; done
for word in $FAKE_PIP_FAILS; do
    case "$*" in *"$word"*) echo "error: building $word failed: the last words"; exit 1;; esac
done
echo "Successfully installed msgtable"
"""


def quiet_install(tmp_path: Path, fails: str = "") -> tuple[subprocess.CompletedProcess[str], Path]:
    """`make install` into a fresh virtualenv with the fake pip; (what it printed, the venv)."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".stamp-venv").touch()  # made already: the step under test is the install
    pip = tmp_path / "pip"
    pip.write_text(FAKE_PIP)
    pip.chmod(0o755)
    env = dict(os.environ, FAKE_PIP_CALLS=str(tmp_path / "calls"), FAKE_PIP_FAILS=fails)
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            f"VENV={venv}",
            f"PIP={pip}",
            "APT_INSTALL=true",
            "install",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, venv


def test_make_install_says_one_line_and_keeps_pips_output_in_the_log_it_names(tmp_path: Path):
    done, venv = quiet_install(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    log = venv / "install.log"
    assert done.stdout.splitlines() == [f"installing msgtable into {venv} (log: {log})"]
    assert done.stderr == ""
    assert "Collecting package-143" in log.read_text()
    assert (tmp_path / "calls").read_text().splitlines() == ["install -e .[server,fast]"]  # once
    assert (venv / ".stamp-install").exists()


def test_without_mysqlclient_make_install_says_so_and_installs_the_server_alone(tmp_path: Path):
    done, _ = quiet_install(tmp_path, fails="fast")
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(done.stdout.splitlines() + done.stderr.splitlines()) == 2
    assert "mysqlclient did not build" in done.stderr
    assert (tmp_path / "calls").read_text().splitlines() == [
        "install -e .[server,fast]",
        "install -e .[server]",
    ]


def test_a_failed_install_shows_the_end_of_the_log_and_its_path(tmp_path: Path):
    done, venv = quiet_install(tmp_path, fails="server")
    assert done.returncode != 0
    log = venv / "install.log"
    assert "error: building server failed: the last words" in done.stderr
    assert f"msgtable: installing msgtable into {venv} failed; the whole log: {log}" in done.stderr
    assert len(done.stderr.splitlines()) < 40  # the log's end, not all of it
    assert not (venv / ".stamp-install").exists()
