"""A small pool of DBAPI connections to one MySQL-family database.

The store runs a handful of statement shapes very often; SQLAlchemy's engine costs about
three times the round trip itself on each of them (checkout, reset, compilation of IN
lists). This pool hands out plain DBAPI connections (PyMySQL, or whichever MySQL driver the
SQLAlchemy URL names) and does nothing else on the way. A connection that saw any error is
closed, and a lost connection empties the idle list (the server probably restarted: the
others are dead too).

Each connection sets its session's ``wait_timeout`` to SESSION_WAIT_TIMEOUT_S: a connection
this server gave up on (a statement's read time-out) while the network dropped its packets
never tells the database it is gone, and its transaction's row locks would stay until the
database's own wait_timeout (8 hours by default). A connection idle in the pool longer than
IDLE_MAX_S is closed instead of used, so the database never ends one the pool would hand out.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from msgtable.errors import Unavailable
from msgtable.store.mysql import lost_connection, open_connection

SESSION_WAIT_TIMEOUT_S = 60
IDLE_MAX_S = 30.0  # well inside SESSION_WAIT_TIMEOUT_S


class ConnectionPool:
    """Up to ``max_connections`` DBAPI connections; at most ``max_idle`` kept between uses."""

    def __init__(
        self,
        url: sa.URL,
        connect_args: dict[str, Any],
        *,
        autocommit: bool,
        init_command: str,
        max_idle: int,
        max_connections: int,
        wait_s: float,
    ) -> None:
        dialect = _dialect(url)
        cargs, cparams = dialect.create_connect_args(url)
        cparams.update(connect_args)
        cparams["autocommit"] = autocommit
        cparams["init_command"] = init_command
        self.dbapi: Any = dialect.loaded_dbapi
        self._cargs, self._cparams = cargs, cparams
        self._idle: list[tuple[Any, float]] = []  # (connection, monotonic time it went idle)
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._max_idle = max_idle
        self._wait_s = wait_s
        self._closed = False

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A connection for one unit of work; errors inside close it."""
        if not self._slots.acquire(timeout=self._wait_s):
            raise Unavailable("database unavailable: all connections are busy")
        try:
            conn, stale = self._take_idle()
            for old in stale:
                _close(old)
            if conn is None:
                conn = open_connection(self.dbapi.connect, *self._cargs, **self._cparams)
                try:
                    with conn.cursor() as cur:
                        cur.execute(f"SET SESSION wait_timeout = {int(SESSION_WAIT_TIMEOUT_S)}")
                except BaseException:
                    _close(conn)
                    raise
            try:
                yield conn
            except BaseException as exc:
                _close(conn)
                if lost_connection(exc):
                    self.clear()
                raise
            with self._lock:
                if not self._closed and len(self._idle) < self._max_idle:
                    self._idle.append((conn, time.monotonic()))
                    conn = None
            if conn is not None:
                _close(conn)
        finally:
            self._slots.release()

    def _take_idle(self) -> tuple[Any | None, list[Any]]:
        """The most recently used idle connection (None: none), and those idle too long.
        The list is in the order the connections went idle, so those are its head: a
        checkout (every statement) compares one time unless some went stale."""
        now = time.monotonic()
        with self._lock:
            idle = self._idle
            cut = 0
            while cut < len(idle) and now - idle[cut][1] > IDLE_MAX_S:
                cut += 1
            stale = [c for c, _ in idle[:cut]]
            del idle[:cut]
            conn = idle.pop()[0] if idle else None
        return conn, stale

    def clear(self) -> None:
        """Close every idle connection."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            _close(conn)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.clear()


def _dialect(url: sa.URL) -> Any:
    """The SQLAlchemy dialect of the URL, with its DBAPI module loaded (no engine, no pool)."""
    dialect_cls: Any = url.get_dialect()
    return dialect_cls(dbapi=dialect_cls.import_dbapi())


def _close(conn: Any) -> None:
    with contextlib.suppress(Exception):  # already broken: nothing to release
        conn.close()
