"""msgtable.testing.devdb against the machine's real mariadbd/mysqld, and the shared fixtures."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from msgtable.errors import MsgtableError
from msgtable.testing import ServerHandle, devdb, watchdog
from msgtable.testing.devdb import MAX_SOCKET_PATH, LocalServer
from msgtable.testing.mysqld import INSTALL_HINT, find_server_binary

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def local_binary() -> None:
    """These tests are about LocalServer itself, so they need a local binary even when the
    session's server comes from MSGTABLE_TEST_DSN."""
    if find_server_binary() is None:
        if os.environ.get("MSGTABLE_TEST_DSN"):
            pytest.skip("no local mariadbd/mysqld; the session server comes from the DSN")
        pytest.fail(f"no local mariadbd/mysqld.\n{INSTALL_HINT}", pytrace=False)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    # A zombie is dead too: it only waits for its parent to reap it.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def wait_until(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting until {what}")
        time.sleep(0.05)


def query(dsn: str, statement: str) -> list[tuple[object, ...]]:
    """Run one statement on a connection of its own, in autocommit mode."""
    engine = sqlalchemy.create_engine(
        dsn, poolclass=sqlalchemy.NullPool, isolation_level="AUTOCOMMIT"
    )
    try:
        with engine.connect() as conn:
            result = conn.exec_driver_sql(statement)
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()


@pytest.fixture
def listener() -> Iterator[int]:
    """A port something already listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_local_server_serves_tcp_with_a_row_binlog_and_leaves_nothing_behind() -> None:
    server = LocalServer()
    server.start()
    try:
        pid, datadir = server.pid, server.datadir
        assert pid is not None and server.running
        assert server.dsn("") == f"mysql+pymysql://msgtable:msgtable@127.0.0.1:{server.port}/"
        assert f"-P {server.port} -u msgtable -pmsgtable app" in server.mysql_cli_command("app")

        [(log_bin, fmt, image, user)] = query(
            server.dsn(),
            "SELECT @@log_bin, @@binlog_format, @@binlog_row_image, CURRENT_USER()",
        )
        assert (log_bin, fmt, image) == (1, "ROW", "FULL")
        assert str(user).startswith("msgtable@")

        server.create_database("app")
        server.create_database("app")  # IF NOT EXISTS
        query(server.dsn("app"), "CREATE TABLE t (id BIGINT PRIMARY KEY)")
        assert ("app",) in query(server.dsn(), "SHOW DATABASES")
        server.drop_database("app")
        assert ("app",) not in query(server.dsn(), "SHOW DATABASES")
    finally:
        server.stop()
    assert not datadir.exists()
    assert not alive(pid)
    server.stop()  # idempotent


def test_without_binlog_the_server_logs_nothing() -> None:
    with LocalServer(binlog=False) as server:
        assert query(server.dsn(), "SELECT @@log_bin") == [(0,)]


def test_a_kept_data_directory_is_reused_with_its_data(tmp_path: Path) -> None:
    datadir = tmp_path / "db"
    with LocalServer(datadir, keep=True) as server:
        server.create_database("app")
        query(server.dsn("app"), "CREATE TABLE t (id BIGINT PRIMARY KEY)")
        query(server.dsn("app"), "INSERT INTO t VALUES (42)")
    assert (datadir / "mysql").is_dir()

    with LocalServer(datadir) as server:
        assert query(server.dsn("app"), "SELECT id FROM t") == [(42,)]
    assert not datadir.exists()


def test_a_durable_server_killed_mid_load_recovers_every_commit_and_its_binlog(
    tmp_path: Path,
) -> None:
    """durable=True: the settings a production server runs with; kill() is a crash (SIGKILL,
    no shutdown), and start() recovers: every transaction whose commit returned is there,
    in the table and in the binary log."""
    server = LocalServer(tmp_path / "db", keep=True, durable=True)
    server.start()
    try:
        # innodb_doublewrite: MariaDB's a boolean, MySQL's (8.0.30+) ON/OFF/DETECT_... an enum
        doublewrite_on = 1 if server.version and server.version.flavour == "mariadb" else "ON"
        assert query(
            server.dsn(),
            "SELECT @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@innodb_doublewrite",
        ) == [(1, 1, doublewrite_on)]
        server.create_database("app")
        query(server.dsn("app"), "CREATE TABLE t (id BIGINT PRIMARY KEY)")
        engine = sqlalchemy.create_engine(server.dsn("app"))
        committed = 0
        try:
            with engine.connect() as conn:
                for i in range(1, 201):
                    conn.exec_driver_sql(f"INSERT INTO t VALUES ({i})")
                    conn.commit()
                    committed = i
        finally:
            engine.dispose()
        pid = server.pid
        assert pid is not None
        server.kill()
        assert not alive(pid)
        server.start()
        assert "crash recovery" in (tmp_path / "db" / "error.log").read_text().lower()
        assert query(server.dsn("app"), "SELECT COUNT(*), MAX(id) FROM t") == [
            (committed, committed)
        ]
        events = query(server.dsn(), "SHOW BINLOG EVENTS IN 'binlog.000001'")
        writes = [e for e in events if e[2] in ("Write_rows_v1", "Write_rows")]
        assert len(writes) >= committed
    finally:
        server.keep = False
        server.stop()


def test_a_taken_port_that_was_asked_for_fails_with_the_log(listener: int) -> None:
    server = LocalServer(port=listener)
    with pytest.raises(MsgtableError, match=f"port {listener} is in use"):
        server.start()
    assert not server.running


def test_a_chosen_port_taken_before_the_server_binds_it_is_replaced(
    listener: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = iter([listener])
    real_free_port = devdb.free_port
    monkeypatch.setattr(devdb, "free_port", lambda: next(ports, None) or real_free_port())
    with LocalServer(binlog=False) as server:
        assert server.port != listener
        assert query(server.dsn(), "SELECT 1") == [(1,)]


def test_a_killed_owner_does_not_leave_its_server_running(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from msgtable.testing.devdb import LocalServer\n"
            "server = LocalServer(binlog=False)\n"
            "server.start()\n"
            "print(server.pid, server.datadir, flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert owner.stdout is not None
    pid_text, datadir = owner.stdout.readline().split()
    pid = int(pid_text)
    assert alive(pid)
    owner.kill()  # no atexit, no finally: only the watchdog can clean up
    owner.wait()
    wait_until(lambda: not alive(pid), watchdog.STOP_TIMEOUT_S + 10, "the orphaned server stops")
    wait_until(lambda: not Path(datadir).exists(), 10, "its data directory is removed")


def test_a_failing_server_reports_the_tail_of_its_log(tmp_path: Path) -> None:
    """A data directory that looks initialised but holds no system tables."""
    datadir = tmp_path / "broken"
    (datadir / "mysql").mkdir(parents=True)  # looks initialised, holds no system tables
    server = LocalServer(datadir, binlog=False)
    with pytest.raises(MsgtableError, match=r"error\.log"):
        server.start(timeout_s=30)
    assert not server.running


def test_the_session_server_gives_each_test_its_own_database(
    mysql_server: ServerHandle, db_name: str, db_dsn: str, sql: Any
) -> None:
    assert db_dsn == mysql_server.dsn(db_name)
    assert db_name.startswith("t_")
    assert sql.scalar("SELECT DATABASE()") == db_name
    sql.execute("CREATE TABLE m (id BIGINT PRIMARY KEY, note VARCHAR(20))")
    sql.execute(
        "INSERT INTO m VALUES (:id, :note)", [{"id": 1, "note": "a"}, {"id": 2, "note": "b"}]
    )
    assert sql.rows("SELECT id, note FROM m ORDER BY id") == [(1, "a"), (2, "b")]
    assert (
        sql.scalar(
            "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = :db",
            {"db": db_name},
        )
        == 1
    )


def test_a_long_temporary_directory_still_gives_a_socket_the_server_can_bind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data directory too deep for a unix socket (104-108 bytes) puts the socket in a
    short directory of its own; the temporary directory may be that deep too (pytest-xdist's
    popen-gwN/ level made an embedded server's TMPDIR one: the server refused to start)."""
    deep = tmp_path / ("t" * 50) / ("u" * 50)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    server = LocalServer()
    try:
        server.start()
        assert len(os.fsencode(server.socket)) <= MAX_SOCKET_PATH
        assert server.execute("SELECT 1") == [(1,)]
    finally:
        server.stop()


@pytest.mark.parametrize("moment", ["data directory made", "server launched"])
def test_a_stop_signal_at_any_moment_of_start_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moment: str
) -> None:
    """`msgtable serve` turns SIGTERM into KeyboardInterrupt while its throwaway database
    starts, and start() cleans up what it made. A signal between making a thing and recording
    it (the data directory, the server's process) lost it: CI's embedded SIGTERM test found
    the data directory left behind. The signal is raised here at exactly those moments."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    launched: list[int] = []
    real_mkdtemp, real_popen = tempfile.mkdtemp, subprocess.Popen

    def mkdtemp(*args: Any, **kwargs: Any) -> str:
        made = real_mkdtemp(*args, **kwargs)
        if moment == "data directory made" and kwargs.get("prefix") == "msgtable-db-":
            signal.raise_signal(signal.SIGTERM)
        return made

    def popen(argv: Any, *args: Any, **kwargs: Any) -> Any:
        process = real_popen(argv, *args, **kwargs)
        if "msgtable.testing.watchdog" not in argv:
            launched.append(process.pid)
            if moment == "server launched":
                signal.raise_signal(signal.SIGTERM)
        return process

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(subprocess, "Popen", popen)
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    server = LocalServer(binlog=False)
    try:
        with pytest.raises(KeyboardInterrupt):
            server.start()
        assert [p for p in launched if alive(p)] == [], f"a server left running after {moment}"
        assert list(scratch.iterdir()) == [], f"left behind after {moment}"
    finally:
        signal.signal(signal.SIGTERM, previous)
        for pid in launched:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        server.stop()
