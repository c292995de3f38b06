"""Finding and preparing a MySQL-family server binary: versions, command lines, data dirs.

The pure and filesystem-level half of the throwaway server (msgtable.testing.devdb runs it):
which binary to use (`MSGTABLE_MYSQLD`, PATH, well-known places), how to run it (`launcher`:
a server unpacked into a private prefix with its own C library, as .ci/mysql-install puts
MySQL 9.7 on a Debian 12 machine, runs through that prefix's dynamic loader), its flavour and
version, the options that start it for a disposable server, and initialised data directories, made
once per binary into a template under ~/.cache/msgtable/devdb (`MSGTABLE_DEVDB_CACHE` moves
it, `off` disables it) and copied for each server.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from msgtable.errors import MsgtableError, ServerBinaryNotFound

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
MIN_MARIADB = (10, 6)
MIN_MYSQL = (8, 0)
_ZEROS = bytes(1 << 20)
STALE_BUILD_S = 3600.0
TEMPLATE_FORMAT = "1"  # bump when install_command changes what a fresh datadir holds
HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0
LOG_TAIL_LINES = 25

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


@dataclass(frozen=True)
class PrivatePrefix:
    """A server unpacked (not installed) into a directory of its own with the C library it was
    built against: `ROOT/usr/sbin/mysqld` beside `ROOT/usr/lib/TRIPLET/ld-linux*.so.*`.
    Such a binary runs through that loader with the prefix's libraries, and finds its error
    messages and plugins in the prefix rather than where its package would have put them."""

    root: Path
    loader: Path

    @property
    def library_path(self) -> str:
        """The prefix's library directories, for the loader's --library-path."""
        triplet = self.loader.parent.name
        dirs = (self.root / "usr" / "lib" / triplet, self.root / "lib" / triplet)
        return ":".join(str(d) for d in dirs)

    def options(self) -> list[str]:
        """The server options that point it into the prefix (after --no-defaults)."""
        usr = self.root / "usr"
        return [
            f"--basedir={usr}",
            f"--lc-messages-dir={usr / 'share' / 'mysql'}",
            f"--plugin-dir={usr / 'lib' / 'mysql' / 'plugin'}",
        ]


def private_prefix(binary: Path) -> PrivatePrefix | None:
    """The private prefix `binary` was unpacked into, or None for an installed binary."""
    path = Path(os.path.abspath(binary))
    if path.parent.name != "sbin" or path.parent.parent.name != "usr":
        return None
    root = path.parent.parent.parent
    if root == Path(root.anchor):
        return None  # /usr/sbin/mysqld: the system's own
    loaders = sorted(root.glob("usr/lib/*-linux-gnu/ld-linux*.so.*"))
    return PrivatePrefix(root, loaders[0]) if loaders else None


def launcher(binary: Path) -> list[str]:
    """The start of a command line that runs `binary` (its arguments follow)."""
    prefix = private_prefix(binary)
    if prefix is None:
        return [str(binary)]
    return [str(prefix.loader), "--library-path", prefix.library_path, str(binary)]


def prefix_options(binary: Path) -> list[str]:
    """Options a private prefix's server needs (none for an installed one)."""
    prefix = private_prefix(binary)
    return prefix.options() if prefix is not None else []


@functools.cache
def server_version(binary: Path) -> ServerVersion:
    """Run `binary --version` (once per binary) and parse it."""
    try:
        done = subprocess.run(
            [*launcher(binary), "--no-defaults", "--version"],
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
            *launcher(binary),
            "--no-defaults",
            *prefix_options(binary),
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
    durable: bool = False,
) -> list[str]:
    """The server's command line: no option files, everything explicit, spelled the way both
    MariaDB 10.6+ and MySQL 8 accept. Durability is traded for speed (it is a throwaway)
    unless ``durable``: then every commit is flushed to disk, the binary log's included,
    and pages are written through the doublewrite buffer, as a production server runs."""
    args = [
        *launcher(binary),
        "--no-defaults",  # must come first
        *prefix_options(binary),
        f"--datadir={datadir}",
        # Temporary tables in its own directory: a server starting deletes every #sql* file
        # of its tmpdir, which in a shared /tmp are other running servers' (error 6 there).
        f"--tmpdir={datadir}",
        f"--socket={socket_path}",
        f"--pid-file={datadir / 'mysqld.pid'}",
        f"--log-error={datadir / 'error.log'}",
        f"--port={port}",
        f"--bind-address={HOST}",
        "--skip-name-resolve",
        # MySQL's default, ON: its counters of rows read per table are there (the bench's
        # filter figure reads them; MariaDB's are userstat's); MariaDB's default, OFF
        f"--performance-schema={'ON' if version.flavour == 'mysql' else 'OFF'}",
        "--character-set-server=utf8mb4",
        "--innodb-buffer-pool-size=256M",
        f"--innodb-flush-log-at-trx-commit={1 if durable else 2}",
        f"--innodb-doublewrite={'ON' if durable else 'OFF'}",
        f"--sync-binlog={1 if durable else 0}",
        "--max-connections=500",
    ]
    if as_root:
        args.append("--user=root")
    if binlog:
        args += ["--server-id=1", "--log-bin=binlog", "--binlog-format=ROW"]
        args.append("--binlog-row-image=FULL")
        # column names in the binlog's table maps: table events need them
        # (msgtable.features.capture.follower)
        args.append("--binlog-row-metadata=FULL")
        if version.flavour == "mysql":
            # each statement's text before its rows, as MariaDB's binlog_annotate_row_events
            # does by default: the binlog follower tells msgtable's own writes by it
            args.append("--binlog-rows-query-log-events=ON")
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
            f"{shlex.join(command)}\n{output}{failure_hints(output)}"
        )


def failure_hints(log: str) -> str:
    """What a user can do about a failure the log only describes."""
    denied = "Permission denied" in log or "Errcode: 13" in log
    if denied and Path("/sys/kernel/security/apparmor").exists():
        return (
            "\nhint: AppArmor may confine the server to its packaged data directory;"
            " try `aa-complain /usr/sbin/mysqld` (or /usr/sbin/mariadbd) as root"
        )
    return ""
