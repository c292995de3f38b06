"""A throwaway local MySQL-family server: the embedded default and the test fixture.

`msgtable serve` without a DSN, the integration-test fixtures and the benchmarks need a
MySQL-family server that nobody has to set up. `LocalServer` runs the `mariadbd` or `mysqld`
installed on the machine in a data directory of its own, with options for a disposable server
(speed over durability; a ROW-format binlog for binlog followers), creates the account
`msgtable`/`msgtable`, and on `stop()` shuts the server down and deletes the directory.

Initialising a data directory is the slow part of a start (0.5 s for MariaDB, several seconds
for MySQL), so it is done once per server binary into a template under ~/.cache/msgtable/devdb
(`MSGTABLE_DEVDB_CACHE` moves it, `off` disables it) and copied for each server.

A server must not outlive its owner: it runs in its own session (Ctrl-C in a terminal reaches
only the owner, which then stops it in order), `stop()` runs at interpreter exit, and a small
watchdog process stops the server and deletes its directory if the owner dies without calling
`stop()` (SIGKILL, `os._exit`), which atexit cannot catch.

`python -m msgtable.devdb find` tells which binary would be used; `... run` keeps a server up
until Ctrl-C and prints its DSN.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import hashlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol, Self, TypeVar

from msgtable.errors import InvalidArgument, MsgtableError, ServerBinaryNotFound

USER = "msgtable"
PASSWORD = "msgtable"
HOST = "127.0.0.1"
BINARY_ENV = "MSGTABLE_MYSQLD"
CACHE_ENV = "MSGTABLE_DEVDB_CACHE"
SERVER_NAMES = ("mariadbd", "mysqld")
SEARCH_DIRS = (
    "/usr/sbin",
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/local/mysql/bin",
    "/usr/local/mariadb/bin",
    "/opt/homebrew/bin",
    "/opt/homebrew/opt/mariadb/bin",
    "/opt/homebrew/opt/mysql/bin",
    "/usr/local/opt/mariadb/bin",
    "/usr/local/opt/mysql/bin",
    "/usr/libexec",
    "/usr/bin",
)
INSTALL_DB_NAMES = ("mariadb-install-db", "mysql_install_db")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.01
PORT_ATTEMPTS = 3
LOG_TAIL_LINES = 25
MIN_MARIADB = (10, 6)
MIN_MYSQL = (8, 0)
MAX_SOCKET_PATH = 100  # unix socket paths are limited to 104-108 bytes
DATABASE_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
_ZEROS = bytes(1 << 20)
STALE_BUILD_S = 3600.0
TEMPLATE_FORMAT = "1"  # bump when install_command changes what a fresh datadir holds

INSTALL_HINT = """\
msgtable needs a MySQL-family server binary (mariadbd or mysqld) to start a throwaway database.
Install one:
  Debian/Ubuntu:  apt-get install mariadb-server     (as root; `make mysql-server` does this)
  Fedora/RHEL:    dnf install mariadb-server
  Arch:           pacman -S mariadb
  macOS:          brew install mariadb               (or: brew install mysql)
or set MSGTABLE_MYSQLD to the path of a mariadbd/mysqld binary,
or use a server you already run by giving msgtable its DSN (a SQLAlchemy URL)."""

Flavour = Literal["mariadb", "mysql"]
_T = TypeVar("_T")


class ServerHandle(Protocol):
    """What tests and benchmarks need of a MySQL-family server: DSNs and scratch databases."""

    def dsn(self, database: str = "") -> str: ...

    def create_database(self, name: str) -> None: ...

    def drop_database(self, name: str) -> None: ...


@dataclass(frozen=True)
class ServerVersion:
    """Flavour and version of a server binary, parsed from `BINARY --version`."""

    flavour: Flavour
    version: tuple[int, int, int]
    text: str

    @property
    def supported(self) -> bool:
        """MariaDB 10.6+ and MySQL 8.0+ are what msgtable's SQL is written for."""
        minimum = MIN_MARIADB if self.flavour == "mariadb" else MIN_MYSQL
        return self.version[:2] >= minimum


def parse_version(text: str) -> ServerVersion:
    """Parse the output of `mysqld --version` / `mariadbd --version`, e.g.
    `mysqld  Ver 8.0.36 for Linux on x86_64 (MySQL Community Server - GPL)` or
    `mariadbd  Ver 10.11.6-MariaDB-0+deb12u1 for debian-linux-gnu on x86_64 (Debian 12)`."""
    match = re.search(r"\bVer\s+(\d+)\.(\d+)\.(\d+)", text)
    if match is None:
        raise MsgtableError(f"cannot read a server version from {text.strip()!r}")
    major, minor, patch = (int(part) for part in match.groups())
    flavour: Flavour = "mariadb" if "mariadb" in text.lower() else "mysql"
    return ServerVersion(flavour, (major, minor, patch), text.strip())


@functools.cache
def server_version(binary: Path) -> ServerVersion:
    """Run `binary --version` (once per binary) and parse it."""
    try:
        done = subprocess.run(
            [str(binary), "--no-defaults", "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MsgtableError(f"cannot run {binary}: {exc}") from exc
    return parse_version(done.stdout + done.stderr)


def find_server_binary(
    path: str | None = None, search_dirs: Sequence[str] = SEARCH_DIRS
) -> Path | None:
    """The server binary to run: $MSGTABLE_MYSQLD, else mariadbd/mysqld on PATH (or `path`),
    else well-known install locations (sbin is often not on a user's PATH)."""
    override = os.environ.get(BINARY_ENV)
    if override:
        if not _is_executable(Path(override)):
            raise ServerBinaryNotFound(
                f"{BINARY_ENV}={override} is not an executable server binary\n{INSTALL_HINT}"
            )
        return Path(override)
    for name in SERVER_NAMES:
        found = shutil.which(name, path=path)
        if found:
            return Path(found)
    for directory in search_dirs:
        for name in SERVER_NAMES:
            candidate = Path(directory) / name
            if _is_executable(candidate):
                return candidate
    return None


def find_install_db(binary: Path) -> Path | None:
    """MariaDB's data-directory initialiser from the same installation as `binary`."""
    resolved = binary.resolve()
    near: tuple[Path, ...] = (binary.parent, resolved.parent, resolved.parent.parent / "bin")
    near += (resolved.parent.parent / "scripts", Path("/usr/bin"))
    for directory in near:
        for name in INSTALL_DB_NAMES:
            if _is_executable(directory / name):
                return directory / name
    for name in INSTALL_DB_NAMES:
        found = shutil.which(name)
        if found:
            return Path(found)
    return None


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def install_command(
    binary: Path, version: ServerVersion, datadir: Path, *, as_root: bool
) -> list[str]:
    """The command that initialises an empty data directory, root without a password."""
    user = ["--user=root"] if as_root else []  # both servers refuse to run as root without it
    if version.flavour == "mysql":
        return [
            str(binary),
            "--no-defaults",
            "--initialize-insecure",
            f"--datadir={datadir}",
            *user,
        ]
    install_db = find_install_db(binary)
    if install_db is None:
        raise ServerBinaryNotFound(f"found {binary} but no mariadb-install-db\n{INSTALL_HINT}")
    return [
        str(install_db),
        "--no-defaults",
        f"--datadir={datadir}",
        "--auth-root-authentication-method=normal",
        "--skip-test-db",
        "--force",  # skips resolveip's check of the host name, which fails in some containers
        *user,
    ]


def server_command(
    binary: Path,
    version: ServerVersion,
    *,
    datadir: Path,
    socket_path: Path,
    port: int,
    binlog: bool,
    as_root: bool,
) -> list[str]:
    """The server's command line: no option files, everything explicit, spelled the way both
    MariaDB 10.6+ and MySQL 8 accept. Durability is traded for speed: it is a throwaway."""
    args = [
        str(binary),
        "--no-defaults",  # must come first
        f"--datadir={datadir}",
        f"--socket={socket_path}",
        f"--pid-file={datadir / 'mysqld.pid'}",
        f"--log-error={datadir / 'error.log'}",
        f"--port={port}",
        f"--bind-address={HOST}",
        "--skip-name-resolve",
        "--performance-schema=OFF",
        "--character-set-server=utf8mb4",
        "--innodb-buffer-pool-size=256M",
        "--innodb-flush-log-at-trx-commit=2",
        "--innodb-doublewrite=OFF",
        "--sync-binlog=0",
        "--max-connections=500",
    ]
    if as_root:
        args.append("--user=root")
    if binlog:
        args += ["--server-id=1", "--log-bin=binlog", "--binlog-format=ROW"]
        args.append("--binlog-row-image=FULL")
    else:
        args.append("--skip-log-bin")  # MySQL 8 logs by default
    if version.flavour == "mysql":
        args.append("--mysqlx=OFF")  # else every server wants port 33060 and /tmp/mysqlx.sock
        args.append("--secure-file-priv=NULL")  # the compiled-in directory may not exist
        if (8, 4) <= version.version < (9, 0):
            # Lets clients without RSA support (pymysql without `cryptography`) log in over TCP.
            args.append("--mysql-native-password=ON")
    return args


def template_cache_dir() -> Path | None:
    """Where initialised data directories are kept for copying, or None when disabled."""
    value = os.environ.get(CACHE_ENV)
    if value is not None:
        return None if value.lower() in ("", "0", "off", "no", "false") else Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "msgtable" / "devdb"


def initialise_datadir(binary: Path, version: ServerVersion, datadir: Path) -> None:
    """Fill the empty directory `datadir` with a fresh server's system tables, by copying a
    cached template (made on first use) or, without a cache, by running the initialiser."""
    as_root = os.geteuid() == 0
    cache = template_cache_dir()
    if cache is not None:
        key = f"{binary.resolve()}\0{version.text}\0{as_root}\0{TEMPLATE_FORMAT}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        template = cache / f"{version.flavour}-{'.'.join(map(str, version.version))}-{digest}"
        with contextlib.suppress(OSError):
            if not template.is_dir():
                cache.mkdir(parents=True, exist_ok=True)
                _remove_stale_builds(cache)
                building = Path(tempfile.mkdtemp(prefix=".building-", dir=cache))
                try:
                    _run_initialiser(install_command(binary, version, building, as_root=as_root))
                    # Atomic: a concurrent builder's rename fails and leaves the winner's copy.
                    with contextlib.suppress(OSError):
                        building.rename(template)
                finally:
                    shutil.rmtree(building, ignore_errors=True)
            shutil.copytree(template, datadir, copy_function=_copy_sparse, dirs_exist_ok=True)
            # MySQL's server_uuid; each server must make its own.
            (datadir / "auto.cnf").unlink(missing_ok=True)
            return
        shutil.rmtree(datadir, ignore_errors=True)  # a half-done copy; start over uncached
        datadir.mkdir(parents=True)
    _run_initialiser(install_command(binary, version, datadir, as_root=as_root))


def _remove_stale_builds(cache: Path) -> None:
    """Templates half-built by a process that was killed meanwhile."""
    for stale in cache.glob(".building-*"):
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > STALE_BUILD_S:
                shutil.rmtree(stale)


def _copy_sparse(src: str, dst: str) -> None:
    """shutil.copy2, but blocks of zeros become holes: a fresh redo log is 96 MB of them."""
    with open(src, "rb") as source, open(dst, "wb") as target:
        while chunk := source.read(len(_ZEROS)):
            if chunk == _ZEROS:
                target.seek(len(chunk), os.SEEK_CUR)
            else:
                target.write(chunk)
        target.truncate()
    shutil.copystat(src, dst)


def _run_initialiser(command: list[str]) -> None:
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S * 2,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MsgtableError(f"initialising a data directory failed: {exc}") from exc
    if done.returncode != 0:
        output = "\n".join((done.stdout + done.stderr).rstrip().splitlines()[-LOG_TAIL_LINES:])
        raise MsgtableError(
            f"initialising a data directory failed (exit {done.returncode}): "
            f"{shlex.join(command)}\n{output}{_hints(output)}"
        )


def _hints(log: str) -> str:
    """What a user can do about a failure the log only describes."""
    denied = "Permission denied" in log or "Errcode: 13" in log
    if denied and Path("/sys/kernel/security/apparmor").exists():
        return (
            "\nhint: AppArmor may confine the server to its packaged data directory;"
            " try `aa-complain /usr/sbin/mysqld` (or /usr/sbin/mariadbd) as root"
        )
    return ""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (callers retry on a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def quote_database_name(name: str) -> str:
    """`name` as a quoted identifier; only [A-Za-z0-9_], 1-64 characters, is accepted."""
    if not DATABASE_NAME.fullmatch(name):
        raise InvalidArgument(
            f"invalid database name {name!r}: use 1-64 letters, digits or underscores"
        )
    return f"`{name}`"


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file, or a note that it does not exist."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path} does not exist)"
    return "\n".join(text.rstrip().splitlines()[-lines:])


# Run as `python -c WATCHDOG PID DIR... KEEP`, its stdin a pipe whose write end only the owner
# holds: data means "I stopped the server myself"; EOF without data means the owner died, so
# the watchdog stops the server and deletes its directories.
WATCHDOG = f"""\
import os, shutil, signal, sys, time
pid, dirs, keep = int(sys.argv[1]), sys.argv[2:-1], sys.argv[-1] == "1"
if sys.stdin.buffer.read():
    sys.exit(0)
def alive():
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
for sig, wait_s in ((signal.SIGTERM, {STOP_TIMEOUT_S!r}), (signal.SIGKILL, 5.0)):
    if alive():
        try:
            os.killpg(pid, sig)
        except OSError:
            pass
        deadline = time.monotonic() + wait_s
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
if not keep:
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
"""


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
    """

    def __init__(
        self,
        datadir: Path | None = None,
        *,
        port: int | None = None,
        binlog: bool = True,
        keep: bool = False,
        binary: Path | None = None,
    ) -> None:
        self._requested_datadir = Path(datadir) if datadir is not None else None
        self._requested_port = port
        self.binlog = binlog
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
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

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
            self._datadir = Path(tempfile.mkdtemp(prefix="msgtable-db-"))
        else:
            self._datadir = self._requested_datadir.absolute()
            self._datadir.mkdir(parents=True, exist_ok=True)
        self._socket = self._datadir / "mysqld.sock"
        if len(os.fsencode(self._socket)) > MAX_SOCKET_PATH:
            self._socket_dir = Path(tempfile.mkdtemp(prefix="msgtable-sock-"))
            self._socket = self._socket_dir / "mysqld.sock"

    def _launch(self, command: list[str]) -> None:
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
        argv = [sys.executable, "-c", WATCHDOG, str(self._process.pid), *dirs, str(int(self.keep))]
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
                    f"the server exited with code {returncode} on start:\n{log}{_hints(log)}"
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


class ExternalServer:
    """A server run by someone else, reached by a SQLAlchemy URL whose account may create
    databases; `dsn()` swaps in the database name. Satisfies ServerHandle."""

    def __init__(self, url: str) -> None:
        from sqlalchemy.engine import make_url

        self._url = make_url(url)

    def dsn(self, database: str = "") -> str:
        """The server's URL with `database` as its database part."""
        if database:
            quote_database_name(database)
        return self._url.set(database=database).render_as_string(hide_password=False)

    def create_database(self, name: str) -> None:
        """CREATE DATABASE IF NOT EXISTS `name`."""
        self._execute(f"CREATE DATABASE IF NOT EXISTS {quote_database_name(name)}")

    def drop_database(self, name: str) -> None:
        """DROP DATABASE IF EXISTS `name`."""
        self._execute(f"DROP DATABASE IF EXISTS {quote_database_name(name)}")

    def _execute(self, statement: str) -> None:
        import sqlalchemy

        engine = sqlalchemy.create_engine(self.dsn(), poolclass=sqlalchemy.NullPool)
        try:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql(statement)
        finally:
            engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m msgtable.devdb find|run`: which binary would be used; a server until Ctrl-C."""
    parser = argparse.ArgumentParser(prog="python -m msgtable.devdb", description=__doc__)
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
        binary = find_server_binary()
        if binary is None:
            print(INSTALL_HINT, file=sys.stderr)
            return 1
        version = server_version(binary)
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
