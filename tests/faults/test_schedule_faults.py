"""A schedule's ticks across server kills (issue 46, item 3): real `msgtable serve` processes on
one database with the default lease, a schedule ticking every second, the server that holds
the schedules' placement unit SIGKILLed again and again (a new one started each time), then
every server killed at once and started again a few seconds later. At the end every second
from the first tick to the last was enqueued exactly once: no tick lost (the next holder, or
the restarted server, catches up each one, in order), none doubled (the enqueue and the move
of next_tick are one transaction, conditional on the tick read)."""

from __future__ import annotations

import signal
import time

import pytest

from msgtable.client import Client
from msgtable.core.tables import current_layout_ddl
from msgtable.limits import DEFAULT_LEASE_PERIOD_S
from tests.integration.helpers import comment

from ..acceptance.helpers import Cli
from ..waiting import wait_until
from .test_failover import leases

pytestmark = [pytest.mark.faults, pytest.mark.timeout(300)]
SECOND = 1_000_000_000
KILLS = 3


@pytest.fixture
def cli(tmp_path):
    runner = Cli(tmp_path)
    try:
        yield runner
    finally:
        runner.stop_all()


def schedules_holder(sql) -> str:
    """The address of the server that ticks the schedules now ("": none)."""
    rows = [r for r in leases(sql) if r.kind == "schedules" and not r.released and r.live]
    return str(rows[0].address) if rows else ""


def ticks(sql) -> list[int]:
    return [int(r[0]) for r in sql.execute("select schedule_tick from jobs order by schedule_tick")]


def test_a_schedules_ticks_are_neither_lost_nor_doubled_across_server_kills(
    cli: Cli, sql, db_dsn: str
):
    ddl = current_layout_ddl("jobs", comment(vt_poller_interval=0.5))
    sql.execute(ddl.replace("  primary key(id)", "  schedule_tick bigint,\n  primary key(id)"))
    servers = [cli.serve("--dsn", db_dsn, "--discovery-interval", "0.5") for _ in range(2)]
    with Client(servers[0].address) as client:
        client.create_schedule("beat", "jobs", "* * * * * *", values={"message": "beat"})
    for k in range(KILLS):
        want = 3 * (k + 1)
        wait_until(lambda want=want: len(ticks(sql)) >= want, timeout_s=30, what="ticks")
        victim = wait_until(
            lambda up=servers: next((s for s in up if s.address == schedules_holder(sql)), None),
            timeout_s=30,
            what=lambda up=servers: f"one of {[s.address for s in up]} ticking: {leases(sql)}",
        )
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout_s=15)
        servers = [s for s in servers if s is not victim]
        servers.append(cli.serve("--dsn", db_dsn, "--discovery-interval", "0.5"))
    # no server at all for a while: the ticks of those seconds come once one is back
    wait_until(lambda: schedules_holder(sql), timeout_s=30, what="a ticking server")
    for s in servers:
        s.send_signal(signal.SIGKILL)
        s.wait(timeout_s=15)
    time.sleep(DEFAULT_LEASE_PERIOD_S + 3)
    last_before = ticks(sql)[-1]
    back = cli.serve("--dsn", db_dsn, "--discovery-interval", "0.5")
    wait_until(
        lambda: ticks(sql)[-1] > last_before + (DEFAULT_LEASE_PERIOD_S + 5) * SECOND,
        timeout_s=4 * DEFAULT_LEASE_PERIOD_S + 20,
        what="the missed seconds caught up and ticking again",
    )
    with Client(back.address) as client:
        assert client.drop_schedule("beat")
    got = ticks(sql)
    assert len(got) == len(set(got)), "a tick enqueued twice"
    expected = list(range(got[0], got[-1] + SECOND, SECOND))
    missing = sorted(set(expected) - set(got))
    assert not missing, f"{len(missing)} ticks lost: {missing[:10]}"
    assert sql.scalar("select count(*) from jobs where message = 'beat'") == len(got)
