"""``msgtable gateway``: one endpoint for a keyspace of shards (msgtable.gateway.gateway), until
SIGINT
or SIGTERM. It starts only when every shard answers with the same message tables."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from typing import TYPE_CHECKING, TextIO, cast

from msgtable.cli.serve import EXIT_OK, _stop_on_signals, open_metrics
from msgtable.core.keyspace import load
from msgtable.errors import InvalidArgument
from msgtable.gateway.gateway import GatewayServicer, KeyspaceGateway
from msgtable.observe.metrics import MetricsServer, parse_listen
from msgtable.server import gil
from msgtable.server.auth import Authorizer
from msgtable.server.servicer import MessagingServer, TlsFiles

if TYPE_CHECKING:
    from msgtable.server.servicer import Engine

log = logging.getLogger("msgtable.cli")


def gateway(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if not args.keyspace_file:
        raise InvalidArgument("no keyspace: --keyspace-file FILE (or MSGTABLE_KEYSPACE_FILE)")
    described = load(args.keyspace_file)
    if args.metrics_listen:
        parse_listen(args.metrics_listen)  # a bad address fails here, before anything runs
    if not args.verbose:  # each retry of a call to a shard: its failure says enough
        logging.getLogger("msgtable.client").setLevel(logging.WARNING)
    authorizer = Authorizer.from_file(args.auth) if args.auth else None
    gil.tune()  # before the gateway's threads start (msgtable.server.gil)
    keyspace = KeyspaceGateway(
        described,
        timeout_s=args.timeout,
        token=args.shard_token,
        tls_ca=args.shard_tls_ca,
        tls_cert=args.shard_tls_cert,
        tls_key=args.shard_tls_key,
    )
    try:
        tables = keyspace.check()  # every shard answers, with the same tables
        server = MessagingServer(
            # the Engine of MessageStream only: GatewayServicer answers the other calls
            cast("Engine", keyspace),
            args.listen,
            authorizer=authorizer,
            tls=TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca)
            if args.tls_cert
            else None,
            servicer=GatewayServicer,
        )
        server.start()
        metrics = None
        if args.metrics_listen:
            metrics = MetricsServer(None, args.metrics_listen, registry=keyspace.metrics.registry)
            keyspace.metrics.watch(server.servicer.streams, lambda: len(keyspace.strays))
            open_metrics(metrics, server, out)
        shards = ", ".join(s.name for s in described.shards)
        print(
            f"gateway of keyspace {described.name!r} (shards {shards}; tables "
            f"{', '.join(tables) or 'none yet'}) on {server.address}; Ctrl-C to stop",
            file=out,
            flush=True,
        )
        stop = threading.Event()
        with _stop_on_signals(stop):
            stop.wait()
            log.info("gateway: stopping (up to %gs for calls in flight)", args.grace_s)
            server.stop(args.grace_s)
            if metrics is not None:
                metrics.close()
        return EXIT_OK
    finally:
        keyspace.close()
