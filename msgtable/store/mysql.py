"""What msgtable knows of MySQL and MariaDB, in one place: connection arguments from a URL, the
driver, error numbers and what they mean, column kinds, and what a server says of its binlog.

Every module that connects (the store's pools, the lease, the binlog follower, Spark's
executors, the bench) takes its arguments and its reading of errors from here.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from msgtable.core.sqltypes import (  # noqa: F401  (re-exported: the store's users)
    BINARY_TYPES,
    BIT,
    CHOICE_TYPES,
    DATE,
    DATETIME,
    DECIMAL_TYPES,
    FLOAT_TYPES,
    INTEGER_TYPES,
    JSON,
    MARIADB_TEXT_TYPES,
    SPATIAL_TYPES,
    TEXT_TYPES,
    TIME,
    TIMESTAMP,
    VECTOR,
    YEAR,
)
from msgtable.errors import (
    DatabaseUnavailable,
    InvalidArgument,
    MsgtableError,
    TableNotFound,
    Unavailable,
)

CONNECT_TIMEOUT_S = 5
IO_TIMEOUT_S = 30  # a statement's reads and writes (PyMySQL and mysqlclient)
# Every connection of msgtable's reads committed rows only: a poll never waits for a lock.
SESSION_SETUP = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"

# -- error numbers -----------------------------------------------------------------------------
DUPLICATE_KEY = 1062
NO_SUCH_TABLE = 1146
ACCESS_DENIED = frozenset({1044, 1045, 1142})  # database, user, table
# The database refuses this server as a whole (not one table): a wrong account or password,
# no access to the database, an unknown database. Like a database that does not answer, these
# keep the server waiting (and saying why), not failing.
REFUSED = frozenset({1044, 1045, 1049})
# What a refusal means where the database's own words do not say it (the DSN's account).
REFUSED_BECAUSE = {
    1045: "the DSN's user or password is wrong, or that user may not connect from this host",
}
# The binlog follower's "it will not work here": a privilege it lacks, or no binlog to read.
# (A refusal of the whole account, REFUSED, keeps it waiting with the rest of the server.)
NO_REPLICATION = (ACCESS_DENIED - REFUSED) | {1227, 1236}
# A statement that lost a lock race (a deadlock's victim, a lock wait that timed out): the
# database is there, so it is retried without being taken for an outage.
# A statement that ran past its time-out: MariaDB's max_statement_time (1969), MySQL's
# MAX_EXECUTION_TIME (3024).
STATEMENT_TIMED_OUT = frozenset({1969, 3024})
LOCK_CONFLICTS = frozenset({1205, 1213})
# Errors that mean "try again later".
RETRYABLE = frozenset(
    {
        1040,  # too many connections
        1053,  # server shutdown in progress
        1205,  # lock wait timeout
        1213,  # deadlock
        1927,  # MariaDB: connection killed
        2002,  # client: cannot connect (socket)
        2003,  # client: cannot connect (TCP)
        2006,  # client: server has gone away
        2013,  # client: lost connection during query
        2014,
        2055,
        4031,  # MySQL 8: disconnected by the server for inactivity
    }
)
# Errors that mean the connection itself is gone (0: the driver's own "not connected").
LOST_CONNECTION = frozenset({0, 1927, 2006, 2013, 2014, 2055, 4031})


def replication_refused(exc: BaseException) -> str | None:
    """Why a binlog reader cannot work here, when ``exc`` says so (NO_REPLICATION; None:
    another error, worth a retry): one line for the log and the status."""
    if error_code(exc, follow_cause=True) not in NO_REPLICATION:
        return None
    return (
        f"the database refused ({exc}); the msgtable user needs "
        "REPLICATION SLAVE and REPLICATION CLIENT"
    )


def error_code(exc: BaseException | None, follow_cause: bool = False) -> int | None:
    """The MySQL error number of a driver's error (None if it has none); with
    ``follow_cause``, of the first error in its ``__cause__`` chain that has one."""
    while exc is not None:
        args = getattr(exc, "args", ())
        if args and isinstance(args[0], int) and (args[0] != 0 or follow_cause):
            return int(args[0])
        exc = exc.__cause__ if follow_cause else None
    return None


def error_text(exc: BaseException) -> str:
    """A driver's error as ``(number) message``."""
    args: tuple[Any, ...] = tuple(getattr(exc, "args", ()))
    if len(args) >= 2:
        return f"({args[0]}) {args[1]}"
    return str(exc) or type(exc).__name__


def database_error(exc: BaseException, table: str | None = None) -> MsgtableError:
    """The MsgtableError for a driver's error (the one place that sorts them): a dropped
    ``table``, a database that is away or refuses us (DatabaseUnavailable: wait for it), a
    package the driver lacks, or anything else."""
    missing = missing_auth_package(exc)
    if missing is not None:
        return missing
    code = error_code(exc)
    if code == NO_SUCH_TABLE and table is not None:
        return TableNotFound(f"message table {table!r} no longer exists")
    if code in LOCK_CONFLICTS:  # the database answers: one statement lost a race, retried
        return Unavailable(f"lock conflict (retried): {error_text(exc)}")
    if code in REFUSED_BECAUSE:
        return DatabaseUnavailable(
            f"database unavailable: {error_text(exc)}: {REFUSED_BECAUSE[code]}"
        )
    if code is None or code in RETRYABLE or code in REFUSED or 2000 <= code < 3000:  # 2xxx: client
        return DatabaseUnavailable(f"database unavailable: {error_text(exc)}")
    return MsgtableError(f"database error: {error_text(exc)}")


def sorted_error(exc: BaseException) -> BaseException:
    """An error as the MsgtableError it means when it came from the database, its driver or
    the network (database_error: mostly Unavailable), or PyMySQL's lack of a package for the
    database's authentication; any other error (a bug) as it is."""
    if isinstance(exc, MsgtableError):
        return exc
    module = type(exc).__module__
    if isinstance(exc, OSError) or module.startswith(DRIVER_MODULES):
        return database_error(exc)
    return missing_auth_package(exc) or exc


# The modules whose exceptions are a MySQL driver's (database_error sorts them).
DRIVER_MODULES = ("pymysql", "MySQLdb", "pymysqlreplication")

# PyMySQL logs in with some authentication methods only with an optional package installed,
# and without it raises a bare RuntimeError ("'cryptography' package is required for ...") in
# the handshake. MySQL 8's default, caching_sha2_password, needs `cryptography` over TCP
# without TLS (whenever the server has not cached the account's password yet: the first login
# after it starts). The package, its PyMySQL extra, and the methods that need it:
AUTH_PACKAGES = {
    "cryptography": (
        "PyMySQL[rsa]",
        "caching_sha2_password (MySQL 8's default) or sha256_password",
    ),
    "pynacl": ("PyMySQL[ed25519]", "MariaDB's ed25519"),
}
_PACKAGE_REQUIRED = re.compile(r"'(\w+)' package is required for")


def missing_auth_package(exc: BaseException) -> MsgtableError | None:
    """The error that says what to install when PyMySQL lacks the package the database's
    authentication method needs; None for any other error."""
    if not isinstance(exc, RuntimeError):
        return None
    match = _PACKAGE_REQUIRED.match(str(exc))
    if match is None or match.group(1).lower() not in AUTH_PACKAGES:
        return None
    package = match.group(1)
    extra, methods = AUTH_PACKAGES[package.lower()]
    return MsgtableError(
        f"the database asks for {methods} authentication, which PyMySQL does only with the "
        f"{package!r} package: pip install '{extra}'"
    )


def open_connection(connect: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``connect(*args, **kwargs)``, a driver's connect(); an authentication method the driver
    lacks a package for raises the MsgtableError that says what to install."""
    try:
        return connect(*args, **kwargs)
    except RuntimeError as exc:
        missing = missing_auth_package(exc)
        if missing is None:
            raise
        raise missing from None


def lost_connection(exc: BaseException) -> bool:
    """Whether an error says the connection itself is gone."""
    args: tuple[Any, ...] = tuple(getattr(exc, "args", ()))
    return bool(args) and isinstance(args[0], int) and args[0] in LOST_CONNECTION


# -- URLs and drivers --------------------------------------------------------------------------
def parse_url(dsn: str) -> sa.URL:
    """A SQLAlchemy URL of a MySQL-family database (``mysql://u:pw@host:3306/db``), checked:
    InvalidArgument names what is wrong."""
    try:
        url = sa.engine.make_url(dsn)
    except Exception as exc:
        raise InvalidArgument(f"not a valid database URL: {exc}") from None
    if not url.database:
        raise InvalidArgument(f"the database URL must name a database: {url!r}")
    if not url.drivername.startswith(("mysql", "mariadb")):
        raise InvalidArgument(f"msgtable needs a MySQL-family database, not {url.drivername}")
    return url


def fastest_driver() -> str:
    """The SQLAlchemy driver name of the fastest MySQL driver installed: ``mysqldb``
    (mysqlclient, C: reads rows about ten times faster) or ``pymysql`` (pure Python)."""
    try:
        importlib.import_module("MySQLdb")
    except ImportError:
        return "pymysql"
    return "mysqldb"


def with_driver(url: sa.URL) -> sa.URL:
    """The URL with a driver: the one it names, else the fastest installed."""
    if url.drivername in ("mysql", "mariadb"):
        return url.set(drivername=f"{url.drivername}+{fastest_driver()}")
    return url


def without_driver(dsn: str) -> str:
    """The URL with its driver taken out (``mysql+pymysql://`` -> ``mysql://``), so that the
    server picks the fastest driver installed."""
    url = sa.engine.make_url(dsn)
    return url.set(drivername=url.get_backend_name()).render_as_string(hide_password=False)


def pymysql_args(url: sa.URL) -> dict[str, Any]:
    """pymysql.connect() arguments (server, account, socket) from a SQLAlchemy URL, for the
    connections made outside the store's pools: the lease, the binlog reader, Spark's
    executors, the bench. No database: callers add the one they need."""
    args: dict[str, Any] = {
        "host": url.host or "localhost",
        "port": url.port or 3306,
        "user": url.username or "",
        "password": url.password or "",
        "connect_timeout": CONNECT_TIMEOUT_S,
    }
    socket = unix_socket(url)
    if socket is not None:
        args["unix_socket"] = socket
    return args


def unix_socket(url: sa.URL) -> str | None:
    """The unix socket a URL names (``?unix_socket=PATH``), if any."""
    socket = url.query.get("unix_socket")
    if isinstance(socket, tuple):
        socket = socket[0] if socket else None
    return socket if isinstance(socket, str) else None


def address(url: sa.URL) -> str:
    """Where a URL's server is, for people: HOST:PORT, or its unix socket."""
    return unix_socket(url) or f"{url.host or 'localhost'}:{url.port or 3306}"


def server_text(value: object) -> str:
    """A server's text, which some drivers hand back as bytes."""
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class BinlogStatus:
    """What the database says about its binary log."""

    enabled: bool
    row_format: str  # binlog_format: ROW, MIXED or STATEMENT
    file: str  # the current binlog file and position ("" and 0 when off)
    position: int
    mariadb: bool
    gtid: str = ""  # MariaDB: @@gtid_binlog_pos, the GTID state the binlog is at now
    # Whether the binlog shows each statement's text before its rows by default (MariaDB's
    # binlog_annotate_row_events, on by default; MySQL's binlog_rows_query_log_events, off)
    annotated: bool = True

    def unusable_because(self) -> str | None:
        if not self.enabled:
            return "the binary log is off (log_bin)"
        if self.row_format.upper() != "ROW":
            return f"binlog_format is {self.row_format}, not ROW"
        return None

    def unannotated_because(self) -> str | None:
        """What the follower misses on a binlog without statement texts, and the fix."""
        if self.annotated:
            return None
        variable = ANNOTATIONS_VARIABLE[self.mariadb]
        fix = (
            f"SET GLOBAL {variable} = ON, and in the server's configuration"
            if self.mariadb
            else f"SET PERSIST {variable} = ON"
        )
        return (
            f"{variable} is OFF, so the binlog does not say which writes are msgtable's own:"
            " acks by DML are not counted as acks, and another client's UPDATE or DELETE"
            f" over {PARSE_MAX_BYTES // 1024} KB is seen only when its row is sent; {fix}"
        )


# The server variable that puts each statement's text before its rows in the binlog, by
# whether the server is MariaDB.
ANNOTATIONS_VARIABLE = {True: "binlog_annotate_row_events", False: "binlog_rows_query_log_events"}
# Without annotations: an UPDATE or DELETE event larger than this is taken for msgtable's
# own merged acks and not parsed (the send's check covers what that misses).
PARSE_MAX_BYTES = 8 * 1024
