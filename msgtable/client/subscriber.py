"""A subscriber as the client holds it: iterate it for messages, ack them, close it to leave.

    with client.subscribe("my_message") as sub:
        for message in sub:
            handle(message.values)
            message.ack()

Its MessageStream opens itself again when it breaks for a passing reason (msgtable.client.
stream); messages received before still ack by id. For throughput, ``ack_async`` acks whole
batches without waiting (msgtable.client.acks).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import grpc

from msgtable.client import requests
from msgtable.client.acks import AckQueue
from msgtable.client.leaser import DEFAULT_MAX_LEASE_S, Leaser
from msgtable.client.message import Message
from msgtable.client.router import Router
from msgtable.client.stream import Stream
from msgtable.core import codec, tracing
from msgtable.core.codec import Field
from msgtable.errors import MsgtableError
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider


class Subscriber:
    """An open MessageStream: iterate it for messages (or batches()); close() to leave.

    Iteration blocks until messages arrive and ends after close(). A stream that breaks for a
    passing reason is opened again by itself and iteration goes on (see
    msgtable.client.stream); after the client's ``retry_for_s`` without a stream, or for any
    other error (table dropped or not found, not allowed), iteration raises the MsgtableError.
    """

    def __init__(
        self,
        router: Router,
        request: pb.MessageStreamRequest,
        *,
        retry: bool,
        retry_for_s: float | None,
        ack_linger_s: float,
        follow: bool = False,
        renew_every_s: float | None = None,
        max_lease_s: float = DEFAULT_MAX_LEASE_S,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.name = request.name
        self.keyspace = request.keyspace
        self.subscription = request.subscription  # "": the table's default group
        self.fields: tuple[Field, ...] = ()
        self.field_names: tuple[str, ...] = ()
        self._router = router
        self._ack_linger_s = ack_linger_s
        self._closed = False
        self._pending: deque[Message] = deque()  # received by iteration, not handed out
        self._pending_at = 0.0  # when they were received (monotonic)
        self._ack_wait_s = 0.0  # the stream's, from its first response (0: not said)
        self._ack_queue: AckQueue | None = None
        self._decoder: codec.RowDecoder | None = None
        # consumer spans (msgtable.core.tracing; None: nothing records, checked once here)
        self._tracing = tracing.consumer(self.name, self.subscription, tracer_provider)
        self._stream = Stream(
            router,
            request,
            first_timeout_s=router.timeout_s,
            retry=retry,
            retry_for_s=retry_for_s,
            on_open=self._adopt,
            follow=follow,
        )
        self._first = self._stream.open()
        # auto-renew (msgtable.client.leaser): messages received are renewed until settled
        self._leaser = (
            Leaser(
                self.name,
                self._send_renew,
                renew_every_s,
                max_lease_s,
                closed=lambda: self._router.closed,
            )
            if renew_every_s is not None
            else None
        )

    @property
    def reconnects(self) -> int:
        """How many times the stream was opened again."""
        return self._stream.reconnects

    @property
    def target(self) -> str:
        """The server of the current stream."""
        return self._stream.target

    def _adopt(self, first: pb.MessageStreamResponse) -> None:
        """Take the columns of a (new) stream's first response."""
        self._ack_wait_s = first.ack_wait_s
        fields = tuple(codec.field_from_proto(f) for f in first.fields)
        if fields != self.fields:
            self.fields = fields
            self.field_names = tuple(f.name for f in fields)
            self._decoder = codec.RowDecoder([f.type for f in fields])
            if self._tracing is not None:
                self._tracing.adopt(self.field_names)

    # -- messages ----------------------------------------------------------------------------
    def _messages(self, response: pb.MessageStreamResponse) -> list[Message]:
        assert self._decoder is not None
        decode, sent_ns = self._decoder.decode, response.sent_ns
        messages = [
            Message(self, decode(row), row.values[0], row.sent_before + 1, sent_ns)
            for row in response.rows
        ]
        if self._leaser is not None:
            self._leaser.add(messages)
        return messages

    def next_batch(self) -> list[Message]:
        """The next batch as the server sent it (up to vt_batch_size); [] once closed."""
        batch = self._next_batch()
        if self._tracing is not None:
            self._tracing.batch(batch)  # one span for the batch, current until the next
        return batch

    def _next_batch(self) -> list[Message]:
        if self._pending:
            batch = list(self._pending)
            self._pending.clear()
            return batch
        while (response := self._stream.next()) is not None:
            if response.rows:
                return self._messages(response)
        return []

    def raw_responses(self) -> Iterator[pb.MessageStreamResponse]:
        """The stream's responses as they come off the wire, the fields response first (once).

        For tests and tools; do not mix with iterating messages.
        """
        if self._first is not None:
            first, self._first = self._first, None
            yield first
        while (response := self._stream.next()) is not None:
            yield response

    def batches(self) -> Iterator[list[Message]]:
        """Batches as they arrive, until close()."""
        while batch := self.next_batch():
            yield batch

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        if self._tracing is not None:
            self._tracing.release_context()  # the last message's span ends here at the latest
        while not self._pending:
            batch = self._next_batch()
            if not batch:
                raise StopIteration
            self._pending.extend(batch)
            self._pending_at = time.monotonic()
        message = self._pending.popleft()
        if self._tracing is not None:
            self._tracing.message(message)  # its span, current until the next message
        return message

    # -- acks --------------------------------------------------------------------------------
    def ack(self, messages: Iterable[Message]) -> int:
        """Acknowledge messages of this subscriber in one call; returns how many it acked."""
        messages = list(messages)
        ids = [m.id_value for m in messages]
        if not ids:
            return 0
        self._settled(messages)  # whatever the call's fate: its ack wait is the safety net
        count = self._send_ack(ids)
        self._acker().counted(count)
        return count

    # -- settlement besides ack (README: Settlement) --------------------------------------------
    def release(
        self, messages: Iterable[Message], delay_s: float = 0.0, reason: str | None = None
    ) -> int:
        """Not now: the messages are due again ``delay_s`` from now (0: at once), to any
        subscriber; this delivery counts as an attempt. Returns how many were released."""
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
        return self._settle("MessageRelease", request, messages)

    def reject(self, messages: Iterable[Message], reason: str | None = None) -> int:
        """Never: the messages are dead now, ``reason`` their last error. Returns how many."""
        messages = list(messages)
        request = requests.reject_request(
            self.name, [m.id_value for m in messages], reason, self.keyspace, self.subscription
        )
        return self._settle("MessageReject", request, messages)

    def renew(
        self, messages: Iterable[Message], extend_s: float = 0.0, reason: str | None = None
    ) -> int:
        """Still working: the messages are not sent again before ``extend_s`` from now (0:
        the table's ack wait). Returns how many were renewed."""
        messages = list(messages)
        if not messages:
            return 0
        ids = [m.id_value for m in messages]
        return self._send_renew(ids, requests.attempts_of(messages), extend_s, reason)

    def _settle(self, method: str, request: Any, messages: list[Message]) -> int:
        if not messages:
            return 0
        self._settled(messages)  # whatever the call's fate: its ack wait is the safety net
        return self._router.settle(method, request, self.target)

    def _send_renew(
        self,
        ids: list[pb.Value],
        attempts: list[int],
        extend_s: float = 0.0,
        reason: str | None = None,
    ) -> int:
        request = requests.renew_request(
            self.name, ids, extend_s, reason, self.keyspace, self.subscription, attempts
        )
        return self._router.settle("MessageRenew", request, self.target)

    def _settled(self, messages: list[Message]) -> None:
        if self._leaser is not None:
            self._leaser.remove(messages)
        if self._tracing is not None:
            self._tracing.settled(messages)

    @property
    def leaser(self) -> Leaser | None:
        """The auto-renewal of held messages (None: not asked for at subscribe)."""
        return self._leaser

    def ack_async(self, messages: Iterable[Message]) -> Future[None]:
        """Queue messages for acking and return at once.

        A background thread sends what is queued in one MessageAck once the oldest queued
        ack waited the client's ``ack_linger_s`` (5 ms by default) and no other call is on
        the wire, so acks queued meanwhile go together in one call. The future completes
        once the call holding these ids returned (its error, a MsgtableError, if it failed;
        the messages then come again after their ack wait). ``acked`` counts what the calls
        acked; ``flush_acks()`` waits for everything queued; ``close()`` flushes first.
        """
        messages = list(messages)
        self._settled(messages)
        return self._acker().add([m.id_value for m in messages])

    def flush_acks(self, timeout_s: float | None = None) -> None:
        """Wait until every ack queued by ack_async was sent and answered.

        Raises the first error of those calls, and Unavailable on a time-out."""
        if self._ack_queue is not None:
            self._ack_queue.flush(timeout_s)

    @property
    def acked(self) -> int:
        """How many messages this subscriber's ack calls acked (the server's counts)."""
        return self._ack_queue.acked if self._ack_queue is not None else 0

    @property
    def ack_calls(self) -> int:
        """How many MessageAck calls ack_async's thread made (each may carry many batches)."""
        return self._ack_queue.calls if self._ack_queue is not None else 0

    def _send_ack(self, ids: list[pb.Value]) -> int:
        """One MessageAck, to the server of the stream (its leader)."""
        return self._router.ack(self.name, self.keyspace, ids, self.target, self.subscription)

    def _acker(self) -> AckQueue:
        if self._ack_queue is None:
            self._ack_queue = AckQueue(self.name, self._send_ack, self._ack_linger_s)
        return self._ack_queue

    def close(self) -> None:
        """Leave: acks queued by ack_async are sent first (for up to the client's time-out),
        then the server releases the subscriber; unacked messages are resent later. The
        rest of a batch that iteration received and never handed out is released at once
        (one try, naming their deliveries: requests.release_unhanded)."""
        if not self._closed:
            self._closed = True
            self._stream.closed = True
            if self._tracing is not None:
                self._tracing.end()
            if self._leaser is not None:
                self._leaser.close()
            try:
                if self._ack_queue is not None:
                    # a failed call's error went to its futures; those messages come again
                    with contextlib.suppress(MsgtableError):
                        self._ack_queue.close(self._router.timeout_s)
            finally:
                self._stream.cancel()
                # after the stream ended: the server would send them right back to it
                self._release_unhanded()

    def _release_unhanded(self) -> None:
        left = []
        while True:  # popleft one at a time: a message goes to iteration or here, never both
            try:
                left.append(self._pending.popleft())
            except IndexError:
                break
        request = requests.unhanded_release(
            left, self._pending_at, self._ack_wait_s, self.name, self.keyspace, self.subscription
        )
        if request is None:
            return
        self._settled(left)
        timeout = requests.UNHANDED_RELEASE_TIMEOUT_S
        with contextlib.suppress(MsgtableError, grpc.RpcError):  # their ack wait is the net
            self._router.invoke(self.target, "MessageRelease", request, timeout=timeout)

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
