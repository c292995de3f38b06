"""Table events as a user meets them: `msgtable serve` SIGKILLed twice while an application
commits changes to a captured table; an independent checker (the application's log of what
it committed against the event table) finds every change exactly once."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import pytest

from tests.integration.test_capture import (
    EVENTS,
    Producer,
    check_exactly_once,
    event_table_ddl,
    events,
)

from .helpers import Cli, wait_until

if TYPE_CHECKING:
    from tests.conftest import Sql

pytestmark = pytest.mark.timeout(180)


class Rows:
    """What the checker reads through: the test's own connection."""

    def __init__(self, sql: Sql) -> None:
        self._sql = sql

    def sql(self, statement: str) -> Any:
        return self._sql.rows(statement)


def test_a_server_killed_while_changes_flow_loses_and_repeats_no_event(
    cli: Cli, sql: Sql, db_dsn: str
):
    sql.execute(event_table_ddl(vt_capture="orders_flow"))
    rows = Rows(sql)
    producer: Producer | None = None
    try:
        for turn in range(3):
            serve = cli.serve("--dsn", db_dsn, "--no-lease", "--discovery-interval", "0.5")
            if producer is None:
                wait_until(
                    lambda: sql.scalar(
                        "select count(*) from information_schema.TABLES where "
                        "TABLE_SCHEMA = database() and TABLE_NAME = 'msgtable_capture'"
                    ),
                    timeout_s=30,
                    what=lambda s=serve: f"the follower's position table:\n{s.describe()}",
                )
                producer = Producer(db_dsn)
            n = len(events(rows))  # type: ignore[arg-type]
            wait_until(
                lambda n=n: len(events(rows)) > n + 100,  # type: ignore[arg-type]
                timeout_s=30,
                what=lambda s=serve, t=turn: f"events flowing (turn {t}):\n{s.describe()}",
            )
            if turn < 2:
                serve.send_signal(signal.SIGKILL)  # no clean anything
                serve.wait(timeout_s=15)
                log, committed = producer.log, len(producer.log)
                wait_until(
                    lambda c=committed, log=log: len(log) > c + 100,
                    what="changes committed while no server runs",
                )
        assert producer is not None
        producer.finish()
        check_exactly_once(rows, producer.log, EVENTS)  # type: ignore[arg-type]
    finally:
        if producer is not None:
            producer.finish()
