"""Where the asyncio client's calls go: grpc.aio channels, one per server, chosen and retried
by the sync client's Route (msgtable.client.router), so both follow the leader and retry by
the same rule."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

from msgtable.client import requests
from msgtable.client.codes import error_from_rpc
from msgtable.client.router import Route, channel_options, table_key
from msgtable.core.retry import Retry
from msgtable.errors import MsgtableError, Unavailable
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.proto.msgtable.v1 import messaging_pb2_grpc as pb_grpc

log = logging.getLogger("msgtable.client")


# The sync channel's SingleThreadedUnaryStream option means nothing to grpc.aio.
def aio_channel_options() -> tuple[tuple[str, Any], ...]:
    """The sync client's channel options without its threading one."""
    return tuple(o for o in channel_options() if "thread" not in o[0].lower())


class AioRouter(Route):
    """The asyncio client's channels over the shared Route. Use from one event loop."""

    def __init__(
        self,
        targets: Sequence[str],
        credentials: grpc.ChannelCredentials | None,
        token: str | None,
        timeout_s: float | None,
    ) -> None:
        super().__init__(targets, timeout_s)
        self._credentials = credentials
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._channels: dict[str, tuple[grpc.aio.Channel, pb_grpc.MessagingStub]] = {}

    def stub(self, target: str) -> pb_grpc.MessagingStub:
        """The stub of ``target``'s channel (channels connect lazily, when first used)."""
        if self._closed:
            raise Unavailable("the client is closed")
        entry = self._channels.get(target)
        if entry is None:
            if self._credentials is not None:
                channel = grpc.aio.secure_channel(
                    target, self._credentials, options=aio_channel_options()
                )
            else:
                channel = grpc.aio.insecure_channel(target, options=aio_channel_options())
            entry = self._channels[target] = (channel, pb_grpc.MessagingStub(channel))
        return entry[1]

    def invoke(self, target: str, method: str, request: Any, **kwargs: Any) -> Any:
        """The call object of ``method`` (await it for a unary answer; read() a stream)."""
        if self._metadata is not None:
            kwargs["metadata"] = self._metadata
        return getattr(self.stub(target), method)(request, **kwargs)

    async def unary(self, method: str, request: Any, target: str = "") -> Any:
        """One unary call with the sync client's retries (Route.retry_delay)."""
        deadline = self.deadline()
        retry = Retry(method, log, self.backoff, level=logging.INFO)
        key = table_key(request)
        error: MsgtableError | None = None
        while True:
            where = target or self.next_target(key)
            left = None if deadline is None else max(0.001, deadline - time.monotonic())
            try:
                response = await self.invoke(where, method, request, timeout=left)
            except grpc.RpcError as exc:
                error = self.cause(exc, error_from_rpc(exc, where), error)
                if self._closed:
                    raise Unavailable("the client is closed") from None
            else:
                retry.succeeded()
                self.answered()
                return response
            target = ""  # a retry goes where the client now thinks best
            await asyncio.sleep(self.retry_delay(error, where, retry, deadline, key))

    async def ack(
        self,
        name: str,
        keyspace: str,
        ids: Sequence[pb.Value],
        target: str = "",
        subscription: str = "",
    ) -> int:
        request = requests.ack_request(name, ids, keyspace, subscription)
        return requests.settled("MessageAck", name, await self.unary("MessageAck", request, target))

    async def settle(self, method: str, request: Any, target: str = "") -> int:
        return requests.settled(method, request.name, await self.unary(method, request, target))

    async def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
        for channel, _ in channels:
            await channel.close()
