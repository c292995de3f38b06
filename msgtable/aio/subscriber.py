"""An asyncio subscriber: ``async for message in sub``, ``await message.ack()``.

    async with client.subscribe("my_message") as sub:
        async for message in sub:
            handle(message.values)
            await message.ack()

Its MessageStream opens itself again when it breaks for a passing reason, by the sync
client's rule (Route.should_retry / Route.failed: follow a NotLeader to the leader at once,
else the next server after a backoff), until the client's ``retry_for_s`` passed without a
stream; any other error (table dropped or not found, not allowed) ends the iteration with the
MsgtableError. Auto-renew is the sync Leaser's rounds run by an asyncio task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from msgtable.aio.router import AioRouter
from msgtable.client import effects, requests
from msgtable.client.codes import error_from_rpc
from msgtable.client.leaser import DEFAULT_MAX_LEASE_S, MIN_RENEW_EVERY_S, Leases
from msgtable.client.message import Received
from msgtable.client.router import table_key
from msgtable.core import codec, tracing
from msgtable.core.codec import Field
from msgtable.core.retry import Retry
from msgtable.errors import MsgtableError, Unavailable
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

log = logging.getLogger("msgtable.client")


class Message(Received["Subscriber"]):
    """One message an asyncio subscriber received; its settlement calls are coroutines."""

    __slots__ = ()

    async def ack(self) -> int:
        """Acknowledge; 1 if this call acked it, 0 if it was already."""
        return await self._subscriber.ack([self])

    async def release(self, delay_s: float = 0.0, reason: str | None = None) -> int:
        """Not now: due again ``delay_s`` from now; 1 if released."""
        return await self._subscriber.release([self], delay_s, reason)

    async def reject(self, reason: str | None = None) -> int:
        """Never: dead now, ``reason`` its last error; 1 if rejected."""
        return await self._subscriber.reject([self], reason)

    async def renew(self, extend_s: float = 0.0, reason: str | None = None) -> int:
        """Still working: not sent again before ``extend_s`` (0: the ack wait); 1 if renewed."""
        return await self._subscriber.renew([self], extend_s, reason)

    async def in_transaction(
        self, engine: Any, handler: Callable[[Any], Awaitable[object]]
    ) -> bool:
        """``await handler(conn)`` and this message's ack in one transaction of ``engine``
        (an AsyncEngine): effects once (msgtable.client.effects); False, without running
        the handler, when an earlier delivery already acked it."""
        return await effects.run_async(self, engine, handler)

    async def in_session(self, sessions: Any, handler: Callable[[Any], Awaitable[object]]) -> bool:
        """:meth:`in_transaction` with an ``async_sessionmaker``: ``await handler(session)``."""
        return await effects.run_in_async_session(self, sessions, handler)


class Subscriber:
    """An open MessageStream of the asyncio client (see the module docstring). Made by
    ``client.subscribe(...)``: ``async with`` it (or ``await sub.open()`` / ``sub.close()``)."""

    def __init__(
        self,
        router: AioRouter,
        request: pb.MessageStreamRequest,
        *,
        retry: bool,
        retry_for_s: float | None,
        follow: bool = False,
        ack_wait_s: Callable[[str, str, str], Awaitable[float]] | None = None,
        max_lease_s: float = DEFAULT_MAX_LEASE_S,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.name = request.name
        self.keyspace = request.keyspace
        self.subscription = request.subscription
        self.fields: tuple[Field, ...] = ()
        self.field_names: tuple[str, ...] = ()
        self.reconnects = 0  # how many times the stream was opened again
        self.target = ""  # the server of the current stream
        self._router = router
        self._request = request
        self._retry = retry
        self._follow = follow  # without retry: still go where the servers send it
        self._retry_for_s = retry_for_s
        self._ack_wait_s = ack_wait_s  # with auto-renew: how to learn the table's ack wait
        self._decoder: codec.RowDecoder | None = None
        self._call: Any = None
        # what the stream's limit (max_messages) leaves to receive (None: no limit): a
        # stream opened again asks for what is left, and none once nothing is
        self._left: int | None = request.max_messages or None
        self._pending: deque[Message] = deque()  # received by iteration, not handed out
        self._pending_at = 0.0  # when they were received (monotonic)
        self._stream_ack_wait_s = 0.0  # the stream's, from its first response (0: not said)
        self._closed = False
        self._closing = asyncio.Event()
        self._leases = Leases(max_lease_s)  # auto-renew's (the sync Leaser's bookkeeping)
        self._renewer: asyncio.Task[None] | None = None
        self.renewed = 0  # messages auto-renew renewed (the server's counts)
        # consumer spans (msgtable.core.tracing; None: nothing records, checked once here)
        self._tracing = tracing.consumer(self.name, self.subscription, tracer_provider)

    # -- opening -----------------------------------------------------------------------------
    async def open(self) -> Subscriber:
        """Subscribe; returns once a server accepted (raises what does not pass)."""
        if self._call is None and not self._closed:
            renew_every_s = None
            if self._ack_wait_s is not None:
                ack_wait_s = await self._ack_wait_s(self.name, self.keyspace, self.subscription)
                renew_every_s = ack_wait_s / 3
            await self._open(None)
            if renew_every_s is not None:
                self._renewer = asyncio.create_task(self._renew_loop(renew_every_s))
        return self

    async def _open(self, broken: MsgtableError | None) -> bool:
        """Open the stream (again, after ``broken``); False if closed meanwhile."""
        if broken is not None and self._left is not None:
            if self._left <= 0:  # every message it asked for came: nothing more will
                return False
            self._request.max_messages = self._left
        router = self._router
        retry = Retry(f"stream of {self.name}", log, router.backoff)
        error, started, target = broken, time.monotonic(), self.target
        while True:
            if error is not None:
                if router.closed or self._closed:
                    if broken is None:
                        raise error
                    self._closed = True
                    return False
                delay = router.reopen_delay(
                    error,
                    target,
                    retry,
                    retrying=self._retry,
                    following=self._follow,
                    started=started,
                    retry_for_s=self._retry_for_s,
                    key=table_key(self._request),
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), delay)
                if self._closing.is_set():
                    return False
            target = router.next_target(table_key(self._request))
            try:
                call = router.invoke(target, "MessageStream", self._request)
                first = await self._first_response(call, target)
            except MsgtableError as exc:
                error = exc
                continue
            if self._closed:
                call.cancel()
                return False
            self._call, self.target = call, target
            router.succeeded(target)
            retry.succeeded()
            if broken is not None:
                self.reconnects += 1
            self._stream_ack_wait_s = first.ack_wait_s
            fields = tuple(codec.field_from_proto(f) for f in first.fields)
            if fields != self.fields:
                self.fields = fields
                self.field_names = tuple(f.name for f in fields)
                self._decoder = codec.RowDecoder([f.type for f in fields])
                if self._tracing is not None:
                    self._tracing.adopt(self.field_names)
            return True

    async def _first_response(self, call: Any, target: str) -> pb.MessageStreamResponse:
        timeout_s = self._router.timeout_s
        try:
            first = await asyncio.wait_for(call.read(), timeout_s)
        except TimeoutError:
            call.cancel()
            raise Unavailable(
                f"no answer from the msgtable server at {target} within {timeout_s}s"
            ) from None
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, target) from None
        if first is grpc.aio.EOF:
            raise Unavailable(f"the server ended the stream of {self.name} at once")
        if not first.fields:
            call.cancel()
            raise MsgtableError("the server's first stream response carried no fields")
        response: pb.MessageStreamResponse = first
        return response

    # -- messages ----------------------------------------------------------------------------
    async def next_batch(self) -> list[Message]:
        """The next batch as the server sent it; [] once closed."""
        batch = await self._next_batch()
        if self._tracing is not None:
            self._tracing.batch(batch)  # one span for the batch, current until the next
        return batch

    async def _next_batch(self) -> list[Message]:
        if self._pending:
            batch = list(self._pending)
            self._pending.clear()
            return batch
        while not self._closed:
            if self._call is None:
                await self.open()
                continue
            try:
                response = await self._call.read()
            except grpc.RpcError as exc:
                if self._closed:
                    return []
                error = error_from_rpc(exc, self.target)
            except asyncio.CancelledError:
                if self._closed or self._router.closed:  # closing the client ends it quietly
                    return []
                raise
            else:
                if response is grpc.aio.EOF:
                    if self._closed:
                        return []
                    error = Unavailable(f"the server ended the stream of {self.name}")
                elif response.rows:
                    if self._left is not None:
                        self._left -= len(response.rows)
                    return self._messages(response)
                else:
                    continue
            if not await self._open(error):
                return []
        return []

    def _messages(self, response: pb.MessageStreamResponse) -> list[Message]:
        assert self._decoder is not None
        decode, sent_ns = self._decoder.decode, response.sent_ns
        messages = [
            Message(self, decode(row), row.values[0], row.sent_before + 1, sent_ns)
            for row in response.rows
        ]
        if self._renewer is not None:
            self._leases.add(messages)
        return messages

    def __aiter__(self) -> Subscriber:
        return self

    async def __anext__(self) -> Message:
        if self._tracing is not None:
            self._tracing.release_context()  # the last message's span ends here at the latest
        while not self._pending:
            batch = await self._next_batch()
            if not batch:
                raise StopAsyncIteration
            self._pending.extend(batch)
            self._pending_at = time.monotonic()
        message = self._pending.popleft()
        if self._tracing is not None:
            self._tracing.message(message)  # its span, current until the next message
        return message

    async def batches(self) -> AsyncIterator[list[Message]]:
        """Batches as they arrive, until close() (an async iterator)."""
        while batch := await self.next_batch():
            yield batch

    # -- settlement --------------------------------------------------------------------------
    async def ack(self, messages: Iterable[Message]) -> int:
        """Acknowledge messages of this subscriber in one call; how many it acked."""
        messages = list(messages)
        if not messages:
            return 0
        self._settled(messages)
        ids = [m.id_value for m in messages]
        return await self._router.ack(self.name, self.keyspace, ids, self.target, self.subscription)

    async def release(
        self, messages: Iterable[Message], delay_s: float = 0.0, reason: str | None = None
    ) -> int:
        """Not now: due again ``delay_s`` from now (0: at once); how many were released."""
        messages = list(messages)
        request = requests.release_request(
            self.name,
            [m.id_value for m in messages],
            delay_s,
            reason,
            self.keyspace,
            self.subscription,
            requests.attempts_of(messages),
        )
        return await self._settle("MessageRelease", request, messages)

    async def reject(self, messages: Iterable[Message], reason: str | None = None) -> int:
        """Never: dead now, ``reason`` their last error; how many were rejected."""
        messages = list(messages)
        request = requests.reject_request(
            self.name, [m.id_value for m in messages], reason, self.keyspace, self.subscription
        )
        return await self._settle("MessageReject", request, messages)

    async def renew(
        self, messages: Iterable[Message], extend_s: float = 0.0, reason: str | None = None
    ) -> int:
        """Still working: not sent again before ``extend_s`` (0: the ack wait); how many."""
        messages = list(messages)
        if not messages:
            return 0
        ids = [m.id_value for m in messages]
        return await self._send_renew(ids, requests.attempts_of(messages), extend_s, reason)

    async def _settle(self, method: str, request: Any, messages: list[Message]) -> int:
        if not messages:
            return 0
        self._settled(messages)
        return await self._router.settle(method, request, self.target)

    async def _send_renew(
        self,
        ids: list[pb.Value],
        attempts: list[int],
        extend_s: float = 0.0,
        reason: str | None = None,
    ) -> int:
        request = requests.renew_request(
            self.name, ids, extend_s, reason, self.keyspace, self.subscription, attempts
        )
        return await self._router.settle("MessageRenew", request, self.target)

    def _settled(self, messages: list[Message]) -> None:
        self._leases.remove(messages)
        if self._tracing is not None:
            self._tracing.settled(messages)

    # -- auto-renew --------------------------------------------------------------------------
    @property
    def leased(self) -> int:
        """How many received messages auto-renew holds."""
        return len(self._leases)

    async def renew_now(self) -> int:
        """One auto-renew round: renew every held message (dropping those held too long)."""
        n = 0
        for ids, attempts in self._leases.due():
            n += await self._send_renew(ids, attempts)
        self.renewed += n
        return n

    async def _renew_loop(self, every_s: float) -> None:
        every_s = max(MIN_RENEW_EVERY_S, every_s)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), every_s)
            if self._closing.is_set() or self._router.closed:  # (the client closed first)
                return
            try:
                await self.renew_now()
            except MsgtableError as exc:
                if self._router.closed:
                    return
                log.warning(
                    "table %s: renewing held messages failed (%s); next round", self.name, exc
                )
            except Exception:  # the task must not die: the ack wait is the safety net
                log.exception("table %s: renewing held messages failed", self.name)

    # -- closing -----------------------------------------------------------------------------
    async def close(self) -> None:
        """Leave: the server releases the subscriber; unacked messages are resent later. The
        rest of a batch that iteration received and never handed out is released at once
        (one try, naming their deliveries: requests.release_unhanded)."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        if self._tracing is not None:
            self._tracing.end()
        if self._call is not None:
            self._call.cancel()
        if self._renewer is not None:  # a renewal run after the release would undo it
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        # after the stream ended: the server would send them right back to it
        await self._release_unhanded()
        self._leases.clear()

    async def _release_unhanded(self) -> None:
        left = list(self._pending)
        self._pending.clear()
        request = requests.unhanded_release(
            left, self._pending_at, self._stream_ack_wait_s, self.name, self.keyspace,
            self.subscription,
        )  # fmt: skip
        if request is None:
            return
        self._settled(left)
        timeout = requests.UNHANDED_RELEASE_TIMEOUT_S
        with contextlib.suppress(MsgtableError, grpc.RpcError):  # their ack wait is the net
            await self._router.invoke(self.target, "MessageRelease", request, timeout=timeout)

    async def __aenter__(self) -> Subscriber:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
