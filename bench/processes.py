"""Worker processes and the msgtable server subprocess of a benchmark.

Every client of a benchmark (the producer, each raw consumer, each gRPC subscriber, the peer's
publisher and consumer) runs in a process of its own, started with ``spawn``, so no two of them
share a GIL, and the msgtable server runs as ``python -m msgtable serve`` in another: the
figures are what separate programs on this machine get, not what one interpreter's threads
get. Processes time themselves with ``time.monotonic()``, which on Linux is one clock for
the whole machine, so a start taken in the producer and an end taken in a subscriber compare.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.errors import BenchError
from bench.measure import rss_mb
from msgtable.store.mysql import without_driver

SERVER_START_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 60.0

CTX = multiprocessing.get_context("spawn")


# -- worker processes ------------------------------------------------------------------------
class Flag:
    """A one-way flag shared by processes: set once, polled.

    Not multiprocessing.Event: with 16 processes waiting on one, set() and is_set() were
    seen to deadlock on its internal lock (about one run in twenty); a plain shared byte
    that is polled has no lock to get stuck on.
    """

    def __init__(self) -> None:
        self._value: Any = CTX.RawValue("b", 0)

    def set(self) -> None:
        self._value.value = 1

    def is_set(self) -> bool:
        return bool(self._value.value)

    def wait(self, poll_s: float = 0.002) -> None:
        while not self._value.value:
            time.sleep(poll_s)
        _cpu_at_go.append(time.process_time())


_cpu_at_go: list[float] = []  # in a worker: its CPU time when it saw ``go`` (see report())


def report(name: str, results: Any, work: Callable[[], dict[str, Any]]) -> None:
    """Run a worker's body and put ("ok", name, result) or ("error", name, traceback).

    A result also holds ``cpu_s``: the CPU seconds the worker process used in ``work`` from
    the moment it saw ``go`` (set-up before it, imports included, is not counted).
    """
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # Workers dumps stuck workers
    try:
        began = time.process_time()
        result = work()
        began = _cpu_at_go[0] if _cpu_at_go else began
        results.put(("ok", name, {**result, "cpu_s": time.process_time() - began}))
    except BaseException:
        results.put(("error", name, traceback.format_exc()))


class Workers:
    """Worker processes of one benchmark run: a ready queue, a go flag, a results queue.

    Targets are called as ``target(*args, name, ready, go, results)``; each puts its name on
    ``ready`` when it is set up, waits for ``go`` if it has to, and reports through
    :func:`report`. ``close()`` terminates whatever is still alive.
    """

    def __init__(self) -> None:
        self.ready: Any = CTX.Queue()
        self.go = Flag()
        self.results: Any = CTX.Queue()
        self._procs: dict[str, Any] = {}

    def start(self, name: str, target: Callable[..., None], *args: Any) -> None:
        proc = CTX.Process(
            target=target,
            args=(*args, name, self.ready, self.go, self.results),
            name=f"bench-{name}",
            daemon=True,
        )
        proc.start()
        self._procs[name] = proc

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until every worker said it is ready; raises BenchError if one fails first."""
        deadline = time.monotonic() + timeout_s
        pending = set(self._procs)
        while pending:
            pending.discard(self._get(self.ready, deadline, pending, "get ready"))

    def collect(self, timeout_s: float, names: Sequence[str] | None = None) -> dict[str, Any]:
        """Every worker's result (or those of ``names``); raises BenchError on an error."""
        deadline = time.monotonic() + timeout_s
        pending = set(self._procs if names is None else names)
        out: dict[str, Any] = {}
        while pending:
            status, name, payload = self._get(self.results, deadline, pending, "finish")
            if status != "ok":
                raise BenchError(f"worker {name} failed:\n{payload}")
            out[name] = payload
            pending.discard(name)
        return out

    def _get(self, q: Any, deadline: float, pending: set[str], what: str) -> Any:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._dump_stacks(pending)
                raise BenchError(f"timed out waiting for {sorted(pending)} to {what}")
            try:
                return q.get(timeout=min(left, 0.5))
            except queue.Empty:
                procs = {n: self._procs[n] for n in pending}
                dead = {n: p.exitcode for n, p in procs.items() if not p.is_alive()}
                if dead and q.empty():
                    detail = ""
                    with contextlib.suppress(queue.Empty):
                        status, name, payload = self.results.get(timeout=0.5)
                        detail = f"\n{name} reported {status}: {payload}"
                    raise BenchError(
                        f"workers exited before they could {what} (exit codes {dead}){detail}"
                    ) from None

    def _dump_stacks(self, names: set[str]) -> None:
        """Make stuck workers print their threads' stacks on stderr (see report())."""
        for name in sorted(names):
            proc = self._procs[name]
            if proc.is_alive() and proc.pid is not None:
                print(f"bench: stacks of the stuck worker {name}:", file=sys.stderr, flush=True)
                os.kill(proc.pid, signal.SIGUSR1)
                time.sleep(0.5)

    def close(self) -> None:
        for proc in self._procs.values():
            if proc.is_alive():
                proc.terminate()
        for proc in self._procs.values():
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for q in (self.ready, self.results):
            q.close()
            q.cancel_join_thread()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the msgtable server subprocess -----------------------------------------------------------
_SERVING = re.compile(r"serving on (\S+) ")


class ServerProcess:
    """``python -m msgtable serve --dsn DSN --listen 127.0.0.1:0`` in a subprocess of its own
    (the server gets its own GIL); ``address`` once started, ``rss_mb()`` its memory."""

    def __init__(
        self,
        dsn: str,
        log_level: str = "warning",
        binlog: bool = True,
        lease: bool = True,
        extra: Sequence[str] = (),
        module: str = "msgtable",
        target: Sequence[str] | None = None,
        listen: str = "127.0.0.1:0",
    ) -> None:
        self.dsn = dsn
        # what it serves: --dsn DSN by default; bench.shards: --keyspace-file F --shard NAME
        self.target = tuple(target) if target is not None else None
        self.listen = listen
        self.module = module  # bench.traced: msgtable serve with tracing on (bench.metrics)
        self.extra = tuple(extra)  # more flags of msgtable serve (bench.push: --push-allow)
        self.log_level = log_level
        self.binlog = binlog  # False: msgtable serve --no-binlog (polling only)
        # False: --no-lease, for a second server beside the bench's main one (which holds the
        # database's lease), serving tables only its own subscribers use
        self.lease = lease
        self.address = ""
        self.process: subprocess.Popen[str] | None = None
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed in stop())
            prefix="msgtable-bench-server-", suffix=".log", delete=False
        )
        self.log_path = Path(self._log.name)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout_s: float = SERVER_START_TIMEOUT_S) -> None:
        command = [
            sys.executable,
            "-m",
            self.module,
            "serve",
            # the fastest driver installed, as msgtable serve picks
            *(self.target or ("--dsn", without_driver(self.dsn))),
            "--listen",
            self.listen,
            "--grace-s",
            "1",
            "--log-level",
            self.log_level,
            "--binlog" if self.binlog else "--no-binlog",
            "--lease" if self.lease else "--no-lease",
            *self.extra,
        ]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        stdout = self.process.stdout
        assert stdout is not None

        def pump() -> None:
            for line in stdout:
                lines.put(line)

        threading.Thread(target=pump, daemon=True, name="bench-server-stdout").start()
        deadline = time.monotonic() + timeout_s
        while not self.address:
            if self.process.poll() is not None:
                raise BenchError(f"msgtable serve exited at start:\n{self.log_tail()}")
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() > deadline:
                    self.stop()
                    raise BenchError(f"msgtable serve did not start:\n{self.log_tail()}") from None
                continue
            match = _SERVING.search(line)
            if match:
                self.address = match.group(1)

    def rss_mb(self) -> float:
        return rss_mb(self.pid)

    def log_tail(self, lines: int = 30) -> str:
        self._log.flush()
        text = self.log_path.read_text(errors="replace").rstrip().splitlines()
        return "\n".join(text[-lines:])

    def check_alive(self) -> None:
        if self.process is None or self.process.poll() is not None:
            raise BenchError(f"the msgtable server died:\n{self.log_tail()}")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        self._log.close()

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if exc[0] is None:
            self.log_path.unlink(missing_ok=True)
        else:
            print(f"(msgtable server log kept: {self.log_path})", file=sys.stderr)
