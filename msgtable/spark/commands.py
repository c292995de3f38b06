"""The pipeline's commands, ``msgtable archive`` and ``msgtable report`` (msgtable.cli parses
their arguments)."""

from __future__ import annotations

import argparse
import sys
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
        raise InvalidArgument(
            "this command runs on Spark: pip install 'msgtable[spark]' (and a Java 17 runtime)"
        ) from None


@contextmanager
def _session(master: str | None, app_name: str) -> Iterator[SparkSession]:
    """A command's Spark session, named on stderr (which Spark ran the job), stopped when the
    command ends."""
    from msgtable.spark.session import describe_session, session

    spark = session(master, app_name)
    print(f"msgtable: {describe_session(spark)}", file=sys.stderr)
    try:
        yield spark
    finally:
        spark.stop()


def archive_command(args: argparse.Namespace) -> int:
    _pyspark()
    if not args.dsn:
        raise InvalidArgument("archive needs the database: --dsn URL or MSGTABLE_DSN")
    from msgtable.spark.archive import archive

    with _session(args.master, "msgtable-archive") as spark:
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
    from msgtable.spark.report import build_report, write_html

    with _session(args.master, "msgtable-report") as spark:
        report = build_report(spark, args.name, dsn=args.dsn, archive=args.archive)
    sys.stdout.write(report.text())
    html = Path(args.html or f"{args.name}-report.html")
    write_html(report, html)
    print(f"HTML report: {html}")
    return 0
