"""The requests both clients send, built in one place: the sync client (msgtable.client) and
the asyncio one (msgtable.aio) check arguments and encode ids the same way."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from msgtable.core import codec
from msgtable.core.deadletters import DeadLetter, RedriveBatch
from msgtable.errors import InvalidArgument, PartlySettled, TableLoadError, TableNotFound
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb


def targets(target: str, retry_for_s: float | None) -> tuple[str, ...]:
    """A client's servers from ``"host:port[,host:port...]"``, its arguments checked."""
    if retry_for_s is not None and retry_for_s < 0:
        raise InvalidArgument(f"retry_for_s must be >= 0 or None, not {retry_for_s}")
    found = tuple(t.strip() for t in target.split(",") if t.strip())
    if not found:
        raise InvalidArgument("no server address given")
    return found


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
    max_messages: int = 0,
) -> pb.MessageStreamRequest:
    """A subscribe's MessageStream request (see Client.subscribe for the arguments)."""
    if not 0 <= max_in_flight <= 0xFFFFFFFF:
        raise InvalidArgument(f"max_in_flight must be >= 0, not {max_in_flight}")
    if not 0 <= max_messages <= 0xFFFFFFFF:
        raise InvalidArgument(f"max_messages must be >= 0, not {max_messages}")
    request = pb.MessageStreamRequest(
        name=name,
        keyspace=keyspace,
        shard=shard,
        max_in_flight=max_in_flight,
        subscription=subscription,
        columns=list(columns),
        filter=filter,
        max_messages=max_messages,
    )
    if key_range is not None:
        request.key_range.start, request.key_range.end = key_range
    return request


def ack_request(
    name: str, ids: Sequence[pb.Value], keyspace: str = "", subscription: str = ""
) -> pb.MessageAckRequest:
    return pb.MessageAckRequest(name=name, keyspace=keyspace, ids=ids, subscription=subscription)


def attempt_of(message: Any) -> int:
    """The attempt a settlement of ``message`` names (pb.MessageReleaseRequest.attempts): its
    delivery's, or 0 (whichever delivery is current) when its server did not say which
    (servers older than Row.sent_before send no batch time either)."""
    return message.attempt if message.sent_ns else 0


def attempts_of(messages: Iterable[Any]) -> list[int]:
    """:func:`attempt_of` each message; [] when none is known (a call by id alone)."""
    attempts = [attempt_of(m) for m in messages]
    return attempts if any(attempts) else []


def release_request(
    name: str,
    ids: Sequence[pb.Value],
    delay_s: float = 0.0,
    reason: str | None = None,
    keyspace: str = "",
    subscription: str = "",
    attempts: Sequence[int] = (),
) -> pb.MessageReleaseRequest:
    """``attempts``: the delivery each id's release answers (leaser.attempts_of); empty: by
    id alone."""
    return pb.MessageReleaseRequest(
        name=name,
        keyspace=keyspace,
        ids=ids,
        delay_s=delay_s,
        reason=reason or "",
        subscription=subscription,
        attempts=attempts,
    )


# The reason of the release of what a closing subscriber received and never handed out
UNHANDED_REASON = "the subscriber closed before handing it out"
UNHANDED_RELEASE_TIMEOUT_S = 5.0  # one try: close() does not wait out an unreachable server


def release_unhanded(
    received_at: float, ack_wait_s: float, now: float, by_delivery: bool = False
) -> bool:
    """Whether a closing subscriber releases the messages its iteration received at
    ``received_at`` (monotonic) and never handed out, so that another subscriber gets them
    at once instead of after their ack wait. ``by_delivery``: the release names each
    message's delivery (every one carries its batch's send time), and the server changes
    none sent again since, however late it comes: always. Otherwise (ids alone) only while
    less than half of ``ack_wait_s`` (the stream's, from its first response) has passed
    since the receipt: the send came before it, and later another subscriber may hold them,
    whose delivery a release of ids would cut short. An ``ack_wait_s`` of 0 (a server older
    than the release at close): never."""
    if ack_wait_s <= 0:
        return False
    return by_delivery or now - received_at < ack_wait_s / 2


def unhanded_release(
    messages: Sequence[Any],
    received_at: float,
    ack_wait_s: float,
    name: str,
    keyspace: str,
    subscription: str,
) -> pb.MessageReleaseRequest | None:
    """The MessageRelease a closing subscriber sends (one try, UNHANDED_RELEASE_TIMEOUT_S,
    its errors ignored: the ack wait is the safety net) for ``messages`` its iteration
    received at ``received_at`` and never handed out, naming their deliveries; None when
    there are none, or when :func:`release_unhanded` says to leave them to their ack wait."""
    if not messages:
        return None
    attempts = attempts_of(messages)
    by_delivery = bool(attempts) and all(attempts)
    if not release_unhanded(received_at, ack_wait_s, time.monotonic(), by_delivery):
        return None
    ids = [m.id_value for m in messages]
    return release_request(name, ids, 0.0, UNHANDED_REASON, keyspace, subscription, attempts)


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
    attempts: Sequence[int] = (),
) -> pb.MessageRenewRequest:
    """``attempts`` as release_request's."""
    return pb.MessageRenewRequest(
        name=name,
        keyspace=keyspace,
        ids=ids,
        extend_s=extend_s,
        reason=reason or "",
        subscription=subscription,
        attempts=attempts,
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
        [codec.table_info_from_proto(t) for t in response.tables],
        response.database_error,
        response.sqs_listen,
        dict(response.sqs_calls),
    )


def dead_letters_request(
    name: str,
    limit: int = 0,
    after: object | None = None,
    keyspace: str = "",
    subscription: str = "",
) -> pb.ListDeadLettersRequest:
    request = pb.ListDeadLettersRequest(
        name=name, keyspace=keyspace, limit=limit, subscription=subscription
    )
    if after is not None:
        request.after.CopyFrom(values([after])[0])
    return request


def dead_letters_from_proto(response: pb.ListDeadLettersResponse) -> tuple[list[DeadLetter], int]:
    return [codec.dead_letter_from_proto(d) for d in response.dead], response.total


def redrive_request(
    name: str,
    to: str = "",
    ids: Sequence[object] | None = None,
    limit: int = 0,
    after: object | None = None,
    keyspace: str = "",
    subscription: str = "",
) -> pb.RedriveRequest:
    request = pb.RedriveRequest(
        name=name,
        keyspace=keyspace,
        to=to,
        ids=values(ids or ()),
        limit=limit,
        subscription=subscription,
    )
    if after is not None:
        request.after.CopyFrom(values([after])[0])
    return request


def redrive_from_proto(response: pb.RedriveResponse) -> RedriveBatch:
    return RedriveBatch(
        moved=response.moved,
        skipped=tuple(codec.decode_value(v) for v in response.skipped),
        last=codec.decode_value(response.last) if response.HasField("last") else None,
    )


def create_subscription_request(
    table: str,
    name: str,
    filter: str | None = None,
    columns: Sequence[str] | None = None,
    ack_wait_s: float | None = None,
    max_attempts: int | None = None,
    max_lag: int | None = None,
    expire_after_s: float | None = None,
    from_start: bool = False,
    keyspace: str = "",
    limits: Mapping[str, str | int] | None = None,
    state_rows: str | None = None,
) -> pb.CreateSubscriptionRequest:
    settings = codec.settings_to_proto(
        filter=filter,
        columns=columns,
        ack_wait_s=ack_wait_s,
        max_attempts=max_attempts,
        max_lag=max_lag,
        expire_after_s=expire_after_s,
        state_rows=state_rows,
        limits=limits,
    )
    return pb.CreateSubscriptionRequest(
        table=table, keyspace=keyspace, name=name, settings=settings, from_start=from_start
    )


SUBSCRIPTION_SETTINGS = (
    "filter",
    "columns",
    "ack_wait_s",
    "max_attempts",
    "max_lag",
    "expire_after_s",
    "limits",
)


def alter_subscription_request(
    table: str, name: str, keyspace: str = "", **changes: Any
) -> pb.AlterSubscriptionRequest:
    unknown = set(changes) - set(SUBSCRIPTION_SETTINGS)
    if unknown:
        raise InvalidArgument(f"unknown subscription setting {sorted(unknown)[0]!r}")
    return pb.AlterSubscriptionRequest(
        table=table, keyspace=keyspace, name=name, settings=codec.settings_to_proto(**changes)
    )


def subscriptions_from_proto(response: pb.ListSubscriptionsResponse) -> list[codec.TableInfo]:
    return [codec.table_info_from_proto(t) for t in response.subscriptions]


def set_endpoint_request(
    table: str,
    url: str,
    secret: str,
    subscription: str = "",
    max_in_flight: int = 0,
    timeout_s: float = 0.0,
    keyspace: str = "",
) -> pb.SetEndpointRequest:
    return pb.SetEndpointRequest(
        table=table,
        keyspace=keyspace,
        subscription=subscription,
        url=url,
        secret=secret,
        max_in_flight=max_in_flight,
        timeout_s=timeout_s,
    )


def settled(method: str, table: str, response: Any) -> int:
    """The count of an ack or settlement answer; PartlySettled when a gateway could not reach
    the shard of some ids (``unreached``: not settled, and not retried here, so that the
    others' acks are not held up while a shard is away)."""
    count: int = response.count
    if response.unreached:
        unreached = codec.decode_ids(response.unreached)
        raise PartlySettled(
            f"{method} of {table}: {len(unreached)} id(s) not settled, their shard did not "
            f"answer in time (e.g. {unreached[0]!r}); {count} settled",
            count,
            unreached,
        )
    return count


def create_schedule_request(
    name: str,
    table: str,
    cron: str,
    values: Mapping[str, Any] | str | None,
    timezone: str,
    missed: str,
    keyspace: str,
) -> pb.CreateScheduleRequest:
    """A CreateSchedule request (see Client.create_schedule for the arguments)."""
    text = values if isinstance(values, str) else json.dumps(dict(values or {}))
    wanted = pb.Schedule(
        name=name, table=table, cron=cron, timezone=timezone, values=text, missed=missed
    )
    return pb.CreateScheduleRequest(keyspace=keyspace, schedule=wanted)
