from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

from msgtable.errors import Unavailable
from msgtable.store import dbpool
from msgtable.store.dbpool import ConnectionPool


class FakeCursor:
    def __init__(self, connection: FakeConnection) -> None:
        self.connection = connection

    def __enter__(self) -> FakeCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def execute(self, statement: str) -> None:
        self.connection.statements.append(statement)


class FakeConnection:
    def __init__(self, **params: object) -> None:
        self.params = params
        self.closed = False
        self.statements: list[str] = []

    def cursor(self) -> FakeCursor:
        return FakeCursor(self)

    def close(self) -> None:
        self.closed = True


class DriverError(Exception):
    pass


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> ConnectionPool:
    dbapi = SimpleNamespace(connect=lambda *a, **kw: FakeConnection(**kw), Error=DriverError)
    dialect = SimpleNamespace(
        create_connect_args=lambda url: ([], {"host": "h"}), loaded_dbapi=dbapi
    )
    monkeypatch.setattr(dbpool, "_dialect", lambda url: dialect)
    url = sa.engine.make_url("mysql+pymysql://u:p@h/db")
    return ConnectionPool(
        url,
        {"connect_timeout": 5},
        autocommit=True,
        init_command="SET x",
        max_idle=2,
        max_connections=3,
        wait_s=0.05,
    )


def test_connections_are_made_with_the_settings_and_reused(pool: ConnectionPool):
    with pool.connection() as first:
        assert first.params == {
            "host": "h",
            "connect_timeout": 5,
            "autocommit": True,
            "init_command": "SET x",
        }
    with pool.connection() as again:
        assert again is first and not first.closed
    # its session ends on the database's side after a minute without a word from here
    assert first.statements == ["SET SESSION wait_timeout = 60"]


def test_a_connection_idle_longer_than_idle_max_is_closed_not_used(
    pool: ConnectionPool, monkeypatch: pytest.MonkeyPatch
):
    now = [1000.0]
    monkeypatch.setattr(dbpool.time, "monotonic", lambda: now[0])
    with pool.connection() as first:
        pass
    now[0] += dbpool.IDLE_MAX_S - 1
    with pool.connection() as again:
        assert again is first
    now[0] += dbpool.IDLE_MAX_S + 1  # the database may end it before long: not handed out
    with pool.connection() as fresh:
        assert fresh is not first and first.closed


def test_a_connection_that_saw_an_error_is_closed_not_reused(pool: ConnectionPool):
    with pytest.raises(DriverError), pool.connection() as broken:
        raise DriverError(1064, "syntax")
    assert broken.closed
    with pool.connection() as fresh:
        assert fresh is not broken


def test_a_lost_connection_closes_the_idle_ones_too(pool: ConnectionPool):
    with pool.connection() as a, pool.connection() as b:
        pass
    with pytest.raises(DriverError), pool.connection():
        raise DriverError(2013, "Lost connection to MySQL server during query")
    assert a.closed and b.closed


def test_no_more_than_max_connections_at_once(pool: ConnectionPool):
    with contextlib.ExitStack() as held:
        for _ in range(3):
            held.enter_context(pool.connection())
        with pytest.raises(Unavailable, match="busy"), pool.connection():
            pass


def test_a_deadlock_is_retried_but_is_no_database_outage():
    import pymysql

    from msgtable.errors import DatabaseUnavailable, Unavailable
    from msgtable.store.mysql import database_error

    for code in (1213, 1205):
        error = database_error(pymysql.err.OperationalError(code, "Deadlock found"))
        assert isinstance(error, Unavailable) and not isinstance(error, DatabaseUnavailable)
        assert str(error).startswith("lock conflict (retried): ")
    assert isinstance(
        database_error(pymysql.err.OperationalError(2013, "Lost connection")), DatabaseUnavailable
    )
