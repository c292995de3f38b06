"""The Python client of a msgtable server: subscribe to a message table, ack, list tables.

    with Client("127.0.0.1:50051") as client:
        with client.subscribe("my_message") as sub:
            for message in sub:
                handle(message.values)
                message.ack()

For throughput, ack whole batches without waiting: ``ack_async`` queues the ids and a
background thread sends them, merging the acks queued while one MessageAck is on the wire
into the next call (at most MAX_ACK_IDS ids a call), so a busy subscriber makes far fewer
calls than it acks batches::

    for batch in sub.batches():
        handle(batch)
        sub.ack_async(batch)     # returns at once; sub.flush_acks() waits for all of them

Errors come back as the server's classes (msgtable.errors): TableNotFound, TableLoadError,
InvalidArgument, Unavailable (unreachable server, shutdown, time-out, too many streams),
and MsgtableError for anything else. Values are decoded by column type as described in
msgtable.codec: dates and times stay text.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.experimental

from msgtable import codec
from msgtable.codec import FieldType
from msgtable.errors import (
    LEADER_METADATA_KEY,
    InvalidArgument,
    MsgtableError,
    NotLeader,
    PermissionDenied,
    ResourceExhausted,
    TableLoadError,
    TableNotFound,
    Unauthenticated,
    Unavailable,
)
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.proto.msgtable.v1 import messaging_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

DEFAULT_TARGET = "127.0.0.1:50051"
DEFAULT_TIMEOUT_S = 10.0
MAX_ACK_IDS = 10_000  # the server's limit of ids per MessageAck (msgtable.manager)
# How long ack_async holds the first queued ack for others to join it in one MessageAck: a
# call costs the server and the client each about 0.25 ms of CPU, so merging matters when
# small batches come fast; a message acked a few ms later changes nothing else.
DEFAULT_ACK_LINGER_S = 0.005
# Ping an idle stream so a dead server or a dropped connection is noticed; the server allows
# pings this often (server.py sets min_ping_interval_without_data_ms below it).
KEEPALIVE_TIME_MS = 60_000
KEEPALIVE_TIMEOUT_MS = 20_000
CHANNEL_OPTIONS = (
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.max_receive_message_length", -1),  # a batch of big rows may exceed the 4 MB default
    # Read a stream's responses on the thread that iterates it, not on a helper thread that
    # hands each one over: about a fifth less client CPU per batch.
    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
)

# The reverse of server.STATUS_CODES: users catch the same classes the engine raises.
ERRORS_BY_CODE: dict[grpc.StatusCode, type[MsgtableError]] = {
    grpc.StatusCode.NOT_FOUND: TableNotFound,
    grpc.StatusCode.FAILED_PRECONDITION: TableLoadError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.INTERNAL: MsgtableError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
    grpc.StatusCode.CANCELLED: Unavailable,
}


# Which errors a subscription or an ack retries: the server or the database is away for
# now, a limit is reached for now, or this server is not the leader (NotLeader, also an
# Unavailable). The others (no such table, bad request, not allowed) would fail again.
RETRYABLE: tuple[type[MsgtableError], ...] = (Unavailable,)
DEFAULT_RETRY_FOR_S = 300.0  # a subscription gives up after this long without a stream
RETRY_MIN_S = 0.1  # the first retry's backoff; it doubles per failure, with full jitter,
RETRY_MAX_S = 5.0  # up to this


def error_from_rpc(error: grpc.RpcError, target: str = "") -> MsgtableError:
    """The MsgtableError for a failed call (the one place that maps status codes back)."""
    code: grpc.StatusCode | None = error.code() if hasattr(error, "code") else None
    details: str = (error.details() if hasattr(error, "details") else None) or ""
    name = code.name if code is not None else "UNKNOWN"
    cls = ERRORS_BY_CODE.get(code) if code is not None else None
    if code is grpc.StatusCode.UNAVAILABLE:
        trailing = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
        for key, value in trailing or ():
            if key == LEADER_METADATA_KEY:
                return NotLeader(details or name, leader=str(value))
    if code is grpc.StatusCode.UNAVAILABLE and details.lower().startswith("failed to connect"):
        return Unavailable(f"cannot reach the msgtable server at {target}: {details}")
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return Unavailable(f"no answer from the msgtable server at {target} in time")
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return MsgtableError(f"the server at {target} does not serve msgtable.v1 ({details})")
    if cls is None:
        return MsgtableError(f"{details or 'server error'} ({name})")
    return cls(details or name)


@dataclass(frozen=True)
class Field:
    """One streamed column: its name, how its values are read, and its MySQL type."""

    name: str
    type: FieldType
    column_type: str


@dataclass(frozen=True)
class TableSettings:
    """The configuration of a loaded message table, as the server reports it."""

    ack_wait_s: float
    purge_after_s: float
    batch_size: int
    cache_size: int
    poller_interval_s: float
    min_backoff_s: float
    max_backoff_s: float  # 0 means unbounded
    layout: str  # "current" or "2018"
    message_columns: tuple[Field, ...]
    postpone_after_s: float  # vt_postpone_after (0: postponed before the send)


@dataclass(frozen=True)
class TableInfo:
    """One message table as the server sees it (msgtable.status.TableStatus, remotely)."""

    name: str
    keyspace: str
    config: TableSettings | None  # None when the table failed to load
    load_error: str  # "" when the table is loaded
    cached: int
    in_flight: int
    subscribers: int
    sent: int
    acked: int

    @property
    def loaded(self) -> bool:
        return not self.load_error


def _field(message: Any) -> Field:
    return Field(message.name, codec.to_field_type(message.type), message.column_type)


def _table_info(message: pb.TableStatus) -> TableInfo:
    config = None
    if message.HasField("config"):
        c = message.config
        config = TableSettings(
            ack_wait_s=c.ack_wait_s,
            purge_after_s=c.purge_after_s,
            batch_size=c.batch_size,
            cache_size=c.cache_size,
            poller_interval_s=c.poller_interval_s,
            min_backoff_s=c.min_backoff_s,
            max_backoff_s=c.max_backoff_s,
            layout=c.layout,
            message_columns=tuple(_field(f) for f in c.message_columns),
            postpone_after_s=c.postpone_after_s,
        )
    return TableInfo(
        name=message.name,
        keyspace=message.keyspace,
        config=config,
        load_error=message.load_error,
        cached=message.cached,
        in_flight=message.in_flight,
        subscribers=message.subscribers,
        sent=message.sent,
        acked=message.acked,
    )


class Message:
    """One message received from a subscription."""

    __slots__ = ("_id_value", "_subscription", "_values", "row")

    def __init__(
        self, subscription: Subscription, row: tuple[object, ...], id_value: pb.Value
    ) -> None:
        self.row = row  # values in the order of subscription.fields, id first
        self._subscription = subscription
        self._id_value = id_value
        self._values: dict[str, object] | None = None

    @property
    def id(self) -> object:
        return self.row[0]

    @property
    def values(self) -> dict[str, object]:
        """Column name -> value, id included."""
        if self._values is None:
            self._values = dict(zip(self._subscription.field_names, self.row, strict=True))
        return self._values

    def ack(self) -> int:
        """Acknowledge this message; returns 1 if this call acked it, 0 if it was already."""
        return self._subscription.ack([self])

    def __repr__(self) -> str:
        return f"Message({self._subscription.name}, {self.values!r})"


class Subscription:
    """An open MessageStream: iterate it for messages (or batches()); close() to leave.

    Iteration blocks until messages arrive and ends after close(). When the stream breaks
    for a reason that passes (the server restarted or shut down, the database is away, a
    limit, another server became the leader) the subscription subscribes again by itself,
    with backoff (RETRY_MIN_S doubling to RETRY_MAX_S, full jitter), going to the leader a
    NotLeader answer names, and iteration goes on; messages received before still ack by
    id. After the client's ``retry_for_s`` without a stream, or for any other error (table
    dropped or not found, not allowed), iteration raises the MsgtableError.
    """

    def __init__(
        self,
        client: Client,
        request: pb.MessageStreamRequest,
        first_timeout_s: float | None,
        retry: bool = True,
    ) -> None:
        self.name = request.name
        self.keyspace = request.keyspace
        self.reconnects = 0  # how many times the stream was opened again
        self.target = ""  # the server the current stream goes to
        self._client = client
        self._request = request
        self._first_timeout_s = first_timeout_s
        self._retry = retry
        self._closed = False
        self._closing = threading.Event()
        self._call: Any = None
        self._pending: deque[Message] = deque()
        self._ack_queue: AckQueue | None = None
        self.fields: tuple[Field, ...] = ()
        self.field_names: tuple[str, ...] = ()
        self._decoder: codec.RowDecoder | None = None
        self._first: Any = self._connect(None)

    # -- the stream ------------------------------------------------------------------------
    def _connect(self, broken: MsgtableError | None) -> Any:
        """Open the stream (again, after ``broken``), retrying what passes; its first
        response. Raises the error that does not pass, or the last one after retry_for_s."""
        client = self._client
        error = broken
        failures = 0 if broken is None else 1
        started = time.monotonic()
        target = self.target  # where the last attempt went
        while True:
            if error is not None:
                if client.closed:  # closing the client ends its subscriptions
                    if broken is None:
                        raise error
                    self._closed = True
                    return None
                if not self._retry or not isinstance(error, RETRYABLE):
                    raise error
                retry_for = client.retry_for_s
                if retry_for is not None and time.monotonic() - started >= retry_for:
                    raise type(error)(f"{error} (gave up after {retry_for:g}s of retrying)")
                leader = error.leader if isinstance(error, NotLeader) else ""
                delay = client._after_failure(error, target, failures)
                if failures > 1 or not leader:
                    log.warning(
                        "stream of %s: %s; subscribing again in %.1fs", self.name, error, delay
                    )
                if self._closing.wait(delay):
                    return None
            target = client._next_target()
            try:
                call = client._stub(target).MessageStream(self._request)
                first = self._first_response(call, target)
            except MsgtableError as exc:
                error = exc
                failures += 1
                continue
            if self._closed:
                call.cancel()
                return None
            self._call, self.target = call, target
            client._succeeded(target)
            if broken is not None:
                self.reconnects += 1
                log.info("stream of %s: subscribed again at %s", self.name, target)
            self._adopt(first)
            return first

    def _first_response(self, call: Any, target: str) -> Any:
        timeout_s = self._first_timeout_s
        timed_out = threading.Event()

        def give_up() -> None:
            timed_out.set()
            call.cancel()

        timer = threading.Timer(timeout_s, give_up) if timeout_s is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            first = next(call)
        except StopIteration:
            raise Unavailable(f"the server ended the stream of {self.name} at once") from None
        except grpc.RpcError as exc:
            if timed_out.is_set():
                raise Unavailable(
                    f"no answer from the msgtable server at {target} within {timeout_s}s"
                ) from None
            raise error_from_rpc(exc, target) from None
        finally:
            if timer is not None:
                timer.cancel()
        if not first.fields:
            call.cancel()
            raise MsgtableError("the server's first stream response carried no fields")
        return first

    def _adopt(self, first: Any) -> None:
        """Take the columns of a (new) stream's first response."""
        fields = tuple(_field(f) for f in first.fields)
        if fields != self.fields:
            self.fields = fields
            self.field_names = tuple(f.name for f in fields)
            self._decoder = codec.RowDecoder([f.type for f in fields])

    def _receive(self) -> Any:
        """The next response (a new stream's first one after a reconnect), or None when the
        stream ended because we closed it."""
        try:
            return next(self._call)
        except StopIteration:
            if self._closed:
                return None
            error: MsgtableError = Unavailable(f"the server ended the stream of {self.name}")
        except grpc.RpcError as exc:
            if self._closed:
                return None
            error = error_from_rpc(exc, self.target)
        return self._connect(error)

    def _messages(self, response: Any) -> list[Message]:
        assert self._decoder is not None
        decode = self._decoder.decode
        return [Message(self, decode(row), row.values[0]) for row in response.rows]

    def next_batch(self) -> list[Message]:
        """The next batch as the server sent it (up to vt_batch_size); [] once closed."""
        if self._pending:
            batch = list(self._pending)
            self._pending.clear()
            return batch
        while (response := self._receive()) is not None:
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
        while (response := self._receive()) is not None:
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

    def ack(self, messages: Iterable[Message]) -> int:
        """Acknowledge messages of this subscription in one call; returns how many it acked."""
        ids = [m._id_value for m in messages]
        if not ids:
            return 0
        count = self._client._ack_values(self.name, self.keyspace, ids, self.target)
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
        return self._acker().add([m._id_value for m in messages])

    def flush_acks(self, timeout_s: float | None = None) -> None:
        """Wait until every ack queued by ack_async was sent and answered.

        Raises the first error of those calls, and Unavailable on a time-out."""
        if self._ack_queue is not None:
            self._ack_queue.flush(timeout_s)

    @property
    def acked(self) -> int:
        """How many messages this subscription's ack calls acked (the server's counts)."""
        return self._ack_queue.acked if self._ack_queue is not None else 0

    @property
    def ack_calls(self) -> int:
        """How many MessageAck calls ack_async's thread made (each may carry many batches)."""
        return self._ack_queue.calls if self._ack_queue is not None else 0

    def _acker(self) -> AckQueue:
        if self._ack_queue is None:
            self._ack_queue = AckQueue(
                self._client,
                self.name,
                self.keyspace,
                self._client.ack_linger_s,
                lambda: self.target,
            )
        return self._ack_queue

    def close(self) -> None:
        """Leave: acks queued by ack_async are sent first (for up to the client's time-out),
        then the server releases the subscription; unacked messages are resent later."""
        if not self._closed:
            self._closed = True
            try:
                if self._ack_queue is not None:
                    # a failed call's error went to its futures; those messages come again
                    with contextlib.suppress(MsgtableError):
                        self._ack_queue.close(self._client.timeout_s)
            finally:
                self._closing.set()
                if self._call is not None:
                    self._call.cancel()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AckQueue:
    """The acks of one subscription waiting to be sent, and the thread that sends them.

    Acks queued while a MessageAck is on the wire go together in the next one (at most
    MAX_ACK_IDS ids); each queued batch gets a future that completes with its call.
    """

    def __init__(
        self,
        client: Client,
        name: str,
        keyspace: str,
        linger_s: float,
        target: Callable[[], str] = str,
    ) -> None:
        self._client = client
        self._target = target  # the server of the subscription's stream (its leader)
        self._name = name
        self._keyspace = keyspace
        self._lock = threading.Condition()
        self._queued: list[tuple[list[pb.Value], Future[None]]] = []
        self._busy = False  # a call is on the wire
        self._closed = False
        self._error: BaseException | None = None  # the first failed call's error
        self._thread: threading.Thread | None = None
        self.acked = 0
        self.calls = 0  # MessageAck calls made for ack_async
        self.linger_s = linger_s
        self._oldest = 0.0  # when the oldest queued ack was queued (monotonic)
        self._size = 0  # ids queued
        self._flushing = 0  # flushes waiting: send without lingering

    def counted(self, count: int) -> None:
        with self._lock:
            self.acked += count

    def add(self, ids: list[pb.Value]) -> Future[None]:
        future: Future[None] = Future()
        if not ids:
            future.set_result(None)
            return future
        with self._lock:
            if self._closed:
                raise MsgtableError(f"the subscription to {self._name} is closed")
            if not self._queued:
                self._oldest = time.monotonic()
            self._queued.append((ids, future))
            self._size += len(ids)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"msgtable-acks-{self._name}", daemon=True
                )
                self._thread.start()
            self._lock.notify_all()
        return future

    def _take(self) -> list[tuple[list[pb.Value], Future[None]]] | None:
        """The next call's share of the queue (whole batches, up to MAX_ACK_IDS ids unless one
        batch alone is larger), once the oldest queued ack waited ``linger_s`` (sooner when
        the queue holds MAX_ACK_IDS ids or a flush asks); None once closed and empty."""
        with self._lock:
            while not self._queued and not self._closed:
                self._lock.wait()
            if not self._queued:
                return None
            if self.linger_s > 0:
                until = self._oldest + self.linger_s
                self._lock.wait_for(
                    lambda: self._closed or self._flushing or self._size >= MAX_ACK_IDS,
                    max(0.0, until - time.monotonic()),
                )
            taken, size = 0, 0
            for ids, _ in self._queued:
                if taken and size + len(ids) > MAX_ACK_IDS:
                    break
                taken += 1
                size += len(ids)
            batch, self._queued = self._queued[:taken], self._queued[taken:]
            self._size -= size
            self._oldest = time.monotonic()
            self._busy = True
            return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            ids = [v for chunk, _ in batch for v in chunk]
            error: BaseException | None = None
            count = 0
            try:
                count = self._client._ack_values(self._name, self._keyspace, ids, self._target())
            except BaseException as exc:  # handed to the futures
                error = exc
            with self._lock:
                self.acked += count
                self.calls += 1
                self._busy = False
                if error is not None and self._error is None:
                    self._error = error
                self._lock.notify_all()
            for _, future in batch:
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)

    def flush(self, timeout_s: float | None) -> None:
        with self._lock:
            self._flushing += 1
            self._lock.notify_all()
            try:
                done = self._lock.wait_for(lambda: not self._queued and not self._busy, timeout_s)
            finally:
                self._flushing -= 1
            error, self._error = self._error, None
        if error is not None:
            raise error
        if not done:
            raise Unavailable(f"acks of {self._name} not answered within {timeout_s}s")

    def close(self, timeout_s: float | None) -> None:
        """Send what is queued (waiting up to ``timeout_s``), then stop the thread."""
        try:
            self.flush(timeout_s)
        finally:
            with self._lock:
                self._closed = True
                self._lock.notify_all()


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise InvalidArgument(f"cannot read {path}: {exc}") from None


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """Adds ``authorization: Bearer TOKEN`` to every call's metadata."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), self._header]
        return (
            details._replace(metadata=metadata)
            if hasattr(details, "_replace")
            else (_CallDetails(details, metadata))
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)


class _CallDetails(grpc.ClientCallDetails):  # type: ignore[misc]
    def __init__(self, base: Any, metadata: Any) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


class Client:
    """A connection to msgtable servers. Thread-safe; close() (or use as a context manager).

    ``target``: one server's HOST:PORT, or several separated by commas (servers of one
    database: the one holding the lease sends, the others answer NotLeader with its
    address). Calls go to the leader once one answer named it, else to the targets in turn.
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        ack_linger_s: float = DEFAULT_ACK_LINGER_S,
        retry_for_s: float | None = DEFAULT_RETRY_FOR_S,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        """``timeout_s``: for each unary call, for the first response of a stream, and for
        the retries of an ack. ``retry_for_s``: how long a subscription keeps subscribing
        again after its stream broke (None: for ever). ``token``: sent as
        ``authorization: Bearer TOKEN`` with every call. ``tls_ca`` (the CA that signed the
        server's certificate; a PEM file), or ``tls_cert`` and ``tls_key`` (a client
        certificate for mutual TLS), make the channels TLS."""
        if ack_linger_s < 0:
            raise InvalidArgument(f"ack_linger_s must be >= 0, not {ack_linger_s}")
        if retry_for_s is not None and retry_for_s < 0:
            raise InvalidArgument(f"retry_for_s must be >= 0 or None, not {retry_for_s}")
        self.targets = tuple(t.strip() for t in target.split(",") if t.strip())
        if not self.targets:
            raise InvalidArgument("no server address given")
        self.target = target
        self.timeout_s = timeout_s
        self.ack_linger_s = ack_linger_s  # see Subscription.ack_async
        self.retry_for_s = retry_for_s
        self._credentials: grpc.ChannelCredentials | None = None
        if tls_ca or tls_cert or tls_key:
            if bool(tls_cert) != bool(tls_key):
                raise InvalidArgument("a client certificate needs both tls_cert and tls_key")
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca) if tls_ca else None,
                private_key=_read(tls_key) if tls_key else None,
                certificate_chain=_read(tls_cert) if tls_cert else None,
            )
        self._token = token
        self._lock = threading.Lock()
        self._channels: dict[str, tuple[grpc.Channel, pb_grpc.MessagingStub]] = {}
        self._leader = ""  # the address a NotLeader answer named, until it fails
        self._turn = 0  # which of the targets is next when no leader is known
        self._closed = False
        self._stub(self.targets[0])  # channels connect lazily: this only builds it

    # -- channels and the choice of server ------------------------------------------------
    def _stub(self, target: str) -> pb_grpc.MessagingStub:
        with self._lock:
            if self._closed:
                raise Unavailable("the client is closed")
            entry = self._channels.get(target)
            if entry is None:
                if self._credentials is not None:
                    raw = grpc.secure_channel(target, self._credentials, options=CHANNEL_OPTIONS)
                else:
                    raw = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
                channel: grpc.Channel = raw
                if self._token:
                    channel = grpc.intercept_channel(raw, _BearerToken(self._token))
                entry = self._channels[target] = (raw, pb_grpc.MessagingStub(channel))
            return entry[1]

    def _next_target(self) -> str:
        """Where the next call goes: the known leader, else the targets in turn."""
        with self._lock:
            if self._leader:
                return self._leader
            return self.targets[self._turn % len(self.targets)]

    def _succeeded(self, target: str) -> None:
        with self._lock:
            if target in self.targets:
                self._turn = self.targets.index(target)

    def _after_failure(self, error: MsgtableError, target: str, failures: int) -> float:
        """Note a failed call to ``target``; how long to wait before the next attempt."""
        with self._lock:
            if isinstance(error, NotLeader) and error.leader and error.leader != target:
                self._leader = error.leader
                if failures <= 2:
                    return 0.0  # a redirect: at once (a loop of them backs off)
            elif target == self._leader or not self._leader:
                self._leader = ""
                self._turn += 1  # try the next target
        return backoff_s(failures)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def leader(self) -> str:
        """The leader's address as the last NotLeader answer named it ("" if none)."""
        return self._leader

    # -- calls -------------------------------------------------------------------------------
    def subscribe(
        self,
        name: str,
        keyspace: str = "",
        shard: str = "",
        key_range: tuple[bytes, bytes] | None = None,
        max_in_flight: int = 0,
        retry: bool = True,
    ) -> Subscription:
        """Subscribe to a message table; returns once a server accepted the subscription.

        ``max_in_flight``: the server sends a batch only while fewer than this many of the
        messages it sent this subscription are unacked (0: the server's default, 1,000).
        ``retry``: subscribe again by itself when the stream breaks for a passing reason,
        and retry the first subscribe too (see Subscription); False raises instead."""
        if not 0 <= max_in_flight <= 0xFFFFFFFF:
            raise InvalidArgument(f"max_in_flight must be >= 0, not {max_in_flight}")
        request = pb.MessageStreamRequest(
            name=name, keyspace=keyspace, shard=shard, max_in_flight=max_in_flight
        )
        if key_range is not None:
            request.key_range.start, request.key_range.end = key_range
        return Subscription(self, request, self.timeout_s, retry)

    def ack(self, name: str, ids: Sequence[object], keyspace: str = "") -> int:
        """Acknowledge messages by id; returns how many this call acked.

        A call that fails for a passing reason is tried again (to the leader, if a server
        named one) with backoff within the client's ``timeout_s``; acks are idempotent, so
        one that was written before its answer was lost counts 0 the second time."""
        values = []
        for i, raw in enumerate(ids):
            try:
                values.append(codec.encode_value(raw))
            except (TypeError, ValueError) as exc:
                raise InvalidArgument(f"ids[{i}]: {exc}") from None
        return self._ack_values(name, keyspace, values)

    def _ack_values(
        self, name: str, keyspace: str, ids: Sequence[pb.Value], target: str = ""
    ) -> int:
        request = pb.MessageAckRequest(name=name, keyspace=keyspace, ids=ids)
        response = self._unary("MessageAck", request, target)
        count: int = response.count
        return count

    def _unary(self, method: str, request: Any, target: str = "") -> Any:
        """One unary call with retries of passing errors until the time-out is spent."""
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        failures = 0
        while True:
            where = target or self._next_target()
            left = None if deadline is None else max(0.001, deadline - time.monotonic())
            try:
                return getattr(self._stub(where), method)(request, timeout=left)
            except grpc.RpcError as exc:
                error = error_from_rpc(exc, where)
            failures += 1
            target = ""  # a retry goes where the client now thinks best
            delay = self._after_failure(error, where, failures)
            if not isinstance(error, RETRYABLE) or (
                deadline is not None and time.monotonic() + delay >= deadline
            ):
                raise error
            time.sleep(delay)

    def list_tables(self) -> list[TableInfo]:
        """Every message table the server knows, with config or load error and counters."""
        response = self._unary("ListTables", pb.ListTablesRequest())
        return [_table_info(t) for t in response.tables]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
        for raw, _ in channels:
            raw.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def backoff_s(failures: int) -> float:
    """The wait before retry number ``failures`` (1, 2, ...): full jitter over an
    exponential ceiling, RETRY_MIN_S * 2^(failures-1) up to RETRY_MAX_S."""
    ceiling = min(RETRY_MAX_S, RETRY_MIN_S * 2.0 ** min(failures - 1, 16))
    return random.uniform(ceiling / 2, ceiling)
