"""Running the `msgtable` command as a user would: subprocesses, bounded and cleaned up.

`Cli` (the `cli` fixture) starts commands with `[sys.executable, "-m", "msgtable", ...]` in an
environment without the user's MSGTABLE_* settings. Every process is bounded in time: a
command run to completion is killed at its time limit, and a background process (serve, a
streaming tail) is stopped at the end of the test whatever happened: SIGTERM, then SIGKILL.
Output goes to files under the test's tmp_path, so a test waits for a line to appear without
a pipe that could fill up, and a failure shows everything each process printed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from msgtable.testing.devdb import free_port

from ..waiting import wait_until

MSGTABLE = (sys.executable, "-m", "msgtable")
# Settings of the user's shell that must not leak into the commands under test.
USER_SETTINGS = (
    "MSGTABLE_DSN",
    "MSGTABLE_SERVER",
    "MSGTABLE_LISTEN",
    "MSGTABLE_LOG_LEVEL",
    "MSGTABLE_METRICS_LISTEN",
)
RUN_TIMEOUT_S = 30.0  # a command that should finish on its own
START_TIMEOUT_S = 30.0  # serve until it answers (an embedded database included)
STOP_TIMEOUT_S = 15.0  # a process asked to stop, before it is killed
PORT_ATTEMPTS = 3


def health_status(address: str, timeout_s: float = 1.0) -> int | None:
    """The gRPC health status of the server at `address`, or None if it does not answer."""
    with grpc.insecure_channel(address) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout_s
            )
        except grpc.RpcError:
            return None
    status: int = response.status
    return status


def assert_one_line_error(done: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """A failed command said what went wrong in one line on stderr, without a traceback."""
    assert done.returncode != 0, describe(done)
    assert "Traceback" not in done.stderr, describe(done)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, describe(done)
    line = lines[0]
    assert line.startswith("msgtable: error: "), describe(done)
    for fragment in fragments:
        assert fragment.lower() in line.lower(), describe(done)
    return line


def describe(done: subprocess.CompletedProcess[str]) -> str:
    return (
        f"{' '.join(map(str, done.args))} exited {done.returncode}\n"
        f"--- stdout:\n{done.stdout}--- stderr:\n{done.stderr}"
    )


def run(
    argv: Sequence[str], env: Mapping[str, str] | None = None, timeout_s: float = RUN_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion; past `timeout_s` it is killed and the test fails."""
    try:
        return subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=dict(env) if env is not None else None,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{' '.join(argv)} did not finish within {timeout_s:g}s\n"
            f"--- stdout:\n{_text(exc.stdout)}--- stderr:\n{_text(exc.stderr)}",
            pytrace=False,
        )


class Process:
    """A `msgtable` command running in the background, its output going to two files."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], log_dir: Path, name: str):
        self.argv = list(argv)
        self.name = name
        self.stdout_path = log_dir / f"{name}.stdout"
        self.stderr_path = log_dir / f"{name}.stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.popen = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=dict(env)
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def running(self) -> bool:
        return self.popen.poll() is None

    def describe(self) -> str:
        state = "running" if self.running() else f"exited {self.popen.returncode}"
        return (
            f"{self.name} ({' '.join(self.argv[1:])}) {state}\n"
            f"--- stdout:\n{self.stdout}--- stderr:\n{self.stderr}"
        )

    def wait_for_output(
        self, pattern: str, timeout_s: float = START_TIMEOUT_S, stream: str = "stdout"
    ) -> re.Match[str]:
        """The first match of `pattern` (multi-line mode) in what the process printed; fails
        when it does not appear in time or the process exits without printing it."""
        regex = re.compile(pattern, re.MULTILINE)

        def found() -> re.Match[str] | None:
            exited = not self.running()  # read after checking, so the last output is seen
            match = regex.search(self.stdout if stream == "stdout" else self.stderr)
            if match is None and exited:
                pytest.fail(f"{pattern!r} never printed:\n{self.describe()}", pytrace=False)
            return match

        match: re.Match[str] = wait_until(
            found, timeout_s, lambda: f"{pattern!r} in {stream}:\n{self.describe()}"
        )
        return match

    def send_signal(self, signum: int) -> None:
        if self.running():
            self.popen.send_signal(signum)

    def wait(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """The exit status; fails (the fixture then kills it) if it has not exited in time."""
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"{self.name} did not exit within {timeout_s:g}s:\n{self.describe()}",
                pytrace=False,
            )

    def stop(self) -> None:
        """End the process whatever its state: SIGTERM, then SIGKILL. Idempotent."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=STOP_TIMEOUT_S)


class Serve(Process):
    """A running `msgtable serve`, reachable at `address`."""

    def __init__(self, address: str, *args: Any, **kwargs: Any) -> None:
        self.address = address
        super().__init__(*args, **kwargs)

    def wait_answering(self, timeout_s: float = START_TIMEOUT_S) -> int:
        """Wait until the server answers gRPC health checks; returns the status."""

        def answers() -> int | None:
            if not self.running():
                pytest.fail(f"serve exited on start:\n{self.describe()}", pytrace=False)
            return health_status(self.address)

        status: int = wait_until(
            answers, timeout_s, lambda: f"{self.address} to answer:\n{self.describe()}"
        )
        return status


class Cli:
    """Runs `msgtable` commands for one test and stops whatever is still running after it."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: list[Process] = []
        self._names: dict[str, int] = {}

    def env(self, **overrides: str | None) -> dict[str, str]:
        """The test process's environment without the user's MSGTABLE_* settings, plus
        `overrides` (None removes a variable)."""
        env = {k: v for k, v in os.environ.items() if k not in USER_SETTINGS}
        env["PYTHONUNBUFFERED"] = "1"
        for key, value in overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def run(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        timeout_s: float = RUN_TIMEOUT_S,
    ) -> subprocess.CompletedProcess[str]:
        """Run a msgtable command to completion (see `run`)."""
        return run([*MSGTABLE, *args], env if env is not None else self.env(), timeout_s)

    def start(self, *args: str, env: Mapping[str, str] | None = None) -> Process:
        """Start a command in the background; it is stopped after the test."""
        process = Process(
            [*MSGTABLE, *args],
            env if env is not None else self.env(),
            self.log_dir,
            self._name(args),
        )
        self.processes.append(process)
        return process

    def serve(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        listen_flag: bool = True,
        wait: bool = True,
    ) -> Serve:
        """`msgtable serve ARGS --listen 127.0.0.1:<free port>`, answering when it returns
        (unless `wait` is false). With `listen_flag` false the port goes in MSGTABLE_LISTEN.
        Another process may take the free port before serve binds it: then it tries again."""
        env = dict(env if env is not None else self.env())
        for attempt in range(PORT_ATTEMPTS):
            address = f"127.0.0.1:{free_port()}"
            argv = [*MSGTABLE, "serve", *args]
            if listen_flag:
                argv += ["--listen", address]
            else:
                env["MSGTABLE_LISTEN"] = address
            serve = Serve(address, argv, env, self.log_dir, self._name(("serve",)))
            self.processes.append(serve)
            if not wait:
                return serve
            try:
                serve.wait_answering()
            except pytest.fail.Exception:
                if "cannot listen" in serve.stderr and attempt < PORT_ATTEMPTS - 1:
                    continue
                raise
            return serve
        raise AssertionError("unreachable")

    def stop_all(self) -> None:
        for process in reversed(self.processes):
            process.stop()

    def _name(self, args: Sequence[str]) -> str:
        command = args[0] if args else "msgtable"
        self._names[command] = self._names.get(command, 0) + 1
        return f"{command}-{self._names[command]}"


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (and is not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        return state != "Z"
    return True
