"""The pipeline's commands, ``msgtable archive`` and ``msgtable report`` (msgtable.cli parses
their arguments)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from msgtable.errors import InvalidArgument


def _pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise InvalidArgument(
            "this command runs on Spark: pip install 'msgtable[spark]' (and a Java 17 runtime)"
        ) from None


def archive_command(args: argparse.Namespace) -> int:
    _pyspark()
    if not args.dsn:
        raise InvalidArgument("archive needs the database: --dsn URL or MSGTABLE_DSN")
    from msgtable.spark.archive import archive
    from msgtable.spark.session import describe_session, session

    spark = session(args.master, "msgtable-archive")
    print(f"msgtable: {describe_session(spark)}", file=sys.stderr)
    try:
        result = archive(spark, args.dsn, args.name, args.to, args.older_than)
    finally:
        spark.stop()
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
    from msgtable.spark.session import describe_session, session

    spark = session(args.master, "msgtable-report")
    print(f"msgtable: {describe_session(spark)}", file=sys.stderr)
    try:
        report = build_report(spark, args.name, dsn=args.dsn, archive=args.archive)
    finally:
        spark.stop()
    sys.stdout.write(report.text())
    html = Path(args.html or f"{args.name}-report.html")
    write_html(report, html)
    print(f"HTML report: {html}")
    return 0
