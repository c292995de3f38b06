"""Every SQL statement of push endpoints: the definitions table ``msgtable_endpoints``
(msgtable.store.protocol.EndpointStore on MySQL; what an endpoint is:
msgtable.core.endpoints).

One row per (table, subscription) that is pushed ('' is the table's default group): its URL,
its secret, how many batches may be in flight to it, and its time-out. The table is created
on the first definition, so every server of the database sees the same endpoints; a server
applies a change at its next discovery. The secret is read by the pusher only: it never
leaves the server (not in ListTables, logs, errors or ``repr``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from msgtable.core.endpoints import DEFAULT_MAX_IN_FLIGHT, DEFAULT_TIMEOUT_S, Endpoint
from msgtable.core.sql import quote

REGISTRY_TABLE = "msgtable_endpoints"

REGISTRY = quote(REGISTRY_TABLE)
REGISTRY_DDL = f"""CREATE TABLE IF NOT EXISTS {REGISTRY} (
  table_name VARCHAR(64) NOT NULL,
  subscription VARCHAR(64) NOT NULL DEFAULT '',
  url VARCHAR(2048) NOT NULL,
  secret VARBINARY(1024) NOT NULL,
  max_in_flight INT NOT NULL DEFAULT {DEFAULT_MAX_IN_FLIGHT},
  timeout_s DOUBLE NOT NULL DEFAULT {DEFAULT_TIMEOUT_S:g},
  time_updated BIGINT NOT NULL,
  PRIMARY KEY (table_name, subscription)
) ENGINE=InnoDB COMMENT 'msgtable push endpoints'"""
EXISTS = (
    "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
)
SELECT_ALL = (
    f"SELECT table_name, subscription, url, secret, max_in_flight, timeout_s FROM {REGISTRY} "
    "ORDER BY table_name, subscription"
)
UPSERT = (
    f"INSERT INTO {REGISTRY} (table_name, subscription, url, secret, max_in_flight, timeout_s, "
    "time_updated) VALUES (%s, %s, %s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE url = VALUES(url), "
    "secret = VALUES(secret), max_in_flight = VALUES(max_in_flight), "
    "timeout_s = VALUES(timeout_s), time_updated = VALUES(time_updated)"
)
DELETE = f"DELETE FROM {REGISTRY} WHERE table_name = %s AND subscription = %s"


class _Pools(Protocol):
    database: str

    def _errors(
        self, table: str | None = None, kind: str = "other"
    ) -> AbstractContextManager[None]: ...

    def _auto_cursor(self) -> AbstractContextManager[Any]: ...


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes | bytearray) else str(value)


class EndpointSQL:
    """Push endpoints' SQL, run on a store's pools: MySQLStore's endpoint_store."""

    def __init__(self, pools: _Pools) -> None:
        self._pools = pools

    @contextmanager
    def _cursor(self, table: str | None = None, *, kind: str) -> Iterator[Any]:
        with self._pools._errors(table, kind=kind), self._pools._auto_cursor() as cur:
            yield cur

    def endpoints(self) -> list[Endpoint]:
        """Every definition (none while the table does not exist)."""
        with self._cursor(kind="endpoints") as cur:
            cur.execute(EXISTS, [self._pools.database, REGISTRY_TABLE])
            if not cur.fetchone()[0]:
                return []
            cur.execute(SELECT_ALL)
            rows: Sequence[Any] = cur.fetchall()
        return [
            Endpoint(_text(t), _text(s), _text(u), _text(sec), int(n), float(to))
            for t, s, u, sec, n, to in rows
        ]

    def set_endpoint(self, ep: Endpoint, now_ns: int) -> None:
        with self._cursor(ep.table, kind="endpoint_set") as cur:
            cur.execute(REGISTRY_DDL)
            secret = ep.secret.encode("utf-8")
            cur.execute(
                UPSERT,
                [ep.table, ep.subscription, ep.url, secret, ep.max_in_flight, ep.timeout_s, now_ns],
            )

    def drop_endpoint(self, table: str, subscription: str) -> int:
        with self._cursor(table, kind="endpoint_drop") as cur:
            cur.execute(EXISTS, [self._pools.database, REGISTRY_TABLE])
            if not cur.fetchone()[0]:
                return 0
            return int(cur.execute(DELETE, [table, subscription]))
