"""Effects exactly once under faults (issue 46, item 2): consumers that count each message's
effect in a table through Message.in_transaction (the handler's INSERT and the ack in one
transaction; tests/faults/effects_consumer.py), while consumers, msgtable servers and the
database itself are SIGKILLed and started again. At the end every message was acked and its
effect exists exactly once: a delivery cut anywhere (before the transaction, inside it, after
its commit but before the client heard of it) comes again and finds the work done or not
done, never half, never twice. Run for the table's default group and for a lazy subscription
(no state row of a message sent from its cursor: the claim makes it)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from msgtable.client import Client
from msgtable.core.tables import current_layout_ddl
from msgtable.testing.devdb import LocalServer
from tests.integration.helpers import comment

from ..acceptance.helpers import Cli
from ..waiting import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.timeout(400)]
ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 600
CONSUMERS = 3
CHAOS_S = 40.0


@pytest.fixture
def cli(tmp_path):
    runner = Cli(tmp_path)
    try:
        yield runner
    finally:
        runner.stop_all()


class Consumers:
    """The consumer processes, each one SIGKILLable and started again."""

    def __init__(self, servers: str, dsn: str, log_dir: Path, subscription: str) -> None:
        self.servers, self.dsn, self.log_dir = servers, dsn, log_dir
        self.subscription = subscription
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0

    def start(self) -> None:
        self.started += 1
        log = open(self.log_dir / f"consumer-{self.started}.log", "wb")  # noqa: SIM115
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        self.procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.faults.effects_consumer",
                    self.servers,
                    self.dsn,
                    self.subscription,
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )

    def kill_one(self, rng: random.Random) -> None:
        victim = self.procs.pop(rng.randrange(len(self.procs)))
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=15)

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=15)


@pytest.mark.parametrize("subscription", ["", "work"], ids=["default-group", "lazy-subscription"])
def test_every_effect_exists_exactly_once_after_consumers_servers_and_the_database_died(
    cli: Cli, own_durable_server: LocalServer, tmp_path: Path, subscription: str
):
    database = own_durable_server
    dsn = database.dsn("app")
    db = sa.create_engine(dsn, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    fields = dict(vt_ack_wait=3, vt_min_backoff=0.5, vt_max_backoff=2, vt_poller_interval=0.5)
    with db.connect() as conn:
        conn.exec_driver_sql(current_layout_ddl("jobs", comment(**fields)))
        conn.exec_driver_sql(
            "create table effects(n bigint not null auto_increment primary key, "
            "message_id bigint not null, index(message_id))"
        )
    servers = [cli.serve("--dsn", dsn, "--discovery-interval", "0.5") for _ in range(2)]
    if subscription:
        with Client(servers[0].address) as client:
            client.create_subscription("jobs", subscription, state_rows="lazy")
    consumers = Consumers(",".join(s.address for s in servers), dsn, tmp_path, subscription)
    for _ in range(CONSUMERS):
        consumers.start()
    rng = random.Random(46)
    produced = 0
    faults: list[str] = []
    began = time.monotonic()
    try:
        while time.monotonic() - began < CHAOS_S or produced < MESSAGES:
            if produced < MESSAGES:
                produced += _produce(db, produced, 30)
            time.sleep(rng.uniform(0.5, 2.0))
            fault = rng.choice(["consumer", "consumer", "server", "database", "none"])
            if fault == "consumer":
                consumers.kill_one(rng)
                consumers.start()
            elif fault == "server":
                victim = servers.pop(rng.randrange(len(servers)))
                victim.send_signal(signal.SIGKILL)
                victim.wait(timeout_s=15)
                servers.append(cli.serve("--dsn", dsn, "--discovery-interval", "0.5"))
                # the consumers know the first two addresses: keep those alive in the list
                consumers.servers = ",".join(s.address for s in servers)
            elif fault == "database":
                database.kill()
                time.sleep(rng.uniform(0.5, 3.0))
                database.start()
            faults.append(fault)
        # the faults are over: everything drains
        settled = _passed if subscription else _acked
        wait_until(
            lambda: settled(db) == MESSAGES,
            timeout_s=180,
            what=lambda: f"every message acked ({settled(db)} of {MESSAGES}; faults {faults})",
        )
        time.sleep(2.0)  # an effect of a duplicate delivery would show by now
    finally:
        consumers.stop()
    with db.connect() as conn:
        doubled = conn.exec_driver_sql(
            "select message_id, count(*) from effects group by message_id having count(*) > 1"
        ).fetchall()
        distinct = conn.exec_driver_sql("select count(distinct message_id) from effects").scalar()
    db.dispose()
    assert not doubled, f"effects twice: {doubled[:10]} (faults {faults})"
    assert distinct == MESSAGES, f"{distinct} effects of {MESSAGES} messages"
    assert {"consumer", "server", "database"} <= set(faults), faults


def _produce(db: sa.Engine, first: int, n: int) -> int:
    n = min(n, MESSAGES - first)
    for _ in range(100):  # the database may be down: retry until it is back
        try:
            with db.begin() as conn:
                conn.exec_driver_sql(
                    "insert into jobs(id, message) values "
                    + ",".join(f"({i}, 'm{i}')" for i in range(first, first + n))
                )
            return n
        except sa.exc.DBAPIError:
            time.sleep(0.3)
    raise AssertionError("the database did not come back")


def _passed(db: sa.Engine) -> int:
    """The messages the lazy subscription's cursor passed: each was settled (and, every ack
    here being an in_transaction's, has its effect)."""
    try:
        with db.connect() as conn:
            return int(
                conn.exec_driver_sql(
                    "select count(*) from jobs, msgtable_fanout_cursors c "
                    "where c.table_name = 'jobs' and c.name = 'work' "
                    "and jobs.time_fanout <= c.sent_upto"
                ).scalar()
            )
    except sa.exc.DBAPIError:
        return -1


def _acked(db: sa.Engine) -> int:
    try:
        with db.connect() as conn:
            return int(
                conn.exec_driver_sql(
                    "select count(*) from jobs where time_acked is not null"
                ).scalar()
            )
    except sa.exc.DBAPIError:
        return -1
