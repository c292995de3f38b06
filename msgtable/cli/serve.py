"""``msgtable serve``: the engine and the gRPC server on one database (or on a throwaway local
one with a demo table), until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TextIO

from msgtable.core.keyspace import Shard
from msgtable.core.keyspace import load as load_keyspace
from msgtable.core.tables import DEFAULT_DISCOVERY_INTERVAL_S
from msgtable.errors import InvalidArgument
from msgtable.limits import DEFAULT_ADDRESS, SHUTDOWN_DATABASE_S
from msgtable.server import gil, heap
from msgtable.server.auth import Authorizer
from msgtable.server.servicer import MessagingServer, TlsFiles, is_loopback

if TYPE_CHECKING:
    from msgtable.engine.engine import MessageEngine
    from msgtable.observe.dashboard import DashboardServer
    from msgtable.observe.metrics import MetricsServer
    from msgtable.testing.devdb import LocalServer

log = logging.getLogger("msgtable.cli")

EXIT_OK = 0
EXIT_ERROR = 1
DEMO_DATABASE = "msgtable"
DEMO_PUSH_ALLOW = "http://127.0.0.0/8,http://[::1]"


def open_engine(
    dsn: str,
    discovery_interval_s: float = DEFAULT_DISCOVERY_INTERVAL_S,
    follow_binlog: bool = False,
    lease_period_s: float | None = None,
    push_allow: str = "",
    push_ca_file: str | None = None,
    shard: Shard | None = None,
    keyspace: str | None = None,
) -> MessageEngine:
    from sqlalchemy.exc import ArgumentError

    from msgtable.features.assembly import assemble_dsn
    from msgtable.features.push.allow import AllowList

    if push_ca_file and not os.path.isfile(push_ca_file):
        raise InvalidArgument(f"--push-ca-file {push_ca_file}: no such file")
    try:
        return assemble_dsn(
            dsn,
            discovery_interval_s=discovery_interval_s,
            follow_binlog=follow_binlog,
            lease_period_s=lease_period_s,
            push_allow=AllowList.parse(push_allow),
            push_ca_file=push_ca_file,
            keyspace=keyspace,
            shard=shard.key_range if shard is not None else None,
        )
    except ArgumentError as exc:
        raise InvalidArgument(f"invalid DSN: {exc}") from None


def start_local_server() -> LocalServer:
    """Start a throwaway server (raises ServerBinaryNotFound with the install hint)."""
    from msgtable.testing.devdb import LocalServer

    local = LocalServer()
    local.start()
    return local


def create_demo_table(dsn: str) -> None:
    import sqlalchemy

    from msgtable.core.tables import DEMO_COMMENT, DEMO_TABLE, current_layout_ddl

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
            log.warning("server: already stopping")
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


def shard_of_file(args: argparse.Namespace) -> tuple[str, Shard] | None:
    """The keyspace and shard ``--keyspace-file`` and ``--shard`` name (None: unsharded);
    InvalidArgument for a misdescribed keyspace or a missing or conflicting flag."""
    if not args.keyspace_file:
        if args.shard:
            raise InvalidArgument("--shard needs --keyspace-file (the keyspace it is a shard of)")
        return None
    if not args.shard:
        raise InvalidArgument(
            "--keyspace-file needs --shard NAME (the shard this server sends); one endpoint for "
            "the whole keyspace is msgtable gateway --keyspace-file FILE"
        )
    if args.dsn:
        raise InvalidArgument(
            "give --dsn or --keyspace-file with --shard, not both: the keyspace file names "
            "the shard's database"
        )
    described = load_keyspace(args.keyspace_file)
    return described.name, described.shard(args.shard)


def _serve(args: argparse.Namespace, out: TextIO) -> int:
    local: LocalServer | None = None
    gil.tune()  # before the engine's threads start
    try:
        sharded = shard_of_file(args)
        dsn: str | None = sharded[1].dsn if sharded is not None else args.dsn
        if not dsn:
            print(
                "msgtable: no DSN given (--dsn or MSGTABLE_DSN): starting a throwaway local "
                "database server...",
                file=out,
                flush=True,
            )
            local = start_local_server()
            dsn = _demo_dsn(local)
        from msgtable.core import tracing

        # the standard OTEL_* variables, when an SDK is installed (README: Tracing)
        tracing.configure_from_env()
        push_allow = args.push_allow
        if local is not None and not push_allow:
            push_allow = DEMO_PUSH_ALLOW  # the demo pushes to this machine only
        engine = open_engine(
            dsn,
            args.discovery_interval,
            args.binlog,
            lease_period_s=args.lease_period if args.lease else None,
            push_allow=push_allow,
            push_ca_file=args.push_ca_file,
            shard=sharded[1] if sharded is not None else None,
            keyspace=sharded[0] if sharded is not None else None,
        )
        metrics = None
        dashboard: DashboardServer | None = None
        sqs = None
        try:
            _check_web_addresses(args)  # a bad address fails here, before anything runs
            authorizer = Authorizer.from_file(args.auth) if args.auth else None
            engine.open()
            if args.http:  # before the gRPC server: a port in use stops it before it serves
                dashboard = _open_dashboard(engine, args.http, authorizer, out)
            from msgtable.server.sqs.app import open_sqs

            sqs = open_sqs(engine, dsn, args, authorizer, out)  # before gRPC, as the dashboard
            server = _messaging_server(engine, args, authorizer)
            server.servicer.sqs = sqs  # ListTables names it
            if dashboard is not None:
                dashboard.api.sqs = sqs
            server.start()
            if args.metrics_listen:
                from msgtable.observe.metrics import MetricsServer

                metrics = MetricsServer(
                    engine, args.metrics_listen, server.servicer.streams, sqs=sqs
                )
                open_metrics(metrics, server, out)
            advertised = args.advertise or advertised_address(args.listen, server.address)
            services = {}
            if sqs is not None:  # calls at this server for a table another sends go there
                services["sqs"] = advertised_address(args.sqs_listen, sqs.address)
            engine.campaign(advertised, services)
            _announce(args, server, advertised, dsn, sharded, local, out)
            log.debug("server: froze %d objects of its startup heap", heap.settle())
            return _serve_until_stopped(engine, server, args.grace_s)
        finally:
            if sqs is not None:
                sqs.close()
            if dashboard is not None:
                dashboard.close()
            if metrics is not None:
                metrics.close()
            _close_within(engine, SHUTDOWN_DATABASE_S)
    finally:
        if local is not None:
            local.stop()


def _demo_dsn(local: LocalServer) -> str:
    """The DSN of a demo database on a throwaway server, with its demo table."""
    local.create_database(DEMO_DATABASE)
    dsn = local.dsn(DEMO_DATABASE)
    create_demo_table(dsn)
    from msgtable.store.mysql import without_driver

    return without_driver(dsn)  # the server takes the fastest driver installed


def _check_web_addresses(args: argparse.Namespace) -> None:
    """--metrics-listen and --http, parsed (InvalidArgument if either is not an address)."""
    if args.metrics_listen:
        from msgtable.observe.metrics import parse_listen

        parse_listen(args.metrics_listen)
    if args.http:
        from msgtable.observe.dashboard import parse_listen as parse_http

        parse_http(args.http)


def _open_dashboard(
    engine: MessageEngine, listen: str, authorizer: Authorizer | None, out: TextIO
) -> DashboardServer:
    dashboard = _dashboard(engine, listen, authorizer)
    dashboard.open()
    print(f"dashboard on {dashboard.url}", file=out, flush=True)
    if authorizer is None and not is_loopback(listen):
        log.warning(
            "dashboard: anyone who reaches %s sees every table and may redrive "
            "(no --auth): bind it to a private address",
            dashboard.address,
        )
    return dashboard


def _messaging_server(
    engine: MessageEngine, args: argparse.Namespace, authorizer: Authorizer | None
) -> MessagingServer:
    return MessagingServer(
        engine,
        args.listen,
        authorizer=authorizer,
        tls=TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None,
        max_subscribers_per_table=args.max_subscribers_per_table,
        max_streams_per_client=args.max_streams_per_client,
    )


def _announce(
    args: argparse.Namespace,
    server: MessagingServer,
    advertised: str,
    dsn: str,
    sharded: tuple[str, Shard] | None,
    local: LocalServer | None,
    out: TextIO,
) -> None:
    """What the server says once it serves (and a warning if the keyspace file's shard does
    not name it)."""
    if sharded is not None and advertised not in sharded[1].servers:
        log.warning(
            "server: %s is not among the servers the keyspace file names for shard %s "
            "(%s): gateways and clients of the keyspace will not reach it",
            advertised,
            sharded[1].name,
            ", ".join(sharded[1].servers) or "none",
        )
    if local is not None:
        print(_demo_instructions(local, server.address, args.listen), file=out)
    # A throwaway database's password is no secret: its DSN is printed as it works
    # (for msgtable report --dsn, say); a real one's is hidden.
    shown = dsn if local is not None else _hide_password(dsn)
    what = f"database {shown}"
    if sharded is not None:
        what = f"shard {sharded[1].name} of keyspace {sharded[0]!r}, {what}"
    print(f"serving on {server.address} ({what}); Ctrl-C to stop", file=out)
    out.flush()


def _dashboard(
    engine: MessageEngine, listen: str, authorizer: Authorizer | None
) -> DashboardServer:
    from msgtable.observe.dashboard import DashboardApi, DashboardServer, RateHistory

    return DashboardServer(DashboardApi(engine, RateHistory(), authorizer), listen)


def open_metrics(metrics: MetricsServer, server: MessagingServer, out: TextIO) -> None:
    """Serve /metrics beside a started ``server``; a port in use is one line, and stops the
    server (nothing is left serving)."""
    try:
        metrics.open()
    except InvalidArgument:
        server.stop(0)
        raise
    print(f"metrics on http://{metrics.address}/metrics", file=out, flush=True)


def advertised_address(listen: str, bound: str) -> str:
    """What other servers tell clients to reach this one at: the address it is bound to,
    or on a wildcard listen (0.0.0.0, [::]) this host's name and the port."""
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    if host in ("", "0.0.0.0", "[::]", "::"):
        import socket

        return f"{socket.gethostname()}:{bound.rsplit(':', 1)[1]}"
    return bound


def _close_within(engine: MessageEngine, seconds: float) -> None:
    """Close the engine (its loops, the postpones of what it sent, the lease given back),
    waiting at most ``seconds``: a database that does not answer (a silent link) would
    otherwise hold the way out for each statement's read time-out. Past the bound the
    process ends anyway; what was not written the next lease holder holds back
    (msgtable.engine.lease)."""
    closing = threading.Thread(target=engine.close, name="msgtable-close", daemon=True)
    closing.start()
    closing.join(seconds)
    if closing.is_alive():
        log.warning(
            "server: the database did not answer within %gs of stopping: the postpones of "
            "messages still in flight and the lease's release may be unwritten (the next "
            "lease holder holds those messages back for their ack wait; the lease ends by "
            "itself); stopping anyway",
            seconds,
        )


def _serve_until_stopped(engine: MessageEngine, server: MessagingServer, grace_s: float) -> int:
    stop = threading.Event()
    code = EXIT_OK
    with _stop_on_signals(stop):
        while not stop.wait(0.5):
            if engine.fatal.is_set():
                log.error("server: stopping: %s", engine.fatal_reason)
                code = EXIT_ERROR
                break
        log.info("server: stopping (up to %gs for calls in flight)", grace_s)
        server.stop(grace_s)
    return code


def command_name() -> str:
    """How the user runs this msgtable: ``msgtable`` when that is on PATH, else the path of
    this installation's script (``.venv/bin/msgtable`` in a clone), else ``python -m``."""
    if shutil.which("msgtable"):
        return "msgtable"
    script = Path(sys.executable).with_name("msgtable")
    if script.is_file():
        try:
            return str(script.relative_to(Path.cwd()))
        except ValueError:
            return str(script)
    return f"{sys.executable} -m msgtable"


def _demo_instructions(local: LocalServer, address: str, listen: str) -> str:
    server_flag = "" if listen == DEFAULT_ADDRESS else f" --server {address}"
    return "\n".join(
        (
            f"msgtable: a throwaway server runs on 127.0.0.1:{local.port} (deleted on exit), "
            f"with the message table my_message in database {DEMO_DATABASE}.",
            f"  look inside:  {local.mysql_cli_command(DEMO_DATABASE)}",
            "  enqueue:      insert into my_message(id, message) values (1, 'hello world');",
            f"  receive:      {command_name()} tail my_message --ack{server_flag}",
        )
    )
