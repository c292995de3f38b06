"""What every benchmark shares: the database, the message shape, the producer, worker
processes and the msgtable server subprocess.

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
import importlib
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql
from sqlalchemy.engine import make_url

from msgtable.devdb import LocalServer
from msgtable.mysql import without_driver
from msgtable.tables import current_layout_ddl
from msgtable.testing import ExternalServer, ServerHandle

# The message every benchmark sends: a small JSON document (66 bytes).
PAYLOAD = '{"order": 123456, "sku": "ABC-123", "qty": 2, "note": "ship fast"}'
DSN_ENV = "MSGTABLE_TEST_DSN"
ACK_WAIT_S = 30  # long enough that nothing is resent during a run
PURGE_AFTER_S = 86400
CACHE_SIZE = 10_000
MIN_PRODUCER_ROWS = 100  # rows per INSERT, at least: see producer_statements
BULK_CHUNK_ROWS = 100_000
SERVER_START_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 60.0
NS = 1_000_000_000

CTX = multiprocessing.get_context("spawn")


class BenchError(Exception):
    """A benchmark could not run or its result is wrong (lost or duplicated messages)."""


# -- the database ----------------------------------------------------------------------------
@dataclass
class Database:
    """The MySQL-family server of this run and a line saying what it is."""

    handle: ServerHandle
    description: str
    version: str
    pid: int | None = None  # the server process when it runs here (for CPU accounting)


@contextlib.contextmanager
def database_server() -> Iterator[Database]:
    """``MSGTABLE_TEST_DSN`` when set (its account may create databases), else a throwaway
    local mariadbd/mysqld (msgtable.devdb.LocalServer), as the tests do."""
    dsn = os.environ.get(DSN_ENV)
    if dsn:
        handle: ServerHandle = ExternalServer(dsn)
        version = server_version(handle)
        yield Database(handle, f"{version} from {DSN_ENV}", version)
        return
    local = LocalServer()
    local.start()
    try:
        version = server_version(local)
        yield Database(
            local, f"{version}, a throwaway local server (msgtable.devdb)", version, local.pid
        )
    finally:
        local.stop()


def server_version(handle: ServerHandle) -> str:
    with contextlib.closing(connect(handle.dsn())) as conn, conn.cursor() as cur:
        cur.execute("select version(), @@version_comment")
        version, comment = cur.fetchone()
    return f"{comment} {version}" if comment and "mariadb" not in version.lower() else version


@contextlib.contextmanager
def scratch_database(server: ServerHandle, name: str) -> Iterator[str]:
    """A fresh database; yields its DSN and drops it afterwards."""
    server.drop_database(name)
    server.create_database(name)
    try:
        yield server.dsn(name)
    finally:
        server.drop_database(name)


def connect(dsn: str) -> Any:
    """A PyMySQL connection (autocommit, READ COMMITTED like msgtable's store) for a DSN."""
    url = make_url(dsn)
    kwargs: dict[str, Any] = {
        "user": url.username or "",
        "password": url.password or "",
        "database": url.database or None,
        "autocommit": True,
        "charset": "utf8mb4",
        "init_command": "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    }
    unix_socket = url.query.get("unix_socket")
    if unix_socket:
        kwargs["unix_socket"] = unix_socket if isinstance(unix_socket, str) else unix_socket[0]
    else:
        kwargs["host"] = url.host or "127.0.0.1"
        kwargs["port"] = url.port or 3306
    return pymysql.connect(**kwargs)


def execute(dsn: str, *statements: str) -> list[tuple[Any, ...]]:
    """Run statements on a fresh connection; returns the last one's rows."""
    rows: list[tuple[Any, ...]] = []
    with contextlib.closing(connect(dsn)) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
            rows = list(cur.fetchall())
    return rows


# vt_postpone_after of every message table the bench makes (python -m bench.run
# --postpone-after); None leaves the engine's default.
POSTPONE_AFTER_S: float | None = None


def message_comment(
    batch_size: int,
    poller_interval_s: float,
    *,
    cache_size: int = CACHE_SIZE,
    purge_after_s: float = PURGE_AFTER_S,
) -> str:
    postpone = "" if POSTPONE_AFTER_S is None else f",vt_postpone_after={POSTPONE_AFTER_S:g}"
    return (
        f"vitess_message,vt_ack_wait={ACK_WAIT_S},vt_purge_after={purge_after_s:g},"
        f"vt_batch_size={batch_size},vt_cache_size={cache_size},"
        f"vt_poller_interval={poller_interval_s:g}{postpone}"
    )


def create_table(dsn: str, table: str, comment: str) -> None:
    """The recommended message table (msgtable.tables.current_layout_ddl)."""
    execute(dsn, f"drop table if exists {table}", current_layout_ddl(table, comment))


def bulk_insert(
    dsn: str,
    table: str,
    count: int,
    *,
    first_id: int = 0,
    time_acked_ns: int | None = None,
) -> float:
    """Insert ``count`` rows (ids from ``first_id``) fast; returns the seconds it took.

    INSERT ... SELECT from a cross join of a ten-row digits table, 100,000 rows a statement:
    about a third faster than multi-row INSERTs of 5,000 rows on MariaDB 10.11, and plain SQL
    on MySQL 8 too. ``time_acked_ns`` inserts acked rows (epoch 1, time_next NULL).
    """
    digits = f"bench_digits_{os.getpid()}"
    acked = "NULL" if time_acked_ns is None else str(int(time_acked_ns))
    epoch, time_next = ("0", "0") if time_acked_ns is None else ("1", "NULL")
    began = time.monotonic()
    with contextlib.closing(connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute(f"create temporary table {digits}(d int primary key)")
        cur.execute(f"insert into {digits} values " + ",".join(f"({d})" for d in range(10)))
        n_expr = "a.d + 10*b.d + 100*c.d + 1000*d.d + 10000*e.d"
        source = (
            f"select {n_expr} as n from {digits} a, {digits} b, {digits} c, {digits} d, {digits} e"
        )
        for lo in range(0, count, BULK_CHUNK_ROWS):
            rows = min(BULK_CHUNK_ROWS, count - lo)
            cur.execute(
                f"insert into {table}(id, priority, time_next, epoch, time_acked, message) "
                f"select {first_id + lo} + s.n, 0, {time_next}, {epoch}, {acked}, %s "
                f"from ({source}) s where s.n < %s",
                (PAYLOAD, rows),
            )
        cur.execute(f"drop temporary table {digits}")
    return time.monotonic() - began


def count_rows(dsn: str, table: str, where: str = "1=1") -> int:
    return int(execute(dsn, f"select count(*) from {table} where {where}")[0][0])


def check_lifecycle(dsn: str, table: str, n: int) -> None:
    """Every one of the ``n`` rows is acked and was claimed exactly once (epoch 1)."""
    rows = execute(
        dsn,
        f"select count(*), coalesce(sum(time_acked is null), 0), coalesce(sum(epoch <> 1), 0) "
        f"from {table}",
    )
    total, unacked, resent = (int(v) for v in rows[0])
    if (total, unacked, resent) != (n, 0, 0):
        raise BenchError(
            f"table {table}: {total} rows of {n} expected, {unacked} unacked, "
            f"{resent} claimed other than exactly once"
        )


# -- the producer ----------------------------------------------------------------------------
def producer_rows(batch_size: int) -> int:
    """Rows per producer INSERT: the batch size, but at least MIN_PRODUCER_ROWS, so that at
    batch 10 the figure is the lifecycle's and not a 10-row INSERT loop's."""
    return max(batch_size, MIN_PRODUCER_ROWS)


def producer_statements(
    table: str, first_id: int, n: int, rows_per_insert: int, partitions: int
) -> list[str]:
    """Multi-row INSERTs of ids first_id .. first_id + n - 1; the rows of the k-th INSERT get
    priority k % partitions (bench.raw gives each consumer the rows of one priority)."""
    literal = "'" + pymysql.converters.escape_string(PAYLOAD) + "'"
    out = []
    for k, lo in enumerate(range(first_id, first_id + n, rows_per_insert)):
        hi = min(first_id + n, lo + rows_per_insert)
        priority = k % partitions
        values = ",".join(f"({i},{priority},{literal})" for i in range(lo, hi))
        out.append(f"insert into {table}(id, priority, message) values {values}")
    return out


def partition_sizes(n: int, rows_per_insert: int, partitions: int) -> list[int]:
    """How many of the producer's rows get each priority (see producer_statements)."""
    sizes = [0] * partitions
    for k, lo in enumerate(range(0, n, rows_per_insert)):
        sizes[k % partitions] += min(n, lo + rows_per_insert) - lo
    return sizes


@dataclass(frozen=True)
class ProducerSpec:
    dsn: str
    table: str
    first_id: int
    n: int
    rows_per_insert: int
    partitions: int


def producer_worker(spec: ProducerSpec, name: str, ready: Any, go: Any, results: Any) -> None:
    """Insert the rows as fast as the database takes them, once ``go`` is set.

    Reports ``start`` (just before the first INSERT) and ``end`` (after the last commit).
    """

    def work() -> dict[str, Any]:
        statements = producer_statements(
            spec.table, spec.first_id, spec.n, spec.rows_per_insert, spec.partitions
        )
        with contextlib.closing(connect(spec.dsn)) as conn, conn.cursor() as cur:
            ready.put(name)
            go.wait()
            start = time.monotonic()
            for statement in statements:
                cur.execute(statement)
            end = time.monotonic()
        return {"start": start, "end": end}

    report(name, results, work)


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

    def __init__(self, dsn: str, log_level: str = "warning", binlog: bool = True) -> None:
        self.dsn = dsn
        self.log_level = log_level
        self.binlog = binlog  # False: msgtable serve --no-binlog (polling only)
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
            "msgtable",
            "serve",
            "--dsn",
            without_driver(self.dsn),  # the fastest driver installed, as msgtable serve picks
            "--listen",
            "127.0.0.1:0",
            "--grace-s",
            "1",
            "--log-level",
            self.log_level,
            "--binlog" if self.binlog else "--no-binlog",
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


def rss_mb(pid: int) -> float:
    """Resident set size of a process in MiB (Linux /proc; psutil elsewhere)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    psutil: Any = importlib.import_module("psutil")  # not on Linux, where /proc answers
    return float(psutil.Process(pid).memory_info().rss) / (1 << 20)


def cpu_seconds(pid: int | None) -> float:
    """CPU seconds (user + system, all threads) a running process has used so far; 0.0 when
    the process is not on this machine (``pid`` None) or cannot be read."""
    if pid is None:
        return 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def cpu_meter(**pids: int | None) -> Iterator[dict[str, float]]:
    """CPU seconds each named process used while the block ran (filled in at its end)."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    used: dict[str, float] = {}
    yield used
    used.update({name: cpu_seconds(pid) - before[name] for name, pid in pids.items()})


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, round(q / 100 * len(sorted_values) + 0.5 - 1e-9))
    return sorted_values[min(len(sorted_values), rank) - 1]


@dataclass
class Throughput:
    """One throughput figure: ``messages`` through the lifecycle in ``seconds``."""

    kind: str  # "raw", "msgtable", "kombu", ...
    batch_size: int
    clients: int  # consumer connections or subscribers
    messages: int
    seconds: float
    note: str = ""
    cpu_s: dict[str, float] = field(default_factory=dict)  # process class -> CPU seconds

    @property
    def msgs_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else float("nan")

    def cpu_per_msg(self) -> dict[str, float]:
        return {k: round(v / self.messages * 1e6, 1) for k, v in self.cpu_s.items()}

    def cpu_note(self) -> str:
        """CPU microseconds per message by process class, e.g. "database 31, clients 40"."""
        if not self.cpu_s or not self.messages:
            return ""
        parts = [f"{name} {s / self.messages * 1e6:.0f}" for name, s in self.cpu_s.items()]
        total = sum(self.cpu_s.values()) / self.messages * 1e6
        return f"CPU us/msg: {', '.join(parts)}; total {total:.0f}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "batch_size": self.batch_size,
            "clients": self.clients,
            "messages": self.messages,
            "seconds": round(self.seconds, 3),
            "msgs_s": round(self.msgs_s),
            **({"note": self.note} if self.note else {}),
            **({"cpu_us_per_msg": self.cpu_per_msg()} if self.cpu_s else {}),
        }


def run_timeout_s(n: int) -> float:
    """How long one throughput run may take before it counts as stuck (>= 500 msgs/s)."""
    return 60.0 + n / 500
