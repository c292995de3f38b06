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
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future

from msgtable import codec
from msgtable.client.acks import AckQueue
from msgtable.client.message import Message
from msgtable.client.router import Router
from msgtable.client.stream import Stream
from msgtable.codec import Field
from msgtable.errors import MsgtableError
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb


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
    ) -> None:
        self.name = request.name
        self.keyspace = request.keyspace
        self.fields: tuple[Field, ...] = ()
        self.field_names: tuple[str, ...] = ()
        self._router = router
        self._ack_linger_s = ack_linger_s
        self._closed = False
        self._pending: deque[Message] = deque()
        self._ack_queue: AckQueue | None = None
        self._decoder: codec.RowDecoder | None = None
        self._stream = Stream(
            router,
            request,
            first_timeout_s=router.timeout_s,
            retry=retry,
            retry_for_s=retry_for_s,
            on_open=self._adopt,
        )
        self._first = self._stream.open()

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
        fields = tuple(codec.field_from_proto(f) for f in first.fields)
        if fields != self.fields:
            self.fields = fields
            self.field_names = tuple(f.name for f in fields)
            self._decoder = codec.RowDecoder([f.type for f in fields])

    # -- messages ----------------------------------------------------------------------------
    def _messages(self, response: pb.MessageStreamResponse) -> list[Message]:
        assert self._decoder is not None
        decode, sent_ns = self._decoder.decode, response.sent_ns
        return [
            Message(self, decode(row), row.values[0], row.sent_before + 1, sent_ns)
            for row in response.rows
        ]

    def next_batch(self) -> list[Message]:
        """The next batch as the server sent it (up to vt_batch_size); [] once closed."""
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
        while not self._pending:
            batch = self.next_batch()
            if not batch:
                raise StopIteration
            self._pending.extend(batch)
        return self._pending.popleft()

    # -- acks --------------------------------------------------------------------------------
    def ack(self, messages: Iterable[Message]) -> int:
        """Acknowledge messages of this subscriber in one call; returns how many it acked."""
        ids = [m.id_value for m in messages]
        if not ids:
            return 0
        count = self._send_ack(ids)
        self._acker().counted(count)
        return count

    def ack_async(self, messages: Iterable[Message]) -> Future[None]:
        """Queue messages for acking and return at once.

        A background thread sends what is queued in one MessageAck once the oldest queued
        ack waited the client's ``ack_linger_s`` (5 ms by default) and no other call is on
        the wire, so acks queued meanwhile go together in one call. The future completes
        once the call holding these ids returned (its error, a MsgtableError, if it failed;
        the messages then come again after their ack wait). ``acked`` counts what the calls
        acked; ``flush_acks()`` waits for everything queued; ``close()`` flushes first.
        """
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
        return self._router.ack(self.name, self.keyspace, ids, self.target)

    def _acker(self) -> AckQueue:
        if self._ack_queue is None:
            self._ack_queue = AckQueue(self.name, self._send_ack, self._ack_linger_s)
        return self._ack_queue

    def close(self) -> None:
        """Leave: acks queued by ack_async are sent first (for up to the client's time-out),
        then the server releases the subscriber; unacked messages are resent later."""
        if not self._closed:
            self._closed = True
            self._stream.closed = True
            try:
                if self._ack_queue is not None:
                    # a failed call's error went to its futures; those messages come again
                    with contextlib.suppress(MsgtableError):
                        self._ack_queue.close(self._router.timeout_s)
            finally:
                self._stream.cancel()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
