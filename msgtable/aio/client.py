"""The asyncio Client: the sync client's calls as coroutines, on grpc.aio."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from msgtable.aio.router import AioRouter
from msgtable.aio.subscriber import Subscriber
from msgtable.client import requests
from msgtable.client.client import DEFAULT_RETRY_FOR_S, DEFAULT_TIMEOUT_S
from msgtable.client.credentials import channel_credentials
from msgtable.client.leaser import DEFAULT_MAX_LEASE_S
from msgtable.core import codec
from msgtable.core.codec import ServerStatus, TableInfo
from msgtable.core.deadletters import DeadLetter, RedriveBatch
from msgtable.core.schedules import Schedule
from msgtable.errors import InvalidArgument
from msgtable.limits import DEFAULT_ADDRESS
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider


class Client:
    """A connection to msgtable servers for asyncio code; ``async with`` it (or ``await
    client.close()``). Its arguments and behaviour are the sync msgtable.client.Client's:
    several servers separated by commas, NotLeader followed to the leader, passing errors
    retried within ``timeout_s``, errors as msgtable.errors classes. Use it from one event
    loop."""

    def __init__(
        self,
        target: str = DEFAULT_ADDRESS,
        *,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        retry_for_s: float | None = DEFAULT_RETRY_FOR_S,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        """Arguments as the sync Client's (``tracer_provider``: msgtable.core.tracing)."""
        targets = requests.targets(target, retry_for_s)
        self.target = target
        self.targets = targets
        self.timeout_s = timeout_s
        self.retry_for_s = retry_for_s
        self.tracer_provider = tracer_provider
        self._router = AioRouter(
            targets, channel_credentials(tls_ca, tls_cert, tls_key), token, timeout_s
        )

    @property
    def closed(self) -> bool:
        return self._router.closed

    @property
    def leader(self) -> str:
        """The leader's address as the last NotLeader answer named it ("" if none)."""
        return self._router.leader

    def subscribe(
        self,
        name: str,
        keyspace: str = "",
        shard: str = "",
        key_range: tuple[bytes, bytes] | None = None,
        max_in_flight: int = 0,
        retry: bool = True,
        auto_renew: bool = False,
        max_lease_s: float = DEFAULT_MAX_LEASE_S,
        subscription: str = "",
        columns: Sequence[str] = (),
        filter: str = "",
        max_messages: int = 0,
        follow: bool = False,
    ) -> Subscriber:
        """A subscriber to a message table (arguments as the sync Client.subscribe); it
        subscribes when entered: ``async with client.subscribe("t") as sub``."""
        request = requests.stream_request(
            name,
            keyspace,
            shard,
            key_range,
            max_in_flight,
            subscription,
            columns,
            filter,
            max_messages,
        )
        if auto_renew and not max_lease_s > 0:
            raise InvalidArgument(f"max_lease_s must be > 0, not {max_lease_s}")
        return Subscriber(
            self._router,
            request,
            retry=retry,
            follow=follow,
            retry_for_s=self.retry_for_s,
            ack_wait_s=self.ack_wait_s if auto_renew else None,
            max_lease_s=max_lease_s,
            tracer_provider=self.tracer_provider,
        )

    async def ack_wait_s(self, name: str, keyspace: str = "", subscription: str = "") -> float:
        """The table's (or subscription's) vt_ack_wait as the server reports it."""
        return requests.ack_wait_s(await self.list_tables(), name, keyspace, subscription)

    async def ack(
        self, name: str, ids: Sequence[object], keyspace: str = "", subscription: str = ""
    ) -> int:
        """Acknowledge messages by id; how many this call acked (retried as the sync one)."""
        return await self._router.ack(
            name, keyspace, requests.values(ids), subscription=subscription
        )

    async def release(
        self,
        name: str,
        ids: Sequence[object],
        delay_s: float = 0.0,
        reason: str | None = None,
        keyspace: str = "",
        subscription: str = "",
    ) -> int:
        """Not now: due again ``delay_s`` from now (0: at once); how many were released."""
        request = requests.release_request(
            name, requests.values(ids), delay_s, reason, keyspace, subscription
        )
        return await self._router.settle("MessageRelease", request)

    async def reject(
        self,
        name: str,
        ids: Sequence[object],
        reason: str | None = None,
        keyspace: str = "",
        subscription: str = "",
    ) -> int:
        """Never: dead now; how many were rejected."""
        request = requests.reject_request(
            name, requests.values(ids), reason, keyspace, subscription
        )
        return await self._router.settle("MessageReject", request)

    async def renew(
        self,
        name: str,
        ids: Sequence[object],
        extend_s: float = 0.0,
        reason: str | None = None,
        keyspace: str = "",
        subscription: str = "",
    ) -> int:
        """Still working: not due again before ``extend_s`` (0: the ack wait); how many."""
        request = requests.renew_request(
            name, requests.values(ids), extend_s, reason, keyspace, subscription
        )
        return await self._router.settle("MessageRenew", request)

    async def create_subscription(
        self,
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
    ) -> int:
        """Create subscription ``name`` of ``table`` (as the sync client's)."""
        request = requests.create_subscription_request(
            table,
            name,
            filter,
            columns,
            ack_wait_s,
            max_attempts,
            max_lag,
            expire_after_s,
            from_start,
            keyspace,
            limits,
            state_rows,
        )
        count: int = (await self._router.unary("CreateSubscription", request)).count
        return count

    async def alter_subscription(
        self, table: str, name: str, keyspace: str = "", **changes: Any
    ) -> None:
        """Change a subscription's settings (as the sync client's)."""
        request = requests.alter_subscription_request(table, name, keyspace, **changes)
        await self._router.unary("AlterSubscription", request)

    async def drop_subscription(self, table: str, name: str, keyspace: str = "") -> None:
        """Drop a subscription and its delivery state."""
        request = pb.DropSubscriptionRequest(table=table, keyspace=keyspace, name=name)
        await self._router.unary("DropSubscription", request)

    async def create_schedule(
        self,
        name: str,
        table: str,
        cron: str,
        values: Mapping[str, Any] | str | None = None,
        timezone: str = "UTC",
        missed: str = "skip",
        keyspace: str = "",
    ) -> Schedule:
        """As the sync Client.create_schedule: each tick of ``cron`` enqueues one message."""
        request = requests.create_schedule_request(
            name, table, cron, values, timezone, missed, keyspace
        )
        response = await self._router.unary("CreateSchedule", request)
        return codec.schedule_from_proto(response.schedule)

    async def list_schedules(self, table: str = "", keyspace: str = "") -> list[Schedule]:
        """The schedules (of ``table``, or all), with their last and next tick."""
        request = pb.ListSchedulesRequest(keyspace=keyspace, table=table)
        response = await self._router.unary("ListSchedules", request)
        return [codec.schedule_from_proto(x) for x in response.schedules]

    async def drop_schedule(self, name: str, keyspace: str = "") -> bool:
        """Drop schedule ``name``; whether there was one."""
        request = pb.DropScheduleRequest(keyspace=keyspace, name=name)
        return bool((await self._router.unary("DropSchedule", request)).dropped)

    async def list_subscriptions(self, table: str = "", keyspace: str = "") -> list[TableInfo]:
        """The subscriptions (of ``table``, or all) with state, filter, lag and counters."""
        request = pb.ListSubscriptionsRequest(table=table, keyspace=keyspace)
        return requests.subscriptions_from_proto(
            await self._router.unary("ListSubscriptions", request)
        )

    async def dead_letters(
        self,
        name: str,
        limit: int = 0,
        after: object | None = None,
        keyspace: str = "",
        subscription: str = "",
    ) -> tuple[list[DeadLetter], int]:
        """Dead messages of table ``name`` (or its ``subscription``) and how many there are."""
        request = requests.dead_letters_request(name, limit, after, keyspace, subscription)
        response = await self._router.unary("ListDeadLetters", request)
        return requests.dead_letters_from_proto(response)

    async def redrive(
        self,
        name: str,
        to: str = "",
        ids: Sequence[object] | None = None,
        limit: int = 0,
        after: object | None = None,
        keyspace: str = "",
        subscription: str = "",
    ) -> RedriveBatch:
        """One batch of moving dead messages back (as the sync client's)."""
        request = requests.redrive_request(name, to, ids, limit, after, keyspace, subscription)
        return requests.redrive_from_proto(await self._router.unary("Redrive", request))

    async def set_endpoint(
        self,
        table: str,
        url: str,
        secret: str,
        subscription: str = "",
        max_in_flight: int = 0,
        timeout_s: float = 0.0,
        keyspace: str = "",
    ) -> None:
        """Push ``table``'s default group (or its ``subscription``) to ``url``."""
        request = requests.set_endpoint_request(
            table, url, secret, subscription, max_in_flight, timeout_s, keyspace
        )
        await self._router.unary("SetEndpoint", request)

    async def drop_endpoint(self, table: str, subscription: str = "", keyspace: str = "") -> None:
        """Stop pushing ``table``'s default group (or its ``subscription``)."""
        request = pb.DropEndpointRequest(table=table, keyspace=keyspace, subscription=subscription)
        await self._router.unary("DropEndpoint", request)

    async def list_tables(self) -> list[TableInfo]:
        """Every message table the server knows, with config or load error and counters."""
        return (await self.status()).tables

    async def status(self) -> ServerStatus:
        """The server's tables, and why it cannot reach its database now ("" while it can)."""
        response = await self._router.unary("ListTables", pb.ListTablesRequest())
        return requests.status_from_proto(response)

    async def close(self) -> None:
        await self._router.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
