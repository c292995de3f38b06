"""The SQS API's managed queues' SQL (``msgtable serve --sqs-manage``): CreateQueue's
``CREATE TABLE``, DeleteQueue's ``DROP TABLE``, PurgeQueue's ``DELETE``.

This is DDL in the user's own database: a queue created is an ordinary message table of
schema/current.sql's shape, with what the SQS API maps messages to (msgtable.server.sqs.messages):
the body in ``message`` (MEDIUMTEXT: up to 16 MB), other attributes in ``message_attributes``
(JSON), the last error in ``last_error``; and, so that any queue may be another's
dead-letter queue, ``time_dead`` and ``attempts`` (NULL until a message dies into it). A FIFO
queue (``.fifo``) is an ordered table: the group id in ``message_group_id`` (vt_order_key),
SQS's deduplication id in ``message_deduplication_id`` with a unique index.

A name reaches SQL only after :func:`check_name` (SQS's letters, digits and underscores, at
most 64: MySQL's longest table name), quoted; the comment's values are numbers or such a
name.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping

import sqlalchemy as sa

from msgtable.core.sql import quote
from msgtable.errors import InvalidArgument, PermissionDenied, Unavailable
from msgtable.store.mysql import ACCESS_DENIED, RETRYABLE, error_code

GROUP_COLUMN = "message_group_id"
TABLE_EXISTS = 1050  # ER_TABLE_EXISTS_ERROR
NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
PURGE_CHUNK = 10_000  # rows a purge deletes per statement (short locks on a big table)
DEFAULTS = {
    "vt_ack_wait": "30",
    "vt_purge_after": "86400",
    "vt_batch_size": "10",
    "vt_cache_size": "10000",
    "vt_poller_interval": "30",
}


def check_name(name: str) -> str:
    """``name`` if it may be a created table's name (ValueError otherwise)."""
    if not NAME.fullmatch(name):
        raise ValueError(name)
    return name


def comment(fields: Mapping[str, str]) -> str:
    """The message table's COMMENT: DEFAULTS, then ``fields`` (numbers, or a checked name)."""
    merged = {**DEFAULTS, **fields}
    for key, value in merged.items():
        if not re.fullmatch(r"vt_\w+", key) or not re.fullmatch(r"[\w.]+", value):
            raise ValueError(f"{key}={value}")
    return ",".join(["vitess_message", *(f"{k}={v}" for k, v in merged.items())])


def create_ddl(name: str, fields: Mapping[str, str], fifo: bool) -> str:
    """The CREATE TABLE of a queue (see the module docstring)."""
    table = quote(check_name(name))
    ordered = ""
    if fifo:
        fields = {**fields, "vt_order_key": GROUP_COLUMN}
        ordered = (
            f"  {GROUP_COLUMN} varchar(128),\n"
            "  message_deduplication_id varbinary(128),\n"
            "  unique key dedup_idx(message_deduplication_id),\n"
            f"  index order_idx({GROUP_COLUMN}, time_acked, id),\n"
        )
    columns = (
        "  id bigint not null,\n"
        "  priority bigint not null default 0,\n"
        "  time_next bigint default 0,\n"
        "  epoch bigint not null default 0,\n"
        "  time_acked bigint,\n"
        "  time_created bigint default (unix_timestamp(now(6)) * 1000000000),\n"
        "  message mediumtext,\n"
        "  message_attributes json,\n"
        "  last_error varchar(1000),\n"
        "  time_dead bigint,\n"
        "  attempts bigint,\n"
    )
    return (
        f"create table {table}(\n{columns}{ordered}"
        "  primary key(id),\n"
        "  index poller_idx(time_acked, priority, time_next)\n"
        f") engine=InnoDB comment '{comment(fields)}'"
    )


class QueueTableExists(InvalidArgument):
    """CREATE TABLE found a table of that name."""


class QueueTables:
    """Creates, drops and empties queues' tables through ``db`` (one statement a call, or a
    chunk of a purge a statement)."""

    def __init__(self, db: sa.Engine) -> None:
        self._db = db

    def close(self) -> None:
        self._db.dispose()

    def create(self, name: str, fields: Mapping[str, str], fifo: bool) -> None:
        ddl = create_ddl(name, fields, fifo)
        with _refused(f"create table {name}"), self._db.begin() as conn:
            conn.exec_driver_sql(ddl)

    def drop(self, name: str) -> None:
        with _refused(f"drop table {name}"), self._db.begin() as conn:
            conn.exec_driver_sql(f"drop table {quote(check_name(name))}")

    def purge(self, name: str) -> int:
        """Delete every message not acked yet, a chunk a statement; how many."""
        statement = (
            f"delete from {quote(check_name(name))} where time_acked is null limit {PURGE_CHUNK}"
        )
        deleted = 0
        while True:
            with _refused(f"purge table {name}"), self._db.begin() as conn:
                n = conn.exec_driver_sql(statement).rowcount
            deleted += n
            if n < PURGE_CHUNK:
                return deleted


@contextlib.contextmanager
def _refused(what: str) -> Iterator[None]:
    """The database's refusals as msgtable's errors, one line naming the cause."""
    try:
        yield
    except sa.exc.DBAPIError as exc:
        code = error_code(exc.orig)
        args = getattr(exc.orig, "args", ())
        why = " ".join(str(args[-1] if args else exc.orig).split())[:200]
        if code == TABLE_EXISTS:
            raise QueueTableExists(f"cannot {what}: {why}") from None
        if code in ACCESS_DENIED:
            raise PermissionDenied(
                f"cannot {what}: {why} (grant msgtable's database user the right)"
            ) from None
        if code in RETRYABLE or isinstance(exc, sa.exc.OperationalError):
            raise Unavailable(f"cannot {what}: database unavailable: {why}") from None
        raise InvalidArgument(f"cannot {what}: {why}") from None
