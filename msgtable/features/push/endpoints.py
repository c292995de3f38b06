"""Every SQL statement of push endpoints: the definitions table ``msgtable_endpoints``.

One row per (table, subscription) that is pushed ('' is the table's default group): its URL,
its secret, how many batches may be in flight to it, and its time-out. The table is created
on the first definition, so every server of the database sees the same endpoints; a server
applies a change at its next discovery. The secret is read by the pusher only: it never
leaves the server (not in ListTables, logs, errors or ``repr``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from msgtable.core.sql import quote
from msgtable.errors import InvalidArgument
from msgtable.features.push.allow import Target, parse_target
from msgtable.features.push.body import secret_bytes

REGISTRY_TABLE = "msgtable_endpoints"
DEFAULT_MAX_IN_FLIGHT = 4
MAX_MAX_IN_FLIGHT = 64
DEFAULT_TIMEOUT_S = 10.0
MAX_TIMEOUT_S = 300.0

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


@dataclass(frozen=True)
class Endpoint:
    """One push endpoint's definition. ``secret`` is kept out of ``repr``."""

    table: str
    subscription: str  # '': the table's default group
    url: str
    secret: str = field(repr=False)
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def label(self) -> str:
        return f"{self.table}/{self.subscription}" if self.subscription else self.table

    def check(self) -> Target:
        """The URL checked (the secret, limits too); InvalidArgument naming the problem."""
        target = parse_target(self.url)
        secret_bytes(self.secret)
        if not 1 <= self.max_in_flight <= MAX_MAX_IN_FLIGHT:
            raise InvalidArgument(
                f"max in flight must be 1 to {MAX_MAX_IN_FLIGHT}, not {self.max_in_flight}"
            )
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise InvalidArgument(
                f"the time-out must be more than 0 and at most {MAX_TIMEOUT_S:g}s, "
                f"not {self.timeout_s:g}"
            )
        return target


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes | bytearray) else str(value)


def read_endpoints(store: Any) -> list[Endpoint]:
    """Every definition (none while the table does not exist)."""
    with store._errors(kind="endpoints"), store._auto_cursor() as cur:
        cur.execute(EXISTS, [store.database, REGISTRY_TABLE])
        if not cur.fetchone()[0]:
            return []
        cur.execute(SELECT_ALL)
        rows: Sequence[Any] = cur.fetchall()
    return [
        Endpoint(_text(t), _text(s), _text(u), _text(sec), int(n), float(to))
        for t, s, u, sec, n, to in rows
    ]


def write_endpoint(store: Any, ep: Endpoint, now_ns: int) -> None:
    with store._errors(ep.table, kind="endpoint_set"), store._auto_cursor() as cur:
        cur.execute(REGISTRY_DDL)
        cur.execute(
            UPSERT,
            [
                ep.table,
                ep.subscription,
                ep.url,
                ep.secret.encode("utf-8"),
                ep.max_in_flight,
                ep.timeout_s,
                now_ns,
            ],
        )


def delete_endpoint(store: Any, table: str, subscription: str) -> int:
    with store._errors(table, kind="endpoint_drop"), store._auto_cursor() as cur:
        cur.execute(EXISTS, [store.database, REGISTRY_TABLE])
        if not cur.fetchone()[0]:
            return 0
        return int(cur.execute(DELETE, [table, subscription]))
