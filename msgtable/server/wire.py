"""What the server takes off the wire before its servicer sees a request, and what it echoes.

* A request that is not its message (a string field that is not UTF-8, a corrupt encoding:
  what a client that is not protobuf's may send) is INVALID_ARGUMENT saying so, not grpc's
  own INTERNAL with a traceback in the server's log.
* A name (a request's ``name``, ``keyspace``, ``subscription``, ``table``, ``to`` or
  ``shard``) longer than MAX_NAME_CHARS, MySQL's identifier limit, is INVALID_ARGUMENT
  before any lookup: it could name nothing.
* A status message is at most MAX_STATUS_CHARS: user text quoted in it (a name, a filter)
  is cut, so a reply's metadata never outgrows HTTP/2's limits (a 64 KB name once made a
  NOT_FOUND that no client could receive).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError

from msgtable.limits import MAX_NAME_CHARS, MAX_STATUS_CHARS

NAME_FIELDS = frozenset({"name", "keyspace", "subscription", "table", "to", "shard"})


def bounded(text: str, limit: int = MAX_STATUS_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"


class Undecodable:
    """A request that did not decode as its message: why (the servicer never sees it)."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


def _decoder(cls: Any) -> Callable[[bytes], Any]:
    full_name = cls.DESCRIPTOR.full_name

    def decode(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except DecodeError as exc:
            text = str(exc)
            why = "a string field is not valid UTF-8" if "UTF-8" in text else text
            return Undecodable(f"the request is not a valid {full_name}: {bounded(why, 200)}")

    return decode


def _names(cls: Any) -> tuple[str, ...]:
    """The name fields of a request message."""
    return tuple(
        f.name
        for f in cls.DESCRIPTOR.fields
        if f.name in NAME_FIELDS and f.type == FieldDescriptor.TYPE_STRING and not f.is_repeated
    )


def _checked(behavior: Callable[..., Any], names: Iterable[str]) -> Callable[..., Any]:
    fields = tuple(names)

    def run(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.why)
        for field in fields:
            n = len(getattr(request, field))
            if n > MAX_NAME_CHARS:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{field} of {n:,} characters: a name has at most {MAX_NAME_CHARS} "
                    "characters (MySQL's limit)",
                )
        return behavior(request, context)

    return run


def add_service(
    servicer: Any, service: ServiceDescriptor, messages: Any, server: grpc.Server
) -> None:
    """Serve ``servicer``'s methods of ``service`` (request and response classes from the
    ``messages`` module) on ``server``, each request decoded and its names checked first
    (see the module docstring). Unary and server-streaming methods (all msgtable has)."""
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
        request_cls = getattr(messages, method.input_type.name)
        response_cls = getattr(messages, method.output_type.name)
        behavior = _checked(getattr(servicer, method.name), _names(request_cls))
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            behavior,
            request_deserializer=_decoder(request_cls),
            response_serializer=response_cls.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
    server.add_registered_method_handlers(service.full_name, handlers)
