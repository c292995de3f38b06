"""Where a client's calls go: one channel per server, each table's sender once an answer
named it (else the servers in turn), and the one rule for which errors are tried again.

A client may name several servers of one database (``Client("a:1,b:2")``): the servers share
its tables (msgtable.engine.placement), each table sent by one of them; the others answer a
MessageStream of it (or a release, reject or renew) with NotLeader and its sender's address,
which the router keeps by table. Unary
calls and subscribers both go through the router: :meth:`Router.next_target` says where,
:meth:`Router.failed` notes an error (it follows a redirect at once, else moves on to the next
server and backs off) and :meth:`Router.should_retry` is the one predicate for what passes, as
google-cloud-pubsub's streaming pull manager keeps its policy in ``_should_recover``. That
policy (:class:`Route`) holds no channel: the asyncio client's router (msgtable.aio.router)
is a Route over grpc.aio channels, so both clients follow the leader and retry alike.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.experimental

from msgtable.client import requests
from msgtable.client.codes import error_from_rpc
from msgtable.client.credentials import BearerToken
from msgtable.core.retry import Backoff, Retry
from msgtable.errors import MsgtableError, NotLeader, ServerUnreachable, Unavailable
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.proto.msgtable.v1 import messaging_pb2_grpc as pb_grpc

log = logging.getLogger("msgtable.client")

# A retry's backoff: RETRY_MIN_S after the first failure, doubling up to RETRY_MAX_S, full
# jitter (each wait drawn between half and all of its ceiling).
RETRY_MIN_S = 0.1
RETRY_MAX_S = 5.0
# ... but at most this while a server answers NotLeader: it is alive and the lease is
# changing hands (a new holder within a lease period), so a call is worth trying soon.
NOT_LEADER_RETRY_MAX_S = 1.0
# Ping an idle stream so a dead server or a dropped connection is noticed; the server allows
# pings this often (server.py sets min_ping_interval_without_data_ms below it).
KEEPALIVE_TIME_MS = 60_000
KEEPALIVE_TIMEOUT_MS = 20_000


def channel_options() -> tuple[tuple[str, Any], ...]:
    """A client channel's options (read when a channel is made)."""
    return (
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        # a ping unanswered this long ends the connection: a server whose packets vanish
        # (half-open) is noticed within KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        # an idle stream sends no data between pings: without this grpc stops after two
        ("grpc.http2.max_pings_without_data", 0),
        *CHANNEL_OPTIONS,
    )


CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", -1),  # a batch of big rows may exceed the 4 MB default
    # Read a stream's responses on the thread that iterates it, not on a helper thread that
    # hands each one over: about a fifth less client CPU per batch.
    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
    # A client's own connections: by default grpc shares them between all the channels of a
    # process, so a client made after its server came back would fail at first with another
    # client's stale "Connection refused" until that connection's reconnect backoff ended.
    ("grpc.use_local_subchannel_pool", 1),
)


class Route:
    """A client's choice of server and its retry policy, without channels: shared by the
    sync Router below and the asyncio client's (msgtable.aio.router). Thread-safe.

    ``timeout_s`` bounds each unary call with its retries (None: no bound).
    ``wait_for_server``: a unary call retries a server that cannot be connected to within
    that bound, as for a server restarting; False: it fails once each server given was tried
    (a command line's one call: nothing listens there, most likely)."""

    def __init__(
        self, targets: Sequence[str], timeout_s: float | None, *, wait_for_server: bool = True
    ) -> None:
        self.targets = tuple(targets)
        self.timeout_s = timeout_s
        self.wait_for_server = wait_for_server
        self.backoff = Backoff(RETRY_MIN_S, RETRY_MAX_S, jitter=True)
        self._lock = threading.Lock()
        self._leader = ""  # the address the last NotLeader answer named
        # by table (table_key): the address a NotLeader answer named for it, until it fails
        self._leaders: dict[str, str] = {}
        self._turn = 0  # which of the targets is next when no leader is known
        # a server answered NotLeader since the last call that went through (see failed())
        self._electing = False
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def leader(self) -> str:
        """The address the last NotLeader answer named, for any table, until a call to it
        failed ("" if none)."""
        return self._leader

    def leader_of(self, key: str) -> str:
        """The sender of a table (``table_key``) as a NotLeader answer named it ("" if
        none, or it failed since)."""
        return self._leaders.get(key, "")

    def next_target(self, key: str = "") -> str:
        """Where the next call about a table (``table_key``; "" for none) goes: its known
        sender, else the targets in turn."""
        with self._lock:
            leader = self._leaders.get(key, "")
            if leader:
                return leader
            return self.targets[self._turn % len(self.targets)]

    def answered(self) -> None:
        """A call went through: the lease has a holder again (see failed())."""
        self._electing = False

    def succeeded(self, target: str) -> None:
        """A stream opened at ``target``: the next ones go there first."""
        with self._lock:
            self._electing = False
            if target in self.targets:
                self._turn = self.targets.index(target)

    def should_retry(self, error: MsgtableError) -> bool:
        """Whether a failed call is tried again: the server or the database is away for now,
        a limit is reached for now, or the server is not the leader (NotLeader, also an
        Unavailable). The others (no such table, bad request, not allowed) would fail again;
        and nothing is tried again once the client is closed."""
        return not self._closed and isinstance(error, Unavailable)

    def failed(
        self,
        error: MsgtableError,
        target: str,
        retry: Retry,
        key: str = "",
        level: int | None = None,
    ) -> float:
        """Note a failed call about table ``key`` to ``target`` that will be tried again
        (counted and logged by ``retry``, a run's first failure at ``level`` if given);
        returns how long to wait before the next attempt."""
        redirect = self._note(error, target, key)
        failures = retry.failures + 1
        if redirect and failures <= 2:  # a redirect: at once (a loop of them backs off)
            return retry.failed(error, delay_s=0.0, level=level or logging.INFO)
        delay = self.backoff.delay_s(failures)
        with self._lock:
            self._electing = self._electing or isinstance(error, NotLeader)
            if self._electing:  # a live server said so: the next holder comes soon
                delay = min(delay, self.backoff.jittered(NOT_LEADER_RETRY_MAX_S))
        return retry.failed(error, delay_s=delay, level=level)

    def retry_delay(
        self,
        error: MsgtableError,
        target: str,
        retry: Retry,
        deadline: float | None,
        key: str = "",
    ) -> float:
        """A unary call to ``target`` failed with ``error``: how long to wait before trying
        again (where next_target() then says), or raise ``error`` when it would fail again or
        the ``deadline`` (monotonic) would pass first. The one rule of both clients."""
        if not self.should_retry(error) or self._gave_up_on_servers(error, target, retry):
            self._note(error, target, key)
            raise error
        delay = self.failed(error, target, retry, key)
        if deadline is not None and time.monotonic() + delay >= deadline:
            raise error
        return delay

    @staticmethod
    def cause(
        exc: grpc.RpcError, error: MsgtableError, before: MsgtableError | None
    ) -> MsgtableError:
        """What a unary call's failed try stands for: a try cut short by the call's time-out
        (each try gets the time left, so a DEADLINE_EXCEEDED is the call's whole time spent)
        after earlier tries failed says only that time ran out; the earlier failure says why
        the call failed (the database away, say), so the call fails with that."""
        cut = hasattr(exc, "code") and exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        return before if cut and before is not None else error

    def reopen_delay(
        self,
        error: MsgtableError,
        target: str,
        retry: Retry,
        *,
        retrying: bool,
        started: float,
        retry_for_s: float | None,
        key: str = "",
        following: bool = False,
    ) -> float:
        """A subscriber's stream to ``target`` broke or failed to open with ``error``: how
        long to wait before opening it again, or raise ``error`` when it would fail again
        (or ``retrying`` is off), and the last error once ``retry_for_s`` passed since
        ``started`` (monotonic). The one rule of both clients' streams.

        ``following`` without ``retrying``: a stream still goes where the servers send it
        (see follows()), and raises on any other error. A NotLeader that begins a run of
        failures is the one line the stream logs of it, a WARNING: it follows the server
        named, or waits out a hand-over."""
        if not self.should_retry(error):
            raise error
        if not retrying and not (following and self.follows(error, target)):
            raise error
        if retry_for_s is not None and time.monotonic() - started >= retry_for_s:
            raise type(error)(f"{error} (gave up after {retry_for_s:g}s of retrying)")
        if not isinstance(error, NotLeader) or retry.failures:
            return self.failed(error, target, retry, key)
        if error.leader and error.leader != target:
            log.warning(
                "%s: the server at %s does not send its table; following it to %s, which does",
                retry.what,
                target,
                error.leader,
            )
        else:
            log.warning("%s: waiting for a server to take its table over (%s)", retry.what, error)
        return self.failed(error, target, retry, key, level=logging.DEBUG)

    def follows(self, error: MsgtableError, target: str) -> bool:
        """Whether a stream that failed at ``target`` with ``error`` is where the servers
        send it rather than a fault: a NotLeader (to the sender it names; or nobody sends
        the table for a moment: a hand-over), or a failure at a server that a NotLeader
        named, not one the client was given (it died or gave the table up: the servers
        given know where the table went)."""
        return isinstance(error, NotLeader) or target not in self.targets

    def _gave_up_on_servers(self, error: MsgtableError, target: str, retry: Retry) -> bool:
        """Without ``wait_for_server``: whether a call has found each server it was given
        unreachable (a server a NotLeader named is not one: the call goes back to those)."""
        return (
            not self.wait_for_server
            and isinstance(error, ServerUnreachable)
            and target in self.targets
            and retry.failures + 1 >= len(self.targets)
        )

    def deadline(self) -> float | None:
        """When a unary call started now gives up (monotonic; None: never)."""
        return None if self.timeout_s is None else time.monotonic() + self.timeout_s

    def _note(self, error: MsgtableError, target: str, key: str) -> bool:
        """Where calls about table ``key`` go after ``error`` from ``target``: to the sender
        it names, else on to the next target. Returns whether it was a redirect."""
        leader = error.leader if isinstance(error, NotLeader) else ""
        redirect = bool(leader) and leader != target
        with self._lock:
            known = self._leaders.get(key, "")
            if redirect:
                self._leaders[key] = self._leader = leader
            elif target == known or not known:
                self._leaders.pop(key, None)
                if self._leader == target:
                    self._leader = ""
                self._turn += 1  # try the next target
        return redirect


def table_key(request: Any) -> str:
    """The table a request is about (its keyspace and name), by which the router keeps each
    table's sender; "" for a request about none (ListTables)."""
    name = getattr(request, "name", "")
    return f"{getattr(request, 'keyspace', '')}/{name}" if name else ""


class Router(Route):
    """A client's channels and its choice of server (see the module docstring). Thread-safe."""

    def __init__(
        self,
        targets: Sequence[str],
        credentials: grpc.ChannelCredentials | None,
        token: str | None,
        timeout_s: float | None,
        *,
        wait_for_server: bool = True,
    ) -> None:
        super().__init__(targets, timeout_s, wait_for_server=wait_for_server)
        self._credentials = credentials
        self._token = token
        self._channels: dict[str, tuple[grpc.Channel, pb_grpc.MessagingStub]] = {}

    def stub(self, target: str) -> pb_grpc.MessagingStub:
        """The stub of ``target``'s channel (channels connect lazily, when first used)."""
        with self._lock:
            if self._closed:
                raise Unavailable("the client is closed")
            entry = self._channels.get(target)
            if entry is None:
                if self._credentials is not None:
                    raw = grpc.secure_channel(target, self._credentials, options=channel_options())
                else:
                    raw = grpc.insecure_channel(target, options=channel_options())
                channel: grpc.Channel = raw
                if self._token:
                    channel = grpc.intercept_channel(raw, BearerToken(self._token))
                entry = self._channels[target] = (raw, pb_grpc.MessagingStub(channel))
            return entry[1]

    def invoke(self, target: str, method: str, request: Any, **kwargs: Any) -> Any:
        """``method`` of ``target``'s stub called with ``request``. A close() of the client
        between taking the stub and the call (grpc's ValueError "Cannot invoke RPC on closed
        channel!") fails as Unavailable "the client is closed", as a call after it does."""
        stub = self.stub(target)
        try:
            return getattr(stub, method)(request, **kwargs)
        except ValueError:
            if not self._closed:
                raise
            raise Unavailable("the client is closed") from None

    def unary(
        self, method: str, request: Any, target: str = "", timeout_s: float | None = None
    ) -> Any:
        """One unary call (to ``target``, else where the router thinks best) with retries of
        passing errors until the time-out (the client's, or ``timeout_s``) is spent."""
        deadline = self.deadline() if timeout_s is None else time.monotonic() + timeout_s
        retry = Retry(method, log, self.backoff, level=logging.INFO)
        key = table_key(request)
        error: MsgtableError | None = None
        while True:
            where = target or self.next_target(key)
            left = None if deadline is None else max(0.001, deadline - time.monotonic())
            try:
                response = self.invoke(where, method, request, timeout=left)
            except grpc.RpcError as exc:
                error = self.cause(exc, error_from_rpc(exc, where), error)
            else:
                retry.succeeded()
                self.answered()
                return response
            target = ""  # a retry goes where the client now thinks best
            time.sleep(self.retry_delay(error, where, retry, deadline, key))

    def ack(
        self,
        name: str,
        keyspace: str,
        ids: Sequence[pb.Value],
        target: str = "",
        subscription: str = "",
    ) -> int:
        """MessageAck; returns how many of ``ids`` this call acked."""
        request = requests.ack_request(name, ids, keyspace, subscription)
        return requests.settled("MessageAck", name, self.unary("MessageAck", request, target))

    def settle(self, method: str, request: Any, target: str = "") -> int:
        """MessageRelease, MessageReject or MessageRenew; returns how many it changed."""
        return requests.settled(method, request.name, self.unary(method, request, target))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
        for raw, _ in channels:
            raw.close()
