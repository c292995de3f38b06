"""The requests both clients send, built in one place: the sync client (msgtable.client) and
the asyncio one (msgtable.aio) check arguments and encode ids the same way."""

from __future__ import annotations

from collections.abc import Sequence

from msgtable import codec
from msgtable.errors import InvalidArgument, TableLoadError, TableNotFound
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb


def values(ids: Sequence[object]) -> list[pb.Value]:
    """Message ids as the wire carries them (InvalidArgument naming the one that cannot)."""
    encoded = []
    for i, raw in enumerate(ids):
        try:
            encoded.append(codec.encode_value(raw))
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"ids[{i}]: {exc}") from None
    return encoded


def stream_request(
    name: str,
    keyspace: str = "",
    shard: str = "",
    key_range: tuple[bytes, bytes] | None = None,
    max_in_flight: int = 0,
    subscription: str = "",
    columns: Sequence[str] = (),
    filter: str = "",
) -> pb.MessageStreamRequest:
    """A subscribe's MessageStream request (see Client.subscribe for the arguments)."""
    if not 0 <= max_in_flight <= 0xFFFFFFFF:
        raise InvalidArgument(f"max_in_flight must be >= 0, not {max_in_flight}")
    request = pb.MessageStreamRequest(
        name=name,
        keyspace=keyspace,
        shard=shard,
        max_in_flight=max_in_flight,
        subscription=subscription,
        columns=list(columns),
        filter=filter,
    )
    if key_range is not None:
        request.key_range.start, request.key_range.end = key_range
    return request


def ack_request(
    name: str, ids: Sequence[pb.Value], keyspace: str = "", subscription: str = ""
) -> pb.MessageAckRequest:
    return pb.MessageAckRequest(name=name, keyspace=keyspace, ids=ids, subscription=subscription)


def release_request(
    name: str,
    ids: Sequence[pb.Value],
    delay_s: float = 0.0,
    reason: str | None = None,
    keyspace: str = "",
    subscription: str = "",
) -> pb.MessageReleaseRequest:
    return pb.MessageReleaseRequest(
        name=name,
        keyspace=keyspace,
        ids=ids,
        delay_s=delay_s,
        reason=reason or "",
        subscription=subscription,
    )


def reject_request(
    name: str,
    ids: Sequence[pb.Value],
    reason: str | None = None,
    keyspace: str = "",
    subscription: str = "",
) -> pb.MessageRejectRequest:
    return pb.MessageRejectRequest(
        name=name, keyspace=keyspace, ids=ids, reason=reason or "", subscription=subscription
    )


def renew_request(
    name: str,
    ids: Sequence[pb.Value],
    extend_s: float = 0.0,
    reason: str | None = None,
    keyspace: str = "",
    subscription: str = "",
) -> pb.MessageRenewRequest:
    return pb.MessageRenewRequest(
        name=name,
        keyspace=keyspace,
        ids=ids,
        extend_s=extend_s,
        reason=reason or "",
        subscription=subscription,
    )


def ack_wait_s(
    tables: Sequence[codec.TableInfo], name: str, keyspace: str, subscription: str
) -> float:
    """The table's (or subscription's) vt_ack_wait as ListTables reports it: auto-renew's
    rhythm."""
    for t in tables:
        if (
            t.name == name
            and t.subscription == subscription
            and (not keyspace or t.keyspace == keyspace)
        ):
            if t.config is None:
                raise TableLoadError(t.load_error)
            return t.config.ack_wait_s
    raise TableNotFound(f"message table {name!r} not found")


def status_from_proto(response: pb.ListTablesResponse) -> codec.ServerStatus:
    return codec.ServerStatus(
        [codec.table_info_from_proto(t) for t in response.tables], response.database_error
    )
