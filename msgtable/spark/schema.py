"""What the Spark side needs to know of a message table: its config (read as the engine reads
it), its columns as Spark types, and how executors connect to the database."""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa

from msgtable.errors import InvalidArgument, TableLoadError, TableNotFound
from msgtable.mysql import pymysql_args
from msgtable.store import MySQLStore
from msgtable.tables import Column, TableConfig, load_table

_DECIMAL = re.compile(r"decimal\((\d+)(?:,(\d+))?\)")
_TEXT = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "json"}
_BYTES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "bit"}
_SMALL_INTS = {"tinyint", "smallint", "mediumint", "year"}


def spark_type(column: Column) -> str:
    """The Spark SQL type (DDL) a column's values take."""
    t, full = column.data_type, column.column_type.lower()
    unsigned = "unsigned" in full
    if t in _SMALL_INTS:
        return "INT"
    if t in ("int", "integer"):
        return "BIGINT" if unsigned else "INT"
    if t == "bigint":
        return "DECIMAL(20,0)" if unsigned else "BIGINT"
    if t == "float":
        return "FLOAT"
    if t in ("double", "real"):
        return "DOUBLE"
    if t in ("decimal", "numeric"):
        m = _DECIMAL.search(full.replace(" ", ""))
        precision, scale = (int(m.group(1)), int(m.group(2) or 0)) if m else (10, 0)
        return f"DECIMAL({min(precision, 38)},{min(scale, 38)})"
    if t in _BYTES:
        return "BINARY"
    if t == "date":
        return "DATE"
    if t in ("datetime", "timestamp"):
        return "TIMESTAMP"
    return "STRING"  # text types, json, time (a duration: its text) and anything else


def spark_schema(columns: tuple[Column, ...]) -> str:
    return ", ".join(f"`{c.name.replace('`', '``')}` {spark_type(c)}" for c in columns)


def describe(dsn: str, table: str) -> TableConfig:
    """The loaded config of message table ``table`` (TableNotFound, TableLoadError)."""
    store = MySQLStore.from_dsn(dsn)
    try:
        definitions = {d.name: d for d in store.discover()}
    finally:
        store.close()
    d = definitions.get(table)
    if d is None:
        raise TableNotFound(f"no message table {table!r} in {store.database}")
    try:
        return load_table(d.name, d.comment, d.columns, d.unique_indexes)
    except TableLoadError:
        raise
    except Exception as exc:  # pragma: no cover - load_table raises TableLoadError
        raise TableLoadError(f"table {table}: {exc}") from None


def connect_args(dsn: str) -> dict[str, Any]:
    """pymysql.connect() arguments for a SQLAlchemy URL (executors use PyMySQL: no C driver
    needs to be on them)."""
    try:
        url = sa.engine.make_url(dsn)
    except Exception as exc:
        raise InvalidArgument(f"not a valid database URL: {exc}") from None
    if not url.database:
        raise InvalidArgument("the database URL must name a database")
    args = pymysql_args(url)
    args.update(database=url.database, charset="utf8mb4", connect_timeout=10)
    return args


def id_bounds(dsn: str, sql: str, params: list[Any]) -> tuple[Any, Any, int]:
    """The (smallest id, largest id, count) a msgtable.bulk id_bounds query answers."""
    import pymysql

    conn = pymysql.connect(**connect_args(dsn))
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            lo, hi, count = cur.fetchone()
    finally:
        conn.close()
    return lo, hi, int(count or 0)


def jdbc_url(dsn: str) -> tuple[str, dict[str, str]]:
    """A JDBC URL and connection properties for MariaDB Connector/J. The URL must say
    jdbc:mysql:// with org.mariadb.jdbc.Driver: a jdbc:mariadb:// URL gets Spark's no-op
    dialect, which quotes names wrongly and returns wrong results."""
    a = connect_args(dsn)
    url = f"jdbc:mysql://{a['host']}:{a['port']}/{a['database']}"
    props = {
        "driver": "org.mariadb.jdbc.Driver",
        "user": a["user"],
        "password": a["password"],
        "rewriteBatchedStatements": "true",
        "useServerPrepStmts": "false",
    }
    return url, props
