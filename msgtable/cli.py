"""The ``msgtable`` command: serve, tables, tail.

    msgtable serve [--dsn URL] [--listen HOST:PORT]   run the server (no DSN: a throwaway
                                                       local MariaDB/MySQL with a demo table)
    msgtable tables [--server HOST:PORT]               every message table, its config and state
    msgtable tail NAME [--ack] [--count N] [--json]    print messages as they arrive

Flags fall back to MSGTABLE_* environment variables. Errors are one message on stderr and a
non-zero exit status, never a traceback (``--log-level debug`` logs the traceback).
"""

from __future__ import annotations

import argparse
import decimal
import json
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

import grpc

from msgtable import __version__
from msgtable.auth import Authorizer
from msgtable.client import Client, Field, Message, TableInfo, error_from_rpc
from msgtable.errors import InvalidArgument, MsgtableError
from msgtable.lease import DEFAULT_LEASE_PERIOD_S
from msgtable.limits import (
    DEFAULT_ADDRESS,
    DEFAULT_MAX_STREAMS_PER_CLIENT,
    DEFAULT_MAX_SUBSCRIBERS_PER_TABLE,
)
from msgtable.server import DEFAULT_GRACE_S, MessagingServer, TlsFiles
from msgtable.tables import DEFAULT_DISCOVERY_INTERVAL_S

if TYPE_CHECKING:
    from msgtable.devdb import LocalServer
    from msgtable.engine import MessageEngine

log = logging.getLogger("msgtable.cli")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130
DEMO_DATABASE = "msgtable"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


# -- arguments ----------------------------------------------------------------------------
def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name) or default


def _env_on(name: str) -> bool:
    """A switch that is on unless the variable says 0, false, no or off."""
    return (_env(name) or "1").strip().lower() not in ("0", "false", "no", "off")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be more than zero, not {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, not {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="msgtable",
        description="A message-table engine for MySQL: enqueue with SQL, stream over gRPC.",
    )
    parser.add_argument("--version", action="version", version=f"msgtable {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the server",
        description="Serve the message tables of one database over gRPC. Without a DSN, start "
        "a throwaway local MariaDB/MySQL server with a demo table (deleted on exit).",
    )
    serve.add_argument(
        "--dsn",
        default=_env("MSGTABLE_DSN"),
        help="SQLAlchemy URL of the database, e.g. "
        "mysql+pymysql://user:password@host:3306/db (env MSGTABLE_DSN)",
    )
    serve.add_argument(
        "--listen",
        default=_env("MSGTABLE_LISTEN", DEFAULT_ADDRESS),
        help=f"HOST:PORT to listen on (env MSGTABLE_LISTEN; default "
        f"{DEFAULT_ADDRESS}); elsewhere than loopback, use --tls-cert and --auth",
    )
    serve.add_argument(
        "--discovery-interval",
        type=_positive_float,
        default=_env("MSGTABLE_DISCOVERY_INTERVAL", str(DEFAULT_DISCOVERY_INTERVAL_S)),
        help="seconds between looks for new, changed and dropped message tables (env "
        f"MSGTABLE_DISCOVERY_INTERVAL; default {DEFAULT_DISCOVERY_INTERVAL_S:g})",
    )
    serve.add_argument(
        "--binlog",
        action=argparse.BooleanOptionalAction,
        default=_env_on("MSGTABLE_BINLOG"),
        help="follow the database's binlog (the default), so rows written by any client go out "
        "at once, not at the next poll; it needs a ROW binlog and REPLICATION SLAVE + "
        "REPLICATION CLIENT, and without them the server says why once and polls. "
        "--no-binlog polls only (env MSGTABLE_BINLOG=0)",
    )
    serve.add_argument(
        "--lease",
        action=argparse.BooleanOptionalAction,
        default=_env_on("MSGTABLE_LEASE"),
        help="share the database with other msgtable servers (the default): the one holding "
        "the lease (the table msgtable_lease) sends, the others answer subscribers with "
        "UNAVAILABLE and its address. --no-lease: this server is the only one "
        "(env MSGTABLE_LEASE=0)",
    )
    serve.add_argument(
        "--lease-period",
        type=_positive_float,
        default=_env("MSGTABLE_LEASE_PERIOD", str(DEFAULT_LEASE_PERIOD_S)),
        metavar="SECONDS",
        help="how long a lease lasts unless renewed; another server takes over within two "
        f"(env MSGTABLE_LEASE_PERIOD; default {DEFAULT_LEASE_PERIOD_S:g})",
    )
    serve.add_argument(
        "--advertise",
        default=_env("MSGTABLE_ADVERTISE"),
        metavar="HOST:PORT",
        help="the address other servers send clients to when this one leads (env "
        "MSGTABLE_ADVERTISE; default the listen address, or this host's name on a wildcard)",
    )
    for flag, metavar, what in (
        ("--auth", "FILE", "tokens, client certificate names and per-table rules (TOML; see "
         "the README); without it every caller may do everything"),
        ("--tls-cert", "PEM", "the server's certificate: serve TLS"),
        ("--tls-key", "PEM", "the server certificate's key"),
        ("--tls-client-ca", "PEM", "require client certificates signed by this CA"),
    ):  # fmt: skip
        _env_flag(serve, flag, metavar, what)
    serve.add_argument(
        "--max-subscribers-per-table",
        type=_positive_int,
        default=DEFAULT_MAX_SUBSCRIBERS_PER_TABLE,
        metavar="N",
        help=f"then RESOURCE_EXHAUSTED (default {DEFAULT_MAX_SUBSCRIBERS_PER_TABLE:,})",
    )
    serve.add_argument(
        "--max-streams-per-client",
        type=_positive_int,
        default=DEFAULT_MAX_STREAMS_PER_CLIENT,
        metavar="N",
        help="streams of one principal (or, without --auth, one address); then "
        f"RESOURCE_EXHAUSTED (default {DEFAULT_MAX_STREAMS_PER_CLIENT})",
    )
    serve.add_argument(
        "--grace-s",
        type=_non_negative_float,
        default=DEFAULT_GRACE_S,
        help="on SIGINT/SIGTERM, seconds to let calls in flight finish "
        f"(default {DEFAULT_GRACE_S:g})",
    )
    serve.add_argument(
        "--log-level",
        default=_env("MSGTABLE_LOG_LEVEL", "info"),
        type=str.lower,
        choices=("debug", "info", "warning", "error"),
        help="env MSGTABLE_LOG_LEVEL; default info",
    )

    server_help = f"msgtable server HOST:PORT (env MSGTABLE_SERVER; default {DEFAULT_ADDRESS})"
    tables = commands.add_parser(
        "tables",
        help="list message tables",
        description="List every message table the server knows: configuration or load "
        "error, and live counters.",
    )
    tables.add_argument(
        "--server", default=_env("MSGTABLE_SERVER", DEFAULT_ADDRESS), help=server_help
    )
    _client_flags(tables)

    tail = commands.add_parser(
        "tail",
        help="print messages as they arrive",
        description="Subscribe to a message table and print each message (id and columns) "
        "as it arrives, until Ctrl-C. Without --ack the messages are not "
        "acknowledged, so they are sent again after the table's ack wait.",
    )
    tail.add_argument("name", help="message table")
    tail.add_argument("--keyspace", default="", help="keyspace (database); default the server's")
    tail.add_argument("--ack", action="store_true", help="acknowledge each batch once printed")
    tail.add_argument(
        "--count", type=_positive_int, default=None, metavar="N", help="exit after N messages"
    )
    tail.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per line (DECIMAL as a string, binary as 0x hex)",
    )
    tail.add_argument(
        "--server", default=_env("MSGTABLE_SERVER", DEFAULT_ADDRESS), help=server_help
    )
    _client_flags(tail)
    _pipeline_commands(commands)
    return parser


def _env_flag(parser: argparse.ArgumentParser, flag: str, metavar: str, what: str) -> None:
    """A flag that falls back to its MSGTABLE_* environment variable."""
    env = "MSGTABLE_" + flag.lstrip("-").replace("-", "_").upper()
    parser.add_argument(flag, default=_env(env), metavar=metavar, help=f"{what} (env {env})")


def _client_flags(parser: argparse.ArgumentParser) -> None:
    _env_flag(parser, "--token", "TOKEN", "bearer token for a server with --auth")
    _env_flag(parser, "--tls-ca", "PEM", "connect with TLS, trusting this CA")


def _client(args: argparse.Namespace) -> Client:
    return Client(args.server, token=args.token, tls_ca=args.tls_ca)


def _duration(text: str) -> float:
    """Seconds from "90", "90s", "15m", "12h" or "7d"."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    raw = text.strip().lower()
    scale = units.get(raw[-1:], 0)
    try:
        value = float(raw[:-1] if scale else raw) * (scale or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration (90s, 15m, 12h, 7d): {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be zero or more, not {text}")
    return value


def _pipeline_commands(commands: Any) -> None:
    """archive and report: Spark jobs (the spark extra)."""
    spark_help = (
        "Spark master (default local[*]; SPARK_REMOTE selects Spark Connect instead); needs "
        "pip install 'msgtable[spark]'"
    )
    dsn_help = "SQLAlchemy URL of the database (env MSGTABLE_DSN)"
    archive = commands.add_parser(
        "archive",
        help="copy old acked rows to Parquet, then delete them",
        description="Copy the rows of message table NAME acked more than --older-than ago "
        "to Parquet under PATH (partitioned by the UTC day they were acked), check the copy's "
        "row count, then delete exactly the copied rows. A crash at any point loses nothing, "
        "and a rerun finishes what was left without copying anything twice.",
    )
    archive.add_argument("name", help="message table")
    archive.add_argument("--to", required=True, metavar="PATH", help="the archive's directory")
    archive.add_argument(
        "--older-than",
        type=_duration,
        default=86400.0,
        metavar="AGE",
        help="archive rows acked more than this long ago: 90s, 15m, 12h, 7d (default 1d)",
    )
    archive.add_argument("--dsn", default=_env("MSGTABLE_DSN"), help=dsn_help)
    archive.add_argument("--master", default=None, help=spark_help)

    report = commands.add_parser(
        "report",
        help="delivery statistics of a message table or an archive",
        description="Delivery latency percentiles (created -> acked, where the table has "
        "time_created), redeliveries by epoch, backlog by age and priority, and throughput "
        "per hour, of message table NAME (or of the archive at --archive PATH): a table in "
        "the terminal and an HTML report with plots.",
    )
    report.add_argument("name", help="message table (or a title, with --archive)")
    report.add_argument("--archive", default=None, metavar="PATH", help="read this archive")
    report.add_argument("--html", default=None, metavar="FILE", help="default NAME-report.html")
    report.add_argument("--dsn", default=_env("MSGTABLE_DSN"), help=dsn_help)
    report.add_argument("--master", default=None, help=spark_help)


# -- entry point --------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = getattr(args, "log_level", "warning")
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    command: Callable[[argparse.Namespace], int] = COMMANDS[args.command]
    try:
        return command(args)
    except MsgtableError as exc:
        return fail(str(exc))
    except grpc.RpcError as exc:  # the client maps these; this is a safety net
        return fail(str(error_from_rpc(exc, getattr(args, "server", ""))))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        log.debug("unexpected error", exc_info=True)
        return fail(f"unexpected {type(exc).__name__}: {exc} (--log-level debug shows more)")


def fail(message: str, stream: TextIO | None = None) -> int:
    print(f"msgtable: error: {message}", file=stream or sys.stderr)
    return EXIT_ERROR


# -- serve --------------------------------------------------------------------------------
def open_engine(
    dsn: str,
    discovery_interval_s: float = DEFAULT_DISCOVERY_INTERVAL_S,
    follow_binlog: bool = False,
    lease_period_s: float | None = None,
) -> MessageEngine:
    from sqlalchemy.exc import ArgumentError

    from msgtable.engine import MessageEngine

    try:
        return MessageEngine.from_dsn(
            dsn,
            discovery_interval_s=discovery_interval_s,
            follow_binlog=follow_binlog,
            lease_period_s=lease_period_s,
        )
    except ArgumentError as exc:
        raise InvalidArgument(f"invalid DSN: {exc}") from None


def start_local_server() -> LocalServer:
    """Start a throwaway server (raises ServerBinaryNotFound with the install hint)."""
    from msgtable.devdb import LocalServer

    local = LocalServer()
    local.start()
    return local


def create_demo_table(dsn: str) -> None:
    import sqlalchemy

    from msgtable.tables import DEMO_COMMENT, DEMO_TABLE, current_layout_ddl

    # The documented comment, but polling every second: a demo should answer at once.
    comment = DEMO_COMMENT.replace("vt_poller_interval=30", "vt_poller_interval=1")
    engine = sqlalchemy.create_engine(dsn)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(current_layout_ddl(DEMO_TABLE, comment))
    finally:
        engine.dispose()


def _hide_password(dsn: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(dsn).render_as_string(hide_password=True)
    except Exception:
        return "(unparsable DSN)"


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    def handle(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            log.warning("already stopping")
        stop.set()

    previous = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def serve(args: argparse.Namespace, out: TextIO | None = None) -> int:
    # Until serving starts, SIGTERM unwinds like Ctrl-C, so a throwaway database caught
    # half-started is still stopped and its data directory removed (the default action
    # would end the process before any clean-up runs).
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return _serve(args, out or sys.stdout)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _serve(args: argparse.Namespace, out: TextIO) -> int:
    local: LocalServer | None = None
    try:
        dsn: str | None = args.dsn
        if not dsn:
            print(
                "msgtable: no DSN given (--dsn or MSGTABLE_DSN): starting a throwaway local "
                "database server...",
                file=out,
                flush=True,
            )
            local = start_local_server()
            local.create_database(DEMO_DATABASE)
            dsn = local.dsn(DEMO_DATABASE)
            create_demo_table(dsn)
            from msgtable.mysql import without_driver

            dsn = without_driver(dsn)  # the server takes the fastest driver installed
        engine = open_engine(
            dsn,
            args.discovery_interval,
            args.binlog,
            lease_period_s=args.lease_period if args.lease else None,
        )
        try:
            engine.open()
            server = MessagingServer(
                engine,
                args.listen,
                authorizer=Authorizer.from_file(args.auth) if args.auth else None,
                tls=TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca)
                if args.tls_cert
                else None,
                max_subscribers_per_table=args.max_subscribers_per_table,
                max_streams_per_client=args.max_streams_per_client,
            )
            server.start()
            engine.campaign(args.advertise or advertised_address(args.listen, server.address))
            if local is not None:
                print(_demo_instructions(local, server.address, args.listen), file=out)
            print(
                f"serving on {server.address} (database {_hide_password(dsn)}); Ctrl-C to stop",
                file=out,
                flush=True,
            )
            return _serve_until_stopped(engine, server, args.grace_s)
        finally:
            engine.close()
    finally:
        if local is not None:
            local.stop()


def advertised_address(listen: str, bound: str) -> str:
    """What other servers tell clients to reach this one at: the address it is bound to,
    or on a wildcard listen (0.0.0.0, [::]) this host's name and the port."""
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    if host in ("", "0.0.0.0", "[::]", "::"):
        import socket

        return f"{socket.gethostname()}:{bound.rsplit(':', 1)[1]}"
    return bound


def _serve_until_stopped(engine: MessageEngine, server: MessagingServer, grace_s: float) -> int:
    stop = threading.Event()
    code = EXIT_OK
    with _stop_on_signals(stop):
        while not stop.wait(0.5):
            if engine.fatal.is_set():
                log.error("stopping: %s", engine.fatal_reason)
                code = EXIT_ERROR
                break
        log.info("stopping (up to %gs for calls in flight)", grace_s)
        server.stop(grace_s)
    return code


def _demo_instructions(local: LocalServer, address: str, listen: str) -> str:
    server_flag = "" if listen == DEFAULT_ADDRESS else f" --server {address}"
    return "\n".join(
        (
            f"msgtable: a throwaway server runs on 127.0.0.1:{local.port} (deleted on exit), "
            f"with the message table my_message in database {DEMO_DATABASE}.",
            f"  look inside:  {local.mysql_cli_command(DEMO_DATABASE)}",
            "  enqueue:      insert into my_message(id, message) values (1, 'hello world');",
            f"  receive:      msgtable tail my_message --ack{server_flag}",
        )
    )


# -- tables -------------------------------------------------------------------------------
def _seconds(value: float) -> str:
    return f"{value:g}s"


def format_tables(tables: Sequence[TableInfo]) -> str:
    """A readable table of every message table; load errors in full below it."""
    if not tables:
        return "no message tables"
    header = (
        "TABLE",
        "KEYSPACE",
        "STATUS",
        "BATCH",
        "CACHE",
        "ACK WAIT",
        "CACHED",
        "IN FLIGHT",
        "SUBSCRIBERS",
        "SENT",
        "ACKED",
    )
    rows = [header]
    for t in tables:
        c = t.config
        rows.append(
            (
                t.name,
                t.keyspace,
                "loaded" if c is not None else "error",
                str(c.batch_size) if c else "-",
                str(c.cache_size) if c else "-",
                _seconds(c.ack_wait_s) if c else "-",
                str(t.cached),
                str(t.in_flight),
                str(t.subscribers),
                str(t.sent),
                str(t.acked),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    failed = [t for t in tables if t.load_error]
    if failed:
        lines.append("")
        lines.append("load errors:")
        lines.extend(f"  {t.name}: {t.load_error}" for t in failed)
    return "\n".join(lines)


def tables(args: argparse.Namespace, out: TextIO | None = None) -> int:
    with _client(args) as client:
        print(format_tables(client.list_tables()), file=out or sys.stdout)
    return EXIT_OK


# -- tail ---------------------------------------------------------------------------------
def _json_default(value: Any) -> str:
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return "0x" + value.hex()
    raise TypeError(f"cannot show {type(value).__name__}")


def _text(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return str(value)


def format_message(message: Message, fields: Sequence[Field], as_json: bool = False) -> str:
    if as_json:
        return json.dumps(message.values, default=_json_default, ensure_ascii=False)
    return " ".join(f"{f.name}={_text(v)}" for f, v in zip(fields, message.row, strict=True))


def tail(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    seen = 0
    try:
        with (
            _client(args) as client,
            client.subscribe(args.name, args.keyspace, retry=False) as sub,
        ):
            for batch in sub.batches():
                if args.count is not None:
                    batch = batch[: args.count - seen]
                for message in batch:
                    print(format_message(message, sub.fields, args.json), file=out)
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


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": serve,
    "tables": tables,
    "tail": tail,
    "archive": archive,
    "report": report,
}
