"""A graceful shutdown with the database's link gone silent (packets dropped, nothing
closed): SIGTERM must end the server within a stated bound, not after each statement of its
way out (postpones, the lease's release) has waited out its 30 s read time-out. What it could
not write is said in its log; the next lease holder holds those messages back anyway.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
import sqlalchemy as sa

from msgtable.client import Client
from msgtable.core.tables import DEMO_COMMENT, current_layout_ddl
from msgtable.limits import DEFAULT_GRACE_S, SHUTDOWN_DATABASE_S

from ..acceptance.helpers import Cli
from ..netfault import FaultProxy
from ..waiting import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

HELD = 20
# the bound: the calls' grace, the database's part of the way out, and a margin for the
# process to start and end (a busy machine)
BOUND_S = DEFAULT_GRACE_S + SHUTDOWN_DATABASE_S + 5


def test_sigterm_with_a_silent_database_link_ends_within_its_bound(tmp_path, sql, db_dsn):
    sql.execute(current_layout_ddl("jobs", DEMO_COMMENT))
    url = sa.make_url(db_dsn)
    cli = Cli(tmp_path)
    with FaultProxy(url.host or "127.0.0.1", url.port or 3306) as link:
        proxied = url.set(host="127.0.0.1", port=link.port).render_as_string(hide_password=False)
        server = cli.serve("--dsn", proxied, "--discovery-interval", "0.5", "--no-lease")
        try:
            got: list[int] = []
            with Client(server.address) as client:

                def receive() -> None:
                    try:
                        with client.subscribe("jobs") as sub:
                            for m in sub:
                                got.append(int(m.id))  # held: never acked
                    except Exception:
                        pass  # the server went away

                threading.Thread(target=receive, daemon=True).start()
                sql.execute(
                    "insert into jobs(id, message) values "
                    + ",".join(f"({i}, 'held')" for i in range(1, HELD + 1))
                )
                wait_until(lambda: len(got) >= HELD, timeout_s=30, what="the batch received")
                link.blackhole = True  # the database's link goes silent
                began = time.monotonic()
                server.send_signal(signal.SIGTERM)
                code = server.wait(timeout_s=BOUND_S + 60)
                took = time.monotonic() - began
            assert took <= BOUND_S, (
                f"SIGTERM took {took:.1f}s with the database's link silent (bound {BOUND_S:g}s)"
                f":\n{server.describe()}"
            )
            assert code == 0, server.describe()
            assert "did not answer" in server.stderr + server.stdout, server.describe()
        finally:
            link.blackhole = False
            cli.stop_all()
