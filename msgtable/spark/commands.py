"""The pipeline's commands, ``msgtable archive`` and ``msgtable report`` (msgtable.cli parses
their arguments).

A command fails in one line that names the cause (msgtable.cli prints a MsgtableError so):
it checks the database and the table before Spark starts (a wrong password or table name
fails in a second, not after the JVM's start), Spark's own output goes to a temporary file
unless ``--verbose``, and what fails inside Spark is unwrapped by msgtable.spark.errors.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from msgtable.errors import InvalidArgument

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        clone = source_checkout()
        if clone is not None:  # the extra is for the published package; a clone has make
            raise InvalidArgument(
                f"this command runs on Spark, which is not installed: make spark in this clone "
                f"({clone}) installs it, with Java and the JDBC jar"
            ) from None
        raise InvalidArgument(
            "this command runs on Spark: pip install 'msgtable[spark]' (and a Java 17 runtime)"
        ) from None


def source_checkout(package: Path | None = None) -> Path | None:
    """The clone of msgtable's repository this msgtable runs from (its pyproject.toml and
    Makefile beside the package), or None for an installed package."""
    package = package or Path(__file__).resolve().parents[1]
    root = package.parent
    if (root / "pyproject.toml").is_file() and (root / "Makefile").is_file():
        return root
    return None


@contextmanager
def _session(args: argparse.Namespace, app_name: str) -> Iterator[SparkSession]:
    """A command's Spark session, named on stderr (which Spark ran the job), stopped when the
    command ends; what fails in it is raised as what it means (msgtable.spark.errors)."""
    from msgtable.spark.errors import spark_errors
    from msgtable.spark.session import describe_session, session

    with _jvm_output(args.verbose) as output, spark_errors():
        spark = session(args.master, app_name, jvm_output=output)
        print(f"msgtable: {describe_session(spark)}", flush=True)  # stderr: only an error
        try:
            yield spark
        finally:
            spark.stop()


@contextmanager
def _jvm_output(verbose: bool) -> Iterator[Path | None]:
    """Where Spark's JVM writes: this terminal with ``--verbose``, else a temporary file
    removed when the command ends."""
    if verbose:
        yield None
        return
    fd, name = tempfile.mkstemp(prefix="msgtable-spark-", suffix=".log")
    os.close(fd)
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def _check_table(dsn: str, name: str) -> None:
    """The database answers and holds message table ``name`` (else its MsgtableError)."""
    from msgtable.spark.database import describe

    describe(dsn, name)


def archive_command(args: argparse.Namespace) -> int:
    _pyspark()
    if not args.dsn:
        raise InvalidArgument("archive needs the database: --dsn URL or MSGTABLE_DSN")
    from msgtable.spark.archive import archive

    _check_table(args.dsn, args.name)
    with _session(args, "msgtable-archive") as spark:
        result = archive(spark, args.dsn, args.name, args.to, args.older_than)
    print(
        f"archived {result.copied:,} rows of {args.name} to {args.to} "
        f"(run {result.run}; {result.deleted:,} deleted; {result.seconds:.1f} s)"
    )
    if result.recovered:
        print(f"finished earlier runs: {', '.join(result.recovered)}")
    return 0


def report_command(args: argparse.Namespace) -> int:
    _pyspark()
    if not args.archive and not args.dsn:
        raise InvalidArgument("report needs --dsn URL (or MSGTABLE_DSN) or --archive PATH")
    from msgtable.spark.report import build_report
    from msgtable.spark.report_html import write_html

    if args.archive:
        if "://" not in args.archive and not Path(args.archive).exists():
            raise InvalidArgument(f"no archive at {args.archive}")
    else:
        _check_table(args.dsn, args.name)
    with _session(args, "msgtable-report") as spark:
        report = build_report(spark, args.name, dsn=args.dsn, archive=args.archive)
    sys.stdout.write(report.text())
    html = Path(args.html or f"{args.name}-report.html")
    write_html(report, html)
    print(f"HTML report: {html}")
    return 0
