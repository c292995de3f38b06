"""The servicer over a real gRPC channel (in-process server on a free port), with a fake engine.

FakeEngine is also used by test_client.py.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from decimal import Decimal

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from msgtable.core.rows import Batch
from msgtable.core.status import TableStatus
from msgtable.core.tables import Column, Layout, TableConfig
from msgtable.errors import (
    InvalidArgument,
    MsgtableError,
    TableLoadError,
    TableNotFound,
    Unavailable,
)
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.proto.msgtable.v1 import messaging_pb2_grpc as pb_grpc
from msgtable.server import wire
from msgtable.server.servicer import (
    INTERNAL_MESSAGE,
    SERVICE_NAME,
    MessagingServer,
    is_loopback,
    status_for,
)

FIELDS = (
    Column("id", "bigint", "bigint(20)"),
    Column("message", "varchar", "varchar(128)"),
    Column("price", "decimal", "decimal(10,2)"),
)
WAIT_S = 5.0
_CLOSED = object()


class FakeSubscriber:
    """A subscription whose batches (or ending error) the test puts in."""

    def __init__(self, fields: tuple[Column, ...]) -> None:
        self.fields = fields
        self.ack_wait_s = 30.0
        self._items: queue.Queue[object] = queue.Queue()
        self.closed = threading.Event()

    def put(self, rows: list[tuple[object, ...]]) -> None:
        self._items.put(rows)

    def end(self, error: Exception) -> None:
        self._items.put(error)

    def next_batch(self, timeout_s: float | None = None) -> Batch:
        if self.closed.is_set():
            raise Unavailable("subscription closed")
        try:
            item = self._items.get(timeout=timeout_s)
        except queue.Empty:
            return Batch([])
        if item is _CLOSED:
            raise Unavailable("subscription closed")
        if isinstance(item, Exception):
            raise item
        assert isinstance(item, list)
        return item if isinstance(item, Batch) else Batch(item)

    def close(self) -> None:
        self.closed.set()
        self._items.put(_CLOSED)


class FakeEngine:
    """Records what the servicer asks and answers what the test set up."""

    def __init__(self) -> None:
        self.fields = FIELDS
        self.subscribe_error: BaseException | None = None
        self.subscribe_errors: list[BaseException] = []  # raised once each, in order, first
        self.subscribe_gate: threading.Event | None = None  # subscribe waits for it if set
        self.subscribe_calls: list[tuple[str, str, str, tuple[bytes, bytes]]] = []
        self.subscribers: queue.Queue[FakeSubscriber] = queue.Queue()
        self.acks: list[tuple[str, str, list[object]]] = []
        self.ack_result = 0
        self.ack_error: BaseException | None = None
        self.ack_errors: list[BaseException] = []  # raised once each, in order, first
        self.tables: list[TableStatus] = []
        self.list_error: BaseException | None = None
        self.db_error = ""

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
    ) -> FakeSubscriber:
        self.subscribe_calls.append((name, keyspace, shard, key_range))
        self.subscription, self.filter = subscription, filter
        self.max_in_flight, self.max_messages = max_in_flight, max_messages
        if self.subscribe_gate is not None:
            self.subscribe_gate.wait(WAIT_S)
        if self.subscribe_errors:
            raise self.subscribe_errors.pop(0)
        if self.subscribe_error is not None:
            raise self.subscribe_error
        sub = FakeSubscriber(self.fields)
        self.subscribers.put(sub)
        return sub

    def next_subscriber(self) -> FakeSubscriber:
        return self.subscribers.get(timeout=WAIT_S)

    def ack(self, name: str, keyspace: str, ids: Sequence[object], subscription: str = "") -> int:
        self.acks.append((name, keyspace, list(ids)))
        self.ack_subscription = subscription
        if self.ack_errors:
            raise self.ack_errors.pop(0)
        if self.ack_error is not None:
            raise self.ack_error
        return self.ack_result

    def list_tables(self) -> list[TableStatus]:
        if self.list_error is not None:
            raise self.list_error
        return self.tables

    def database_error(self) -> str:
        return self.db_error


def loaded_table(name: str = "my_message") -> TableStatus:
    config = TableConfig(
        name=name,
        ack_wait_s=30,
        purge_after_s=86400,
        batch_size=10,
        cache_size=10000,
        poller_interval_s=30,
        min_backoff_s=30,
        max_backoff_s=0,
        layout=Layout.CURRENT,
        columns=FIELDS,
        message_columns=FIELDS,
    )
    return TableStatus(
        name=name,
        keyspace="app",
        config=config,
        load_error=None,
        cached=3,
        in_flight=2,
        subscribers=1,
        sent=5,
        acked=4,
    )


def failed_table(name: str = "bad") -> TableStatus:
    return TableStatus(
        name=name,
        keyspace="app",
        config=None,
        load_error=f"table {name}: missing comment field vt_ack_wait",
    )


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def channel(server: MessagingServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as ch:
        yield ch


@pytest.fixture
def stub(channel: grpc.Channel) -> pb_grpc.MessagingStub:
    return pb_grpc.MessagingStub(channel)


ERROR_CODES = [
    (TableNotFound("message table 'nope' not found"), grpc.StatusCode.NOT_FOUND),
    (
        TableLoadError("table bad: missing comment field vt_ack_wait"),
        grpc.StatusCode.FAILED_PRECONDITION,
    ),
    (InvalidArgument("shard '-80' not found"), grpc.StatusCode.INVALID_ARGUMENT),
    (Unavailable("database unavailable"), grpc.StatusCode.UNAVAILABLE),
    (MsgtableError("something the user should read"), grpc.StatusCode.INTERNAL),
]


# -- MessageStream ----------------------------------------------------------------------
def test_a_stream_sends_the_fields_first_then_one_response_per_batch(engine, stub):
    call = stub.MessageStream(pb.MessageStreamRequest(name="my_message"))
    first = next(call)
    assert [(f.name, f.type, f.column_type) for f in first.fields] == [
        ("id", pb.FIELD_TYPE_INT, "bigint(20)"),
        ("message", pb.FIELD_TYPE_TEXT, "varchar(128)"),
        ("price", pb.FIELD_TYPE_DECIMAL, "decimal(10,2)"),
    ]
    assert not first.rows
    sub = engine.next_subscriber()
    sub.put([(1, "a", Decimal("1.50")), (2, None, None)])
    sub.put([(3, "c", Decimal("0.01"))])
    second, third = next(call), next(call)
    assert not second.fields and not third.fields
    assert [[v.WhichOneof("kind") for v in r.values] for r in second.rows] == [
        ["int_value", "text_value", "text_value"],
        ["int_value", "null_value", "null_value"],
    ]
    assert [r.values[0].int_value for r in third.rows] == [3]
    assert third.rows[0].values[2].text_value == "0.01"
    call.cancel()


def test_the_stream_request_reaches_the_engine_as_is(engine, stub):
    call = stub.MessageStream(
        pb.MessageStreamRequest(
            name="t",
            keyspace="ks",
            shard="0",
            key_range=pb.KeyRange(start=b"\x00", end=b"\x80"),
            max_in_flight=7,
        )
    )
    next(call)
    assert engine.subscribe_calls == [("t", "ks", "0", (b"\x00", b"\x80"))]
    assert engine.max_in_flight == 7
    call.cancel()


def test_a_stream_names_its_subscription_and_filter_and_gets_only_its_columns(engine, stub):
    call = stub.MessageStream(
        pb.MessageStreamRequest(
            name="t", subscription="billing", filter="price > 1", columns=["price"]
        )
    )
    first = next(call)
    assert [f.name for f in first.fields] == ["id", "price"]
    assert (engine.subscription, engine.filter) == ("billing", "price > 1")
    engine.next_subscriber().put([(1, "a", Decimal("1.50"))])
    row = next(call).rows[0]
    assert [v.WhichOneof("kind") for v in row.values] == ["int_value", "text_value"]
    call.cancel()


def test_a_stream_asking_for_an_unknown_column_is_invalid(engine, stub):
    call = stub.MessageStream(pb.MessageStreamRequest(name="t", columns=["nope"]))
    with pytest.raises(grpc.RpcError) as info:
        next(call)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown column 'nope'" in info.value.details()
    assert engine.next_subscriber().closed.wait(WAIT_S)


def test_an_ack_names_its_subscription(engine, stub):
    stub.MessageAck(
        pb.MessageAckRequest(name="t", ids=[pb.Value(int_value=1)], subscription="audit")
    )
    assert engine.ack_subscription == "audit"


@pytest.mark.parametrize(("error", "code"), ERROR_CODES)
def test_a_refused_subscription_gets_the_status_of_its_error(engine, stub, error, code):
    engine.subscribe_error = error
    with pytest.raises(grpc.RpcError) as caught:
        next(stub.MessageStream(pb.MessageStreamRequest(name="t")))
    assert caught.value.code() == code
    assert caught.value.details() == str(error)


def test_an_unexpected_error_is_internal_with_a_generic_message_and_a_logged_traceback(
    engine, stub, caplog
):
    engine.subscribe_error = KeyError("secret internals")
    with (
        caplog.at_level(logging.ERROR, logger="msgtable.server.servicer"),
        pytest.raises(grpc.RpcError) as caught,
    ):
        next(stub.MessageStream(pb.MessageStreamRequest(name="t")))
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert caught.value.details() == INTERNAL_MESSAGE
    assert "secret" not in caught.value.details()
    (record,) = [r for r in caplog.records if r.name == "msgtable.server.servicer"]
    assert "MessageStream" in record.getMessage() and record.exc_info is not None


def test_a_stream_the_engine_ends_reports_why_after_the_rows_it_sent(engine, stub):
    call = stub.MessageStream(pb.MessageStreamRequest(name="t"))
    next(call)
    sub = engine.next_subscriber()
    sub.put([(1, "a", None)])
    sub.end(TableNotFound("message table 't' was dropped"))
    assert next(call).rows[0].values[0].int_value == 1
    with pytest.raises(grpc.RpcError) as caught:
        next(call)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "dropped" in caught.value.details()
    wait_until(sub.closed.is_set, "the subscriber to be closed")


def test_when_the_client_cancels_the_subscriber_is_closed(engine, stub):
    call = stub.MessageStream(pb.MessageStreamRequest(name="t"))
    next(call)
    sub = engine.next_subscriber()
    call.cancel()
    wait_until(sub.closed.is_set, "the subscriber to be closed")


def test_stop_ends_open_streams_with_unavailable_and_refuses_new_ones(engine, server, stub):
    call = stub.MessageStream(pb.MessageStreamRequest(name="t"))
    next(call)
    sub = engine.next_subscriber()
    started = time.monotonic()
    server.stop(2.0)
    assert time.monotonic() - started < 1.5  # the stream did not hold the server for the grace
    with pytest.raises(grpc.RpcError) as caught:
        next(call)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert sub.closed.is_set()
    assert server.wait(0)


def test_stop_lets_batches_already_claimed_for_a_stream_reach_it(engine, server, stub):
    # Batches the engine already claimed for this subscriber are still queued when the server
    # stops: they are sent before the stream ends, not dropped (to come back a lease later).
    call = stub.MessageStream(pb.MessageStreamRequest(name="t"))
    next(call)
    sub = engine.next_subscriber()
    held = [[(1, "a", Decimal("1.00"))], [(2, "b", None)]]
    real_end = sub.end

    def end(error: Exception) -> None:  # like the engine's Subscriber: batches, then the error
        for batch in held:
            sub.put(batch)
        real_end(error)

    sub.end = end  # type: ignore[method-assign]
    server.stop(2.0)
    ids = []
    with pytest.raises(grpc.RpcError) as caught:
        for response in call:
            ids += [row.values[0].int_value for row in response.rows]
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert ids == [1, 2]


def test_streams_beyond_the_limit_are_refused_but_acks_still_work(engine):
    server = MessagingServer(
        engine, "127.0.0.1:0", max_workers=4, max_streams=1, stream_poll_s=0.05
    )
    server.start()
    try:
        with grpc.insecure_channel(server.address) as ch:
            stub = pb_grpc.MessagingStub(ch)
            first = stub.MessageStream(pb.MessageStreamRequest(name="t"))
            next(first)
            with pytest.raises(grpc.RpcError) as caught:
                next(stub.MessageStream(pb.MessageStreamRequest(name="t")))
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            engine.ack_result = 1
            ack = pb.MessageAckRequest(name="t", ids=[pb.Value(int_value=1)])
            assert stub.MessageAck(ack, timeout=WAIT_S).count == 1
            first.cancel()
            engine.next_subscriber()
            # the slot comes back once the cancelled stream has wound down
            second = None
            deadline = time.monotonic() + WAIT_S
            while second is None:
                try:
                    call = stub.MessageStream(pb.MessageStreamRequest(name="t"))
                    next(call)
                    second = call
                except grpc.RpcError:
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
            second.cancel()
    finally:
        server.stop(0)


# -- MessageAck / ListTables ------------------------------------------------------------
def test_an_ack_reaches_the_engine_with_python_ids_and_returns_its_count(engine, stub):
    engine.ack_result = 2
    response = stub.MessageAck(
        pb.MessageAckRequest(
            name="t",
            keyspace="ks",
            ids=[
                pb.Value(int_value=1),
                pb.Value(uint_value=2**64 - 1),
                pb.Value(text_value="x"),
                pb.Value(bytes_value=b"\xff"),
                pb.Value(null_value=0),
            ],
        )
    )
    assert response.count == 2
    assert engine.acks == [("t", "ks", [1, 2**64 - 1, "x", b"\xff", None])]


def test_an_ack_id_with_no_value_is_invalid_and_never_reaches_the_engine(engine, stub):
    with pytest.raises(grpc.RpcError) as caught:
        stub.MessageAck(pb.MessageAckRequest(name="t", ids=[pb.Value(int_value=1), pb.Value()]))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ids[1]" in caught.value.details()
    assert engine.acks == []


@pytest.mark.parametrize(("error", "code"), ERROR_CODES)
def test_a_failed_ack_gets_the_status_of_its_error(engine, stub, error, code):
    engine.ack_error = error
    with pytest.raises(grpc.RpcError) as caught:
        stub.MessageAck(pb.MessageAckRequest(name="t", ids=[pb.Value(int_value=1)]))
    assert (caught.value.code(), caught.value.details()) == (code, str(error))


def test_list_tables_reports_loaded_and_failed_tables(engine, stub):
    engine.tables = [loaded_table(), failed_table()]
    loaded, failed = stub.ListTables(pb.ListTablesRequest()).tables
    assert (
        loaded.name,
        loaded.keyspace,
        loaded.load_error,
        loaded.config.batch_size,
        loaded.cached,
        loaded.in_flight,
        loaded.subscribers,
    ) == ("my_message", "app", "", 10, 3, 2, 1)
    assert [f.name for f in loaded.config.message_columns] == ["id", "message", "price"]
    assert not failed.HasField("config")
    assert failed.load_error == "table bad: missing comment field vt_ack_wait"


def test_list_tables_while_the_database_is_down_is_unavailable(engine, stub):
    engine.list_error = Unavailable("database unavailable: connection refused")
    with pytest.raises(grpc.RpcError) as caught:
        stub.ListTables(pb.ListTablesRequest())
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


# -- health, reflection, binding ----------------------------------------------------------
def test_health_reports_serving_for_the_server_and_the_service(channel):
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE_NAME):
        response = health.Check(health_pb2.HealthCheckRequest(service=service))
        assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_describes_the_messaging_service(channel):
    database = ProtoReflectionDescriptorDatabase(channel)
    assert {SERVICE_NAME, "grpc.health.v1.Health"} <= set(database.get_services())
    service = descriptor_pool.DescriptorPool(database).FindServiceByName(SERVICE_NAME)
    assert {m.name for m in service.methods} == {
        "MessageStream",
        "MessageAck",
        "ListTables",
        "MessageRelease",
        "MessageReject",
        "MessageRenew",
        "ListDeadLetters",
        "Redrive",
        "CreateSubscription",
        "AlterSubscription",
        "DropSubscription",
        "ListSubscriptions",
        "SetEndpoint",
        "DropEndpoint",
        "CreateSchedule",
        "ListSchedules",
        "DropSchedule",
    }


def test_listening_on_a_port_in_use_raises_a_clear_error(engine, server):
    second = MessagingServer(engine, server.address)
    with pytest.raises(MsgtableError, match=f"cannot listen on {server.address}"):
        second.start()


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:50051", True),
        ("localhost:1", True),
        ("[::1]:50051", True),
        ("unix:/tmp/msgtable.sock", True),
        ("0.0.0.0:50051", False),
        ("[::]:50051", False),
        ("10.1.2.3:50051", False),
        ("db.example.com:50051", False),
    ],
)
def test_only_loopback_addresses_count_as_local(listen, loopback):
    assert is_loopback(listen) is loopback


def test_a_subclass_of_a_domain_error_maps_like_its_parent():
    class ReplicaLagging(Unavailable):
        pass

    assert status_for(ReplicaLagging("lagging")) == (grpc.StatusCode.UNAVAILABLE, "lagging")
    assert status_for(ValueError("x")) == (grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)


# -- what comes off the wire (msgtable.server.wire)
# -------------------------------------------------
def test_a_status_message_is_cut_saying_how_much_was_left_out():
    assert wire.bounded("x" * 10, 10) == "x" * 10
    assert wire.bounded("x" * 12, 10) == "x" * 10 + "... (2 more characters)"


def test_names_over_64_characters_and_undecodable_requests_are_refused_before_the_engine(
    engine, server
):
    engine.ack_result = 1
    with grpc.insecure_channel(server.address) as channel:
        ack = channel.unary_unary("/msgtable.v1.Messaging/MessageAck")
        ids = pb.MessageAckRequest(ids=[pb.Value(int_value=1)]).SerializeToString()
        for name, why in (
            ("t" * 65, "name of 65 characters: a name has at most 64 characters"),
            ("t" * 64 + "\x00", "at most 64"),
        ):
            request = pb.MessageAckRequest(name=name).SerializeToString() + ids
            with pytest.raises(grpc.RpcError) as err:
                ack(request, timeout=WAIT_S)
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert why in (err.value.details() or "")
        ks = pb.MessageAckRequest(name="t", keyspace="k" * 65).SerializeToString() + ids
        with pytest.raises(grpc.RpcError, match="keyspace of 65 characters"):
            ack(ks, timeout=WAIT_S)
        with pytest.raises(grpc.RpcError) as err:
            ack(b"\x0a\x03t\xff\xfe" + ids, timeout=WAIT_S)  # name: not UTF-8
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").endswith(
            "not a valid msgtable.v1.MessageAckRequest: a string field is not valid UTF-8"
        )
        assert engine.acks == []  # none reached the engine
        at_the_limit = pb.MessageAckRequest(name="t" * 64).SerializeToString() + ids
        assert pb.MessageAckResponse.FromString(ack(at_the_limit)).count == 1
