"""A Python client of a keyspace that reaches the shards' servers itself, with no gateway tier.

    with KeyspaceClient("keyspace.toml") as client:      # or a msgtable.keyspace.Keyspace
        for message in client.subscribe("order_events"):
            ...
            message.ack()

It is a msgtable.client.Client in every way (subscribe, ack, release, reject, renew,
auto-renew, dead letters, subscriptions), connected to a gateway of its own
(msgtable.gateway) that runs inside this process on a private Unix socket: streams merge
here, each ack goes from here to the shard of its id, and no other process can reach it.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from msgtable.client import DEFAULT_TIMEOUT_S, Client
from msgtable.gateway import GatewayServicer, KeyspaceGateway
from msgtable.keyspace import Keyspace, load
from msgtable.server import MessagingServer

if TYPE_CHECKING:
    from msgtable.server import Engine


class KeyspaceClient(Client):
    """A Client of every shard of ``keyspace`` (a Keyspace, or the path of its file).
    ``token`` and the TLS files are the shard servers'; the other arguments are Client's."""

    def __init__(
        self,
        keyspace: Keyspace | str | Path,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        **client_kwargs: Any,
    ) -> None:
        described = keyspace if isinstance(keyspace, Keyspace) else load(keyspace)
        self.gateway = KeyspaceGateway(
            described,
            timeout_s=timeout_s,
            token=token,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )
        self._dir = tempfile.mkdtemp(prefix="msgtable-keyspace-")  # 0700: this user's only
        self._server = MessagingServer(
            cast("Engine", self.gateway),  # GatewayServicer answers every other call
            f"unix:{self._dir}/gateway.sock",
            servicer=GatewayServicer,
        )
        try:
            self._server.start()
            super().__init__(self._server.listen, timeout_s=timeout_s, **client_kwargs)
        except BaseException:
            self._stop()
            raise

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._stop()

    def _stop(self) -> None:
        self._server.stop(0)
        self.gateway.close()
        shutil.rmtree(self._dir, ignore_errors=True)
