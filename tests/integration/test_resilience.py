"""The database going away and the server shutting down: nothing is lost, errors are clear."""

from __future__ import annotations

import logging
import time

import pytest

from msgtable.client import Client
from msgtable.core.tables import current_layout_ddl
from msgtable.errors import Unavailable
from msgtable.testing.devdb import LocalServer

from ..waiting import wait_until
from .helpers import Collector, comment, serve


def test_a_database_outage_gives_unavailable_and_delivery_resumes(own_server: LocalServer):
    with serve(own_server.dsn("app"), discovery_interval_s=0.2) as s:
        s.sql(current_layout_ddl("jobs", comment(vt_poller_interval=0.1)))
        s.sql("insert into jobs(id, message) values (1, 'before')")
        c = Collector(s.client, "jobs")
        assert c.take(1)[0].id == 1
        assert s.client.ack("jobs", [1]) == 1
        s.db.dispose()

        own_server.stop()
        with pytest.raises(Unavailable, match="database unavailable"):
            s.client.ack("jobs", [1])
        assert s.client.list_tables()[0].name == "jobs"  # the server itself keeps serving

        own_server.start()
        s.sql("insert into jobs(id, message) values (2, 'after')")
        (m,) = c.take(1, timeout_s=15)  # the same stream: the poller reconnected by itself
        assert m.id == 2 and m.ack() == 1
        c.close()


def test_a_server_started_while_the_database_is_down_serves_once_it_is_up(
    own_server: LocalServer,
):
    dsn = own_server.dsn("app")
    own_server.stop()
    with serve(dsn, discovery_interval_s=0.2) as s:
        assert s.client.list_tables() == []  # at once, with the reason:
        assert s.client.status().database_error.startswith("waiting for the database at ")
        with pytest.raises(Unavailable):
            s.client.subscribe("jobs", retry=False)
        own_server.start()
        s.sql(current_layout_ddl("jobs", comment(vt_poller_interval=0.1)))
        wait_until(lambda: _tables(s.client), timeout_s=20, what="discovery after the outage")
        s.sql("insert into jobs(id, message) values (1, 'x')")
        c = Collector(s.client, "jobs")
        assert c.take(1)[0].id == 1
        c.close()


def test_an_outage_is_said_once_when_it_begins_and_once_when_it_ends(
    own_server: LocalServer, caplog: pytest.LogCaptureFixture
):
    """Every loop (poller, sender, purger, discovery, binlog follower, lease) fails while the
    database is away; the user reads one line when it goes and one when it is back."""
    with (
        caplog.at_level(logging.INFO, logger="msgtable"),
        serve(own_server.dsn("app"), discovery_interval_s=0.2, follow_binlog=True,
              lease_period_s=0.6) as s,
    ):  # fmt: skip
        s.sql(current_layout_ddl("jobs", comment(vt_poller_interval=0.1)))
        wait_until(lambda: s.engine.leading, what="the lease")
        c = Collector(s.client, "jobs")
        s.db.dispose()
        outage = s.engine.store.outage
        own_server.stop()
        wait_until(lambda: outage.away, what="the outage noticed")
        time.sleep(1.5)  # every loop fails meanwhile, some more than once
        own_server.start()
        wait_until(lambda: not outage.away, timeout_s=20, what="the database back")
        s.sql("insert into jobs(id, message) values (1, 'after')")
        assert c.take(1, timeout_s=15)[0].id == 1
        c.close()
    said = [  # the server's lines (the client, in this same process, says its own)
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.INFO and not r.name.startswith("msgtable.client")
    ]
    waiting = [m for m in said if m.startswith("waiting for the database at ")]
    back = [m for m in said if "answers again after" in m]
    assert len(waiting) == 1 and len(back) == 1, said
    assert [m for m in said if " failed" in m or "works again" in m] == [], said


def _tables(client: Client) -> list[str]:
    try:
        return [t.name for t in client.list_tables()]
    except Unavailable:
        return []


def test_shutdown_while_streaming_loses_nothing(db_dsn: str):
    fast = comment(vt_ack_wait=0.3, vt_min_backoff=0.2, vt_poller_interval=0.1, vt_batch_size=5)
    with serve(db_dsn) as s:
        s.sql(current_layout_ddl("work", fast))
        s.sql("insert into work(id, message) values " + ",".join(f"({i}, 'm')" for i in range(50)))
        c = Collector(s.client, "work")
        c.take(10)  # received, never acked: the server stops under them
    with serve(db_dsn) as s:
        c = Collector(s.client, "work")
        seen: set[object] = set()

        def all_acked() -> bool:
            while not c.messages.empty():
                m = c.messages.get()
                seen.add(m.id)
                m.ack()
            return len(seen) == 50

        wait_until(all_acked, timeout_s=20, what="every message delivered after the restart")
        assert s.sql("select count(*) from work where time_acked is null")[0][0] == 0
        c.close()


def test_a_server_with_a_lease_started_while_the_database_is_down_leads_once_it_is_up(
    own_server: LocalServer,
):
    dsn = own_server.dsn("app")
    own_server.stop()
    with serve(dsn, discovery_interval_s=0.2, lease_period_s=0.5) as s:  # campaign() at once
        assert not s.engine.leading
        own_server.start()
        s.sql(current_layout_ddl("jobs", comment(vt_poller_interval=0.1)))
        wait_until(lambda: s.engine.leading, timeout_s=20, what="the lease after the outage")
        s.sql("insert into jobs(id, message) values (1, 'x')")
        c = Collector(s.client, "jobs")
        assert c.take(1)[0].id == 1
        c.close()
