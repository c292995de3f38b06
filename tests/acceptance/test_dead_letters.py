"""Dead letters as a user meets them: a server killed in the middle of dead-lettering, and
`msgtable dead` / `msgtable redrive` against a real `msgtable serve`.

The application's side is plain SQL through the `sql` fixture (the test's own database);
msgtable runs in subprocesses started by the `cli` fixture.
"""

from __future__ import annotations

import re
import signal
import threading
from typing import TYPE_CHECKING

import pytest

from msgtable.client import Client, Message
from msgtable.core.tables import current_layout_ddl
from tests.integration.helpers import comment

from .helpers import Cli, describe, wait_until

if TYPE_CHECKING:
    from tests.conftest import Sql

pytestmark = pytest.mark.timeout(120)

N = 50
DEAD = "time_dead bigint, attempts bigint, last_error varchar(1000)"


def create_pair(sql: Sql, **fields: object) -> None:
    def ddl(name: str, extra: str, **f: object) -> str:
        text = current_layout_ddl(name, comment(**f))
        return text.replace("  primary key(id)", f"  {extra},\n  primary key(id)")

    sql.execute(ddl("jobs_dead", DEAD))
    sql.execute(ddl("jobs", "last_error varchar(1000)", vt_dead_letter="jobs_dead", **fields))


def where(sql: Sql) -> tuple[set[int], set[int]]:
    """The ids in jobs and in jobs_dead."""
    return (
        {r[0] for r in sql.rows("select id from jobs")},
        {r[0] for r in sql.rows("select id from jobs_dead")},
    )


def others_transactions(sql: Sql) -> list[tuple[object, ...]]:
    """Open transactions of other sessions on this test's database (the server is shared:
    other tests' sessions elsewhere do not count)."""
    return sql.rows(
        "select p.id, p.command, p.state, t.trx_state from information_schema.innodb_trx t "
        "join information_schema.processlist p on p.id = t.trx_mysql_thread_id "
        "where p.db = database() and p.id <> connection_id()"
    )


def take(client: Client, n: int) -> tuple[list[Message], threading.Thread]:
    """Subscribe on a thread and hold (never ack) what comes; returns at once."""
    got: list[Message] = []

    def run() -> None:
        try:
            with client.subscribe("jobs") as sub:
                for m in sub:
                    got.append(m)
        except Exception:
            pass  # the server was killed: the test judges the tables, not this stream

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return got, t


def test_a_server_killed_while_dead_lettering_leaves_each_message_in_exactly_one_table(
    cli: Cli, sql: Sql, db_dsn: str
):
    create_pair(sql, vt_ack_wait=0.5, vt_max_attempts=1, vt_poller_interval=0.2)
    sql.execute(
        "insert into jobs(id, message) values "
        + ",".join(f"({i}, 'm{i}')" for i in range(1, N + 1))
    )
    first = cli.serve("--dsn", db_dsn, "--no-lease", "--discovery-interval", "0.5")
    # The test holds the dead-letter table: the server's move stops at its INSERT, with the
    # rows of jobs locked by its transaction (the moment of the move to crash in).
    lock = sql.engine.connect()
    lock.exec_driver_sql("lock tables jobs_dead write")
    try:
        client = Client(first.address)
        got, _ = take(client, N)
        wait_until(lambda: len(got) >= N, timeout_s=30, what=lambda: f"{N} sent ({len(got)})")
        wait_until(  # their one ack wait ends; the move begins and waits for the lock
            lambda: sql.scalar(
                "select count(*) from information_schema.processlist "
                "where info like 'INSERT INTO `jobs_dead`%%'"
            ),
            timeout_s=30,
            what=lambda: f"the move to wait at its INSERT:\n{first.describe()}",
        )
        first.send_signal(signal.SIGKILL)
        first.wait(timeout_s=15)
        client.close()
    finally:
        lock.exec_driver_sql("unlock tables")
        lock.close()
    # the killed server's transaction is rolled back once the database sees it gone
    wait_until(
        lambda: not others_transactions(sql),
        timeout_s=30,
        what=lambda: f"its rollback; still open: {others_transactions(sql)}",
    )
    live, dead = where(sql)
    assert live & dead == set(), f"in both tables: {sorted(live & dead)}"
    assert live | dead == set(range(1, N + 1)), f"in neither: {set(range(1, N + 1)) - live - dead}"
    assert dead == set()  # nothing committed: all still in their own table

    second = cli.serve("--dsn", db_dsn, "--no-lease", "--discovery-interval", "0.5")
    client = Client(second.address)
    try:
        take(client, N)  # a subscriber, so the table is served; they are due and die
        wait_until(
            lambda: where(sql) == (set(), set(range(1, N + 1))),
            timeout_s=30,
            what=lambda: f"all {N} moved once: {[len(x) for x in where(sql)]}",
        )
    finally:
        client.close()
    rows = sql.rows("select distinct attempts, last_error from jobs_dead")
    assert rows == [(1, "no ack after 1 attempts (vt_max_attempts=1)")]


def test_dead_lists_dead_letters_and_redrive_moves_them_back_once(cli: Cli, sql: Sql, db_dsn: str):
    create_pair(sql)
    sql.execute(
        "insert into jobs(id, message) values " + ",".join(f"({i}, 'm{i}')" for i in range(1, 8))
    )
    serve = cli.serve("--dsn", db_dsn, "--no-lease")
    with Client(serve.address) as client:
        assert client.reject("jobs", list(range(1, 8)), reason="bug 7") == 7

    listed = cli.run("dead", "jobs", "--server", serve.address, "--limit", "3")
    assert listed.returncode == 0, describe(listed)
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["ID", "DIED", "ATTEMPTS", "LAST", "ERROR"], describe(listed)
    assert [ln.split()[0] for ln in lines[1:4]] == ["1", "2", "3"]
    assert all(ln.split()[-2:] == ["bug", "7"] for ln in lines[1:4]), describe(listed)
    assert lines[4] == "3 shown of 7 dead letters in jobs"

    part = cli.run(
        "redrive", "jobs_dead", "--server", serve.address, "--limit", "3", "--batch", "2"
    )
    assert part.returncode == 0, describe(part)
    assert part.stdout.strip() == "moved 3 dead letters of jobs_dead to their table"
    assert where(sql) == ({1, 2, 3}, {4, 5, 6, 7})

    rest = cli.run("redrive", "jobs_dead", "--server", serve.address, "--rate", "100/s")
    assert rest.returncode == 0, describe(rest)
    assert re.fullmatch(r"moved 4 dead letters of jobs_dead to their table\n", rest.stdout)
    assert where(sql) == (set(range(1, 8)), set())
    assert sql.rows("select distinct epoch, time_acked from jobs") == [(0, None)]

    none = cli.run("dead", "jobs", "--server", serve.address)
    assert none.stdout.strip() == "no dead letters in jobs", describe(none)
    bad = cli.run("redrive", "jobs", "--server", serve.address, "--to", "nowhere")
    assert bad.returncode == 1 and "nowhere" in bad.stderr and "Traceback" not in bad.stderr
