"""The Spark pipeline fails in one line that names the cause.

In-process, on a real local Spark session: what the data source's Python workers and Spark's
JDBC reader raise (wrapped by PySpark and Py4J) is unwrapped to the msgtable error it means.
As a user runs them: `msgtable report` and `msgtable archive` with a wrong password, an
unknown table, an unreachable port, no Java, a Java that does not start, and a failure inside
Spark print one `msgtable: error:` line (no traceback, none of Spark's output) and exit 1;
`--verbose` shows the rest."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy

from msgtable.core.tables import current_layout_ddl
from msgtable.errors import MsgtableError, TableNotFound, Unavailable
from msgtable.spark.errors import spark_error
from msgtable.spark.jdbc import read_query
from msgtable.testing.devdb import free_port

from ..acceptance.helpers import assert_one_line_error, describe
from ..integration.helpers import comment

SPARK_RUN_TIMEOUT_S = 240  # a command that starts Spark (several seconds on a busy machine)
ACCESS_DENIED = "Access denied for user 'msgtable'"


def with_url(dsn: str, **parts: object) -> str:
    return sqlalchemy.make_url(dsn).set(**parts).render_as_string(hide_password=False)


def failure(action) -> BaseException:
    try:
        action()
    except Exception as exc:
        return exc
    raise AssertionError("it did not fail")


# -- in-process: the errors Spark wraps ------------------------------------------------------
def test_a_wrong_password_in_the_data_source_is_the_database_s_answer(spark, sql, db_dsn):
    sql.execute(current_layout_ddl("m", comment()))
    wrong = with_url(db_dsn, password="WRONG")
    exc = failure(lambda: spark.read.format("msgtable").option("dsn", wrong).load("m").count())
    meant = spark_error(exc)
    assert type(exc).__module__.startswith("pyspark")  # wrapped, the cause in its text
    assert isinstance(meant, MsgtableError)
    assert str(meant).startswith(f"database unavailable: (1045) {ACCESS_DENIED}")


def test_an_unknown_table_and_an_unreachable_database_in_the_data_source(spark, db_dsn):
    exc = failure(lambda: spark.read.format("msgtable").option("dsn", db_dsn).load("nope").count())
    meant = spark_error(exc)
    assert isinstance(meant, TableNotFound) and "no message table 'nope'" in str(meant)

    gone = with_url(db_dsn, port=free_port())
    exc = failure(lambda: spark.read.format("msgtable").option("dsn", gone).load("m").count())
    meant = spark_error(exc)
    assert isinstance(meant, Unavailable) and "t connect" in str(meant)


def test_a_failed_read_in_an_executor_is_the_driver_s_error(spark, sql, db_dsn):
    """A table with a text id is read without planning queries: its read fails in the
    executors' workers (the table is dropped after load())."""
    ddl = current_layout_ddl("texts", comment()).replace("id bigint not null", "id varchar(20)")
    sql.execute(ddl)
    sql.execute("insert into texts(id, message) values ('a', 'x')")
    df = spark.read.format("msgtable").option("dsn", db_dsn).load("texts")
    sql.execute("drop table texts")
    meant = spark_error(failure(df.count))
    assert "(1146)" in str(meant) and "texts' doesn't exist" in str(meant)


def test_a_failed_jdbc_connection_is_its_sql_exception(spark, sql, db_dsn):
    sql.execute(current_layout_ddl("m", comment()))
    query = "select * from m"
    wrong = with_url(db_dsn, password="WRONG")
    meant = spark_error(failure(lambda: read_query(spark, wrong, query, (1, 2), 1).count()))
    assert isinstance(meant, Unavailable)  # refused, as a driver's 1045 is
    assert str(meant).startswith(f"database unavailable: {ACCESS_DENIED}")

    gone = with_url(db_dsn, port=free_port())
    meant = spark_error(failure(lambda: read_query(spark, gone, query, (1, 2), 1).count()))
    assert isinstance(meant, Unavailable)
    assert "Connection refused" in str(meant)


# -- the commands, as a user runs them -------------------------------------------------------
def msgtable(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MSGTABLE_")}
    return subprocess.run(
        [sys.executable, "-m", "msgtable", *args],
        capture_output=True,
        text=True,
        timeout=SPARK_RUN_TIMEOUT_S,
        check=False,
        stdin=subprocess.DEVNULL,
        env={**base, **(env or {})},
    )


def one_line_error(done: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert done.returncode == 1, describe(done)
    return assert_one_line_error(done, *fragments)


def test_report_with_a_wrong_password_fails_in_one_line_and_verbose_shows_the_rest(
    sql, db_dsn, tmp_path
):
    sql.execute(current_layout_ddl("my_message", comment()))
    wrong = with_url(db_dsn, password="WRONG")
    done = msgtable("report", "my_message", "--dsn", wrong, "--html", str(tmp_path / "r.html"))
    one_line_error(done, "database unavailable: (1045) access denied for user 'msgtable'")
    assert not (tmp_path / "r.html").exists()

    done = msgtable("report", "my_message", "--dsn", wrong, "--verbose")
    assert done.returncode == 1, describe(done)
    assert "Traceback" in done.stderr and "OperationalError" in done.stderr, describe(done)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("msgtable: error: database unavailable: (1045)"), describe(done)


def test_report_and_archive_name_an_unknown_table_and_an_unreachable_database(
    sql, db_dsn, tmp_path
):
    done = msgtable("report", "nope", "--dsn", db_dsn)
    one_line_error(done, "no message table 'nope'")
    gone = with_url(db_dsn, port=free_port())
    done = msgtable("report", "my_message", "--dsn", gone)
    one_line_error(done, "database unavailable: (", "t connect")
    wrong = with_url(db_dsn, password="WRONG")
    done = msgtable("archive", "my_message", "--dsn", wrong, "--to", str(tmp_path / "a"))
    one_line_error(done, "database unavailable: (1045) access denied")
    done = msgtable("report", "x", "--archive", str(tmp_path / "none"))
    one_line_error(done, f"no archive at {tmp_path / 'none'}")


def test_without_java_spark_commands_say_so_in_one_line(sql, db_dsn, tmp_path):
    sql.execute(current_layout_ddl("my_message", comment()))
    done = msgtable("report", "my_message", "--dsn", db_dsn, env={"JAVA_HOME": str(tmp_path)})
    one_line_error(done, f"Spark needs Java 17 or later, and JAVA_HOME ({tmp_path}) has no")

    java = tmp_path / "jdk" / "bin" / "java"  # a Java that does not start
    java.parent.mkdir(parents=True)
    java.write_text('#!/bin/sh\necho "Error: could not find libjava.so" >&2\nexit 1\n')
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    env = {"JAVA_HOME": str(tmp_path / "jdk")}
    done = msgtable("report", "my_message", "--dsn", db_dsn, env=env)
    one_line_error(done, "Spark did not start: Error: could not find libjava.so")


def test_a_failure_inside_spark_is_one_line(tmp_path: Path):
    """Past the checks, what Spark says is hidden (without --verbose) and its error unwrapped:
    stderr is the one error line (the Spark it started is named on stdout)."""
    empty = tmp_path / "empty-archive"
    empty.mkdir()
    done = msgtable("report", "x", "--archive", str(empty), "--master", "local[1]")
    assert done.returncode == 1, describe(done)
    assert "Traceback" not in done.stderr, describe(done)
    assert done.stderr.strip().splitlines() == [
        "msgtable: error: Spark: Unable to infer schema for Parquet. It must be specified "
        "manually.",
    ], describe(done)
    assert done.stdout.splitlines()[0] == "msgtable: Spark local[1]", describe(done)


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_spark_s_own_output_shows_only_with_verbose(sql, db_dsn, tmp_path, verbose):
    sql.execute(current_layout_ddl("my_message", comment()))
    args = ["report", "my_message", "--dsn", db_dsn, "--master", "local[1]"]
    args += ["--html", str(tmp_path / "r.html")] + (["--verbose"] if verbose else [])
    done = msgtable(*args)
    assert done.returncode == 0, describe(done)
    if verbose:
        assert "log4j" in done.stderr or "WARN" in done.stderr, describe(done)
    else:
        assert done.stderr.strip() == "", describe(done)
        assert "msgtable: Spark local[1]" in done.stdout, describe(done)
