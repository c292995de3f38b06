"""A lease's rules, shared by every server of one database (msgtable.engine.placement uses them
for each table's lease): how long it lasts, how a step's connection is opened and bounded,
and what a new sender learns about the one before it (``Takeover``).

The servers of versions before msgtable.engine.placement shared ONE lease for the whole database:
a row ``sender`` of ``msgtable_lease``, whose holder sent every table. Its table is only
read now, so a new server never sends beside an old one (see msgtable.engine.placement).

Fencing: a renewal that began at local time t makes a lease valid until t + period on this
server's monotonic clock, which ends no later than the end the database wrote. A send hands
messages over only while its table's lease is valid, so once another server holds it the
old holder sends nothing more. What the new holder must still wait for is the old holder's
messages in flight whose postpone (their ack wait, in the table) was not written yet
(vt_postpone_after > 0): ``Takeover`` tells the engine how long ago the old lease ended, and
whether it was given back cleanly (every postpone written); the engine holds the table's
sends until vt_ack_wait after that end.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from msgtable.store.mysql import open_connection, pymysql_args

LEASE_TABLE = "msgtable_lease"
# A renewal that comes back after its validity is logged the first time and every this many
LATE_LOG_EVERY = 100
MIN_LEASE_PERIOD_S = 0.3
LEASE_DDL = f"""CREATE TABLE IF NOT EXISTS {LEASE_TABLE} (
  name VARCHAR(64) NOT NULL,
  holder VARCHAR(64) NOT NULL,
  address VARCHAR(255) NOT NULL,
  expires DATETIME(6) NOT NULL,
  released TINYINT NOT NULL DEFAULT 0,
  PRIMARY KEY (name)
) COMMENT='msgtable: which server sends this database''s messages'"""
LEASE_NAME = "sender"  # the one row: one holder sends every message table of the database
# A step's reads and writes: a hung step is retried soon (the holder's own clock ends its
# lease on time whatever a step does).
IO_TIMEOUT_S = 5


# A step waits this long at most for the lease row's lock (the database's default: 50 s):
# a step that cannot have it soon is tried again, as a hung one is.
LOCK_WAIT_TIMEOUT_S = IO_TIMEOUT_S - 1


def session_wait_timeout_s(period_s: float) -> int:
    """The lease connection's ``wait_timeout`` on the database's side: two lease periods
    (whole seconds, at least 2). A step holds the lease row's lock from its SELECT ... FOR
    UPDATE to its COMMIT; a holder whose link dies in between (a half-open connection: no
    FIN, no RST) leaves its session waiting for the rest, the lock held, until the database
    ends the session: by default after 8 hours, with every other server's takeover waiting
    on that lock. A holder renews every third of a period, so its connection is never idle
    that long while it is well."""
    return max(2, math.ceil(2 * period_s))


def connector(url: sa.URL, database: str) -> Callable[[], Any]:
    """How the lease opens its connection of its own (transactions, short time-outs)."""

    def connect() -> Any:
        import pymysql

        return open_connection(
            pymysql.connect,
            **pymysql_args(url),
            database=database,
            autocommit=False,
            read_timeout=IO_TIMEOUT_S,
            write_timeout=IO_TIMEOUT_S,
        )

    return connect


@dataclass(frozen=True)
class Takeover:
    """What a new holder learns about the one before it."""

    previous: str  # the previous holder's id ("" if there was none)
    ended_s_ago: float  # how long ago, in the database's clock, its lease ended
    released: bool  # it gave the lease back after writing its postpones
    by_me: bool  # the previous holder was this very server (it lost the lease and got it back)
