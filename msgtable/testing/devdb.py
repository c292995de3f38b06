"""A throwaway local MySQL-family server: the embedded default and the test fixture.

`msgtable serve` without a DSN, the integration-test fixtures and the benchmarks need a
MySQL-family server that nobody has to set up. `LocalServer` runs the `mariadbd` or `mysqld`
installed on the machine in a data directory of its own, with options for a disposable server
(speed over durability, unless `durable`; a ROW-format binlog for binlog followers), creates
the account `msgtable`/`msgtable`, and on `stop()` shuts the server down and deletes the
directory.

Which binary, its options and the (cached, copied) data directory come from msgtable.testing.mysqld.

A server must not outlive its owner: it runs in its own session (Ctrl-C in a terminal reaches
only the owner, which then stops it in order), `stop()` runs at interpreter exit, and a small
watchdog process stops the server and deletes its directory if the owner dies without calling
`stop()` (SIGKILL, `os._exit`), which atexit cannot catch.

`python -m msgtable.testing.devdb find` tells which binary would be used; `... run` keeps a server
up
until Ctrl-C and prints its DSN.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from msgtable.core.sql import quote_database_name
from msgtable.errors import MsgtableError, ServerBinaryNotFound
from msgtable.testing.mysqld import (
    HOST,
    INSTALL_HINT,
    LOG_TAIL_LINES,
    START_TIMEOUT_S,
    ServerVersion,
    failure_hints,
    find_server_binary,
    initialise_datadir,
    server_command,
    server_version,
)
from msgtable.testing.watchdog import STOP_TIMEOUT_S

USER = "msgtable"
PASSWORD = "msgtable"
POLL_INTERVAL_S = 0.01
PORT_ATTEMPTS = 3
MAX_SOCKET_PATH = 100  # unix socket paths are limited to 104-108 bytes

_T = TypeVar("_T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (callers retry on a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file, or a note that it does not exist."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path} does not exist)"
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _short_tmp() -> str:
    """The temporary directory, or /tmp where that is too deep for a socket under it."""
    tmp = tempfile.gettempdir()
    room = MAX_SOCKET_PATH - len("/msgtable-sock-XXXXXXXX/mysqld.sock")
    return tmp if len(os.fsencode(tmp)) <= room or not os.path.isdir("/tmp") else "/tmp"


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then run their handlers.

    Between making a thing (the data directory, the server's process) and recording it, a
    KeyboardInterrupt (Ctrl-C, or SIGTERM while `msgtable serve` starts its database) would lose
    it: stop() would not know to delete or stop it. The block is short (a mkdtemp, two
    launches). Only the main thread can set handlers; elsewhere the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in stops}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for signum in dict.fromkeys(held):
            signal.raise_signal(signum)  # the handler in effect again runs now


class _PortInUse(MsgtableError):
    """The server could not bind its port (taken between choosing and binding it)."""


class LocalServer:
    """Starts mysqld/mariadbd in a data directory it owns; stops it and removes the directory.

    `datadir=None` makes a fresh temporary directory. A given `datadir` is created if missing
    and reused if it already holds an initialised server; either way it is deleted on `stop()`
    unless `keep=True`. `port=None` picks a free port. With `binlog=True` the server writes a
    ROW-format binary log with full row images. Use it as a context manager or call `start()`
    and `stop()`; `stop()` also runs at interpreter exit, and a watchdog process stops the
    server if its owner dies without calling it. `binary` overrides find_server_binary().
    `durable=True` runs it with a production server's durability (every commit flushed to
    disk, the binlog's included; msgtable.testing.mysqld.server_command); `kill()` crashes it.
    """

    def __init__(
        self,
        datadir: Path | None = None,
        *,
        port: int | None = None,
        binlog: bool = True,
        keep: bool = False,
        binary: Path | None = None,
        durable: bool = False,
    ) -> None:
        self._requested_datadir = Path(datadir) if datadir is not None else None
        self._requested_port = port
        self.binlog = binlog
        self.durable = durable
        self.keep = keep
        self._binary = binary
        self._datadir: Path | None = None
        self._socket: Path | None = None
        self._socket_dir: Path | None = None  # a short temp dir, when the datadir path is long
        self._port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._watchdog_pipe: int | None = None
        self.version: ServerVersion | None = None
        self.startup_s: float | None = None  # wall time of the last start(), for reports

    @property
    def datadir(self) -> Path:
        """The data directory; it also holds the pid file, the logs and usually the socket."""
        return self._started(self._datadir or self._requested_datadir)

    @property
    def socket(self) -> Path:
        """The unix socket; root logs in through it without a password."""
        return self._started(self._socket)

    @property
    def port(self) -> int:
        """The TCP port on 127.0.0.1."""
        return self._started(self._port)

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    def _started(self, value: _T | None) -> _T:
        if value is None:
            raise MsgtableError("the local server is not started")
        return value

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Initialise the data directory if needed, start the server, wait until it answers,
        and create the `msgtable` account (all privileges, from localhost and over TCP).

        Raises ServerBinaryNotFound (with INSTALL_HINT) when there is no server binary, and
        MsgtableError with the tail of the server's log when it does not answer within
        `timeout_s` of being launched.
        """
        if self._process is not None:
            raise MsgtableError("the local server is already started")
        began = time.monotonic()
        binary = self._binary or find_server_binary()
        if binary is None:
            raise ServerBinaryNotFound(f"no mariadbd or mysqld binary found.\n{INSTALL_HINT}")
        version = server_version(binary)
        if not version.supported:
            raise MsgtableError(
                f"{binary} is {version.text}; msgtable needs MariaDB 10.6+ or MySQL 8.0+"
            )
        self.version = version
        atexit.register(self.stop)
        try:
            self._prepare_dirs()
            if not (self.datadir / "mysql").is_dir():
                initialise_datadir(binary, version, self.datadir)
            deadline = time.monotonic() + timeout_s  # initialising has a limit of its own
            for attempt in range(PORT_ATTEMPTS):
                self._port = self._requested_port or free_port()
                self._launch(
                    server_command(
                        binary,
                        version,
                        datadir=self.datadir,
                        socket_path=self.socket,
                        port=self._port,
                        binlog=self.binlog,
                        as_root=os.geteuid() == 0,
                        durable=self.durable,
                    )
                )
                try:
                    self._wait_until_ready(deadline)
                    break
                except _PortInUse:
                    self._end_process()
                    if self._requested_port is not None or attempt == PORT_ATTEMPTS - 1:
                        raise
            self._create_account(version)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - began

    def stop(self) -> None:
        """Shut the server down gracefully (SIGTERM), kill it if it takes over STOP_TIMEOUT_S,
        and delete its directory unless `keep`. Idempotent."""
        atexit.unregister(self.stop)
        self._end_process()
        if not self.keep and self._datadir is not None:
            shutil.rmtree(self._datadir, ignore_errors=True)
        self._remove_socket_dir()

    def _remove_socket_dir(self) -> None:
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    def kill(self) -> None:
        """Crash the server: SIGKILL, no shutdown. Its data directory stays (whatever
        ``keep`` says); the next start() recovers it (InnoDB crash recovery)."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        self._end_process()  # (the process is gone: this dismisses the watchdog)
        self._remove_socket_dir()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def dsn(self, database: str = "") -> str:
        """SQLAlchemy URL of the `msgtable` account over TCP, e.g.
        `mysql+pymysql://msgtable:msgtable@127.0.0.1:PORT/db`."""
        if database:
            quote_database_name(database)
        return f"mysql+pymysql://{USER}:{PASSWORD}@{HOST}:{self.port}/{database}"

    def mysql_cli_command(self, database: str = "") -> str:
        """A command line a user can paste to look inside with the mysql client."""
        command = f"mysql -h {HOST} -P {self.port} -u {USER} -p{PASSWORD}"
        return f"{command} {shlex.quote(database)}" if database else command

    def create_database(self, name: str) -> None:
        """CREATE DATABASE IF NOT EXISTS `name`."""
        self.execute(f"CREATE DATABASE IF NOT EXISTS {quote_database_name(name)}")

    def drop_database(self, name: str) -> None:
        """DROP DATABASE IF EXISTS `name`."""
        self.execute(f"DROP DATABASE IF EXISTS {quote_database_name(name)}")

    def execute(self, *statements: str) -> list[tuple[Any, ...]]:
        """Run statements as root over the unix socket; returns the last one's rows."""
        rows: list[tuple[Any, ...]] = []
        with contextlib.closing(self._connect_as_root(timeout_s=10)) as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
                rows = list(cur.fetchall())
        return rows

    def _prepare_dirs(self) -> None:
        if self._requested_datadir is None:
            with _signals_held():
                self._datadir = Path(tempfile.mkdtemp(prefix="msgtable-db-"))
        else:
            self._datadir = self._requested_datadir.absolute()
            self._datadir.mkdir(parents=True, exist_ok=True)
        self._socket = self._datadir / "mysqld.sock"
        if len(os.fsencode(self._socket)) > MAX_SOCKET_PATH:
            with _signals_held():
                self._socket_dir = Path(tempfile.mkdtemp(prefix="msgtable-sock-", dir=_short_tmp()))
            self._socket = self._socket_dir / "mysqld.sock"

    def _launch(self, command: list[str]) -> None:
        with _signals_held():  # the process and its watchdog recorded before an interrupt
            self._launch_recorded(command)

    def _launch_recorded(self, command: list[str]) -> None:
        # What a server prints before it opens its error log ("how to run as root") lands here.
        with open(self.datadir / "server.out", "ab") as out:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        read_end, write_end = os.pipe()
        dirs = [str(self.datadir)] + ([str(self._socket_dir)] if self._socket_dir else [])
        argv = [
            sys.executable,
            "-m",
            "msgtable.testing.watchdog",
            str(self._process.pid),
            *dirs,
            str(int(self.keep)),
        ]
        try:
            self._watchdog = subprocess.Popen(
                argv,
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._watchdog_pipe = write_end
        except OSError:
            os.close(write_end)  # atexit still covers the ordinary ways to die
        finally:
            os.close(read_end)

    def _end_process(self) -> None:
        """Stop the server process, then dismiss the watchdog."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)  # mysqld's graceful shutdown
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._watchdog_pipe is not None:
            with contextlib.suppress(OSError):
                os.write(self._watchdog_pipe, b"stopped")
            os.close(self._watchdog_pipe)
            self._watchdog_pipe = None
        if self._watchdog is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(timeout=5)
            self._watchdog = None

    def _wait_until_ready(self, deadline: float) -> None:
        import pymysql

        assert self._process is not None
        while True:
            returncode = self._process.poll()
            if returncode is not None:
                log = self._log_tail()
                if "Bind on TCP/IP port" in log:
                    raise _PortInUse(f"port {self._port} is in use:\n{log}")
                raise MsgtableError(
                    f"the server exited with code {returncode} on start:\n{log}{failure_hints(log)}"
                )
            if self.socket.exists():
                try:
                    self._connect_as_root(timeout_s=2).close()
                    return
                except pymysql.err.OperationalError:
                    pass
            if time.monotonic() > deadline:
                raise MsgtableError(f"the server did not answer in time:\n{self._log_tail()}")
            time.sleep(POLL_INTERVAL_S)

    def _log_tail(self) -> str:
        out, err = self.datadir / "server.out", self.datadir / "error.log"
        return f"--- {out}:\n{tail(out)}\n--- {err}:\n{tail(err)}"

    def _connect_as_root(self, timeout_s: float) -> Any:
        import pymysql

        return pymysql.connect(
            unix_socket=str(self.socket),
            user="root",
            password="",
            connect_timeout=timeout_s,
            autocommit=True,
        )

    def _create_account(self, version: ServerVersion) -> None:
        plugin = ""
        if version.flavour == "mysql":
            # Clients without RSA support cannot log in with caching_sha2_password over plain
            # TCP; prefer mysql_native_password while the server still has it.
            active = self.execute(
                "SELECT COUNT(*) FROM information_schema.PLUGINS"
                " WHERE PLUGIN_NAME = 'mysql_native_password' AND PLUGIN_STATUS = 'ACTIVE'"
            )
            if active and active[0][0]:
                plugin = "WITH mysql_native_password "
        statements = []
        for host in ("localhost", HOST, "%"):
            account = f"'{USER}'@'{host}'"
            statements += [
                f"CREATE USER IF NOT EXISTS {account} IDENTIFIED {plugin}BY '{PASSWORD}'",
                f"GRANT ALL PRIVILEGES ON *.* TO {account} WITH GRANT OPTION",
            ]
        self.execute(*statements)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m msgtable.testing.devdb find|run`: which binary would be used; a server until
    Ctrl-C."""
    parser = argparse.ArgumentParser(prog="python -m msgtable.testing.devdb", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("find", help="print the server binary and its version, or how to get one")
    run = commands.add_parser("run", help="start a throwaway server and wait for Ctrl-C")
    run.add_argument("--datadir", type=Path, default=None)
    run.add_argument("--port", type=int, default=None)
    run.add_argument("--keep", action="store_true", help="keep the data directory on exit")
    run.add_argument("--no-binlog", action="store_true")
    run.add_argument("--database", default="msgtable", help="create it (default: %(default)s)")
    args = parser.parse_args(argv)

    if args.command == "find":
        try:
            binary = find_server_binary()
            if binary is None:
                raise ServerBinaryNotFound(INSTALL_HINT)
            version = server_version(binary)
        except MsgtableError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"{binary} ({version.flavour} {'.'.join(map(str, version.version))})")
        return 0

    server = LocalServer(args.datadir, port=args.port, binlog=not args.no_binlog, keep=args.keep)
    try:
        server.start()
    except MsgtableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        server.create_database(args.database)
        print(f"started in {server.startup_s:.2f}s, datadir {server.datadir}")
        print(f"DSN:   {server.dsn(args.database)}")
        print(f"mysql: {server.mysql_cli_command(args.database)}", flush=True)
        # Also when started in the background by a shell, which makes it ignore SIGINT.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.default_int_handler)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                signal.pause()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
