"""MySQL-family servers to test against: what a test or a benchmark needs of one
(:class:`ServerHandle`), and a server someone else runs (:class:`ExternalServer`, e.g. from
``MSGTABLE_TEST_DSN``). A throwaway local one is msgtable.testing.devdb.LocalServer."""

from __future__ import annotations

from typing import Protocol

from msgtable.core.sql import quote_database_name


class ServerHandle(Protocol):
    """What tests and benchmarks need of a MySQL-family server: DSNs and scratch databases."""

    def dsn(self, database: str = "") -> str: ...

    def create_database(self, name: str) -> None: ...

    def drop_database(self, name: str) -> None: ...


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
