"""The Client: a connection to msgtable servers, and the calls users make (subscribe, ack,
list tables)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from msgtable.client import requests
from msgtable.client.acks import DEFAULT_ACK_LINGER_S
from msgtable.client.credentials import channel_credentials
from msgtable.client.leaser import DEFAULT_MAX_LEASE_S
from msgtable.client.router import Router
from msgtable.client.subscriber import Subscriber
from msgtable.core import codec
from msgtable.core.codec import ServerStatus, TableInfo
from msgtable.core.deadletters import DeadLetter, RedriveBatch
from msgtable.core.schedules import Schedule
from msgtable.errors import InvalidArgument
from msgtable.limits import DEFAULT_ADDRESS
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_RETRY_FOR_S = 300.0  # a subscriber gives up after this long without a stream


class Client:
    """A connection to msgtable servers. Thread-safe; close() (or use as a context manager).

    ``target``: one server's HOST:PORT, or several separated by commas (servers of one
    database: the one holding the lease sends, the others answer NotLeader with its
    address). Calls go to the leader once one answer named it, else to the targets in turn.
    """

    def __init__(
        self,
        target: str = DEFAULT_ADDRESS,
        *,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        ack_linger_s: float = DEFAULT_ACK_LINGER_S,
        retry_for_s: float | None = DEFAULT_RETRY_FOR_S,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tracer_provider: TracerProvider | None = None,
        wait_for_server: bool = True,
    ) -> None:
        """``timeout_s``: for each unary call, for the first response of a stream, and for
        the retries of an ack. ``retry_for_s``: how long a subscriber keeps subscribing
        again after its stream broke (None: for ever). ``token``: sent as
        ``authorization: Bearer TOKEN`` with every call. ``tls_ca`` (the CA that signed the
        server's certificate; a PEM file), or ``tls_cert`` and ``tls_key`` (a client
        certificate for mutual TLS), make the channels TLS. ``tracer_provider``: where the
        subscribers' consumer spans go (msgtable.core.tracing; None: the global provider, if one
        was configured when a subscriber is made). ``wait_for_server``: a unary call retries
        a server that cannot be connected to within ``timeout_s`` (False: it fails once each
        server was tried, as a command line's call should)."""
        if ack_linger_s < 0:
            raise InvalidArgument(f"ack_linger_s must be >= 0, not {ack_linger_s}")
        targets = requests.targets(target, retry_for_s)
        self.target = target
        self.targets = targets
        self.timeout_s = timeout_s
        self.ack_linger_s = ack_linger_s  # see Subscriber.ack_async
        self.retry_for_s = retry_for_s
        self.tracer_provider = tracer_provider
        self._router = Router(
            targets,
            channel_credentials(tls_ca, tls_cert, tls_key),
            token,
            timeout_s,
            wait_for_server=wait_for_server,
        )
        self._router.stub(targets[0])  # channels connect lazily: this only builds it

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
        """Subscribe to a message table; returns once a server accepted the subscriber.

        ``max_in_flight``: the server sends a batch only while fewer than this many of the
        messages it sent this subscriber are unacked (0: the server's default, 1,000).
        ``retry``: subscribe again by itself when the stream breaks for a passing reason,
        and retry the first subscribe too (see msgtable.client.stream); False raises
        instead; with ``follow`` too, it still goes where the servers send it (to the server
        a NotLeader names, through a hand-over, and back to the servers given when one it
        was sent to fails) and raises on anything else. ``auto_renew``: renew every message
        received until it is acked, released or rejected, every third of the table's ack
        wait, for at most ``max_lease_s`` after it arrived (msgtable.client.leaser): a
        handler may take longer than the ack wait.
        ``subscription``: receive as that subscription (consumer group) of the table, not
        its default group; acks and settlement of its messages go to it. ``columns``: only
        these message columns (``id`` always first). ``filter``: only the messages of the
        group that match it (README: Filters); the others go to the group's other
        subscribers. ``max_messages``: the server sends this subscriber no more than this
        many messages in all (0: no limit), for a worker that takes N and leaves."""
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
        renew_every_s = None
        if auto_renew:
            if not max_lease_s > 0:
                raise InvalidArgument(f"max_lease_s must be > 0, not {max_lease_s}")
            renew_every_s = self._ack_wait_s(name, keyspace, subscription) / 3
        return Subscriber(
            self._router,
            request,
            retry=retry,
            follow=follow,
            retry_for_s=self.retry_for_s,
            ack_linger_s=self.ack_linger_s,
            renew_every_s=renew_every_s,
            max_lease_s=max_lease_s,
            tracer_provider=self.tracer_provider,
        )

    def _ack_wait_s(self, name: str, keyspace: str, subscription: str = "") -> float:
        """The table's vt_ack_wait as the server reports it (auto-renew's rhythm)."""
        return requests.ack_wait_s(self.list_tables(), name, keyspace, subscription)

    def ack(
        self, name: str, ids: Sequence[object], keyspace: str = "", subscription: str = ""
    ) -> int:
        """Acknowledge messages by id; returns how many this call acked.

        A call that fails for a passing reason is tried again (to the leader, if a server
        named one) with backoff within the client's ``timeout_s``; acks are idempotent, so
        one that was written before its answer was lost counts 0 the second time."""
        return self._router.ack(name, keyspace, _values(ids), subscription=subscription)

    # -- settlement (README: Settlement) -------------------------------------------------------
    def release(
        self,
        name: str,
        ids: Sequence[object],
        delay_s: float = 0.0,
        reason: str | None = None,
        keyspace: str = "",
        subscription: str = "",
    ) -> int:
        """Not now: the messages are due again ``delay_s`` from now (0: at once), to any
        subscriber; the send counts as an attempt. Returns how many were released (sent at
        least once, not acked, not dead)."""
        request = requests.release_request(
            name, _values(ids), delay_s, reason, keyspace, subscription
        )
        return self._router.settle("MessageRelease", request)

    def reject(
        self,
        name: str,
        ids: Sequence[object],
        reason: str | None = None,
        keyspace: str = "",
        subscription: str = "",
    ) -> int:
        """Never: the messages are dead now (moved to the table's vt_dead_letter table, or
        dead in place). Returns how many were rejected (not acked or dead before)."""
        request = requests.reject_request(name, _values(ids), reason, keyspace, subscription)
        return self._router.settle("MessageReject", request)

    def renew(
        self,
        name: str,
        ids: Sequence[object],
        extend_s: float = 0.0,
        reason: str | None = None,
        keyspace: str = "",
        subscription: str = "",
    ) -> int:
        """Still working: the messages (sent, not acked, not due again yet) are not due again
        before ``extend_s`` from now (0: the table's vt_ack_wait). Returns how many."""
        request = requests.renew_request(
            name, _values(ids), extend_s, reason, keyspace, subscription
        )
        return self._router.settle("MessageRenew", request)

    def dead_letters(
        self,
        name: str,
        limit: int = 0,
        after: object | None = None,
        keyspace: str = "",
        subscription: str = "",
    ) -> tuple[list[DeadLetter], int]:
        """Dead messages of table ``name`` (or of its ``subscription``) by id (after
        ``after``; ``limit`` 0: 100), with their reasons, and how many there are (counted up
        to 100,000)."""
        request = requests.dead_letters_request(name, limit, after, keyspace, subscription)
        return requests.dead_letters_from_proto(self._router.unary("ListDeadLetters", request))

    def redrive(
        self,
        name: str,
        to: str = "",
        ids: Sequence[object] | None = None,
        limit: int = 0,
        after: object | None = None,
        keyspace: str = "",
        subscription: str = "",
    ) -> RedriveBatch:
        """One batch (one transaction) of moving dead messages back as fresh ones; call
        again with ``after=batch.last`` until ``batch.last`` is None (msgtable redrive does).
        ``subscription``: that subscription's dead messages of table ``name``, for it alone."""
        request = requests.redrive_request(name, to, ids, limit, after, keyspace, subscription)
        return requests.redrive_from_proto(self._router.unary("Redrive", request))

    # -- subscriptions (README: Subscriptions) ----------------------------------------------------
    def create_subscription(
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
        """Create subscription ``name`` of ``table``: it gets every message enqueued from now
        on that matches ``filter`` (with ``from_start``, also every retained one the default
        group has not acked: returns how many). Settings left None take the table's.
        ``limits``: flow control of its own, in place of the table's for this subscription
        only, by name (rate, rate_burst, max_in_flight, key_rate, key_burst,
        key_concurrency: the comment's vt_<name>) with values as the comment's ("100/s",
        5); "off" turns the table's off for it. ``state_rows="lazy"``: state rows only for
        messages sent and not settled in order (fewer writes; acked over gRPC, not by DML
        yet); "eager" (the default): one per message."""
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
        count: int = self._router.unary("CreateSubscription", request).count
        return count

    def alter_subscription(self, table: str, name: str, keyspace: str = "", **changes: Any) -> None:
        """Change a subscription's settings (filter, columns, ack_wait_s, max_attempts,
        max_lag, expire_after_s, limits); 0 or "" clears one (back to the table's, or no
        limit). ``limits={"rate": "50/s"}`` changes the limits named, the others stay; a
        value "" puts one back to the table's."""
        request = requests.alter_subscription_request(table, name, keyspace, **changes)
        self._router.unary("AlterSubscription", request)

    def drop_subscription(self, table: str, name: str, keyspace: str = "") -> None:
        """Drop a subscription and its delivery state; its subscribers end (NOT_FOUND)."""
        request = pb.DropSubscriptionRequest(table=table, keyspace=keyspace, name=name)
        self._router.unary("DropSubscription", request)

    def list_subscriptions(self, table: str = "", keyspace: str = "") -> list[TableInfo]:
        """The subscriptions (of ``table``, or all) with state, filter, lag and counters."""
        request = pb.ListSubscriptionsRequest(table=table, keyspace=keyspace)
        return requests.subscriptions_from_proto(self._router.unary("ListSubscriptions", request))

    # -- push endpoints (README: Push to HTTP endpoints) ---------------------------------------
    def set_endpoint(
        self,
        table: str,
        url: str,
        secret: str,
        subscription: str = "",
        max_in_flight: int = 0,
        timeout_s: float = 0.0,
        keyspace: str = "",
    ) -> None:
        """Push ``table``'s default group (or its ``subscription``) to ``url``, signed with
        ``secret`` (``whsec_<base64>`` or 16-512 bytes of text); ``max_in_flight`` batches
        at once (0: 4), each POST timing out after ``timeout_s`` (0: 10 s)."""
        request = requests.set_endpoint_request(
            table, url, secret, subscription, max_in_flight, timeout_s, keyspace
        )
        self._router.unary("SetEndpoint", request)

    def drop_endpoint(self, table: str, subscription: str = "", keyspace: str = "") -> None:
        """Stop pushing ``table``'s default group (or its ``subscription``)."""
        request = pb.DropEndpointRequest(table=table, keyspace=keyspace, subscription=subscription)
        self._router.unary("DropEndpoint", request)

    # -- schedules (docs/how-to/schedules.md) -------------------------------------------------
    def create_schedule(
        self,
        name: str,
        table: str,
        cron: str,
        values: Mapping[str, Any] | str | None = None,
        timezone: str = "UTC",
        missed: str = "skip",
        keyspace: str = "",
    ) -> Schedule:
        """Make schedule ``name``: each tick of ``cron`` (in ``timezone``) enqueues one message
        of ``values`` (column -> value, or their JSON) into ``table``, exactly once across the
        servers; ticks missed while no server ran are skipped or enqueued once (``missed``).
        Returns it as written (its first tick in next_tick_ns)."""
        request = requests.create_schedule_request(
            name, table, cron, values, timezone, missed, keyspace
        )
        return codec.schedule_from_proto(self._router.unary("CreateSchedule", request).schedule)

    def list_schedules(self, table: str = "", keyspace: str = "") -> list[Schedule]:
        """The schedules (of ``table``, or all), with their last and next tick."""
        request = pb.ListSchedulesRequest(keyspace=keyspace, table=table)
        response = self._router.unary("ListSchedules", request)
        return [codec.schedule_from_proto(x) for x in response.schedules]

    def drop_schedule(self, name: str, keyspace: str = "") -> bool:
        """Drop schedule ``name`` (no tick of it is enqueued after); whether there was one."""
        request = pb.DropScheduleRequest(keyspace=keyspace, name=name)
        return bool(self._router.unary("DropSchedule", request).dropped)

    def list_tables(self) -> list[TableInfo]:
        """Every message table the server knows, with config or load error and counters."""
        return self.status().tables

    def status(self) -> ServerStatus:
        """The server's tables (as list_tables), and why it cannot reach its database now
        ("" while it can): a server answers at once while its database is away."""
        return requests.status_from_proto(self._router.unary("ListTables", pb.ListTablesRequest()))

    def close(self) -> None:
        self._router.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_values = requests.values
