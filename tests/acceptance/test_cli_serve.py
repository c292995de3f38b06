"""`msgtable serve`, `tables` and `tail` as a user runs them against their own database.

The application's side is plain SQL through the `sql` fixture (the test's own database);
everything msgtable does happens in subprocesses started by the `cli` fixture.
"""

from __future__ import annotations

import json
import re
import signal
import time
from typing import TYPE_CHECKING

import pytest
from grpc_health.v1 import health_pb2
from sqlalchemy.engine import make_url

from msgtable.core.tables import current_layout_ddl
from tests.integration.helpers import comment

from .helpers import Cli, assert_one_line_error, describe, free_port, wait_until

if TYPE_CHECKING:
    from tests.conftest import Sql

pytestmark = pytest.mark.timeout(90)

TAIL_LINE = re.compile(r"^id=(\d+) message=(.*)$", re.MULTILINE)
# Comes back quickly when not acked: 0.5 s ack wait + 0.5-1 s backoff; polled twice a second.
QUICK = dict(vt_ack_wait=0.5, vt_min_backoff=0.5, vt_max_backoff=1, vt_poller_interval=0.5)


def tailed(output: str) -> list[tuple[int, str]]:
    """(id, message) of each line `msgtable tail` printed."""
    return [(int(i), message) for i, message in TAIL_LINE.findall(output)]


def acked_ids(sql: Sql, table: str) -> set[int]:
    return {row[0] for row in sql.rows(f"select id from {table} where time_acked is not null")}


def unacked_ids(sql: Sql, table: str) -> set[int]:
    return {row[0] for row in sql.rows(f"select id from {table} where time_acked is null")}


def insert_three(sql: Sql, table: str) -> None:
    sql.execute(f"insert into {table}(id, message) values (1, 'one'), (2, 'two'), (3, 'three')")


# -- serve, tables, tail -----------------------------------------------------------------
def test_tables_lists_each_message_table_and_the_load_error_of_a_bad_one(
    cli: Cli, sql: Sql, db_dsn: str, db_name: str
):
    sql.execute(current_layout_ddl("orders", comment(vt_batch_size=7)))
    sql.execute(current_layout_ddl("broken", comment(vt_batch_size=0)))
    serve = cli.serve("--dsn", db_dsn)
    assert serve.wait_answering() == health_pb2.HealthCheckResponse.SERVING

    done = cli.run("tables", "--wide", "--server", serve.address)

    assert done.returncode == 0, describe(done)
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.strip()}
    assert rows["TABLE"][:4] == ["TABLE", "KEYSPACE", "STATUS", "BATCH"], describe(done)
    assert rows["orders"][:5] == ["orders", db_name, "loaded", "7", "10000"], describe(done)
    assert rows["orders"][5] == "30s", describe(done)  # ACK WAIT
    assert rows["broken"][:4] == ["broken", db_name, "error", "-"], describe(done)
    errors = done.stdout.split("load errors:", 1)[1]
    assert re.search(r"^\s+broken: .*vt_batch_size", errors, re.MULTILINE), describe(done)
    assert "orders" not in errors, describe(done)
    password = make_url(db_dsn).password
    assert password and f":{password}@" not in serve.stdout + serve.stderr, serve.describe()


def test_tables_fits_an_80_column_terminal_and_shows_the_rest_wide_or_as_json(
    cli: Cli, sql: Sql, db_dsn: str, db_name: str
):
    sql.execute(current_layout_ddl("customer_notifications", comment()))
    sql.execute(current_layout_ddl("orders", comment(vt_batch_size=7)))
    insert_three(sql, "orders")
    serve = cli.serve("--dsn", db_dsn)
    assert serve.wait_answering() == health_pb2.HealthCheckResponse.SERVING
    tail = cli.run("tail", "orders", "--ack", "--count", "3", "--server", serve.address)
    assert tail.returncode == 0, describe(tail)

    narrow = cli.run("tables", "--server", serve.address)
    wide = cli.run("tables", "--wide", "--server", serve.address)
    as_json = cli.run("tables", "--json", "--server", serve.address)

    for done in (narrow, wide, as_json):
        assert done.returncode == 0, describe(done)
    table = narrow.stdout.split("\n\n", 1)[0].splitlines()
    assert max(len(line) for line in table) <= 80, describe(narrow)
    assert table[0].split() == [
        "TABLE",
        "STATUS",
        "SUBSCRIBERS",
        "IN",
        "FLIGHT",
        "SENT",
        "ACKED",
        "DEAD",
    ]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert rows["orders"][:2] == ["orders", "loaded"] and rows["orders"][5] == "3", describe(narrow)
    assert wide.stdout.splitlines()[0].split()[:4] == ["TABLE", "KEYSPACE", "STATUS", "BATCH"]
    assert len(wide.stdout.splitlines()[0].split()) == 20  # 17 columns, three of two words
    entries = {e["name"]: e for e in map(json.loads, as_json.stdout.splitlines())}
    assert sorted(entries) == ["customer_notifications", "orders"], describe(as_json)
    orders = entries["orders"]
    assert (orders["keyspace"], orders["acked"], orders["config"]["batch_size"]) == (db_name, 3, 7)
    assert {"released", "renewed", "dead_lettered", "due", "sender", "shard"} <= set(orders)


def test_tail_with_ack_prints_the_rows_inserted_by_sql_and_acks_them(
    cli: Cli, sql: Sql, db_dsn: str
):
    sql.execute(current_layout_ddl("orders", comment()))
    serve = cli.serve("--dsn", db_dsn)
    insert_three(sql, "orders")

    done = cli.run("tail", "orders", "--server", serve.address, "--ack", "--count", "3")

    assert done.returncode == 0, describe(done)
    assert sorted(tailed(done.stdout)) == [(1, '"one"'), (2, '"two"'), (3, '"three"')], describe(
        done
    )
    assert len(done.stdout.splitlines()) == 3, describe(done)
    # tail exits after its ack call returned: the acks are committed by then.
    assert acked_ids(sql, "orders") == {1, 2, 3}


def test_a_second_tail_with_count_gets_the_messages_the_first_left(cli: Cli, sql: Sql, db_dsn: str):
    # The first tail's ack gave its window of 3 room again before its stream ended: the
    # server sent it 4-6, which nobody printed, and they waited out their ack wait (30 s).
    sql.execute(current_layout_ddl("orders", comment()))
    serve = cli.serve("--dsn", db_dsn)
    rows = ", ".join(f"({i}, 'm{i}')" for i in range(1, 11))
    sql.execute(f"insert into orders(id, message) values {rows}")

    first = cli.run("tail", "orders", "--server", serve.address, "--ack", "--count", "3")
    assert [i for i, _ in tailed(first.stdout)] == [1, 2, 3], describe(first)
    second = cli.run(
        "tail", "orders", "--server", serve.address, "--ack", "--count", "7", timeout_s=15
    )

    assert sorted(i for i, _ in tailed(second.stdout)) == list(range(4, 11)), describe(second)
    assert acked_ids(sql, "orders") == set(range(1, 11))
    # nothing was sent to the first tail after its third message
    sent = sql.rows("select id, epoch from orders where id between 4 and 10 order by id")
    assert all(epoch == 1 for _, epoch in sent), f"4-10 sent more than once: {sent}"


def test_tail_of_an_unknown_table_is_a_one_line_error(cli: Cli, db_dsn: str):
    serve = cli.serve("--dsn", db_dsn)

    done = cli.run("tail", "no_such_table", "--server", serve.address, "--count", "1")

    assert_one_line_error(done, "no_such_table", "not found")
    assert done.stdout == ""


def test_tables_without_a_server_is_a_one_line_error(cli: Cli):
    address = f"127.0.0.1:{free_port()}"

    done = cli.run("tables", "--server", address)

    assert_one_line_error(done, "cannot reach", address)


# -- configuration from the environment --------------------------------------------------
def test_environment_variables_stand_in_for_the_flags(cli: Cli, sql: Sql, db_dsn: str):
    sql.execute(current_layout_ddl("orders", comment()))
    sql.execute("insert into orders(id, message) values (1, 'from env')")
    serve = cli.serve(env=cli.env(MSGTABLE_DSN=db_dsn), listen_flag=False)  # MSGTABLE_LISTEN
    client_env = cli.env(MSGTABLE_SERVER=serve.address)

    listed = cli.run("tables", "--wide", env=client_env)
    tail = cli.run("tail", "orders", "--ack", "--count", "1", "--json", env=client_env)

    assert listed.returncode == 0, describe(listed)
    assert re.search(r"^orders\s+\S+\s+loaded\b", listed.stdout, re.MULTILINE), describe(listed)
    assert tail.returncode == 0, describe(tail)
    assert [json.loads(line) for line in tail.stdout.splitlines()] == [
        {"id": 1, "message": "from env"}
    ], describe(tail)
    assert acked_ids(sql, "orders") == {1}


# -- shutdown ----------------------------------------------------------------------------
def test_sigterm_stops_serve_gracefully_and_the_unacked_messages_come_back(
    cli: Cli, sql: Sql, db_dsn: str
):
    sql.execute(current_layout_ddl("orders", comment(**QUICK)))
    insert_three(sql, "orders")
    first = cli.serve("--dsn", db_dsn)
    tail = cli.start("tail", "orders", "--server", first.address)  # no --ack
    wait_until(
        lambda: {i for i, _ in tailed(tail.stdout)} == {1, 2, 3},
        timeout_s=20,
        what=lambda: f"tail to print ids 1-3:\n{tail.describe()}",
    )

    first.send_signal(signal.SIGTERM)

    assert first.wait(timeout_s=15) == 0, first.describe()
    assert "Traceback" not in first.stderr, first.describe()
    # The stream ends with the server: tail says so in one line and exits.
    assert tail.wait(timeout_s=15) != 0, tail.describe()
    assert "Traceback" not in tail.stderr, tail.describe()
    assert len(tail.stderr.strip().splitlines()) == 1, tail.describe()
    # Nothing was acked, nothing was lost: the rows are all still there, waiting.
    assert unacked_ids(sql, "orders") == {1, 2, 3}

    second = cli.serve("--dsn", db_dsn)
    again = cli.run("tail", "orders", "--server", second.address, "--ack", "--count", "3")

    assert again.returncode == 0, describe(again)
    assert sorted(i for i, _ in tailed(again.stdout)) == [1, 2, 3], describe(again)
    assert acked_ids(sql, "orders") == {1, 2, 3}


def test_sigint_ends_tail_and_serve_cleanly(cli: Cli, sql: Sql, db_dsn: str):
    sql.execute(current_layout_ddl("orders", comment()))
    sql.execute("insert into orders(id, message) values (1, 'one')")
    serve = cli.serve("--dsn", db_dsn)
    tail = cli.start("tail", "orders", "--server", serve.address)
    tail.wait_for_output(r'^id=1 message="one"$', timeout_s=20)

    tail.send_signal(signal.SIGINT)  # Ctrl-C is how tail ends

    assert tail.wait(timeout_s=15) == 0, tail.describe()
    assert tail.stderr == "", tail.describe()

    serve.send_signal(signal.SIGINT)

    assert serve.wait(timeout_s=15) == 0, serve.describe()
    assert "Traceback" not in serve.stderr, serve.describe()
    assert "KeyboardInterrupt" not in serve.stderr, serve.describe()


# -- a database that is not there --------------------------------------------------------
def test_serve_keeps_running_when_the_database_is_unreachable(cli: Cli):
    port = free_port()
    nobody = f"mysql+pymysql://msgtable:msgtable@127.0.0.1:{port}/nowhere"
    serve = cli.serve("--dsn", nobody)

    began = time.monotonic()
    listed = cli.run("tables", "--server", serve.address)
    answered_s = time.monotonic() - began
    tail = cli.run("tail", "orders", "--server", serve.address, "--count", "1")

    # tables answers at once with the database's state (it took ~10 s of retries, then failed)
    assert listed.returncode == 0 and answered_s < 5, describe(listed)
    waiting = f"waiting for the database at 127.0.0.1:{port}"
    assert "no message tables" in listed.stdout and waiting in listed.stdout, describe(listed)
    assert_one_line_error(tail, "unavailable")
    assert serve.running(), serve.describe()
    assert serve.wait_answering() is not None
    said = [line for line in serve.stderr.splitlines() if waiting in line]
    assert len(said) == 1 and "refused" in said[0].lower(), serve.describe()  # once, and why
    assert "campaign" not in serve.stderr, serve.describe()
    serve.send_signal(signal.SIGTERM)
    assert serve.wait(timeout_s=15) == 0, serve.describe()
    assert "Traceback" not in serve.stderr, serve.describe()


def test_serve_with_a_wrong_password_waits_for_the_database_and_says_why(cli: Cli, db_dsn: str):
    """One policy for a database that keeps the server away, whatever the reason: it serves,
    says once why it waits, and answers requests with that reason (it used to exit at once
    on a wrong password or an unknown database, and wait quietly for an unreachable one)."""
    wrong = make_url(db_dsn).set(password="not-the-password")
    serve = cli.serve("--dsn", wrong.render_as_string(hide_password=False))
    assert serve.wait_answering() is not None and serve.running(), serve.describe()
    wait_until(lambda: "Access denied" in serve.stderr, what="the reason in the log")
    said = [line for line in serve.stderr.splitlines() if "waiting for the database" in line]
    assert len(said) == 1, serve.describe()
    listed = cli.run("tables", "--server", serve.address)
    assert listed.returncode == 0 and "Access denied" in listed.stdout, describe(listed)
    serve.send_signal(signal.SIGTERM)
    assert serve.wait(timeout_s=15) == 0, serve.describe()


def test_serve_freezes_its_startup_heap_once_it_serves(cli: Cli, db_dsn: str):
    """The collector does not rescan every module's objects in each full collection while
    the server runs (msgtable.server.heap; issue 42): serve freezes them once it started."""
    serve = cli.serve("--dsn", db_dsn, "--log-level", "debug")
    wait_until(
        lambda: "objects of its startup heap" in serve.stderr,
        timeout_s=20,
        what=lambda: f"serve to say it froze its startup heap:\n{serve.describe()}",
    )
    said = [line for line in serve.stderr.splitlines() if "objects of its startup heap" in line]
    assert len(said) == 1, serve.describe()
