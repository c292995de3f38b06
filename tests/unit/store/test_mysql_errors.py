"""msgtable.store.mysql's reading of driver errors: the binlog readers' "it will not work here"."""

from __future__ import annotations

import pymysql

from msgtable.errors import DatabaseUnavailable
from msgtable.store.mysql import database_error, replication_refused


def test_a_refused_replication_says_which_privileges_the_user_needs():
    exc = pymysql.err.OperationalError(1227, "Access denied; you need the REPLICATION SLAVE")
    why = replication_refused(exc)
    assert why is not None and why.startswith("the database refused (")
    assert why.endswith("the msgtable user needs REPLICATION SLAVE and REPLICATION CLIENT")
    wrapped = RuntimeError("binlog stream failed")
    wrapped.__cause__ = pymysql.err.OperationalError(1236, "no binlog")
    assert replication_refused(wrapped) is not None


def test_other_errors_are_for_a_retry():
    assert replication_refused(pymysql.err.OperationalError(2013, "Lost connection")) is None
    assert replication_refused(ValueError("x")) is None


def test_a_wrong_password_is_no_replication_refusal_but_the_database_refusing_the_dsn():
    """Issue 39: 1045 (Access denied, using password: YES) is the account or its password,
    which keeps the whole server waiting, not the binlog's grants."""
    exc = pymysql.err.OperationalError(
        1045, "Access denied for user 'mq'@'10.0.0.7' (using password: YES)"
    )
    assert replication_refused(exc) is None
    error = database_error(exc)
    assert isinstance(error, DatabaseUnavailable)
    assert str(error).startswith("database unavailable: (1045) Access denied for user 'mq'")
    assert "the DSN's user or password is wrong" in str(error)
