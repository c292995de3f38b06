"""A consumer that counts its effects exactly once (issue 46, item 2), run as a process the
fault test SIGKILLs: it subscribes to ``jobs`` (its subscription argv[3], when given: a lazy
one in the test) through the servers named by argv[1] and, for
each message, runs Message.in_transaction with a handler that INSERTs one row into
``effects`` (no unique key: a second effect of a message would be a second row). The handler
and the ack commit together or not at all. Errors (a server or the database away) are the
client's to retry; this process only stops when killed.

    python -m tests.faults.effects_consumer SERVERS DSN [SUBSCRIPTION]
"""

from __future__ import annotations

import sys
import time

import sqlalchemy as sa

from msgtable.client import Client
from msgtable.errors import MsgtableError


def main() -> None:
    servers, dsn = sys.argv[1], sys.argv[2]
    subscription = sys.argv[3] if len(sys.argv) > 3 else ""
    db = sa.create_engine(dsn, pool_pre_ping=True, isolation_level="READ COMMITTED")
    while True:
        try:
            with (
                Client(servers) as client,
                client.subscribe("jobs", subscription=subscription, max_in_flight=20) as sub,
            ):
                for msg in sub:
                    msg.in_transaction(
                        db,
                        lambda conn, m=msg: conn.exec_driver_sql(
                            "insert into effects(message_id) values (%s)", (m.id,)
                        ),
                    )
        except (MsgtableError, sa.exc.DBAPIError, OSError) as exc:
            print(f"consumer: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            time.sleep(0.5)


if __name__ == "__main__":
    main()
