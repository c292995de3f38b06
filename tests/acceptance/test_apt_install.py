""".ci/apt-install, the one way the Makefile runs apt-get: it waits for another package manager
to let go of apt's locks, says so, and gives up after MSGTABLE_APT_LOCK_TIMEOUT seconds with
one sentence.

The locks are apt's real ones, taken here as apt takes them (an fcntl write lock on the whole
file), so these run as root on a machine with apt-get only. The package "installed" is one
already installed by hand (apt-mark showmanual), so nothing is downloaded or changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ..waiting import wait_until

HELPER = Path(__file__).parents[2] / ".ci" / "apt-install"
FRONTEND_LOCK = "/var/lib/dpkg/lock-frontend"
LISTS_LOCK = "/var/lib/apt/lists/lock"
SHORT_TIMEOUT_S = 2
LONG_TIMEOUT_S = 60  # a wait that the test ends long before
LOCK_WAIT_S = 60  # for a real package manager that holds a lock when a test begins
WAITING = "msgtable: another package manager"

needs_root_and_apt = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("apt-get") is None,
    reason="takes apt's locks and runs apt-get install: root on a machine with apt-get only",
)


@contextmanager
def held(path: str) -> Iterator[int]:
    """Holds apt's lock file ``path`` as apt does; closing the yielded descriptor lets go."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.skip(f"another package manager kept {path} for {LOCK_WAIT_S}s")
                time.sleep(0.5)
        yield fd
    finally:
        with contextlib.suppress(OSError):  # the test let go already
            os.close(fd)


def installed_package() -> str:
    """A package installed by hand: installing it again changes nothing."""
    manual = subprocess.run(
        ["apt-mark", "showmanual"], capture_output=True, text=True, check=True
    ).stdout.split()
    if not manual:
        pytest.skip("no package is marked as installed by hand (apt-mark showmanual)")
    return manual[0]


def helper_env(timeout_s: int) -> dict[str, str]:
    return {**os.environ, "MSGTABLE_APT_LOCK_TIMEOUT": str(timeout_s)}


def run_helper(*packages: str, timeout_s: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(HELPER), "--for", "the tests", *packages],
        capture_output=True,
        text=True,
        env=helper_env(timeout_s),
        timeout=timeout_s + 60,
    )


def describe(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n--- stdout\n{done.stdout}--- stderr\n{done.stderr}"


@needs_root_and_apt
def test_install_waits_for_the_dpkg_lock_then_gives_up_in_one_sentence() -> None:
    package = installed_package()
    with held(FRONTEND_LOCK):
        began = time.monotonic()
        done = run_helper(package, timeout_s=SHORT_TIMEOUT_S)
        waited_s = time.monotonic() - began
    assert done.returncode == 75, describe(done)
    assert (
        f"holds the dpkg lock ({FRONTEND_LOCK}); waiting up to {SHORT_TIMEOUT_S} s" in done.stdout
    ), describe(done)
    assert waited_s >= SHORT_TIMEOUT_S - 0.1, describe(done)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, describe(done)
    assert lines[0].startswith(f"msgtable: gave up installing {package} (for the tests) after"), (
        describe(done)
    )
    assert f"still holds the dpkg lock ({FRONTEND_LOCK})" in lines[0], describe(done)


@needs_root_and_apt
def test_install_goes_ahead_once_the_lock_is_let_go(tmp_path: Path) -> None:
    package = installed_package()
    out = tmp_path / "out.txt"
    with held(FRONTEND_LOCK) as fd, out.open("w") as sink:
        helper = subprocess.Popen(
            ["bash", str(HELPER), package],
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            env=helper_env(LONG_TIMEOUT_S),
        )
        try:
            wait_until(lambda: WAITING in out.read_text(), 30, "the waiting line")
            os.close(fd)
            rc = helper.wait(timeout=LONG_TIMEOUT_S)
        finally:
            if helper.poll() is None:
                helper.kill()
                helper.wait()
    output = out.read_text()
    assert rc == 0, output
    assert f"holds the dpkg lock ({FRONTEND_LOCK}); waiting up to" in output, output
    assert "gave up" not in output, output


@needs_root_and_apt
def test_update_waits_for_the_package_lists_lock() -> None:
    # An unknown package fails to install, so the helper updates the package lists (apt-get
    # update), which takes a lock of its own that apt-get itself would not wait for.
    with held(LISTS_LOCK):
        done = run_helper("msgtable-test-no-such-package", timeout_s=SHORT_TIMEOUT_S)
    assert done.returncode == 75, describe(done)
    waiting = f"holds apt's package-lists lock ({LISTS_LOCK}); waiting up to"
    assert waiting in done.stdout, describe(done)
    last = done.stderr.strip().splitlines()[-1]
    gave_up = "msgtable: gave up installing msgtable-test-no-such-package"
    assert last.startswith(gave_up), describe(done)
    assert f"still holds apt's package-lists lock ({LISTS_LOCK})" in last, describe(done)


def test_a_timeout_that_is_not_a_number_is_refused() -> None:
    done = subprocess.run(
        ["bash", str(HELPER), "make"],
        capture_output=True,
        text=True,
        env={**os.environ, "MSGTABLE_APT_LOCK_TIMEOUT": "ten minutes"},
        timeout=30,
    )
    assert done.returncode == 2, describe(done)
    assert "MSGTABLE_APT_LOCK_TIMEOUT must be a whole number of seconds" in done.stderr
