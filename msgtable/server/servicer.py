"""The gRPC server: a thin servicer over the engine, health checking and reflection.

Servicers translate; they hold no SQL and no rules. Every error the engine raises on
purpose is a MsgtableError, mapped to a status code by :func:`status_for` (the one place);
anything else is a bug: logged with its traceback, answered with a generic INTERNAL.

Each MessageStream holds one thread of the server's pool for its whole life, so the pool is
sized for many streams and a share of it is kept free for MessageAck and ListTables: streams
beyond ``max_streams`` are refused with RESOURCE_EXHAUSTED instead of starving acks.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from msgtable.core import codec
from msgtable.core.deadletters import DeadLetter, RedriveBatch
from msgtable.core.rows import Batch, RelayedBatch
from msgtable.core.status import TableStatus
from msgtable.core.subscriptions import Subscription
from msgtable.core.tables import Column
from msgtable.engine.components import SchedulesComponent
from msgtable.engine.subscriber import narrowed
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
from msgtable.features.push.endpoints import DEFAULT_MAX_IN_FLIGHT as DEFAULT_PUSH_IN_FLIGHT
from msgtable.features.push.endpoints import DEFAULT_TIMEOUT_S as DEFAULT_PUSH_TIMEOUT_S
from msgtable.features.push.endpoints import Endpoint
from msgtable.limits import (
    DEFAULT_ADDRESS,
    DEFAULT_DEAD_LISTED,
    DEFAULT_GRACE_S,
    DEFAULT_MAX_STREAMS_PER_CLIENT,
    DEFAULT_MAX_SUBSCRIBERS_PER_TABLE,
    DEFAULT_REDRIVE_BATCH,
    MAX_REQUEST_BYTES,
)
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.proto.msgtable.v1 import messaging_pb2_grpc as pb_grpc
from msgtable.server import wire
from msgtable.server.auth import ANONYMOUS, Authorizer
from msgtable.server.listen import cannot_listen

if TYPE_CHECKING:
    from msgtable.server.sqs.app import SqsServer

log = logging.getLogger(__name__)

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["Messaging"].full_name
DEFAULT_MAX_WORKERS = 256
STREAM_POLL_S = 1.0  # how often an idle stream checks that its client is still there
# The server pings each client connection this often when nothing else came from it, and
# drops the connection (its streams end, its subscribers leave) when a ping is not answered
# within KEEPALIVE_TIMEOUT_MS: a client whose packets vanish (half-open: no FIN, no RST) is
# noticed in at most their sum, not after TCP's own retransmissions give up (minutes).
KEEPALIVE_TIME_MS = 60_000
KEEPALIVE_TIMEOUT_MS = 20_000
# Clients may ping this often (theirs: msgtable.client.router.KEEPALIVE_TIME_MS, 60 s).
MIN_CLIENT_PING_MS = 10_000
INTERNAL_MESSAGE = "internal server error (details are in the server log)"
SHUTTING_DOWN = "server shutting down"


class Subscriber(Protocol):
    """What the servicer needs of a subscriber (msgtable.engine.subscriber.Subscriber)."""

    @property
    def fields(self) -> Sequence[Column]: ...

    @property
    def ack_wait_s(self) -> float: ...

    def next_batch(self, timeout_s: float | None = None, /) -> Batch: ...

    def end(self, error: MsgtableError, /) -> None: ...

    def close(self) -> None: ...


class Engine(Protocol):
    """What the servicer needs of the engine (msgtable.engine.engine.MessageEngine)."""

    def subscribe(
        self,
        name: str,
        keyspace: str,
        shard: str,
        key_range: tuple[bytes, bytes],
        max_in_flight: int,
        subscription: str = "",
        filter: str = "",
        max_messages: int = 0,
    ) -> Subscriber: ...

    def ack(
        self, name: str, keyspace: str, ids: Sequence[object], /, subscription: str = ""
    ) -> int: ...

    def list_tables(self) -> list[TableStatus]: ...

    def release(
        self,
        name: str,
        keyspace: str,
        ids: Sequence[object],
        delay_s: float,
        reason: str | None,
        /,
        subscription: str = "",
        attempts: Sequence[int] = (),
    ) -> int: ...

    def reject(
        self,
        name: str,
        keyspace: str,
        ids: Sequence[object],
        reason: str | None,
        /,
        subscription: str = "",
    ) -> int: ...

    def renew(
        self,
        name: str,
        keyspace: str,
        ids: Sequence[object],
        extend_s: float,
        reason: str | None,
        /,
        subscription: str = "",
        attempts: Sequence[int] = (),
    ) -> int: ...

    def dead_letters(
        self, name: str, keyspace: str, after: object | None, limit: int, /, subscription: str = ""
    ) -> tuple[list[DeadLetter], int]: ...

    def redrive(
        self,
        name: str,
        keyspace: str,
        to: str,
        ids: Sequence[object] | None,
        after: object | None,
        limit: int,
        /,
        subscription: str = "",
    ) -> RedriveBatch: ...

    def database_error(self) -> str: ...

    def create_subscription(self, sub: Subscription, from_start: bool = False) -> int: ...

    def alter_subscription(self, table: str, name: str, **changes: Any) -> Subscription: ...

    def drop_subscription(self, table: str, name: str) -> None: ...

    def list_subscriptions(self, table: str = "") -> list[TableStatus]: ...

    def set_endpoint(self, endpoint: Endpoint) -> None: ...

    def drop_endpoint(self, table: str, subscription: str = "") -> None: ...


# The one mapping from domain errors to status codes; the first class in an error's MRO wins.
STATUS_CODES: dict[type[MsgtableError], grpc.StatusCode] = {
    TableNotFound: grpc.StatusCode.NOT_FOUND,
    TableLoadError: grpc.StatusCode.FAILED_PRECONDITION,
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    # A MsgtableError without a more precise class: its message is meant for users, so it
    # goes out as is, under the code for "the server could not do it".
    MsgtableError: grpc.StatusCode.INTERNAL,
}


def status_for(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and details a client sees for an exception."""
    if isinstance(error, MsgtableError):
        for cls in type(error).__mro__:
            code = STATUS_CODES.get(cls)
            if code is not None:
                return code, str(error) or type(error).__name__
    return grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE


def _fail(context: grpc.ServicerContext, method: str, exc: Exception) -> NoReturn:
    """End the RPC with the status for ``exc``; log it if it is a bug."""
    code, details = status_for(exc)
    if isinstance(exc, NotLeader) and exc.leader:
        context.set_trailing_metadata(((LEADER_METADATA_KEY, exc.leader),))
    if not isinstance(exc, MsgtableError):
        log.error("server: %s failed unexpectedly", method, exc_info=exc)
    elif code is grpc.StatusCode.INTERNAL:
        log.error("server: %s failed: %s", method, wire.bounded(str(exc)))
    _abort(context, code, details)


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    context.abort(code, wire.bounded(details))  # raises
    raise AssertionError("context.abort returned")  # pragma: no cover


class MessagingServicer(pb_grpc.MessagingServicer):
    """msgtable.v1.Messaging over an engine: translation only."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_streams: int | None = None,
        stream_poll_s: float = STREAM_POLL_S,
        authorizer: Authorizer | None = None,
        max_subscribers_per_table: int = DEFAULT_MAX_SUBSCRIBERS_PER_TABLE,
        max_streams_per_client: int = DEFAULT_MAX_STREAMS_PER_CLIENT,
    ) -> None:
        self._engine = engine
        self._stream_poll_s = stream_poll_s
        self._authorizer = authorizer
        self._max_per_table = max_subscribers_per_table
        self._max_per_client = max_streams_per_client
        self._per_table: dict[tuple[str, str], int] = {}
        self._per_client: dict[str, int] = {}
        self._max_streams = max_streams
        self._stream_slots = (
            threading.BoundedSemaphore(max_streams) if max_streams is not None else None
        )
        self._lock = threading.Lock()
        self._active: set[Subscriber] = set()
        self._stopping = threading.Event()
        self.sqs: SqsServer | None = None  # the SQS API beside it (ListTables names it)

    def streams(self) -> int:
        """MessageStream calls open now (msgtable.observe.metrics)."""
        with self._lock:
            return len(self._active)

    def shutdown(self) -> None:
        """End every stream with UNAVAILABLE and refuse new ones. Idempotent.

        Batches already claimed for a stream are still sent first (within the server's
        grace period): end() lets next_batch hand them out before it raises.
        """
        self._stopping.set()
        with self._lock:
            active = list(self._active)
        for sub in active:
            sub.end(Unavailable(SHUTTING_DOWN))

    def MessageStream(
        self, request: Any, context: grpc.ServicerContext
    ) -> Iterator[pb.MessageStreamResponse]:
        if self._stopping.is_set():
            _abort(context, grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
        if self._stream_slots is not None and not self._stream_slots.acquire(blocking=False):
            _abort(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this server already serves {self._max_streams} streams; "
                "retry later or use another server",
            )
        try:
            principal = self._allowed(
                context, "subscribe", _resource(request.name, request.subscription)
            )
            with self._counted(principal or _peer_host(context), request) as refused:
                if refused:
                    _fail(context, "MessageStream", ResourceExhausted(refused))
                yield from self._stream(request, context)
        except MsgtableError as exc:
            _fail(context, "MessageStream", exc)
        finally:
            if self._stream_slots is not None:
                self._stream_slots.release()

    def _allowed(self, context: grpc.ServicerContext, action: str, table: str) -> str:
        """The caller's principal, if it may do ``action`` to ``table`` (else raises)."""
        if self._authorizer is None:
            return ANONYMOUS
        principal = self._principal(context)
        self._authorizer.check(principal, action, table)
        return principal

    def _principal(self, context: grpc.ServicerContext) -> str:
        assert self._authorizer is not None
        names = [
            n.decode("utf-8", "replace")
            for n in (context.auth_context() or {}).get("x509_common_name", [])
        ]
        return self._authorizer.authenticate(context.invocation_metadata() or (), names)

    @contextlib.contextmanager
    def _counted(self, client: str, request: Any) -> Iterator[str]:
        """Count a stream against its client's and its table's limits while it lives;
        yields why it is refused ("" if it is not)."""
        table = (request.keyspace, request.name)
        with self._lock:
            if self._per_client.get(client, 0) >= self._max_per_client:
                refused = (
                    f"this client already has {self._max_per_client} streams open "
                    "(--max-streams-per-client)"
                )
            elif self._per_table.get(table, 0) >= self._max_per_table:
                refused = (
                    f"table {request.name} already has {self._max_per_table} subscribers "
                    "(--max-subscribers-per-table)"
                )
            else:
                refused = ""
                self._per_client[client] = self._per_client.get(client, 0) + 1
                self._per_table[table] = self._per_table.get(table, 0) + 1
        try:
            yield refused
        finally:
            if not refused:
                with self._lock:
                    _uncount(self._per_client, client)
                    _uncount(self._per_table, table)

    def _stream(
        self, request: Any, context: grpc.ServicerContext
    ) -> Iterator[pb.MessageStreamResponse]:
        try:
            key_range = (request.key_range.start, request.key_range.end)
            sub = self._engine.subscribe(
                request.name,
                request.keyspace,
                request.shard,
                key_range,
                request.max_in_flight,
                subscription=request.subscription,
                filter=request.filter,
                max_messages=request.max_messages,
            )
            sub = narrowed(sub, list(request.columns), request.name)
        except Exception as exc:
            _fail(context, "MessageStream", exc)
        with self._lock:
            self._active.add(sub)
        try:
            if not context.add_callback(sub.close):  # the client already left
                return
            encoder = codec.RowEncoder(sub.fields)
            yield encoder.fields_response(sub.ack_wait_s)
            while context.is_active():
                batch = sub.next_batch(self._stream_poll_s)
                if isinstance(
                    batch, RelayedBatch
                ):  # a shard's (msgtable.gateway.gateway), as it came
                    yield batch.response
                elif batch:
                    yield encoder.rows_response(batch, batch.sent_before, batch.sent_ns)
        except Exception as exc:
            if not self._stopping.is_set() and not context.is_active():
                return  # the client left; sub.close() ended next_batch
            _fail(
                context,
                "MessageStream",
                Unavailable(SHUTTING_DOWN) if self._stopping.is_set() else exc,
            )
        finally:
            with self._lock:
                self._active.discard(sub)
            sub.close()

    def MessageAck(self, request: Any, context: grpc.ServicerContext) -> pb.MessageAckResponse:
        try:
            self._allowed(context, "ack", _resource(request.name, request.subscription))
            count = self._engine.ack(
                request.name,
                request.keyspace,
                self._ids(request.ids),
                subscription=request.subscription,
            )
            return pb.MessageAckResponse(count=count)
        except Exception as exc:
            _fail(context, "MessageAck", exc)

    def _ids(self, values: Any) -> list[object]:
        try:
            return codec.decode_ids(values)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None

    def _settle(
        self,
        context: grpc.ServicerContext,
        method: str,
        request: Any,
        settle: Callable[[list[object]], int],
    ) -> pb.MessageSettleResponse:
        """A release, reject or renew: the ack action's right, then ``settle(ids)``."""
        try:
            self._allowed(context, "ack", _resource(request.name, request.subscription))
            return pb.MessageSettleResponse(count=settle(self._ids(request.ids)))
        except Exception as exc:
            _fail(context, method, exc)

    def MessageRelease(
        self, request: Any, context: grpc.ServicerContext
    ) -> pb.MessageSettleResponse:
        r = request
        return self._settle(
            context,
            "MessageRelease",
            r,
            lambda ids: self._engine.release(
                r.name,
                r.keyspace,
                ids,
                r.delay_s,
                r.reason or None,
                subscription=r.subscription,
                attempts=r.attempts,
            ),
        )

    def MessageReject(
        self, request: Any, context: grpc.ServicerContext
    ) -> pb.MessageSettleResponse:
        r = request
        return self._settle(
            context,
            "MessageReject",
            r,
            lambda ids: self._engine.reject(
                r.name, r.keyspace, ids, r.reason or None, subscription=r.subscription
            ),
        )

    def MessageRenew(self, request: Any, context: grpc.ServicerContext) -> pb.MessageSettleResponse:
        r = request
        return self._settle(
            context,
            "MessageRenew",
            r,
            lambda ids: self._engine.renew(
                r.name,
                r.keyspace,
                ids,
                r.extend_s,
                r.reason or None,
                subscription=r.subscription,
                attempts=r.attempts,
            ),
        )

    def ListDeadLetters(
        self, request: Any, context: grpc.ServicerContext
    ) -> pb.ListDeadLettersResponse:
        try:
            self._allowed(context, "list", _resource(request.name, request.subscription))
            after = self._ids([request.after])[0] if request.HasField("after") else None
            rows, total = self._engine.dead_letters(
                request.name,
                request.keyspace,
                after,
                request.limit or DEFAULT_DEAD_LISTED,
                subscription=request.subscription,
            )
            return pb.ListDeadLettersResponse(
                dead=[codec.dead_letter_to_proto(d) for d in rows], total=total
            )
        except Exception as exc:
            _fail(context, "ListDeadLetters", exc)

    def Redrive(self, request: Any, context: grpc.ServicerContext) -> pb.RedriveResponse:
        try:
            self._allowed(context, "redrive", _resource(request.name, request.subscription))
            if request.to:
                self._allowed(context, "redrive", request.to)
            after = self._ids([request.after])[0] if request.HasField("after") else None
            batch = self._engine.redrive(
                request.name,
                request.keyspace,
                request.to,
                self._ids(request.ids) if request.ids else None,
                after,
                request.limit or DEFAULT_REDRIVE_BATCH,
                subscription=request.subscription,
            )
            response = pb.RedriveResponse(
                moved=batch.moved, skipped=[codec.encode_value(i) for i in batch.skipped]
            )
            if batch.last is not None:
                response.last.CopyFrom(codec.encode_value(batch.last))
            return response
        except Exception as exc:
            _fail(context, "Redrive", exc)

    def ListTables(self, request: Any, context: grpc.ServicerContext) -> pb.ListTablesResponse:
        try:
            tables = self._engine.list_tables()
            if self._authorizer is not None:
                principal = self._principal(context)
                tables = [
                    t
                    for t in tables
                    if self._authorizer.allows(principal, "list", _resource(t.name, t.subscription))
                ]
            return pb.ListTablesResponse(
                tables=[codec.table_status_to_proto(t) for t in tables],
                database_error=self._engine.database_error(),
                sqs_listen=self.sqs.address if self.sqs is not None else "",
                sqs_calls=self.sqs.calls_by_action() if self.sqs is not None else {},
            )
        except Exception as exc:
            _fail(context, "ListTables", exc)

    # -- subscriptions --------------------------------------------------------------------------
    def CreateSubscription(
        self, request: Any, context: grpc.ServicerContext
    ) -> pb.SubscriptionResponse:
        try:
            self._allowed(context, "manage", _resource(request.table, request.name))
            _keyspace(self._engine, request.keyspace)
            changes = codec.settings_from_proto(request.settings)
            sub = Subscription(table=request.table, name=request.name, **changes)
            n = self._engine.create_subscription(sub, request.from_start)
            return pb.SubscriptionResponse(count=n)
        except Exception as exc:
            _fail(context, "CreateSubscription", exc)

    def AlterSubscription(
        self, request: Any, context: grpc.ServicerContext
    ) -> pb.SubscriptionResponse:
        try:
            self._allowed(context, "manage", _resource(request.table, request.name))
            _keyspace(self._engine, request.keyspace)
            changes = codec.settings_from_proto(request.settings, alter=True)
            self._engine.alter_subscription(request.table, request.name, **changes)
            return pb.SubscriptionResponse()
        except Exception as exc:
            _fail(context, "AlterSubscription", exc)

    def DropSubscription(
        self, request: Any, context: grpc.ServicerContext
    ) -> pb.SubscriptionResponse:
        try:
            self._allowed(context, "manage", _resource(request.table, request.name))
            _keyspace(self._engine, request.keyspace)
            self._engine.drop_subscription(request.table, request.name)
            return pb.SubscriptionResponse()
        except Exception as exc:
            _fail(context, "DropSubscription", exc)

    def ListSubscriptions(
        self, request: Any, context: grpc.ServicerContext
    ) -> pb.ListSubscriptionsResponse:
        try:
            _keyspace(self._engine, request.keyspace)
            subs = self._engine.list_subscriptions(request.table)
            if self._authorizer is not None:
                principal = self._principal(context)
                subs = [
                    s
                    for s in subs
                    if self._authorizer.allows(principal, "list", _resource(s.name, s.subscription))
                ]
            return pb.ListSubscriptionsResponse(
                subscriptions=[codec.table_status_to_proto(s) for s in subs]
            )
        except Exception as exc:
            _fail(context, "ListSubscriptions", exc)

    # -- schedules (msgtable.features.schedules) -------------------------------------------
    def CreateSchedule(self, request: Any, context: grpc.ServicerContext) -> pb.ScheduleResponse:
        try:
            wanted = request.schedule
            self._allowed(context, "manage", wanted.table)
            _keyspace(self._engine, request.keyspace)
            made = _schedules(self._engine).create_schedule(
                wanted.name,
                wanted.table,
                wanted.cron,
                values=wanted.values or "{}",
                timezone=wanted.timezone or "UTC",
                missed=wanted.missed or "skip",
            )
            return pb.ScheduleResponse(schedule=codec.schedule_to_proto(made))
        except Exception as exc:
            _fail(context, "CreateSchedule", exc)

    def ListSchedules(
        self, request: Any, context: grpc.ServicerContext
    ) -> pb.ListSchedulesResponse:
        try:
            _keyspace(self._engine, request.keyspace)
            listed = [
                s
                for s in _schedules(self._engine).list_schedules()
                if not request.table or s.table == request.table
            ]
            if self._authorizer is not None:
                principal = self._principal(context)
                listed = [s for s in listed if self._authorizer.allows(principal, "list", s.table)]
            return pb.ListSchedulesResponse(schedules=[codec.schedule_to_proto(s) for s in listed])
        except Exception as exc:
            _fail(context, "ListSchedules", exc)

    def DropSchedule(self, request: Any, context: grpc.ServicerContext) -> pb.ScheduleResponse:
        try:
            _keyspace(self._engine, request.keyspace)
            schedules = _schedules(self._engine)
            of = {s.name: s.table for s in schedules.list_schedules()}
            if request.name in of:
                self._allowed(context, "manage", of[request.name])
            return pb.ScheduleResponse(dropped=schedules.drop_schedule(request.name))
        except Exception as exc:
            _fail(context, "DropSchedule", exc)

    # -- push endpoints (msgtable.features.push)
    # ---------------------------------------------------------
    def SetEndpoint(self, request: Any, context: grpc.ServicerContext) -> pb.EndpointResponse:
        try:
            self._allowed(context, "manage", _resource(request.table, request.subscription))
            _keyspace(self._engine, request.keyspace)
            endpoint = Endpoint(
                table=request.table,
                subscription=request.subscription,
                url=request.url,
                secret=request.secret,
                max_in_flight=request.max_in_flight or DEFAULT_PUSH_IN_FLIGHT,
                timeout_s=request.timeout_s or DEFAULT_PUSH_TIMEOUT_S,
            )
            self._engine.set_endpoint(endpoint)
            return pb.EndpointResponse()
        except Exception as exc:
            _fail(context, "SetEndpoint", exc)

    def DropEndpoint(self, request: Any, context: grpc.ServicerContext) -> pb.EndpointResponse:
        try:
            self._allowed(context, "manage", _resource(request.table, request.subscription))
            _keyspace(self._engine, request.keyspace)
            self._engine.drop_endpoint(request.table, request.subscription)
            return pb.EndpointResponse()
        except Exception as exc:
            _fail(context, "DropEndpoint", exc)


def _schedules(engine: Any) -> SchedulesComponent:
    """The engine's schedules (msgtable.features.schedules), or InvalidArgument."""
    schedules: SchedulesComponent | None = getattr(engine, "schedules", None)
    if schedules is None:
        raise InvalidArgument("this server serves no schedules")
    return schedules


def _resource(table: str, subscription: str) -> str:
    """What access rules name: a table, or ``table/subscription`` (msgtable.server.auth)."""
    return f"{table}/{subscription}" if subscription else table


def _keyspace(engine: Any, keyspace: str) -> None:
    served = getattr(engine, "keyspace", "")
    if keyspace and served and keyspace != served:
        raise TableNotFound(f"keyspace {keyspace!r} not found: this server serves {served!r}")


def _uncount(counts: dict[Any, int], key: Any) -> None:
    counts[key] -= 1
    if not counts[key]:
        del counts[key]


def _peer_host(context: grpc.ServicerContext) -> str:
    """The caller's address without its port ("ipv4:10.0.0.5:51234" -> "ipv4:10.0.0.5")."""
    peer: str = context.peer() or ""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


def is_loopback(listen: str) -> bool:
    """Whether a listen address only accepts connections from this machine."""
    if listen.startswith(("unix:", "unix-abstract:")):
        return True
    host = listen.rsplit(":", 1)[0].strip("[]") if ":" in listen else listen
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


@dataclass(frozen=True)
class TlsFiles:
    """The server's certificate and key (PEM files), and optionally the CA whose client
    certificates it requires (mutual TLS; the certificate's common name can then be a
    principal in the auth file's [certificates])."""

    cert: str
    key: str
    client_ca: str | None = None

    def server_credentials(self) -> grpc.ServerCredentials:
        def read(path: str) -> bytes:
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise InvalidArgument(f"cannot read {path}: {exc}") from None

        ca = read(self.client_ca) if self.client_ca else None
        return grpc.ssl_server_credentials(
            [(read(self.key), read(self.cert))],
            root_certificates=ca,
            require_client_auth=ca is not None,
        )


class MessagingServer:
    """The msgtable gRPC server: Messaging, health checking and reflection on one port.

    ``stop()`` ends the streams (UNAVAILABLE, so clients reconnect elsewhere), lets unary
    calls in flight finish within the grace period, and stops the server. It does not close
    the engine: whoever made the engine closes it, after ``stop()``.
    """

    def __init__(
        self,
        engine: Engine,
        listen: str = DEFAULT_ADDRESS,
        *,
        max_workers: int = DEFAULT_MAX_WORKERS,
        max_streams: int | None = None,
        stream_poll_s: float = STREAM_POLL_S,
        authorizer: Authorizer | None = None,
        tls: TlsFiles | None = None,
        max_subscribers_per_table: int = DEFAULT_MAX_SUBSCRIBERS_PER_TABLE,
        max_streams_per_client: int = DEFAULT_MAX_STREAMS_PER_CLIENT,
        servicer: type[MessagingServicer] = MessagingServicer,
    ) -> None:
        """``servicer``: the class that answers the calls (msgtable.gateway.gateway's for a
        keyspace)."""
        if max_workers < 2:
            raise InvalidArgument("max_workers must be at least 2")
        if max_streams is None:
            # keep an eighth of the threads (at least one) for acks and ListTables
            max_streams = max_workers - max(1, max_workers // 8)
        if not 0 < max_streams < max_workers:
            raise InvalidArgument("max_streams must be between 1 and max_workers - 1")
        self.listen = listen
        self.max_workers = max_workers
        self.max_streams = max_streams
        if max_subscribers_per_table < 1 or max_streams_per_client < 1:
            raise InvalidArgument("the per-table and per-client stream limits must be >= 1")
        self.authorizer = authorizer
        self.tls = tls
        self.servicer = servicer(
            engine,
            max_streams=max_streams,
            stream_poll_s=stream_poll_s,
            authorizer=authorizer,
            max_subscribers_per_table=max_subscribers_per_table,
            max_streams_per_client=max_streams_per_client,
        )
        self.health = health.HealthServicer()
        self.port = 0
        self._server: Any = None
        self._stopped = threading.Event()

    def start(self) -> None:
        """Bind and serve. Raises MsgtableError if the address cannot be bound."""
        if self._server is not None:
            return
        options = [
            ("grpc.so_reuseport", 0),  # otherwise a second server binds the same port silently
            # both sides ping idle connections to notice dead peers (KEEPALIVE_TIME_MS)
            ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            # an idle stream sends no data between pings: without this grpc stops pinging
            # after two
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.http2.min_time_between_pings_ms", KEEPALIVE_TIME_MS),
            ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_MS),
            ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
        ]
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self.max_workers, thread_name_prefix="msgtable-rpc"
            ),
            options=options,
            # bounds the calls waiting for a thread; beyond it, RESOURCE_EXHAUSTED at once
            maximum_concurrent_rpcs=self.max_workers * 2,
        )
        wire.add_service(self.servicer, pb.DESCRIPTOR.services_by_name["Messaging"], pb, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
        why = cannot_listen(self.listen)  # before gRPC, which would log its own line first
        if why is not None:
            raise MsgtableError(f"cannot listen on {self.listen}: {why}: give another --listen")
        cannot = MsgtableError(
            f"cannot listen on {self.listen}: the address is in use or not one of this machine's"
        )
        try:
            if self.tls is None:
                port = server.add_insecure_port(self.listen)
            else:
                port = server.add_secure_port(self.listen, self.tls.server_credentials())
        except RuntimeError:  # grpc logs the cause (e.g. "Address already in use")
            raise cannot from None
        if port == 0 and not self.listen.startswith("unix"):
            raise cannot
        if not is_loopback(self.listen) and (self.tls is None or self.authorizer is None):
            missing = " and ".join(
                what
                for what, absent in (
                    ("TLS (--tls-cert/--tls-key)", self.tls is None),
                    ("authentication (--auth)", self.authorizer is None),
                )
                if absent
            )
            log.warning(
                "server: listening on %s, reachable from other machines, without %s: anyone who "
                "can connect %s",
                self.listen,
                missing,
                "can read and ack messages"
                if self.authorizer is None
                else "can read the traffic, tokens included",
            )
        server.start()
        self.port = port
        self._server = server
        for service in ("", SERVICE_NAME):
            self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("server: listening on %s", self.address)

    @property
    def address(self) -> str:
        """host:port clients connect to (the real port when listening on port 0)."""
        if self.listen.startswith("unix"):
            return self.listen
        host = self.listen.rsplit(":", 1)[0]
        if host in ("", "0.0.0.0", "[::]", "::"):
            host = "127.0.0.1"
        return f"{host}:{self.port}"

    def stop(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        """Stop serving: health NOT_SERVING, end streams, finish unary calls within grace_s.

        Idempotent; blocks until the server has stopped.
        """
        server = self._server
        if server is None:
            self._stopped.set()
            return
        self.health.enter_graceful_shutdown()
        self.servicer.shutdown()
        server.stop(grace_s).wait()
        self._stopped.set()
        log.info("server: stopped")

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until stop() finished (or timeout_s passed); True if stopped."""
        return self._stopped.wait(timeout_s)

    def __enter__(self) -> MessagingServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
