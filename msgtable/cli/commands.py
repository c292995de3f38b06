"""The client-side commands: ``msgtable tables`` and ``msgtable tail`` (over gRPC), and the
Spark pipeline's ``msgtable archive`` and ``msgtable report`` (the spark extra)."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from msgtable.cli.output import format_message, format_tables
from msgtable.client import Client
from msgtable.limits import MAX_IN_FLIGHT

EXIT_OK = 0


def _client(args: argparse.Namespace) -> Client:
    return Client(args.server, token=args.token, tls_ca=args.tls_ca)


def tables(args: argparse.Namespace, out: TextIO | None = None) -> int:
    with _client(args) as client:
        status = client.status()
    print(format_tables(status.tables), file=out or sys.stdout)
    if status.database_error:
        print(f"database: {status.database_error}", file=out or sys.stdout)
    return EXIT_OK


def tail(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    seen = 0
    try:
        # With --count N the window is N: the server sends no more than tail will show, so
        # no message is left in flight unseen when it exits.
        window = min(args.count, MAX_IN_FLIGHT) if args.count is not None else 0
        with (
            _client(args) as client,
            client.subscribe(args.name, args.keyspace, max_in_flight=window, retry=False) as sub,
        ):
            for batch in sub.batches():
                if args.count is not None:
                    batch = batch[: args.count - seen]
                for message in batch:
                    print(format_message(message, sub.fields, args.json, args.time), file=out)
                out.flush()
                if args.ack:
                    sub.ack(batch)
                seen += len(batch)
                if args.count is not None and seen >= args.count:
                    break
    except KeyboardInterrupt:
        pass  # Ctrl-C is how tail ends
    return EXIT_OK


def archive(args: argparse.Namespace) -> int:
    from msgtable.spark.commands import archive_command

    return archive_command(args)


def report(args: argparse.Namespace) -> int:
    from msgtable.spark.commands import report_command

    return report_command(args)
