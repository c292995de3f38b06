"""The client against a real in-process server over a fake engine (see test_server.py)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from decimal import Decimal

import grpc
import pytest

from msgtable.client import ERRORS_BY_CODE, Client, Field, error_from_rpc
from msgtable.core.codec import FieldType
from msgtable.errors import (
    InvalidArgument,
    MsgtableError,
    PermissionDenied,
    ResourceExhausted,
    TableLoadError,
    TableNotFound,
    Unauthenticated,
    Unavailable,
)
from msgtable.server.servicer import STATUS_CODES, MessagingServer
from tests.unit.server.test_server import ERROR_CODES, WAIT_S, failed_table, loaded_table


@pytest.fixture
def client(server: MessagingServer) -> Iterator[Client]:
    with Client(server.address, timeout_s=WAIT_S) as c:
        yield c


def test_a_subscription_knows_its_fields_and_yields_decoded_messages(engine, client):
    with client.subscribe("my_message") as sub:
        assert sub.fields == (
            Field("id", FieldType.INT, "bigint(20)"),
            Field("message", FieldType.TEXT, "varchar(128)"),
            Field("price", FieldType.DECIMAL, "decimal(10,2)"),
        )
        engine.next_subscriber().put([(1, "hello", Decimal("9.99")), (2, None, None)])
        first, second = next(sub), next(sub)
    assert (first.id, first.row) == (1, (1, "hello", Decimal("9.99")))
    assert first.values == {"id": 1, "message": "hello", "price": Decimal("9.99")}
    assert second.values == {"id": 2, "message": None, "price": None}


def test_batches_come_as_the_server_sent_them(engine, client):
    with client.subscribe("my_message") as sub:
        feed = engine.next_subscriber()
        feed.put([(1, "a", None), (2, "b", None)])
        feed.put([(3, "c", None)])
        batches = sub.batches()
        assert [m.id for m in next(batches)] == [1, 2]
        assert [m.id for m in next(batches)] == [3]


def test_a_message_acks_itself_with_the_id_exactly_as_received(engine, client):
    engine.fields = (engine.fields[0].__class__("id", "bigint", "bigint unsigned"),)
    engine.ack_result = 1
    with client.subscribe("my_message", keyspace="app") as sub:
        engine.next_subscriber().put([(2**64 - 1,)])
        message = next(sub)
        assert message.ack() == 1
    assert engine.acks == [("my_message", "app", [2**64 - 1])]


def test_a_batch_is_acked_in_one_call(engine, client):
    engine.ack_result = 2
    with client.subscribe("my_message") as sub:
        engine.next_subscriber().put([(1, "a", None), (2, "b", None)])
        assert sub.ack(sub.next_batch()) == 2
    assert engine.acks == [("my_message", "", [1, 2])]


def test_ack_by_ids_sends_python_values(engine, client):
    engine.ack_result = 3
    assert client.ack("t", [1, "two", b"\x03"], keyspace="ks") == 3
    assert engine.acks == [("t", "ks", [1, "two", b"\x03"])]


def test_an_id_that_cannot_be_sent_is_refused_before_any_call(engine, client):
    with pytest.raises(InvalidArgument, match=r"ids\[1\]"):
        client.ack("t", [1, object()])
    assert engine.acks == []


def test_closing_a_subscription_ends_iteration_quietly(engine, client):
    sub = client.subscribe("my_message")
    received: list[object] = []
    done = threading.Event()

    def consume() -> None:
        received.extend(m.id for m in sub)  # blocks until close()
        done.set()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    feed = engine.next_subscriber()
    feed.put([(1, "a", None)])
    sub.close()
    assert done.wait(WAIT_S)
    assert received in ([], [1])
    assert feed.closed.wait(WAIT_S)


def test_a_stream_ended_by_the_server_raises_its_error_after_the_messages(engine, client):
    sub = client.subscribe("my_message")
    feed = engine.next_subscriber()
    feed.put([(1, "a", None)])
    feed.end(TableNotFound("message table 'my_message' was dropped"))
    assert next(sub).id == 1
    with pytest.raises(TableNotFound, match="dropped"):
        next(sub)


def test_raw_responses_start_with_the_fields(engine, client):
    with client.subscribe("my_message") as sub:
        responses = sub.raw_responses()
        first = next(responses)
        assert [f.name for f in first.fields] == ["id", "message", "price"]
        engine.next_subscriber().put([(1, "a", None)])
        assert len(next(responses).rows) == 1


@pytest.mark.parametrize(("error", "code"), ERROR_CODES)
def test_errors_come_back_as_the_classes_the_engine_raised(engine, server, error, code):
    engine.subscribe_error = error
    engine.ack_error = error
    engine.list_error = error
    client = Client(server.address, timeout_s=0.5)  # Unavailable is retried for the time-out
    calls = (lambda: client.subscribe("t", retry=False), lambda: client.ack("t", [1]))
    for call in (*calls, client.list_tables):
        with pytest.raises(MsgtableError) as caught:
            call()
        assert type(caught.value) is type(error)
        assert str(caught.value) == str(error)


def test_an_unexpected_server_error_reads_as_a_plain_msgtable_error(engine, client):
    engine.ack_error = RuntimeError("boom")
    with pytest.raises(MsgtableError, match="internal server error") as caught:
        client.ack("t", [1])
    assert type(caught.value) is MsgtableError


def test_an_unreachable_server_is_unavailable():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"127.0.0.1:{port}", timeout_s=WAIT_S) as c:
        with pytest.raises(Unavailable, match=f"127.0.0.1:{port}"):
            c.list_tables()
        with pytest.raises(Unavailable):
            c.subscribe("t", retry=False)


def test_subscribe_gives_up_when_the_server_does_not_answer_in_time(engine, server):
    engine.subscribe_gate = threading.Event()
    try:
        with (
            Client(server.address, timeout_s=0.2) as c,
            pytest.raises(Unavailable, match="no answer"),
        ):
            c.subscribe("t", retry=False)
    finally:
        engine.subscribe_gate.set()


def test_list_tables_returns_loaded_and_failed_tables(engine, client):
    engine.tables = [loaded_table(), failed_table()]
    loaded, failed = client.list_tables()
    assert loaded.loaded and loaded.load_error == ""
    assert loaded.config is not None and loaded.config.batch_size == 10
    assert loaded.config.layout == "current"
    assert [f.name for f in loaded.config.message_columns] == ["id", "message", "price"]
    assert (loaded.cached, loaded.in_flight, loaded.subscribers, loaded.sent, loaded.acked) == (
        3,
        2,
        1,
        5,
        4,
    )
    assert not failed.loaded and failed.config is None
    assert failed.load_error == "table bad: missing comment field vt_ack_wait"


def test_the_client_mapping_is_the_inverse_of_the_server_mapping():
    for cls, code in STATUS_CODES.items():
        assert ERRORS_BY_CODE[code] is cls
    for cls in (TableNotFound, TableLoadError, InvalidArgument, Unavailable):
        assert cls in STATUS_CODES


class _FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (grpc.StatusCode.RESOURCE_EXHAUSTED, ResourceExhausted),  # an Unavailable: retry later
        (grpc.StatusCode.UNAUTHENTICATED, Unauthenticated),
        (grpc.StatusCode.PERMISSION_DENIED, PermissionDenied),
        (grpc.StatusCode.DEADLINE_EXCEEDED, Unavailable),
        (grpc.StatusCode.UNIMPLEMENTED, MsgtableError),
        (grpc.StatusCode.DATA_LOSS, MsgtableError),
    ],
)
def test_other_status_codes_map_to_the_nearest_error(code, cls):
    error = error_from_rpc(_FakeRpcError(code, "details"), "host:1")
    assert type(error) is cls
    assert isinstance(ResourceExhausted("x"), Unavailable)


def test_a_closing_subscriber_releases_what_it_never_handed_out_late_only_by_delivery():
    """The rest of a batch is released at close whenever its release names each message's
    delivery (the server changes nothing sent again since). A release of ids alone (a server
    that sent no batch times) only while less than half the stream's ack wait has passed
    since it was received: no other subscriber can hold those messages yet. When the server
    did not say its ack wait (older than the release at close), never."""
    from msgtable.client.requests import release_unhanded

    assert release_unhanded(received_at=100.0, ack_wait_s=30.0, now=100.1, by_delivery=True)
    assert release_unhanded(received_at=100.0, ack_wait_s=30.0, now=900.0, by_delivery=True)
    assert release_unhanded(received_at=100.0, ack_wait_s=30.0, now=100.1, by_delivery=False)
    assert release_unhanded(received_at=100.0, ack_wait_s=30.0, now=114.9, by_delivery=False)
    assert not release_unhanded(received_at=100.0, ack_wait_s=30.0, now=115.0, by_delivery=False)
    assert not release_unhanded(received_at=100.0, ack_wait_s=0.0, now=100.0, by_delivery=True)
