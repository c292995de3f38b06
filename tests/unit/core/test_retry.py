"""msgtable.core.retry: the backoff of a retrying loop and the one way it logs trouble; and
msgtable.store.mysql.sorted_error, which tells the database's trouble from a bug."""

from __future__ import annotations

import logging
import random

import pymysql
import pytest

from msgtable.core.retry import Backoff, Outage, Retry
from msgtable.errors import DatabaseUnavailable, MsgtableError, Unavailable
from msgtable.store.mysql import sorted_error

log = logging.getLogger("msgtable.test_retry")


def test_the_backoff_doubles_from_its_first_wait_up_to_its_ceiling():
    backoff = Backoff(0.2, 1.0)
    assert [backoff.delay_s(n) for n in range(1, 6)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff.delay_s(10_000) == 1.0


def test_full_jitter_draws_between_half_and_all_of_the_ceiling():
    backoff = Backoff(0.1, 5.0, jitter=True, rng=random.Random(7))
    waits = [backoff.delay_s(3) for _ in range(500)]
    assert all(0.2 <= w <= 0.4 for w in waits) and len(set(waits)) > 400


def test_a_run_of_failures_logs_its_first_at_warning_the_rest_at_debug_and_its_recovery(caplog):
    retry = Retry("table t: poll", log, Backoff(0.2, 1.0))
    with caplog.at_level(logging.DEBUG, logger=log.name):
        assert retry.failed(Unavailable("gone")) == 0.2
        assert retry.failed(Unavailable("gone")) == 0.4
        retry.succeeded()
        retry.succeeded()  # no run of failures: nothing to say
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert levels == [
        ("WARNING", "table t: poll failed: gone; retrying in 0.2s"),
        ("DEBUG", "table t: poll failed (2 in a row): gone; retrying in 0.4s"),
        ("INFO", "table t: poll works again (after 2 failures)"),
    ]
    assert all(r.exc_info is None for r in caplog.records)
    assert retry.failures == 0


def test_an_error_that_is_no_msgtable_error_is_a_bug_logged_with_its_traceback(caplog):
    retry = Retry("lease", log, Backoff(1.0, 1.0))
    with caplog.at_level(logging.DEBUG, logger=log.name):
        retry.failed(KeyError("surprise"))
    (record,) = caplog.records
    assert record.levelname == "ERROR" and record.exc_info is not None


def test_a_caller_may_name_the_attempt_its_wait_and_the_level_of_an_expected_failure(caplog):
    retry = Retry("stream of t", log, Backoff(1.0, 1.0))
    with caplog.at_level(logging.DEBUG, logger=log.name):
        assert retry.failed(Unavailable("not the leader"), delay_s=0.0, level=logging.INFO) == 0
        retry.failed(Unavailable("still not"), what="stream of t (again)")
    assert [r.levelname for r in caplog.records] == ["INFO", "DEBUG"]
    assert caplog.records[1].getMessage().startswith("stream of t (again) failed (2 in a row)")


@pytest.mark.parametrize(
    "raw",
    [
        pymysql.err.OperationalError(2003, "Can't connect to MySQL server"),
        pymysql.err.InterfaceError(0, ""),
        ConnectionError("the binlog stream ended"),
    ],
)
def test_the_databases_trouble_is_sorted_as_unavailable_not_as_a_bug(raw):
    assert isinstance(sorted_error(raw), Unavailable)


def test_a_bug_and_a_msgtable_error_stay_as_they_are():
    bug, ours = KeyError("x"), MsgtableError("y")
    assert sorted_error(bug) is bug and sorted_error(ours) is ours


def test_an_outage_is_said_once_when_it_begins_and_once_when_it_ends(caplog):
    outage = Outage("the database at db:3306", log, tell=True)
    with caplog.at_level(logging.DEBUG, logger=log.name):
        outage.up()  # nothing to say: it answers
        outage.down(Unavailable("database unavailable: (2003) refused"))
        outage.down(Unavailable("database unavailable: (1045) Access denied"))
        assert outage.away and outage.reason == "(1045) Access denied"
        assert outage.describe().startswith("waiting for the database at db:3306 since ")
        outage.up()
        outage.up()
    assert [(r.levelname, r.getMessage().split(" after ")[0]) for r in caplog.records] == [
        ("WARNING", "waiting for the database at db:3306: (2003) refused"),
        ("INFO", "the database at db:3306 answers again"),
    ]
    assert not outage.away and outage.describe() == ""


def test_a_loop_with_an_outage_leaves_the_database_to_it(caplog):
    outage = Outage("the database at db:3306", log, tell=True)
    retry = Retry("table t: poll", log, Backoff(0.2, 1.0), outage=outage)
    with caplog.at_level(logging.DEBUG, logger=log.name):
        retry.failed(DatabaseUnavailable("database unavailable: (2003) refused"))
        retry.succeeded()
        retry.failed(Unavailable("not the database"))  # other trouble: the loop says so
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert levels[0] == ("WARNING", "waiting for the database at db:3306: (2003) refused")
    assert [level for level, _ in levels[1:]] == ["DEBUG", "DEBUG", "WARNING"]
    assert outage.away  # only a statement that went through says it is back
