"""Fixtures shared by all test layers: a MySQL-family server, a fresh database per test.

The server (`mysql_server`, one per session) comes from, in order:
1. `MSGTABLE_TEST_DSN`: a SQLAlchemy URL of a running server whose account may create
   databases (its database part is ignored);
2. a testcontainers MySQL 8 container, when a Docker engine answers;
3. a throwaway local mariadbd/mysqld (msgtable.testing.devdb.LocalServer) in a temporary directory:
   `MSGTABLE_MYSQLD` names the binary (`make test` runs the integration and acceptance layers
   twice: on MariaDB 10.11, then with the MySQL 9.7 that .ci/mysql-install unpacks).
With none of them the tests that need a server fail with a message saying how to get one: a
missing server is a broken setup, not a reason to skip (`make test` installs one).

Tests under tests/integration are marked `integration`, under tests/acceptance `acceptance`,
so `-m "not integration"` runs only what needs no server. Each test of those two layers carries
the server's flavour and series in its id (`test_x[mysql-9.7]`, `test_y[case-mariadb-10.11]`),
so every failure names the server it failed on; the `flavour` fixture ("mariadb" or "mysql")
is for the tests that assert one server's own behaviour.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import os
import signal
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy.engine import Connection, CursorResult, Engine

from msgtable.errors import MsgtableError
from msgtable.testing import ExternalServer, ServerHandle
from msgtable.testing.devdb import LocalServer, free_port
from msgtable.testing.mysqld import INSTALL_HINT, find_server_binary, parse_version, server_version

# The tests press Ctrl-C (SIGINT) on the commands they start, as a user at a terminal would.
# A shell that runs the suite in the background (nohup, `&`, some CI runners) makes SIGINT
# ignored, and every command started from here would inherit that: give the suite the
# disposition of a foreground process.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

DSN_ENV = "MSGTABLE_TEST_DSN"
MYSQL_IMAGE = "mysql:8.0"
# The same trade of durability for speed as LocalServer; MySQL 8 logs ROW binlogs by default.
CONTAINER_OPTIONS = (
    "--innodb-flush-log-at-trx-commit=2 --sync-binlog=0 --max-connections=500"
    " --binlog-format=ROW --binlog-row-image=FULL --binlog-row-metadata=FULL --skip-name-resolve"
)
DOCKER_PING_TIMEOUT_S = 3
TESTS_DIR = Path(__file__).parent
LAYER_MARKERS = {
    "integration": pytest.mark.integration,
    "acceptance": pytest.mark.acceptance,
    "spark": pytest.mark.spark,
    "faults": pytest.mark.faults,
}

# The layers whose tests run on the session's server, and whose ids say which it is.
SERVER_LAYERS = ("integration", "acceptance")

_database_numbers = itertools.count(1)


def _layer(path: Path) -> str | None:
    try:
        return path.relative_to(TESTS_DIR).parts[0]
    except ValueError:
        return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with the layer (directory under tests/) it lives in."""
    for item in items:
        marker = LAYER_MARKERS.get(_layer(item.path) or "")
        if marker is not None:
            item.add_marker(marker)


class ServerUnderTest:
    """Which server the session's tests run on: `label` ("mariadb-10.11", "mysql-9.7"),
    `flavour` and a line saying where it comes from. Found without starting it."""

    def __init__(self) -> None:
        self.label = "unknown-server"
        self.flavour = ""
        dsn = os.environ.get(DSN_ENV)
        if dsn:
            self.where = f"{DSN_ENV}"
            self._read_version(_dsn_version(dsn))
        elif _docker_engine_answers():
            self.where = "a Docker MySQL 8 container (testcontainers), else a local server"
            self._read_version(f"mysqld  Ver {MYSQL_IMAGE.split(':')[1]}.0")
        else:
            binary = find_server_binary()
            self.where = f"local {binary}" if binary else "no local mariadbd/mysqld"
            if binary is not None:
                with contextlib.suppress(MsgtableError):
                    self._read_version(server_version(binary).text)

    def _read_version(self, text: str) -> None:
        with contextlib.suppress(MsgtableError):
            version = parse_version(text)
            self.flavour = version.flavour
            self.label = f"{version.flavour}-{version.version[0]}.{version.version[1]}"
            self.where += f" ({'.'.join(map(str, version.version))})"


def _dsn_version(dsn: str) -> str:
    """`mysqld  Ver X.Y.Z[-MariaDB]` for the server behind a DSN, or "" when it does not
    answer (the mysql_server fixture then says why)."""
    engine = sqlalchemy.create_engine(dsn, poolclass=sqlalchemy.NullPool)
    try:
        with engine.connect() as conn:
            return f"mysqld  Ver {conn.exec_driver_sql('SELECT VERSION()').scalar()}"
    except sqlalchemy.exc.SQLAlchemyError:
        return ""
    finally:
        engine.dispose()


@functools.cache
def server_under_test() -> ServerUnderTest:
    """The session's ServerUnderTest (found once)."""
    return ServerUnderTest()


def pytest_report_header(config: pytest.Config) -> str:
    """Say up front which server the integration and acceptance tests will use."""
    server = server_under_test()
    return f"msgtable test server: {server.label}, {server.where}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Name the server in the id of every test of the layers that run on it."""
    if "server_label" in metafunc.fixturenames and _layer(metafunc.definition.path) in (
        SERVER_LAYERS
    ):
        label = server_under_test().label
        metafunc.parametrize("server_label", [label], ids=[label], indirect=True)


@pytest.fixture(autouse=True)
def server_label(request: pytest.FixtureRequest) -> str:
    """The server the test runs on, as its id shows it ("" outside the server layers)."""
    return str(getattr(request, "param", ""))


@pytest.fixture
def flavour() -> str:
    """The flavour of the session's server, "mariadb" or "mysql", for a test that asserts
    that server's own behaviour (a plan, a counter, an error number)."""
    return server_under_test().flavour


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """One line per server layer: how many of its tests passed and failed, on which server."""
    counts: dict[str, dict[str, int]] = {}
    for outcome in ("passed", "failed", "error", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            layer = report.nodeid.split("/")[1] if report.nodeid.startswith("tests/") else ""
            if layer in SERVER_LAYERS:
                per = counts.setdefault(layer, {})
                per[outcome] = per.get(outcome, 0) + 1
    if not counts:
        return
    label = server_under_test().label
    for layer in SERVER_LAYERS:
        if layer in counts:
            figures = ", ".join(f"{n} {outcome}" for outcome, n in counts[layer].items())
            terminalreporter.write_line(f"msgtable {layer} layer on {label}: {figures}")


@pytest.fixture(scope="session")
def mysql_server() -> Iterator[ServerHandle]:
    """The session's MySQL-family server: `.dsn(database)`, `.create_database(name)`,
    `.drop_database(name)` (see the module docstring for where it comes from)."""
    dsn = os.environ.get(DSN_ENV)
    if dsn:
        yield ExternalServer(dsn)
        return
    problems: list[str] = []
    with contextlib.ExitStack() as stack:
        if _docker_engine_answers():
            container: ServerHandle | None = None
            try:
                container = stack.enter_context(_mysql_container())
            except Exception as exc:  # fall back to a local server, and say why if that fails
                problems.append(f"a Docker engine answered, but MySQL 8 did not start: {exc!r}")
            if container is not None:
                yield container
                return
        if find_server_binary() is None:
            problems.append(f"no local mariadbd/mysqld.\n{INSTALL_HINT}")
        else:
            server = LocalServer()
            try:
                server.start()
            except MsgtableError as exc:
                problems.append(f"a local server did not start: {exc}")
            else:
                stack.callback(server.stop)
                yield server
                return
        pytest.fail(
            "No MySQL-family server for the tests. Set MSGTABLE_TEST_DSN to the SQLAlchemy URL"
            " of a server whose account may create databases, run a Docker engine, or install"
            " a local server (`make test` does).\n" + "\n".join(problems),
            pytrace=False,
        )


def _docker_engine_answers() -> bool:
    try:
        import docker
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=DOCKER_PING_TIMEOUT_S)
    except Exception:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


@contextlib.contextmanager
def _mysql_container() -> Iterator[ServerHandle]:
    try:
        from testcontainers.community.mysql import MySqlContainer
    except ImportError:  # testcontainers < 4.14
        from testcontainers.mysql import MySqlContainer

    container = MySqlContainer(
        MYSQL_IMAGE, dialect="pymysql", username="root", password="msgtable", dbname="msgtable"
    )
    container.with_command(CONTAINER_OPTIONS)
    with container:
        yield ExternalServer(container.get_connection_url())


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[LocalServer]:
    """A database server of this test's own (database "app"), which it may stop and start
    again (the data directory is kept until the end of the test)."""
    yield from _own_server(tmp_path, durable=False)


@pytest.fixture
def own_durable_server(tmp_path: Path) -> Iterator[LocalServer]:
    """own_server with a production server's durability (every commit flushed to disk, the
    binlog's included), which the test may also crash (kill()) and start again."""
    yield from _own_server(tmp_path, durable=True)


def _own_server(tmp_path: Path, durable: bool) -> Iterator[LocalServer]:
    server = LocalServer(tmp_path / "db", port=free_port(), keep=True, durable=durable)
    server.start()
    server.create_database("app")
    try:
        yield server
    finally:
        server.keep = False
        server.stop()


@pytest.fixture
def db_name(request: pytest.FixtureRequest, mysql_server: ServerHandle) -> Iterator[str]:
    """A fresh, empty database for this test (`t_<hash of the test id>_<pid>_<n>`), dropped
    afterwards."""
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:8]
    name = f"t_{digest}_{os.getpid()}_{next(_database_numbers)}"
    mysql_server.drop_database(name)  # a leftover of a killed run must not leak into this one
    mysql_server.create_database(name)
    yield name
    mysql_server.drop_database(name)


@pytest.fixture
def db_dsn(mysql_server: ServerHandle, db_name: str) -> str:
    """SQLAlchemy URL of this test's fresh database (created before, dropped after the test)."""
    return mysql_server.dsn(db_name)


class Sql:
    """The test's own connection to its database, in autocommit mode, for the DDL and DML an
    application would run: `sql.execute("INSERT INTO t (id) VALUES (:id)", {"id": 1})`,
    `sql.scalar(...)`, `sql.rows(...)`. Statements are SQLAlchemy `text()`: bind parameters
    are `:name`, and a literal colon is written `\\:`. `sql.engine` is a separate pool for
    explicit transactions (`with sql.engine.begin() as conn: ...`)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.engine: Engine = sqlalchemy.create_engine(dsn)
        self.connection: Connection = self.engine.connect().execution_options(
            isolation_level="AUTOCOMMIT"
        )

    def execute(
        self, statement: str, params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
    ) -> CursorResult[Any]:
        """Run one statement (a list of dicts as `params` runs it once per dict)."""
        return self.connection.execute(sqlalchemy.text(statement), params)

    def scalar(self, statement: str, params: Mapping[str, Any] | None = None) -> Any:
        """The first column of the first row, or None."""
        return self.execute(statement, params).scalar()

    def rows(
        self, statement: str, params: Mapping[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        """All rows, as plain tuples."""
        return [tuple(row) for row in self.execute(statement, params)]

    def close(self) -> None:
        """Close the connection and the pool."""
        self.connection.close()
        self.engine.dispose()


@pytest.fixture
def sql(db_dsn: str) -> Iterator[Sql]:
    """An autocommit connection to this test's database (see `Sql`), closed after the test."""
    runner = Sql(db_dsn)
    yield runner
    runner.close()
