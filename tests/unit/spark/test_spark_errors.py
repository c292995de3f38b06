"""What a Spark job's failure means (msgtable.spark.errors), on the texts Spark really wraps its
causes in (PySpark 4.0 with MariaDB Connector/J 2.7, copied from real runs). Needs no Spark:
the wrappers are stand-ins whose module is PySpark's or Py4J's, as the real ones' is."""

from __future__ import annotations

import errno

import pymysql
import pytest

from msgtable.errors import MsgtableError, TableNotFound, Unavailable
from msgtable.spark.errors import SparkError, spark_error, spark_errors
from msgtable.spark.source import DuplicateMessage


class AnalysisException(Exception):
    """Stands for pyspark.errors.exceptions.captured.AnalysisException."""


class PythonException(Exception):
    """Stands for pyspark.errors.exceptions.captured.PythonException."""


class Py4JJavaError(Exception):
    """Stands for py4j.protocol.Py4JJavaError."""


AnalysisException.__module__ = PythonException.__module__ = "pyspark.errors.exceptions.captured"
Py4JJavaError.__module__ = "py4j.protocol"


def wrapped(cls: type[Exception], text: str, java: str = "") -> Exception:
    """``cls(text)`` as PySpark raises it: while handling the Py4JJavaError of ``java``."""
    try:
        try:
            raise Py4JJavaError(java or "An error occurred while calling o41.load.\n")
        except Py4JJavaError:
            raise cls(text) from None
    except Exception as exc:
        return exc


def worker_traceback(*frames_and_lines: str) -> str:
    return "Traceback (most recent call last):\n" + "\n".join(frames_and_lines)


SCHEMA_FAILED = (
    "[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: "
    + worker_traceback(
        '  File "/work/msgtable/spark/source.py", line 78, in schema',
        "    return spark_schema(self.config().columns)",
        "                        ^^^^^^^^^^^^^",
        '  File "/work/msgtable/store/mysqlstore.py", line 279, in _errors',
        "    raise database_error(exc, table) from exc",
        "msgtable.errors.MsgtableError: database error: (1045) Access denied for user "
        "'msgtable'@'127.0.0.1' (using password: YES)",
        " SQLSTATE: 38000",
    )
)

READ_FAILED = "An exception was thrown from the Python worker:\n" + worker_traceback(
    '  File "/work/msgtable/spark/source.py", line 143, in read',
    "    cur.execute(sql, args)",
    '  File "/venv/lib/python3.11/site-packages/pymysql/err.py", line 154, in raise_mysql_e',
    "    raise errorclass(errno, errval, sqlstate=sqlstate)",
    "pymysql.err.ProgrammingError: (1146, \"Table 'msgtable.sid' doesn't exist\")",
)

JDBC_FAILED = "[FAILED_JDBC.CONNECTION] Failed JDBC jdbc:mysql:*********(redacted) on the " \
    "operation: Couldn't connect to the database SQLSTATE: HV000"  # fmt: skip


def java_trace(*causes: str) -> str:
    lines = ["An error occurred while calling o39.jdbc.", f": {JDBC_FAILED}"]
    for cause in causes:
        lines += [f"Caused by: {cause}", "\tat org.mariadb.jdbc.Driver.connect(Driver.java:1)"]
    return "\n".join(lines)


def test_a_msgtable_error_raised_in_a_data_source_worker_is_itself_again():
    meant = spark_error(wrapped(AnalysisException, SCHEMA_FAILED))
    assert type(meant) is MsgtableError
    assert str(meant) == (
        "database error: (1045) Access denied for user 'msgtable'@'127.0.0.1' (using password: YES)"
    )


def test_the_worker_error_keeps_its_class():
    text = worker_traceback(
        '  File "x.py", line 1, in config',
        "msgtable.errors.TableNotFound: no message table 'x' in db",
    )
    meant = spark_error(wrapped(AnalysisException, "[PYTHON_DATA_SOURCE_ERROR] " + text))
    assert isinstance(meant, TableNotFound) and str(meant) == "no message table 'x' in db"
    dup = worker_traceback(
        '  File "x.py", line 1, in write',
        "msgtable.spark.source.DuplicateMessage: partition 0: Duplicate entry '1' for key 'P'",
    )
    assert isinstance(spark_error(wrapped(PythonException, dup)), DuplicateMessage)


def test_a_driver_error_in_a_worker_is_sorted_as_the_server_sorts_it():
    meant = spark_error(wrapped(PythonException, READ_FAILED))
    assert str(meant) == "database error: (1146) Table 'msgtable.sid' doesn't exist"
    refused = worker_traceback(
        '  File "x.py", line 1, in connect',
        "pymysql.err.OperationalError: (2003, \"Can't connect to MySQL server on '127.0.0.1' "
        '([Errno 111] Connection refused)")',
    )
    meant = spark_error(wrapped(PythonException, refused))
    assert isinstance(meant, Unavailable)
    assert str(meant).startswith("database unavailable: (2003) Can't connect to MySQL server")


def test_the_last_exception_of_a_chained_traceback_is_the_one_meant():
    text = worker_traceback(
        '  File "x.py", line 1, in discover',
        "pymysql.err.OperationalError: (1045, \"Access denied for user 'u'@'h'\")",
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        '  File "x.py", line 2, in config',
        "msgtable.errors.Unavailable: database unavailable: gone",
    )
    meant = spark_error(wrapped(AnalysisException, text))
    assert isinstance(meant, Unavailable) and str(meant) == "database unavailable: gone"


def test_a_jdbc_failure_is_its_deepest_sql_exception():
    denied = wrapped(
        AnalysisException,
        JDBC_FAILED,
        java_trace(
            "java.sql.SQLInvalidAuthorizationSpecException: Could not connect to address=(host="
            "127.0.0.1)(port=3306)(type=master) : (conn=20) Access denied for user 'msgtable'",
            "java.sql.SQLInvalidAuthorizationSpecException: (conn=20) Access denied for user "
            "'msgtable'@'127.0.0.1' (using password: YES)",
        ),
    )
    meant = spark_error(denied)
    assert isinstance(meant, Unavailable)  # refused, as a driver's 1045 is (mysql.REFUSED)
    assert str(meant) == (
        "database unavailable: Access denied for user 'msgtable'@'127.0.0.1' (using password: YES)"
    )
    refused = wrapped(
        AnalysisException,
        JDBC_FAILED,
        java_trace(
            "java.sql.SQLNonTransientConnectionException: Socket fail to connect to host:"
            "127.0.0.1, port:1. Connection refused",
            "java.net.ConnectException: Connection refused",
        ),
    )
    meant = spark_error(refused)
    assert isinstance(meant, Unavailable)
    assert str(meant) == (
        "database unavailable: Socket fail to connect to host:127.0.0.1, port:1. Connection refused"
    )


def test_any_other_spark_error_is_the_first_line_of_its_message():
    exc = wrapped(
        AnalysisException,
        "[PATH_NOT_FOUND] Path does not exist: file:/tmp/none. SQLSTATE: 42K03\n\nJVM stacktrace:\n"
        "org.apache.spark.sql.AnalysisException: ...",
    )
    meant = spark_error(exc)
    assert isinstance(meant, SparkError)
    assert str(meant) == "Spark: Path does not exist: file:/tmp/none."


def test_a_bug_in_a_worker_is_named_unexpected():
    text = worker_traceback('  File "x.py", line 1, in read', "KeyError: 'epoch'")
    meant = spark_error(wrapped(PythonException, text))
    assert isinstance(meant, SparkError)
    assert str(meant) == "unexpected KeyError in a Spark worker: 'epoch'"


def test_errors_that_are_not_spark_s_are_left_alone_but_the_driver_s_are_sorted():
    bug = ValueError("x")
    assert spark_error(bug) is bug
    mine = TableNotFound("t")
    assert spark_error(mine) is mine
    driver = pymysql.err.OperationalError(2003, "Can't connect")
    assert isinstance(spark_error(driver), Unavailable)
    disk = PermissionError(errno.EACCES, "Permission denied", "/archive/_runs")
    assert str(spark_error(disk)) == "Permission denied: /archive/_runs"


def test_spark_errors_raises_what_the_failure_means_chained_to_it():
    failure = wrapped(PythonException, READ_FAILED)
    with pytest.raises(MsgtableError, match=r"\(1146\)") as caught, spark_errors():
        raise failure
    assert caught.value.__cause__ is failure
    with pytest.raises(ValueError), spark_errors():
        raise ValueError("a bug stays a bug")
