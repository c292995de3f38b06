"""The enqueue side: SendMessage and SendMessageBatch as INSERTs through msgtable.enqueue.

One call is one transaction: a batch's messages are all written or none is. Its messages are
grouped by what msgtable.enqueue takes once per INSERT (delay, group id, columns), one
multi-row INSERT a group. A table with the ``message_deduplication_id`` column (and its
unique index) deduplicates: each message of the call then goes in under a savepoint of the
call's transaction, and one the index refuses as a duplicate is answered as sent (SQS does
the same within its five minutes; here for as long as the earlier row is in the table).
After the commit this server's sender of the table is woken, so a long-polling receive has
the message at once even without the binlog.

A connection taken from the pool is pinged only when it was idle longer than IDLE_PING_S
(one dropped by the database, or a server restarted, is replaced before it is used): a
ping on every checkout was one round trip of a send's three (ping, INSERT, COMMIT;
msgtable.enqueue reads a connection's database once). A connection lost within that
second fails its send as Unavailable (503: SDKs retry it), with nothing written.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import sqlalchemy as sa

from msgtable.enqueue import enqueue_many
from msgtable.errors import InvalidArgument, MsgtableError, Unavailable
from msgtable.server.sqs.messages import Outgoing, shape_of
from msgtable.server.sqs.queues import Queue

POOL_SIZE = 8
IDLE_PING_S = 1.0  # a connection idle longer is pinged when taken from the pool
MAX_OVERFLOW = 24
DUPLICATE_KEY = 1062  # MySQL's ER_DUP_ENTRY


class Sender:
    """Writes messages into their tables (see the module docstring)."""

    def __init__(
        self, dsn: str, woken: Callable[[str], None], idle_ping_s: float = IDLE_PING_S
    ) -> None:
        self._engine = sa.create_engine(
            dsn,
            pool_size=POOL_SIZE,
            max_overflow=MAX_OVERFLOW,
            pool_recycle=3600,
        )
        sa.event.listen(self._engine, "checkin", _idle_from)
        sa.event.listen(self._engine, "checkout", lambda c, r, p: _ping_if_idle(c, r, idle_ping_s))
        self._woken = woken
        self._rng = random.Random()
        self._rng_lock = threading.Lock()

    def close(self) -> None:
        self._engine.dispose()

    def send(self, q: Queue, messages: Sequence[Outgoing]) -> list[Hashable]:
        """Write ``messages`` into the queue's table in one transaction; their ids."""
        shape = shape_of(q.config)
        with self._rng_lock:
            ids = [shape.new_id(self._rng) for _ in messages]
        rows = [shape.row(m, i) for m, i in zip(messages, ids, strict=True)]
        table = q.config.name
        try:
            with self._engine.begin() as conn:
                if any(m.dedup_id is not None for m in messages):
                    for m, row in zip(messages, rows, strict=True):
                        _insert_once(conn, table, m, row)
                else:
                    for (delay, group, _), group_rows in _groups(messages, rows).items():
                        enqueue_many(conn, table, group_rows, delay_s=delay, order_key=group)
        except MsgtableError:
            raise
        except sa.exc.OperationalError as exc:
            raise Unavailable(f"database unavailable: {_why(exc)}") from None
        except sa.exc.DBAPIError as exc:
            raise InvalidArgument(f"table {table}: {_why(exc)}") from None
        self._woken(table)
        return ids


def _idle_from(dbapi_connection: Any, record: Any) -> None:
    record.info["idle_since"] = time.monotonic()


def _ping_if_idle(dbapi_connection: Any, record: Any, idle_ping_s: float) -> None:
    """A connection idle past ``idle_ping_s`` answers a ping, or the pool replaces it."""
    since = record.info.get("idle_since")
    if since is None or time.monotonic() - since <= idle_ping_s:
        return
    try:
        dbapi_connection.ping(False)
    except Exception:
        raise sa.exc.DisconnectionError("the connection did not answer a ping") from None


def _groups(
    messages: Sequence[Outgoing], rows: Sequence[dict[str, Any]]
) -> dict[tuple[int, str | None, tuple[str, ...]], list[dict[str, Any]]]:
    out: dict[tuple[int, str | None, tuple[str, ...]], list[dict[str, Any]]] = {}
    for m, row in zip(messages, rows, strict=True):
        out.setdefault((m.delay_s, m.group_id, tuple(row)), []).append(row)
    return out


def _insert_once(conn: sa.Connection, table: str, m: Outgoing, row: dict[str, Any]) -> None:
    """One message under a savepoint: a duplicate (the dedup index) is left out."""
    savepoint = conn.begin_nested()
    try:
        enqueue_many(conn, table, [row], delay_s=m.delay_s, order_key=m.group_id)
    except sa.exc.IntegrityError as exc:
        savepoint.rollback()
        if _code(exc) != DUPLICATE_KEY:
            raise
        return
    except InvalidArgument:
        savepoint.rollback()
        raise
    savepoint.commit()


def _code(exc: sa.exc.DBAPIError) -> int | None:
    args = getattr(exc.orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _why(exc: sa.exc.DBAPIError) -> str:
    args = getattr(exc.orig, "args", ())
    text = str(args[-1]) if args else str(exc.orig)
    return " ".join(text.split())[:200]
