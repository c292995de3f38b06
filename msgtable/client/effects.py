"""Effects exactly once: a handler's writes and its message's ack in one database transaction.

    def handle(conn):                       # a SQLAlchemy Connection, in the transaction
        conn.execute(insert(payments), {...})

    for message in sub:
        message.in_transaction(engine, handle)   # engine: the application's SQLAlchemy Engine

The transaction first locks the message's row and finds it still unsettled; then the handler
runs; then the ack is an UPDATE of that row; then it commits. So the handler's writes and the
ack commit together or not at all, and a delivery that comes after a crash, an ack wait that
ended or a server's takeover finds the work done (the row acked: the handler is not run
again, ``in_transaction`` returns False) or not done (nothing of it was written). Two
deliveries at once wait for each other on the row's lock: one runs, the other finds it
acked. The server sees the ack as any ack by DML (at once with the binlog).

The message's row is in the table it came from: the table's own for its default group
(locked by ``SELECT ... FOR UPDATE``), the subscription's state table (``TABLE__NAME``) for a
subscription. A subscription's row is locked by an upsert that makes it if it is missing
(``claim_sql``: epoch -1, a value the server never writes, marks it as this transaction's):
a lazy subscription (``state_rows=lazy``) has no state row of a message sent from its cursor.
A row the claim made is checked against the subscription (``cursor_sql``): the message is
still to be worked on only if the subscription is lazy and the message is above its cursor
(a missing row of an eager subscription, or below a lazy one's cursor, was settled and
purged; a message gone from its table was too); otherwise the transaction rolls back, the
claim with it. The ack of a claimed row writes its epoch back to 0.

The statements are MySQL's (and MariaDB's), run through the connection's
``exec_driver_sql``: this module imports no database library; the application brings
SQLAlchemy (an Engine or an AsyncEngine, a sessionmaker or an async_sessionmaker).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Protocol, TypeVar

# A subscription's state table is its table's name, this, and its own name
# (msgtable.core.subscriptions.SEPARATOR; a test holds these equal to the server's).
STATE_SEPARATOR = "__"
# time_next of a message dead in place (msgtable.core.tables.DEAD_TIME_NEXT)
DEAD_TIME_NEXT = 2**63 - 1
# where the server keeps subscriptions, their mode and their cursors
# (msgtable.core.subscriptions.REGISTRY_TABLE, LAZY, FANOUT_COLUMN;
# msgtable.store.sequences.CURSOR_TABLE)
REGISTRY_TABLE = "msgtable_subscriptions"
CURSOR_TABLE = "msgtable_fanout_cursors"
FANOUT_COLUMN = "time_fanout"
LAZY = "lazy"
# the epoch of a state row a claim made (the server writes epochs from 0 up)
CLAIM_EPOCH = -1

T = TypeVar("T")
# a statement and its parameters; the runner sends back its first row (None: no row, or a
# statement that returns none)
Step = tuple[str, tuple[object, ...]]


class Delivered(Protocol):
    """What the statements need of a received message (both clients' Message)."""

    @property
    def id(self) -> object: ...

    @property
    def table(self) -> str: ...

    @property
    def message_table(self) -> str: ...

    @property
    def subscription(self) -> str: ...


class _Settled(Exception):
    """The message was settled already: roll back (a claim's row with it), run nothing."""


def row_table(name: str, subscription: str) -> str:
    """Where a received message's row is: its table's, or its subscription's state table."""
    return f"{name}{STATE_SEPARATOR}{subscription}" if subscription else name


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def claim_sql(table: str) -> str:
    """A subscription's state row of the message, locked; made (epoch -1) if missing."""
    return (
        f"INSERT INTO {_quote(table)} (`id`, `time_next`, `epoch`) VALUES (%s, NULL, "
        f"{CLAIM_EPOCH}) ON DUPLICATE KEY UPDATE `id` = `id`"
    )


def lock_sql(table: str) -> str:
    return (
        f"SELECT `time_acked`, `time_next`, `epoch` FROM {_quote(table)} WHERE `id` = %s FOR UPDATE"
    )


def cursor_sql(table: str) -> str:
    """For a row a claim made: the subscription's mode, its cursor, and the message's number
    in the table's fan-out sequence (NULL: the message is gone). Parameters: the id, the
    table's name, the subscription's."""
    return (
        f"SELECT s.`state_rows`, c.`sent_upto`, m.`{FANOUT_COLUMN}` FROM {REGISTRY_TABLE} s "
        f"LEFT JOIN {CURSOR_TABLE} c ON c.`table_name` = s.`table_name` AND c.`name` = s.`name` "
        f"LEFT JOIN {_quote(table)} m ON m.`id` = %s "
        "WHERE s.`table_name` = %s AND s.`name` = %s"
    )


def ack_sql(table: str, claimed: bool = False) -> str:
    epoch = ", `epoch` = 0" if claimed else ""
    return (
        f"UPDATE {_quote(table)} SET `time_acked` = %s, `time_next` = NULL{epoch} "
        "WHERE `id` = %s AND `time_acked` IS NULL"
    )


def unsettled(row: Any) -> bool:
    """Whether the locked row (None: it is gone) is still to be worked on: not acked (nor
    purged after an ack), not dead (in place; a dead letter moved away is gone)."""
    return row is not None and row[0] is None and row[1] != DEAD_TIME_NEXT


def above_cursor(row: Any) -> bool:
    """Whether a message whose state row a claim made is still to be worked on (``row``:
    cursor_sql's; None: the subscription was dropped): only a lazy subscription's message
    above its cursor is."""
    if row is None:
        return False
    mode, upto, number = row
    mode = mode.decode() if isinstance(mode, bytes) else mode
    return mode == LAZY and upto is not None and number is not None and number > upto


def claim(message: Delivered) -> Generator[Step, Any, bool]:
    """The statements that lock the message's row, in order (each is sent its first row);
    returns whether the row was made by the claim (its ack writes the epoch back). Raises
    _Settled when the message is not to be worked on."""
    table = message.table
    if message.subscription:
        yield claim_sql(table), (message.id,)
    row = yield lock_sql(table), (message.id,)
    if not unsettled(row):
        raise _Settled
    if row[2] != CLAIM_EPOCH:
        return False
    args = (message.id, message.message_table, message.subscription)
    if not above_cursor((yield cursor_sql(message.message_table), args)):
        raise _Settled
    return True


def _first(result: Any) -> Any:
    return result.first() if result.returns_rows else None


def _claimed(execute: Callable[..., Any], message: Delivered) -> bool:
    steps = claim(message)
    try:
        sql, args = next(steps)
        while True:
            sql, args = steps.send(_first(execute(sql, args)))
    except StopIteration as done:
        return bool(done.value)


async def _claimed_async(execute: Callable[..., Awaitable[Any]], message: Delivered) -> bool:
    steps = claim(message)
    try:
        sql, args = next(steps)
        while True:
            sql, args = steps.send(_first(await execute(sql, args)))
    except StopIteration as done:
        return bool(done.value)


def _work(message: Delivered, conn: Any, handler: Callable[[], object]) -> None:
    """In the transaction of ``conn``: claim the row, run the handler, ack the row."""
    claimed = _claimed(conn.exec_driver_sql, message)
    handler()
    conn.exec_driver_sql(ack_sql(message.table, claimed), (time.time_ns(), message.id))


async def _work_async(
    message: Delivered, conn: Any, handler: Callable[[], Awaitable[object]]
) -> None:
    claimed = await _claimed_async(conn.exec_driver_sql, message)
    await handler()
    await conn.exec_driver_sql(ack_sql(message.table, claimed), (time.time_ns(), message.id))


def run(message: Delivered, engine: Any, handler: Callable[[Any], T]) -> bool:
    """The sync form (see the module docstring): ``engine.begin()`` gives the transaction."""
    try:
        with engine.begin() as conn:
            _work(message, conn, lambda: handler(conn))
    except _Settled:
        return False
    return True


def run_in_session(message: Delivered, sessions: Any, handler: Callable[[Any], T]) -> bool:
    """The ORM form: ``sessions`` is a sessionmaker; the handler gets the Session."""
    try:
        with sessions.begin() as session:
            _work(message, session.connection(), lambda: handler(session))
    except _Settled:
        return False
    return True


async def run_async(
    message: Delivered, engine: Any, handler: Callable[[Any], Awaitable[T]]
) -> bool:
    """The asyncio form: ``engine`` an AsyncEngine, ``handler`` a coroutine function."""
    try:
        async with engine.begin() as conn:
            await _work_async(message, conn, lambda: handler(conn))
    except _Settled:
        return False
    return True


async def run_in_async_session(
    message: Delivered, sessions: Any, handler: Callable[[Any], Awaitable[T]]
) -> bool:
    """The asyncio ORM form: ``sessions`` an async_sessionmaker."""
    try:
        async with sessions.begin() as session:
            conn = await session.connection()
            await _work_async(message, conn, lambda: handler(session))
    except _Settled:
        return False
    return True
