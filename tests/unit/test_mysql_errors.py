"""msgtable.mysql's reading of driver errors: the binlog readers' "it will not work here"."""

from __future__ import annotations

import pymysql

from msgtable.mysql import replication_refused


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
