"""The bench still runs: ``python -m bench.run --smoke`` (what ``make bench-smoke`` runs: every
section of bench.run.SECTIONS, the full-only ones too, at bench.smoke's sizes, seconds each) runs
once, in a subprocess with its own throwaway database server as a user runs it, exits 0 and
prints a JSON line holding the figures each section fills (bench.report.SECTION_KEYS) and the
headline ratios of the sections run side by side (JOINT_KEYS). One test a section judges that
section's keys in the run's line. The figures are not judged, nor are the targets met or not; a
section that no longer runs, or whose keys vanish, fails here with what the run printed (a
section that raises ends the run: every test then fails, each with the run's last lines, which
name the section).

One run, not one a section: each section's run paid a Python start, its imports and a
database server's start and stop, about a quarter of this module's time (209 s one a section,
159 s one run, MariaDB on a quiet machine)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.report import JOINT_KEYS, SECTION_KEYS
from bench.run import SECTIONS

from .helpers import USER_SETTINGS

ROOT = Path(__file__).parents[2]
# every section at smoke size: about 160 s on a quiet machine (Spark's session about 20 s),
# twice that or more on a busy one
RUN_TIMEOUT_S = 900.0
TAIL_LINES = 40  # of what a failing run printed


def bench(tmp_path: Path) -> tuple[int | None, str, str]:
    """``python -m bench.run --smoke``: its exit status (None: killed at the time limit, with
    every process it started), stdout and stderr."""
    env = {k: v for k, v in os.environ.items() if k not in USER_SETTINGS}
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.run", "--smoke"],
            cwd=ROOT,
            env=env,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # its servers and workers go with it at the time limit
        )
        try:
            code: int | None = proc.wait(RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if proc.poll() is None or code is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return code, out.read_text(), err.read_text()


def tail(text: str) -> str:
    return "\n".join(text.splitlines()[-TAIL_LINES:])


def figure(doc: dict[str, Any], key: str) -> Any:
    """A key of the JSON line, or "targets.<key>": that target's value."""
    if key.startswith("targets."):
        return doc["targets"].get(key.removeprefix("targets."), {}).get("value")
    return doc.get(key)


@dataclass(frozen=True)
class SmokeRun:
    code: int | None
    out: str
    err: str

    def printed(self) -> str:
        return f"stderr:\n{tail(self.err)}\nstdout:\n{tail(self.out)}"

    def doc(self) -> dict[str, Any]:
        """The run's JSON line; fails the test when the run did not end well with one."""
        printed = self.printed()
        assert self.code is not None, (
            f"bench --smoke: still running after {RUN_TIMEOUT_S:g} s (killed); {printed}"
        )
        assert self.code == 0, f"bench --smoke: exited {self.code}; {printed}"
        lines = self.out.strip().splitlines()
        try:
            doc = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            doc = None
        assert isinstance(doc, dict), f"bench --smoke: no JSON line last; {printed}"
        assert doc["mode"] == "smoke"
        return doc


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> SmokeRun:
    """``python -m bench.run --smoke``: every section, once for the module."""
    code, out, err = bench(tmp_path_factory.mktemp("bench-smoke"))
    return SmokeRun(code, out, err)


def check(run: SmokeRun, what: str, keys: tuple[str, ...]) -> None:
    doc = run.doc()
    missing = [k for k in keys if figure(doc, k) is None]
    assert not missing, (
        f"bench --smoke: {what} ran, but the JSON line has no figure for {missing}; {run.printed()}"
    )


# (the run is the first test's set-up: its time limit counts it)
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize("section", SECTIONS)
def test_each_bench_section_runs_and_prints_its_figures(section: str, smoke_run: SmokeRun) -> None:
    keys = SECTION_KEYS.get(section)
    assert keys, f"bench section {section}: bench.report.SECTION_KEYS names none of its figures"
    check(smoke_run, f"section {section}", keys)


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_the_sections_side_by_side_print_their_ratios(smoke_run: SmokeRun) -> None:
    """raw, msgtable and peer together: the headline ratios, from rounds run side by side."""
    sections = sorted({s for joint in JOINT_KEYS for s in joint}, key=SECTIONS.index)
    keys = tuple(k for keys in JOINT_KEYS.values() for k in keys)
    check(smoke_run, "side by side, " + ",".join(sections), keys)


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_test_installs_what_the_bench_needs(tmp_path: Path) -> None:
    """The peer section needs kombu (the bench extra), the spark section the spark extra."""
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", f"VENV={tmp_path / 'venv'}", "test"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "-m pip install -e '.[test,spark,bench,docs]'" in done.stdout, (
        f"make test does not install the bench and spark extras:\n{done.stdout}"
    )
