"""Effects exactly once: a handler's writes and its message's ack in one database transaction.

    def handle(conn):                       # a SQLAlchemy Connection, in the transaction
        conn.execute(insert(payments), {...})

    for message in sub:
        message.in_transaction(engine, handle)   # engine: the application's SQLAlchemy Engine

The transaction first locks the message's row (``SELECT ... FOR UPDATE``) and finds it still
unsettled; then the handler runs; then the ack is an UPDATE of that row; then it commits. So
the handler's writes and the ack commit together or not at all, and a delivery that comes
after a crash, an ack wait that ended or a server's takeover finds the work done (the row
acked: the handler is not run again, ``in_transaction`` returns False) or not done (nothing
of it was written). Two deliveries at once wait for each other on the row's lock: one runs,
the other finds it acked. The server sees the ack as any ack by DML (at once with the binlog).

The message's row is in the table it came from: the table's own for its default group, the
subscription's state table (``TABLE__NAME``) for a subscription. The statements are MySQL's
(and MariaDB's), run through the connection's ``exec_driver_sql``: this module imports no
database library; the application brings SQLAlchemy (an Engine or an AsyncEngine, a
sessionmaker or an async_sessionmaker).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

# A subscription's state table is its table's name, this, and its own name
# (msgtable.core.subscriptions.SEPARATOR; a test holds the two equal).
STATE_SEPARATOR = "__"
# time_next of a message dead in place (msgtable.core.tables.DEAD_TIME_NEXT)
DEAD_TIME_NEXT = 2**63 - 1

T = TypeVar("T")


class Delivered(Protocol):
    """What the statements need of a received message (both clients' Message)."""

    @property
    def id(self) -> object: ...

    @property
    def table(self) -> str: ...


def row_table(name: str, subscription: str) -> str:
    """Where a received message's row is: its table's, or its subscription's state table."""
    return f"{name}{STATE_SEPARATOR}{subscription}" if subscription else name


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def lock_sql(table: str) -> str:
    return f"SELECT `time_acked`, `time_next` FROM {_quote(table)} WHERE `id` = %s FOR UPDATE"


def ack_sql(table: str) -> str:
    return (
        f"UPDATE {_quote(table)} SET `time_acked` = %s, `time_next` = NULL "
        "WHERE `id` = %s AND `time_acked` IS NULL"
    )


def unsettled(row: Any) -> bool:
    """Whether the locked row (None: it is gone) is still to be worked on: not acked (nor
    purged after an ack), not dead (in place; a dead letter moved away is gone)."""
    return row is not None and row[0] is None and row[1] != DEAD_TIME_NEXT


def run(message: Delivered, engine: Any, handler: Callable[[Any], T]) -> bool:
    """The sync form (see the module docstring): ``engine.begin()`` gives the transaction."""
    with engine.begin() as conn:
        if not _claimed(conn.exec_driver_sql, message):
            return False
        handler(conn)
        conn.exec_driver_sql(ack_sql(message.table), (time.time_ns(), message.id))
    return True


def run_in_session(message: Delivered, sessions: Any, handler: Callable[[Any], T]) -> bool:
    """The ORM form: ``sessions`` is a sessionmaker; the handler gets the Session."""
    with sessions.begin() as session:
        conn = session.connection()
        if not _claimed(conn.exec_driver_sql, message):
            return False
        handler(session)
        conn.exec_driver_sql(ack_sql(message.table), (time.time_ns(), message.id))
    return True


async def run_async(
    message: Delivered, engine: Any, handler: Callable[[Any], Awaitable[T]]
) -> bool:
    """The asyncio form: ``engine`` an AsyncEngine, ``handler`` a coroutine function."""
    async with engine.begin() as conn:
        result = await conn.exec_driver_sql(lock_sql(message.table), (message.id,))
        if not unsettled(result.first()):
            return False
        await handler(conn)
        await conn.exec_driver_sql(ack_sql(message.table), (time.time_ns(), message.id))
    return True


async def run_in_async_session(
    message: Delivered, sessions: Any, handler: Callable[[Any], Awaitable[T]]
) -> bool:
    """The asyncio ORM form: ``sessions`` an async_sessionmaker."""
    async with sessions.begin() as session:
        conn = await session.connection()
        result = await conn.exec_driver_sql(lock_sql(message.table), (message.id,))
        if not unsettled(result.first()):
            return False
        await handler(session)
        await conn.exec_driver_sql(ack_sql(message.table), (time.time_ns(), message.id))
    return True


def _claimed(execute: Callable[..., Any], message: Delivered) -> bool:
    return unsettled(execute(lock_sql(message.table), (message.id,)).first())
