"""The bench still runs: every section of ``python -m bench.run`` (bench.run.SECTIONS, the
full-only ones too) runs in smoke mode (``--smoke``: bench.smoke's sizes, seconds each), each by
itself as a user runs it (a subprocess with its own throwaway database server), exits 0 and
prints a JSON line holding the figures the section fills (bench.report.SECTION_KEYS). The
figures are not judged, nor are the targets met or not; a section that no longer runs, or
whose keys vanish, fails here with what it printed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.report import JOINT_KEYS, SECTION_KEYS
from bench.run import SECTIONS

from .helpers import USER_SETTINGS

ROOT = Path(__file__).parents[2]
RUN_TIMEOUT_S = 240.0  # a section at smoke size takes seconds; Spark's session about a minute
TAIL_LINES = 40  # of what a failing section printed


def bench(only: str, tmp_path: Path) -> tuple[int | None, str, str]:
    """``python -m bench.run --smoke --only ONLY``: its exit status (None: killed at the time
    limit, with every process it started), stdout and stderr."""
    env = {k: v for k, v in os.environ.items() if k not in USER_SETTINGS}
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.run", "--smoke", "--only", only],
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


def check(only: str, keys: tuple[str, ...], tmp_path: Path) -> None:
    code, out, err = bench(only, tmp_path)
    printed = f"stderr:\n{tail(err)}\nstdout:\n{tail(out)}"
    assert code is not None, (
        f"bench section {only}: still running after {RUN_TIMEOUT_S:g} s (killed); {printed}"
    )
    assert code == 0, f"bench section {only}: exited {code}; {printed}"
    lines = out.strip().splitlines()
    try:
        doc = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        doc = None
    assert isinstance(doc, dict), f"bench section {only}: no JSON line last; {printed}"
    assert doc["mode"] == "smoke"
    missing = [k for k in keys if figure(doc, k) is None]
    assert not missing, (
        f"bench section {only}: ran, but its JSON line has no figure for {missing}; {printed}"
    )


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize("section", SECTIONS)
def test_each_bench_section_runs_and_prints_its_figures(section: str, tmp_path: Path) -> None:
    keys = SECTION_KEYS.get(section)
    assert keys, f"bench section {section}: bench.report.SECTION_KEYS names none of its figures"
    check(section, keys, tmp_path)


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_the_sections_side_by_side_print_their_ratios(tmp_path: Path) -> None:
    """raw, msgtable and peer together: the headline ratios, from rounds run side by side."""
    sections = sorted({s for joint in JOINT_KEYS for s in joint}, key=SECTIONS.index)
    check(",".join(sections), tuple(k for keys in JOINT_KEYS.values() for k in keys), tmp_path)


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
