"""Python clients of a keyspace that reach the shards' servers themselves, with no gateway tier.

    with KeyspaceClient("keyspace.toml") as client:      # or a msgtable.core.keyspace.Keyspace
        for message in client.subscribe("order_events"):
            ...
            message.ack()

    async with AsyncKeyspaceClient("keyspace.toml") as client:   # msgtable.aio's Client
        async with client.subscribe("order_events") as sub:
            async for message in sub:
                await message.ack()

Each is a client of its kind in every way (subscribe, ack, release, reject, renew,
auto-renew, dead letters, subscriptions), connected to a gateway of its own
(msgtable.gateway.gateway) that runs inside this process on a private Unix socket: streams merge
here, each ack goes from here to the shard that sent it, and no other process can reach it.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from msgtable import aio
from msgtable.client import DEFAULT_TIMEOUT_S, Client
from msgtable.core.keyspace import Keyspace, load
from msgtable.gateway.gateway import GatewayServicer, KeyspaceGateway
from msgtable.server.servicer import MessagingServer

if TYPE_CHECKING:
    from msgtable.server.servicer import Engine


class EmbeddedGateway:
    """A gateway of ``keyspace`` on a Unix socket in a directory only this user can open
    (``address``); ``token`` and the TLS files are the shard servers'. ``stop()`` ends it."""

    def __init__(
        self,
        keyspace: Keyspace | str | Path,
        *,
        timeout_s: float,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        described = keyspace if isinstance(keyspace, Keyspace) else load(keyspace)
        self.gateway = KeyspaceGateway(
            described, timeout_s=timeout_s, token=token, tls_ca=tls_ca, tls_cert=tls_cert,
            tls_key=tls_key,
        )  # fmt: skip
        self._dir = tempfile.mkdtemp(prefix="msgtable-keyspace-")  # 0700: this user's only
        self._server = MessagingServer(
            cast("Engine", self.gateway),  # GatewayServicer answers every other call
            f"unix:{self._dir}/gateway.sock",
            servicer=GatewayServicer,
        )
        try:
            self._server.start()
        except BaseException:
            self.stop()
            raise
        self.address = self._server.listen

    def stop(self) -> None:
        self._server.stop(0)
        self.gateway.close()
        shutil.rmtree(self._dir, ignore_errors=True)


class _OwnGateway:
    """What both clients share: an EmbeddedGateway of ``keyspace`` (a Keyspace, or the path
    of its file), the client connected to it. ``token`` and the TLS files are the shard
    servers'; the other arguments are the client's."""

    embedded: EmbeddedGateway

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
        self.embedded = EmbeddedGateway(
            keyspace, timeout_s=timeout_s, token=token, tls_ca=tls_ca, tls_cert=tls_cert,
            tls_key=tls_key,
        )  # fmt: skip
        self.gateway = self.embedded.gateway
        try:  # the client class after this one in the MRO
            super().__init__(self.embedded.address, timeout_s=timeout_s, **client_kwargs)  # type: ignore[call-arg]
        except BaseException:
            self.embedded.stop()
            raise


class KeyspaceClient(_OwnGateway, Client):
    """A Client of every shard of a keyspace (see _OwnGateway for the arguments)."""

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.embedded.stop()


class AsyncKeyspaceClient(_OwnGateway, aio.Client):
    """msgtable.aio's Client of every shard of a keyspace (as KeyspaceClient)."""

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            await asyncio.to_thread(self.embedded.stop)  # a grace of 0: at once
