"""The SQS API's sends (msgtable.server.sqs.sender) on a real MariaDB: a pooled connection
the database dropped while it was idle is replaced before a send uses it."""

from __future__ import annotations

import time

from msgtable.core.tables import current_layout_ddl
from msgtable.features.assembly import assemble_dsn
from msgtable.server.sqs.messages import Outgoing
from msgtable.server.sqs.queues import Queue
from msgtable.server.sqs.sender import Sender

from ..waiting import wait_until
from .helpers import comment


def test_a_connection_dropped_while_idle_is_replaced_before_a_send(sql, db_dsn: str):
    sql.execute(current_layout_ddl("jobs", comment(vt_poller_interval=1)))
    engine = assemble_dsn(db_dsn, discovery_interval_s=0.5)
    engine.open()
    sender = Sender(db_dsn, lambda table: None, idle_ping_s=0.05)
    try:
        wait_until(
            lambda: "jobs" in [s.name for s, _ in engine.live_statuses()], what="jobs loaded"
        )
        config = next(s for s, _ in engine.live_statuses() if s.name == "jobs").config
        q = Queue(engine.keyspace, "jobs", "", config)
        sender.send(q, [Outgoing("one", {}, 0)])
        with sender._engine.connect() as conn:  # the pool's one connection
            mine = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
        sql.execute(f"KILL {int(mine)}")
        time.sleep(0.1)  # idle past idle_ping_s: the time this test is about
        sender.send(q, [Outgoing("two", {}, 0)])
        assert sql.scalar("select count(*) from jobs") == 2
    finally:
        sender.close()
        engine.close()
