"""``msgtable gateway``: one endpoint for a whole keyspace of shards, as Vitess's vtgate.

The gateway holds no state and no database connection: it reads the keyspace file
(msgtable.core.keyspace) and talks gRPC to each shard's servers (``msgtable serve --keyspace FILE
--shard NAME``), as a client of each, following each table's sender there.

* MessageStream of a table merges its shards' streams (msgtable.gateway.merge); ``shard`` asks for
  one shard, ``key_range`` for the whole shards inside it.
* MessageAck, MessageRelease, MessageReject and MessageRenew go to the shard that holds each
  id (the shard whose key range holds the id's keyspace id, the shard that sent it), one
  call a shard, at once; the count is their sum. An id that is not an integer 0 to 2**64-1
  has no shard: INVALID_ARGUMENT.
* ListTables and ListSubscriptions list every shard's entries, each naming its ``shard``; a
  shard that does not answer is named in ``database_error``. ListTables' ``sqs_calls`` are the
  shards' servers' that answered (one a shard), summed by action; its ``sqs_listen`` is ""
  (the gateway serves no SQS API: a queue is one shard's table, at that shard's servers).
* ListDeadLetters merges the shards' dead letters by id; Redrive by ids goes to their shards,
  a batch by ``after`` / ``limit`` to every shard (``last`` is where every shard's next batch
  starts).
* Subscriptions and push endpoints are defined on every shard, in shard order; a shard that
  refuses stops it there, named (the shards before it have the change: run it again, or undo
  it, once the shard is back).

Clients in any language reach a keyspace through a gateway; the Python client may also use
the shards' servers directly (msgtable.core.keyspace names them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any, cast

import grpc

from msgtable.client.credentials import channel_credentials
from msgtable.client.router import Router
from msgtable.core import codec
from msgtable.core.keyspace import KeyRange, Keyspace, Shard
from msgtable.core.window import check_limit
from msgtable.errors import InvalidArgument, MsgtableError, TableNotFound, Unavailable
from msgtable.gateway.merge import MergedSubscriber, shard_error
from msgtable.gateway.metrics import GatewayMetrics
from msgtable.gateway.strays import Strays
from msgtable.limits import (
    DEFAULT_DEAD_LISTED,
    DEFAULT_GATEWAY_TIMEOUT_S,
    DEFAULT_REDRIVE_BATCH,
    GATEWAY_SETTLE_TIMEOUT_S,
)
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.server.servicer import MessagingServicer, _fail, _keyspace, _resource

log = logging.getLogger("msgtable.gateway.gateway")


class KeyspaceGateway:
    """The shards of one keyspace, reached through their servers (the module docstring)."""

    def __init__(
        self,
        keyspace: Keyspace,
        *,
        timeout_s: float = DEFAULT_GATEWAY_TIMEOUT_S,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        for s in keyspace.shards:
            if not s.servers:
                raise InvalidArgument(
                    f"keyspace {keyspace.name!r}: shard {s.name} names no servers "
                    '(servers = ["HOST:PORT", ...] in the keyspace file)'
                )
        credentials = channel_credentials(tls_ca, tls_cert, tls_key)
        self.keyspace = keyspace.name
        self.described = keyspace
        self.timeout_s = timeout_s
        self.routers = {
            s.name: Router(s.servers, credentials, token, timeout_s) for s in keyspace.shards
        }
        self.strays = Strays(keyspace)
        self.metrics = GatewayMetrics()  # msgtable gateway --metrics-listen serves them
        self._pool = futures.ThreadPoolExecutor(
            max(4, 2 * len(keyspace.shards)), thread_name_prefix="msgtable-gateway"
        )

    # -- the shards -----------------------------------------------------------------------
    def each(
        self, method: str, request: Any, shards: Sequence[Shard] | None = None
    ) -> dict[str, Any | MsgtableError]:
        """``method`` on every shard (or ``shards``) at once: each shard's response, or the
        error it answered (its message naming the shard)."""
        chosen = list(self.described.shards if shards is None else shards)
        calls = {
            s.name: self._pool.submit(self.routers[s.name].unary, method, request) for s in chosen
        }
        out: dict[str, Any | MsgtableError] = {}
        for name, call in calls.items():
            try:
                out[name] = call.result()
            except MsgtableError as exc:
                self.metrics.shard_errors.labels(method, name).inc()
                out[name] = shard_error(self.keyspace, name, exc)
        return out

    def all_of(
        self, method: str, request: Any, shards: Sequence[Shard] | None = None
    ) -> dict[str, Any]:
        """As ``each``, raising the first shard's error."""
        answers = self.each(method, request, shards)
        for answer in answers.values():
            if isinstance(answer, MsgtableError):
                raise answer
        return answers

    def check(self) -> list[str]:
        """At start: every shard answers ListTables and has the same message tables; a
        MsgtableError naming the first shard that does not. Returns the tables."""
        answers = self.all_of("ListTables", pb.ListTablesRequest())
        tables = {
            name: {t.name for t in r.tables if not t.subscription} for name, r in answers.items()
        }
        union = set().union(*tables.values())
        for name, has in tables.items():
            missing = sorted(union - has)
            if missing:
                raise TableNotFound(
                    f"keyspace {self.keyspace!r}: shard {name} has no message table "
                    f"{missing[0]!r}, which other shards have"
                )
        return sorted(union)

    def shards_for(self, keyspace: str, shard: str, key_range: tuple[bytes, bytes]) -> list[Shard]:
        """The shards a stream reads: one named, the whole ones inside a key range, or all."""
        _keyspace(self, keyspace)
        if shard:
            found = self.described.shard(shard)
            if tuple(key_range) != (b"", b"") and not KeyRange(*key_range).holds(found.key_range):
                raise InvalidArgument(
                    f"shard {found.name} is outside key range {KeyRange(*key_range)}"
                )
            return [found]
        if tuple(key_range) != (b"", b""):
            found_in = self.described.within(KeyRange(*(b.rstrip(b"\0") for b in key_range)))
            if not found_in:
                raise InvalidArgument(
                    f"no shard of keyspace {self.keyspace!r} is inside key range "
                    f"{KeyRange(*key_range)}"
                )
            return found_in
        return list(self.described.shards)

    # -- the servicer's engine ---------------------------------------------------------------
    def subscribe(
        self,
        name: str,
        keyspace: str = "",
        shard: str = "",
        key_range: tuple[bytes, bytes] = (b"", b""),
        max_in_flight: int = 0,
        subscription: str = "",
        filter: str = "",
        max_messages: int = 0,
    ) -> MergedSubscriber:
        if not name:
            raise InvalidArgument("a table name is required")
        shards = self.shards_for(keyspace, shard, key_range)
        request = pb.MessageStreamRequest(
            name=name,
            max_in_flight=max_in_flight,
            subscription=subscription,
            filter=filter,
            max_messages=check_limit(max_messages),
        )
        return MergedSubscriber(
            self.keyspace,
            shards,
            self.routers,
            request,
            self.timeout_s,
            on_relay=lambda shard, response: self._relayed(name, subscription, shard, response),
        )

    def _relayed(self, table: str, subscription: str, shard: str, response: Any) -> None:
        self.metrics.relayed.labels(table, shard).inc(len(response.rows))
        self.strays.check(table, subscription, shard, response)

    def database_error(self) -> str:
        return ""

    def split(self, request: Any) -> dict[str, Any]:
        """A request of ids (and their ``attempts``), one a shard: each id to the shard
        that sent it (msgtable.gateway.strays), which is the shard its hash names."""
        try:
            ids = codec.decode_ids(request.ids)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        name = getattr(request, "name", "")
        settled = isinstance(request, pb.MessageAckRequest | pb.MessageRejectRequest)
        owners = self.strays.shards(name, request.subscription, ids, settled)
        attempts = list(getattr(request, "attempts", ()))
        out: dict[str, Any] = {}
        for k, shard in enumerate(owners):
            part = out.get(shard)
            if part is None:
                part = out[shard] = type(request)()
                part.CopyFrom(request)
                del part.ids[:]
                if attempts:
                    del part.attempts[:]
            part.ids.append(request.ids[k])
            if attempts and k < len(attempts):
                part.attempts.append(attempts[k])
        return out

    def settle(self, method: str, request: Any) -> tuple[int, list[Any]]:
        """An ack or settlement verb, each id to its shard at once: the sum of the counts,
        and the ids whose shard did not answer within GATEWAY_SETTLE_TIMEOUT_S (or was
        away), not settled. Another error of a shard's is raised, naming it (the other
        shards' ids are settled: a retry counts those 0)."""
        _keyspace(self, request.keyspace)
        parts = self.split(request)
        timeout_s = min(self.timeout_s, GATEWAY_SETTLE_TIMEOUT_S)
        calls = {
            name: self._pool.submit(self.routers[name].unary, method, part, "", timeout_s)
            for name, part in parts.items()
        }
        total, unreached, first_error = 0, [], None
        for name, call in calls.items():
            try:
                count = call.result().count
            except Unavailable:  # away, or slow: its ids come again (or are acked again)
                self.metrics.shard_errors.labels(method, name).inc()
                unreached.extend(parts[name].ids)
            except MsgtableError as exc:
                self.metrics.shard_errors.labels(method, name).inc()
                first_error = first_error or shard_error(self.keyspace, name, exc)
            else:
                self.metrics.settled.labels(method, name).inc(count)
                total += count
        if first_error is not None:
            raise first_error
        return total, unreached

    def close(self) -> None:
        for router in self.routers.values():
            router.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


class GatewayServicer(MessagingServicer):
    """msgtable.v1.Messaging for a keyspace: streams through the base class (its limits and
    access rules), every other call relayed to the shards (the module docstring)."""

    @property
    def _gateway(self) -> KeyspaceGateway:
        return cast(KeyspaceGateway, self._engine)

    def _relay(
        self,
        context: grpc.ServicerContext,
        method: str,
        check: Callable[[], object],
        answer: Callable[[], Any],
    ) -> Any:
        try:
            check()
            return answer()
        except Exception as exc:
            _fail(context, method, exc)

    def _settle_call(self, method: str, request: Any, context: grpc.ServicerContext) -> Any:
        return self._relay(
            context,
            method,
            lambda: self._allowed(context, "ack", _resource(request.name, request.subscription)),
            lambda: self._settled(method, *self._gateway.settle(method, request)),
        )

    @staticmethod
    def _settled(method: str, count: int, unreached: list[Any]) -> Any:
        kind = pb.MessageAckResponse if method == "MessageAck" else pb.MessageSettleResponse
        return kind(count=count, unreached=unreached)

    def MessageAck(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._settle_call("MessageAck", request, context)

    def MessageRelease(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._settle_call("MessageRelease", request, context)

    def MessageReject(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._settle_call("MessageReject", request, context)

    def MessageRenew(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._settle_call("MessageRenew", request, context)

    def ListTables(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._relay(
            context, "ListTables", lambda: None, lambda: self._tables(request, context)
        )

    def _tables(self, request: Any, context: grpc.ServicerContext) -> pb.ListTablesResponse:
        response = pb.ListTablesResponse()
        problems = []
        for name, answer in self._gateway.each("ListTables", request).items():
            if isinstance(answer, MsgtableError):
                problems.append(str(answer))
                continue
            if answer.database_error:
                problems.append(f"shard {name}: {answer.database_error}")
            for action, n in answer.sqs_calls.items():
                response.sqs_calls[action] += n
            for t in answer.tables:
                if self._may_list(context, t.name, t.subscription):
                    t.shard = t.shard or name
                    response.tables.append(t)
        response.tables.sort(key=lambda t: (t.name, t.subscription, t.shard))
        response.database_error = "; ".join(problems)
        return response

    def _may_list(self, context: grpc.ServicerContext, table: str, subscription: str) -> bool:
        if self._authorizer is None:
            return True
        return self._authorizer.allows(
            self._principal(context), "list", _resource(table, subscription)
        )

    def ListSubscriptions(self, request: Any, context: grpc.ServicerContext) -> Any:
        def answer() -> pb.ListSubscriptionsResponse:
            _keyspace(self._gateway, request.keyspace)
            out = pb.ListSubscriptionsResponse()
            for name, r in self._gateway.all_of("ListSubscriptions", request).items():
                for s in r.subscriptions:
                    if self._may_list(context, s.name, s.subscription):
                        s.shard = s.shard or name
                        out.subscriptions.append(s)
            out.subscriptions.sort(key=lambda s: (s.name, s.subscription, s.shard))
            return out

        return self._relay(context, "ListSubscriptions", lambda: None, answer)

    def ListDeadLetters(self, request: Any, context: grpc.ServicerContext) -> Any:
        def answer() -> pb.ListDeadLettersResponse:
            _keyspace(self._gateway, request.keyspace)
            answers = self._gateway.all_of("ListDeadLetters", request)
            dead = sorted(
                (d for r in answers.values() for d in r.dead),
                key=lambda d: codec.decode_value(d.id),  # type: ignore[arg-type,return-value]
            )
            limit = request.limit or DEFAULT_DEAD_LISTED
            return pb.ListDeadLettersResponse(
                dead=dead[:limit], total=sum(r.total for r in answers.values())
            )

        return self._relay(
            context,
            "ListDeadLetters",
            lambda: self._allowed(context, "list", _resource(request.name, request.subscription)),
            answer,
        )

    def Redrive(self, request: Any, context: grpc.ServicerContext) -> Any:
        def check() -> None:
            self._allowed(context, "redrive", _resource(request.name, request.subscription))
            if request.to:
                self._allowed(context, "redrive", request.to)
            _keyspace(self._gateway, request.keyspace)

        def answer() -> pb.RedriveResponse:
            if request.ids:
                parts = self._gateway.split(request)
                answers = {
                    name: self._gateway.all_of(
                        "Redrive", part, [self._gateway.described.shard(name)]
                    )[name]
                    for name, part in parts.items()
                }
            else:
                answers = self._gateway.all_of("Redrive", request)
            out = pb.RedriveResponse(moved=sum(r.moved for r in answers.values()))
            for r in answers.values():
                out.skipped.extend(r.skipped)
            # the next batch starts where the first shard that filled its batch stopped:
            # what moved after it elsewhere is not dead any more, so it is not moved twice
            limit = request.limit or DEFAULT_REDRIVE_BATCH
            full = [
                r
                for r in answers.values()
                if r.HasField("last") and r.moved + len(r.skipped) >= limit
            ]
            lasts = [r.last for r in (full or [r for r in answers.values() if r.HasField("last")])]
            if lasts:
                pick = min if full else max
                out.last.CopyFrom(pick(lasts, key=codec.decode_value))  # type: ignore[arg-type]
            return out

        return self._relay(context, "Redrive", check, answer)

    def _everywhere(
        self, method: str, request: Any, context: grpc.ServicerContext, resource: str, empty: Any
    ) -> Any:
        """A definition (subscription, endpoint) made on every shard, in shard order."""

        def answer() -> Any:
            _keyspace(self._gateway, request.keyspace)
            total = 0
            for s in self._gateway.described.shards:
                r = self._gateway.all_of(method, request, [s])[s.name]
                total += getattr(r, "count", 0)
            out = empty()
            if hasattr(out, "count"):
                out.count = total
            return out

        return self._relay(
            context, method, lambda: self._allowed(context, "manage", resource), answer
        )

    def CreateSubscription(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._everywhere(
            "CreateSubscription",
            request,
            context,
            _resource(request.table, request.name),
            pb.SubscriptionResponse,
        )

    def AlterSubscription(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._everywhere(
            "AlterSubscription",
            request,
            context,
            _resource(request.table, request.name),
            pb.SubscriptionResponse,
        )

    def DropSubscription(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._everywhere(
            "DropSubscription",
            request,
            context,
            _resource(request.table, request.name),
            pb.SubscriptionResponse,
        )

    def SetEndpoint(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._everywhere(
            "SetEndpoint",
            request,
            context,
            _resource(request.table, request.subscription),
            pb.EndpointResponse,
        )

    def DropEndpoint(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._everywhere(
            "DropEndpoint",
            request,
            context,
            _resource(request.table, request.subscription),
            pb.EndpointResponse,
        )
