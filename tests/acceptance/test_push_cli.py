"""Push endpoints from the command line, and pushing through crashes and restarts:
`msgtable endpoint set / list / drop` against real `msgtable serve` subprocesses, a real HTTP
receiver on loopback (tests/push_receiver.py), and an independent judge (``judge``) that
compares what the receiver got with the rows inserted, reading the table with its own SQL.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from msgtable.core.tables import current_layout_ddl
from tests.integration.helpers import comment

from ..push_receiver import Receiver
from .helpers import Cli, assert_one_line_error, describe, wait_until

if TYPE_CHECKING:
    from tests.conftest import Sql

pytestmark = pytest.mark.timeout(180)

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
ALLOW = ("--push-allow", "http://127.0.0.0/8")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(SECRET).start()
    yield r
    r.stop()


@pytest.fixture
def secret_file(tmp_path: Path) -> str:
    path = tmp_path / "push.secret"
    path.write_text(SECRET + "\n")
    return str(path)


def create_jobs(sql: Sql, **fields: object) -> None:
    sql.execute(current_layout_ddl("jobs", comment(vt_poller_interval=0.2, **fields)))


def insert(sql: Sql, ids: range) -> None:
    sql.execute("insert into jobs(id, message) values " + ",".join(f"({i}, 'm{i}')" for i in ids))


def judge(receiver: Receiver, sql: Sql, inserted: set[int]) -> str:
    """'' when every inserted message reached the receiver at least once and, settled, is
    acked in the table; else what is wrong."""
    got = set(receiver.ids())
    problems = []
    if inserted - got:
        problems.append(f"never arrived: {sorted(inserted - got)[:20]}")
    if got - inserted:
        problems.append(f"arrived but never inserted: {sorted(got - inserted)[:20]}")
    unacked = {r[0] for r in sql.rows("select id from jobs where time_acked is null")}
    if unacked & inserted:
        problems.append(f"not acked: {sorted(unacked & inserted)[:20]}")
    if receiver.bad_signatures:
        problems.append(f"bad signatures: {receiver.bad_signatures[:5]}")
    return "; ".join(problems)


def test_endpoint_set_list_drop_from_the_command_line(
    cli: Cli, sql: Sql, db_dsn: str, receiver: Receiver, secret_file: str
) -> None:
    create_jobs(sql)
    serve = cli.serve("--dsn", db_dsn, "--no-lease", "--discovery-interval", "0.5", *ALLOW)
    server = ("--server", serve.address)
    done = cli.run("endpoint", "set", "jobs", receiver.url(), "--secret-file", secret_file, *server)
    assert done.returncode == 0, describe(done)
    assert f"jobs is pushed to {receiver.url()}" in done.stdout
    insert(sql, range(1, 11))
    wait_until(lambda: sorted(receiver.ids()) == list(range(1, 11)), what="10 pushed")
    listed = cli.run("endpoint", "list", *server)
    assert receiver.url() in listed.stdout and "pushing" in listed.stdout, describe(listed)
    assert SECRET not in listed.stdout + serve.stdout + serve.stderr
    no_secret = cli.run("endpoint", "set", "jobs", receiver.url(), *server)
    assert_one_line_error(no_secret, "needs a secret")
    hostile = cli.run(
        "endpoint",
        "set",
        "jobs",
        "http://127.0.0.1@evil.test/",
        "--secret-file",
        secret_file,
        *server,
    )
    assert_one_line_error(hostile, "user name")
    env_secret = cli.run(
        "endpoint",
        "set",
        "jobs",
        receiver.url("/other"),
        *server,
        env=cli.env(MSGTABLE_PUSH_SECRET=SECRET),
    )
    assert env_secret.returncode == 0, describe(env_secret)
    dropped = cli.run("endpoint", "drop", "jobs", *server)
    assert dropped.returncode == 0 and "no longer pushed" in dropped.stdout, describe(dropped)
    assert "no push endpoints" in cli.run("endpoint", "list", *server).stdout


def test_a_server_killed_mid_push_pushes_the_batch_again_after_its_ack_wait(
    cli: Cli, sql: Sql, db_dsn: str, receiver: Receiver, secret_file: str
) -> None:
    create_jobs(sql, vt_ack_wait=2, vt_min_backoff=0.2)
    args = ("--dsn", db_dsn, "--no-lease", "--discovery-interval", "0.5", *ALLOW)
    first = cli.serve(*args)
    receiver.hang()
    done = cli.run(
        "endpoint",
        "set",
        "jobs",
        receiver.url(),
        "--secret-file",
        secret_file,
        "--server",
        first.address,
    )
    assert done.returncode == 0, describe(done)
    insert(sql, range(1, 11))
    wait_until(lambda: receiver.requests >= 1, what=lambda: f"a POST:\n{first.describe()}")
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_at = time.time_ns()
    receiver.unhang()
    assert receiver.ids() == []
    cli.serve(*args)
    wait_until(
        lambda: sorted(set(receiver.ids())) == list(range(1, 11)),
        timeout_s=30,
        what=lambda: f"the batch again, got {receiver.ids()}",
    )
    assert all(r.at_ns > killed_at for r in receiver.received())
    wait_until(lambda: not judge(receiver, sql, set(range(1, 11))), what="every row acked")


def test_a_rolling_restart_of_two_servers_moves_the_lease_without_a_gap_or_a_loss(
    cli: Cli, sql: Sql, db_dsn: str, receiver: Receiver, secret_file: str
) -> None:
    create_jobs(sql, vt_ack_wait=3, vt_min_backoff=0.2)
    args = ("--dsn", db_dsn, "--lease-period", "1", "--discovery-interval", "0.5", *ALLOW)
    servers = [cli.serve(*args), cli.serve(*args)]
    done = cli.run(
        "endpoint",
        "set",
        "jobs",
        receiver.url(),
        "--secret-file",
        secret_file,
        "--server",
        servers[0].address,
    )
    assert done.returncode == 0, describe(done)
    stop = threading.Event()
    inserted: list[int] = []

    def produce() -> None:
        n = 0
        while not stop.is_set():
            insert(sql, range(n + 1, n + 6))
            inserted.extend(range(n + 1, n + 6))
            n += 5
            stop.wait(0.02)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        for i in range(2):  # each original server in turn: SIGTERM, then a new one
            before = len(set(receiver.ids()))
            wait_until(
                lambda b=before: len(set(receiver.ids())) > b + 50,
                timeout_s=30,
                what="pushes going on",
            )
            servers[i].send_signal(signal.SIGTERM)
            assert servers[i].wait() == 0, servers[i].describe()
            after = len(set(receiver.ids()))
            wait_until(  # the other server pushes now: no gap longer than a lease or two
                lambda a=after: len(set(receiver.ids())) > a + 50,
                timeout_s=10,
                what=lambda o=servers[-1]: f"the other server pushing:\n{o.describe()}",
            )
            servers.append(cli.serve(*args))
    finally:
        stop.set()
        producer.join(10)
    everything = set(inserted)
    wait_until(
        lambda: not judge(receiver, sql, everything),
        timeout_s=60,
        what=lambda: judge(receiver, sql, everything),
    )


def test_a_receiver_down_for_30_s_gets_everything_afterwards_in_order_per_key(
    cli: Cli, sql: Sql, db_dsn: str, receiver: Receiver, secret_file: str
) -> None:
    """The issue's outage: the receiver goes away for 30 s while an ordered table fills."""
    ddl = current_layout_ddl(
        "jobs",
        comment(vt_poller_interval=0.2, vt_order_key="k", vt_min_backoff=0.5, vt_max_backoff=4),
    )
    sql.execute(
        ddl.replace(
            "  primary key(id)",
            "  k varchar(16), index order_idx(k, time_acked, id),\n  primary key(id)",
        )
    )
    serve = cli.serve("--dsn", db_dsn, "--no-lease", "--discovery-interval", "0.5", *ALLOW)
    done = cli.run(
        "endpoint",
        "set",
        "jobs",
        receiver.url(),
        "--secret-file",
        secret_file,
        "--server",
        serve.address,
    )
    assert done.returncode == 0, describe(done)
    receiver.go_away()
    down_at = time.monotonic()
    ids = range(1, 301)
    for lo in range(1, 301, 30):  # spread over the outage
        sql.execute(
            "insert into jobs(id, k, message) values "
            + ",".join(f"({i}, 'key{i % 7}', 'm{i}')" for i in range(lo, lo + 30))
        )
        time.sleep(2.5)
    time.sleep(max(0.0, 30 - (time.monotonic() - down_at)))
    assert receiver.ids() == []
    receiver.come_back()
    wait_until(
        lambda: not judge(receiver, sql, set(ids)),
        timeout_s=60,
        what=lambda: judge(receiver, sql, set(ids)),
    )
    by_key: dict[str, list[int]] = {}
    for r in receiver.received():
        by_key.setdefault(r.event["orderkey"], []).append(int(r.event["data"]["id"]))
    for key, got in by_key.items():
        firsts = list(dict.fromkeys(got))
        assert firsts == sorted(firsts), f"{key} out of order: {got}"
