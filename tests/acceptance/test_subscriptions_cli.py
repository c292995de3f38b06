"""Subscriptions from the command line: `msgtable subscription create / alter / drop / list`,
`msgtable tail --subscription` and `msgtable tables`, against a real `msgtable serve`.

The application's side is plain SQL through the `sql` fixture (the test's own database);
msgtable runs in subprocesses started by the `cli` fixture.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import pytest

from msgtable.core.tables import current_layout_ddl
from tests.integration.helpers import comment

from .helpers import Cli, Process, assert_one_line_error, describe, wait_until

if TYPE_CHECKING:
    from tests.conftest import Sql

pytestmark = pytest.mark.timeout(120)

FAST = dict(vt_poller_interval=0.2, vt_ack_wait=30)
BAD_FILTER = "region = 'eu' AND amont > 1"  # "amont" starts at character 19


def create_orders(sql: Sql) -> None:
    ddl = current_layout_ddl("orders", comment(**FAST))
    sql.execute(ddl.replace("  primary key(id)", "  region varchar(8),\n  primary key(id)"))


def enqueue(sql: Sql, rows: dict[int, str]) -> None:
    values = ",".join(f"({i}, 'm{i}', '{region}')" for i, region in rows.items())
    sql.execute(f"insert into orders(id, message, region) values {values}")


def tail_json(cli: Cli, address: str, *args: str, count: int) -> list[dict[str, object]]:
    """What `msgtable tail orders ... --json --count N` printed once it has N messages."""
    tail = cli.start("tail", "orders", *args, "--json", "--count", str(count), "--server", address)
    lines = wait_until(
        lambda: _lines(tail, count),
        timeout_s=30,
        what=lambda: f"{count} messages from tail {' '.join(args)}:\n{tail.describe()}",
    )
    assert tail.wait() == 0, tail.describe()
    return [json.loads(line) for line in lines]


def _lines(process: Process, count: int) -> list[str] | None:
    lines = process.stdout.splitlines()
    return lines if len(lines) >= count else None


def state_ids(sql: Sql) -> set[int]:
    return {row[0] for row in sql.rows("select id from orders__eu")}


def listed(cli: Cli, address: str) -> list[dict[str, object]]:
    done = cli.run("subscription", "list", "orders", "--json", "--server", address)
    assert done.returncode == 0, describe(done)
    return [json.loads(line) for line in done.stdout.splitlines()]


def _row(cli: Cli, address: str, lag: str) -> list[str] | None:
    """The first row of `msgtable subscription list`, split, once its LAG is `lag`."""
    done = cli.run("subscription", "list", "--server", address)
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    return rows[0] if rows and rows[0][4] == lag else None


def test_a_subscription_is_created_listed_read_altered_and_dropped_from_the_command_line(
    cli: Cli, sql: Sql, db_dsn: str
):
    create_orders(sql)
    serve = cli.serve("--dsn", db_dsn, "--no-lease", "--discovery-interval", "0.5")
    address = serve.address

    made = cli.run(
        "subscription", "create", "orders", "eu", "--filter", "region = 'eu'", "--server", address
    )
    assert made.returncode == 0, describe(made)
    assert made.stdout == (
        "created subscription orders/eu: messages matching \"region = 'eu'\" enqueued from now on\n"
    ), describe(made)

    # a bad filter: one line naming the position, and nothing created
    bad = cli.run(
        "subscription", "create", "orders", "typo", "--filter", BAD_FILTER, "--server", address
    )
    line = assert_one_line_error(bad, "filter: at position 19", "amont")
    assert bad.returncode == 1, line
    assert [s["subscription"] for s in listed(cli, address)] == ["eu"]

    # list: a table, and JSON lines
    table = cli.run("subscription", "list", "--server", address)
    assert table.returncode == 0, describe(table)
    header, row = table.stdout.splitlines()
    assert header.split() == [
        "TABLE", "SUBSCRIPTION", "STATE", "SUBSCRIBERS", "LAG", "OLDEST", "HOLDING", "FILTER"
    ], describe(table)  # fmt: skip
    assert row.split() == ["orders", "eu", "active", "0", "0", "-", "yes", "region", "=", "'eu'"]
    (entry,) = listed(cli, address)
    assert (entry["state"], entry["filter"], entry["holding"]) == ("active", "region = 'eu'", True)

    # tail --subscription gets the matching messages only, and acks them there
    enqueue(sql, {1: "eu", 2: "us", 3: "eu", 4: "us", 5: "eu", 6: "us"})
    wait_until(
        lambda: state_ids(sql) == {1, 3, 5},
        timeout_s=30,
        what=lambda: f"rows 1, 3 and 5 handed to orders/eu (it has {sorted(state_ids(sql))})",
    )
    waiting = wait_until(
        lambda: _row(cli, address, lag="3"),
        timeout_s=30,
        what=lambda: f"a lag of 3 in the list: {listed(cli, address)}",
    )
    assert re.fullmatch(r"\d+(\.\d)?s", waiting[5]), waiting  # OLDEST: its age
    got = tail_json(cli, address, "--subscription", "eu", "--ack", count=3)
    assert sorted(int(str(m["id"])) for m in got) == [1, 3, 5]
    assert {m["region"] for m in got} == {"eu"}
    wait_until(
        lambda: listed(cli, address)[0]["lag"] == 0,
        timeout_s=30,
        what=lambda: f"a lag of 0 once tail acked all three: {listed(cli, address)}",
    )
    acked = sql.rows("select id from orders__eu where time_acked is not null order by id")
    assert [r[0] for r in acked] == [1, 3, 5]
    assert sql.rows("select count(*) from orders where time_acked is not null") == [(0,)]

    # tables: the subscription under its table
    tables = cli.run("tables", "--server", address)
    assert tables.returncode == 0, describe(tables)
    section = tables.stdout.split("subscriptions:\n", 1)
    assert len(section) == 2, describe(tables)
    rows = [ln.split() for ln in section[1].splitlines()]
    assert rows[0][:3] == ["TABLE", "UNSEEN", "STATE"], describe(tables)
    assert rows[1] == ["orders", "0"], describe(tables)
    assert rows[2][:6] == ["eu", "active", "0", "0", "-", "yes"], describe(tables)

    # alter: the new filter and columns apply to what comes from now on
    altered = cli.run(
        "subscription", "alter", "orders", "eu", "--filter", "region = 'us'",
        "--columns", "id,region", "--server", address,
    )  # fmt: skip
    assert altered.returncode == 0, describe(altered)
    assert altered.stdout.startswith("altered subscription orders/eu: filter \"region = 'us'\"")
    enqueue(sql, {7: "eu", 8: "us"})
    (message,) = tail_json(cli, address, "--subscription", "eu", "--ack", count=1)
    assert message == {"id": 8, "region": "us"}
    assert state_ids(sql) == {1, 3, 5, 8}  # 7 (eu) came after the new filter: not handed over
    assert listed(cli, address)[0]["filter"] == "region = 'us'"
    refused = cli.run(
        "subscription", "alter", "orders", "eu", "--filter", BAD_FILTER, "--server", address
    )
    assert_one_line_error(refused, "filter: at position 19")
    assert listed(cli, address)[0]["filter"] == "region = 'us'"

    # dead: a subscription's dead messages, dead in place in its state table
    enqueue(sql, {9: "us"})
    wait_until(lambda: 9 in state_ids(sql), timeout_s=30, what="row 9 handed to orders/eu")
    sql.execute(
        "update orders__eu set time_next = 9223372036854775807, last_error = 'bad payload' "
        "where id = 9"
    )
    dead = cli.run("dead", "orders", "--subscription", "eu", "--server", address)
    assert dead.returncode == 0, describe(dead)
    assert "bad payload" in dead.stdout and re.search(r"^9\s", dead.stdout, re.M), describe(dead)
    table_dead = cli.run("dead", "orders", "--server", address)
    assert "bad payload" not in table_dead.stdout, describe(table_dead)
    # redrive: it lives again for the subscription (fresh: epoch 0, due now)
    redriven = cli.run("redrive", "orders", "--subscription", "eu", "--server", address)
    assert redriven.returncode == 0, describe(redriven)
    assert "moved 1 dead message of subscription orders/eu back to it" in redriven.stdout
    alive = "select epoch, time_next < 9223372036854775807 from orders__eu where id = 9"
    assert sql.rows(alive)[0] == (0, 1)
    with_to = cli.run(
        "redrive", "orders", "--subscription", "eu", "--to", "orders", "--server", address
    )
    assert_one_line_error(with_to, "no --to with subscription orders/eu")

    # drop: gone, with its state table; a second drop is one line saying so
    dropped = cli.run("subscription", "drop", "orders", "eu", "--server", address)
    assert dropped.returncode == 0, describe(dropped)
    assert dropped.stdout == "dropped subscription orders/eu and its state table orders__eu\n"
    assert sql.rows("show tables like 'orders\\_\\_eu'") == []
    none = cli.run("subscription", "list", "--server", address)
    assert none.stdout == "no subscriptions\n", describe(none)
    again = cli.run("subscription", "drop", "orders", "eu", "--server", address)
    assert_one_line_error(again, "orders/eu", "not found")
    gone = cli.run("tail", "orders", "--subscription", "eu", "--server", address)
    assert_one_line_error(gone, "orders/eu")
    tables = cli.run("tables", "--server", address)
    assert "subscriptions:" not in tables.stdout, describe(tables)
    assert re.search(r"^orders\s", tables.stdout, re.MULTILINE), describe(tables)
