"""A subscription's own limits from the command line: `msgtable subscription create / alter
--rate ... --max-in-flight ...`, shown by `msgtable tables` and `subscription list --json`;
a bad value is one line naming the field, and nothing is written."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from .helpers import Cli, assert_one_line_error, describe, wait_until
from .test_subscriptions_cli import create_orders, listed

if TYPE_CHECKING:
    from tests.conftest import Sql

pytestmark = pytest.mark.timeout(120)


def flow_section(cli: Cli, address: str) -> list[str]:
    """The lines of `msgtable tables`' flow control section."""
    done = cli.run("tables", "--server", address)
    assert done.returncode == 0, describe(done)
    lines = done.stdout.splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith("flow control")), None)
    if at is None:
        return []
    section = []
    for line in lines[at + 1 :]:
        if not line.startswith("  "):
            break
        section.append(line.strip())
    return section


def test_a_subscriptions_own_limits_are_set_shown_and_altered_from_the_command_line(
    cli: Cli, sql: Sql, db_dsn: str
):
    create_orders(sql)
    address = cli.serve("--dsn", db_dsn, "--no-lease", "--discovery-interval", "0.5").address

    for flags, fragments in (
        (("--rate", "fast"), ("subscription orders/capped: rate='fast' is not a rate",)),
        (("--max-in-flight", "0"), ("max_in_flight=0 must be between 1 and",)),
        (("--key-rate", "5/s"), ("key_rate needs the table's vt_limit_key",)),
    ):
        bad = cli.run("subscription", "create", "orders", "capped", *flags, "--server", address)
        line = assert_one_line_error(bad, *fragments)
        assert bad.returncode == 1, line
    assert listed(cli, address) == [], "a refused create made a subscription"

    made = cli.run(
        "subscription", "create", "orders", "capped", "--rate", "30/m", "--max-in-flight", "3",
        "--server", address,
    )  # fmt: skip
    assert made.returncode == 0, describe(made)
    (entry,) = listed(cli, address)
    assert entry["limits"] == "rate 0.5/s (burst 1), max in flight 3", entry
    section = wait_until(
        lambda: flow_section(cli, address),
        timeout_s=30,
        what="a flow control section in msgtable tables",
    )
    assert section == ["orders/capped: rate 0.5/s (burst 1), max in flight 3; held back: never"]

    bad = cli.run(
        "subscription", "alter", "orders", "capped", "--rate-burst", "x", "--server", address
    )
    assert_one_line_error(bad, "rate_burst='x' is not a whole number")
    (entry,) = listed(cli, address)
    assert entry["limits"] == "rate 0.5/s (burst 1), max in flight 3", "a refused alter changed it"

    altered = cli.run(
        "subscription", "alter", "orders", "capped", "--rate", "off", "--max-in-flight", "",
        "--server", address,
    )  # fmt: skip
    assert altered.returncode == 0, describe(altered)
    assert altered.stdout == (
        "altered subscription orders/capped: rate off, max in flight the table's\n"
    ), describe(altered)
    (entry,) = listed(cli, address)
    assert entry["limits"] == "", json.dumps(entry)
    assert flow_section(cli, address) == []
