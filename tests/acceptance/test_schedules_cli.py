"""Schedules from the command line: `msgtable schedule create / list / drop` and `msgtable
tables`, against a real `msgtable serve` (the admin rpcs CreateSchedule, ListSchedules and
DropSchedule underneath)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from msgtable.core.tables import current_layout_ddl
from tests.integration.helpers import comment

from .helpers import Cli, assert_one_line_error, describe, wait_until

if TYPE_CHECKING:
    from tests.conftest import Sql

pytestmark = pytest.mark.timeout(120)


def test_a_schedule_is_created_ticks_is_listed_and_dropped_from_the_command_line(
    cli: Cli, sql: Sql, db_dsn: str
):
    sql.execute(current_layout_ddl("jobs", comment(vt_poller_interval=0.2)))
    serve = cli.serve("--dsn", db_dsn, "--no-lease", "--discovery-interval", "0.5")
    address = serve.address

    made = cli.run(
        "schedule", "create", "beat", "jobs", "* * * * * *", "--values",
        '{"message": "beat"}', "--timezone", "Europe/Paris", "--server", address,
    )  # fmt: skip
    assert made.returncode == 0, describe(made)
    assert made.stdout.startswith(
        "created schedule beat: '* * * * * *' in Europe/Paris into table jobs, first tick "
    ), describe(made)
    wait_until(
        lambda: sql.scalar("select count(*) from jobs where message = 'beat'") >= 2,
        timeout_s=15,
        what="two ticks enqueued",
    )

    bad = cli.run("schedule", "create", "typo", "jobs", "*/0 * * * *", "--server", address)
    line = assert_one_line_error(bad, "field 1 (minute)", "'*/0'")
    assert bad.returncode == 1, line

    listed = cli.run("schedule", "list", "--server", address)
    assert listed.returncode == 0, describe(listed)
    header, row = listed.stdout.splitlines()
    assert header.split()[:4] == ["SCHEDULE", "TABLE", "CRON", "TIMEZONE"]
    assert row.startswith("beat") and "Europe/Paris" in row

    as_json = cli.run("schedule", "list", "jobs", "--json", "--server", address)
    (entry,) = [json.loads(x) for x in as_json.stdout.splitlines()]
    assert (entry["name"], entry["values"], entry["missed"]) == (
        "beat",
        {"message": "beat"},
        "skip",
    )

    tables = wait_until(
        lambda: (
            (done := cli.run("tables", "--server", address)).stdout.count("jobs <- beat") and done
        ),
        timeout_s=10,
        what="msgtable tables shows the schedule",
    )
    assert "last tick" in tables.stdout and "next " in tables.stdout, describe(tables)
    tables_json = cli.run("tables", "--json", "--server", address)
    assert tables_json.returncode == 0, describe(tables_json)

    dropped = cli.run("schedule", "drop", "beat", "--server", address)
    assert dropped.stdout == "dropped schedule beat\n", describe(dropped)
    again = cli.run("schedule", "drop", "beat", "--server", address)
    assert again.stdout == "no schedule beat: nothing to drop\n", describe(again)
    assert cli.run("schedule", "list", "--server", address).stdout == "no schedules\n"
