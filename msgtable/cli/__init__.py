"""The ``msgtable`` command: serve, tables, tail, subscription, dead, redrive, archive, report.

    msgtable serve [--dsn URL] [--listen HOST:PORT]   run the server (no DSN: a throwaway
                                                       local MariaDB/MySQL with a demo table)
    msgtable serve --keyspace-file F --shard -80       serve one shard of a keyspace
    msgtable gateway --keyspace-file F                 one endpoint for all of its shards
    msgtable tables [--server HOST:PORT]               every message table, its config and state
    msgtable tail NAME [--ack] [--count N] [--json]    print messages as they arrive
                  [--subscription SUB]                 (as a subscription of the table)
    msgtable subscription create|alter TABLE NAME      a subscription's filter, columns and
                  [--filter TEXT] [--columns A,B] ...  settings (alter: '' or 0 clears one)
    msgtable subscription drop TABLE NAME / list       drop one / list them with lag and state
    msgtable endpoint set TABLE URL [--subscription S]  push a table or subscription by HTTP
                  [--secret-file F] / drop TABLE / list (CloudEvents, signed); drop / list them
    msgtable schedule create NAME TABLE 'CRON'        a message at each tick, exactly once
                  [--values JSON] [--timezone TZ] [--missed skip|once] / list / drop NAME
    msgtable dead NAME / redrive NAME [--to TABLE]     dead letters: list them, move them back
    msgtable archive NAME --to PATH / report NAME      the Spark pipeline's jobs

Flags fall back to MSGTABLE_* environment variables (flags.py declares them). Errors are one
message on stderr and a non-zero exit status, never a traceback (``--verbose`` logs the
traceback). The package: flags.py (the commands and flags, as data), serve.py (serve),
commands.py (the others), output.py (what they print), logs.py (how they log).

Modules:
    commands   The client-side commands
    flags      The ``msgtable`` command's commands and flags, declared as data
    gateway    ``msgtable gateway``
    logs       What the ``msgtable`` command logs, and how it looks
    output     What the ``msgtable`` command prints
    schedules  ``msgtable schedule create / list / drop``
    serve      ``msgtable serve``
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

import grpc

from msgtable.cli import commands, logs, schedules
from msgtable.cli.flags import build_parser
from msgtable.client import error_from_rpc
from msgtable.errors import MsgtableError, ServerUnreachable

log = logging.getLogger("msgtable.cli")

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130

# The third-party packages of the server side (the server extra: pip install 'msgtable[server]');
# a client-only install runs the commands that only call a server.
SERVER_PACKAGES = frozenset(
    {"sqlalchemy", "pymysql", "pymysqlreplication", "cryptography", "urllib3", "werkzeug"}
    | {"cheroot", "prometheus_client", "grpc_health", "grpc_reflection", "MySQLdb"}
)


def _server_side(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """A command that runs a server (serve, gateway): its module is imported when it runs, so
    that the client's commands need none of the server's packages."""

    def run(args: argparse.Namespace) -> int:
        try:
            command = getattr(importlib.import_module(f"msgtable.cli.{module}"), name)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] not in SERVER_PACKAGES:
                raise
            raise MsgtableError(
                f"msgtable {args.command} runs a server, and this install has the client only "
                f"(no module {exc.name!r}): pip install 'msgtable[server]'"
            ) from None
        result: int = command(args)
        return result

    return run


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": _server_side("serve", "serve"),
    "gateway": _server_side("gateway", "gateway"),
    "tables": commands.tables,
    "tail": commands.tail,
    "subscription create": commands.subscription_create,
    "subscription alter": commands.subscription_alter,
    "subscription drop": commands.subscription_drop,
    "subscription list": commands.subscription_list,
    "endpoint set": commands.endpoint_set,
    "endpoint drop": commands.endpoint_drop,
    "endpoint list": commands.endpoint_list,
    "schedule create": schedules.create,
    "schedule list": schedules.listed,
    "schedule drop": schedules.drop,
    "dead": commands.dead,
    "redrive": commands.redrive,
    "archive": commands.archive,
    "report": commands.report,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(getattr(args, "log_level", "warning"), args.verbose)
    command = COMMANDS[" ".join(filter(None, (args.command, getattr(args, "action", None))))]
    try:
        return command(args)
    except MsgtableError as exc:
        log.debug("the error in full", exc_info=True)
        return fail(said(exc, args))
    except grpc.RpcError as exc:  # the client maps these; this is a safety net
        return fail(said(error_from_rpc(exc, getattr(args, "server", "")), args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        log.debug("unexpected error", exc_info=True)
        return fail(f"unexpected {type(exc).__name__}: {exc} (--verbose shows more)")


def said(exc: MsgtableError, args: argparse.Namespace) -> str:
    """An error as a command says it: no server at the address a client command was given
    also names where that address comes from."""
    if isinstance(exc, ServerUnreachable) and getattr(args, "server", None) is not None:
        return (
            f"{exc} (no msgtable server there? start one with msgtable serve, or give its "
            "address with --server or MSGTABLE_SERVER)"
        )
    return str(exc)


def fail(message: str, stream: TextIO | None = None) -> int:
    print(f"msgtable: error: {message}", file=stream or sys.stderr)
    return EXIT_ERROR
