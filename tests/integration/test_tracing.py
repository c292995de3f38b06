"""OpenTelemetry through messages against the real server and MariaDB: a trace started by a
producer is the parent of the consumer's span, in the sync and the asyncio client, through a
plain INSERT of ``msgtable.core.tracing.traceparent()`` and through ``enqueue(...,
traceparent=CURRENT)``; the server's poll / send / ack spans; a bad traceparent delivers; a
parent-based sampler that leaves the roots out still traces a sampled producer's message."""

from __future__ import annotations

import asyncio
import logging

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, Sampler

from msgtable import aio
from msgtable.client import Client
from msgtable.core import tracing
from msgtable.enqueue import enqueue
from tests.waiting import wait_until

from .helpers import Served, serve

TRACE_COLUMNS = "traceparent varchar(55), tracestate varchar(512)"


class Spans:
    """A tracer provider whose spans end up in memory."""

    def __init__(self, sampler: Sampler | None = None) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(sampler=sampler)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, f"{name}: {[s.name for s in self.exporter.get_finished_spans()]}"
        return found[0]


@pytest.fixture
def server_spans() -> Spans:
    return Spans()


@pytest.fixture
def served(db_dsn: str, server_spans: Spans):
    with serve(db_dsn, tracer_provider=server_spans.provider) as s:
        yield s


def assert_child(child: ReadableSpan, parent: ReadableSpan) -> None:
    assert child.parent is not None, f"{child.name} has no parent (wanted {parent.name})"
    assert child.parent.span_id == parent.context.span_id
    assert child.context.trace_id == parent.context.trace_id


def test_a_producer_span_is_the_parent_of_the_sync_consumer_span(served: Served):
    served.create_table("orders", TRACE_COLUMNS, vt_poller_interval=0.1)
    app = Spans()
    with app.tracer.start_as_current_span("checkout"):  # the producer, plain SQL
        served.sql(
            "insert into orders (id, message, traceparent) values (1, 'paid', :tp)",
            tp=tracing.traceparent(),
        )
    with (
        Client(served.server.address, tracer_provider=app.provider) as client,
        client.subscribe("orders") as sub,
    ):
        for message in sub:
            with app.tracer.start_as_current_span("handle"):  # the user's own span
                assert message.values["message"] == "paid"
            message.ack()
            break
    # left by break: closing the subscriber took its context off the current one
    assert trace.get_current_span() is trace.INVALID_SPAN
    process = app.one("process orders")
    assert_child(process, app.one("checkout"))
    assert_child(app.one("handle"), process)
    assert process.kind is trace.SpanKind.CONSUMER
    attributes = dict(process.attributes or {})
    assert attributes["messaging.system"] == "msgtable"
    assert attributes["messaging.destination.name"] == "orders"
    assert attributes["messaging.message.id"] == "1"
    assert attributes["messaging.consumer.group.name"] == "default"


def test_enqueue_with_current_makes_a_producer_span_the_aio_consumer_continues(
    served: Served, monkeypatch: pytest.MonkeyPatch
):
    served.create_table("orders", TRACE_COLUMNS, vt_poller_interval=0.1)
    app = Spans()
    # enqueue's producer span goes to the global provider: this test's, for its duration
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: app.provider)
    with app.tracer.start_as_current_span("checkout"), served.transaction() as conn:
        enqueue(conn, "orders", {"id": 1, "message": "paid"}, traceparent=tracing.CURRENT)

    async def consume() -> None:
        async with (
            aio.Client(served.server.address) as client,  # the global provider too
            client.subscribe("orders") as sub,
        ):
            async for message in sub:
                with app.tracer.start_as_current_span("handle"):
                    assert message.values["message"] == "paid"
                await message.ack()
                break

    asyncio.run(consume())
    send = app.one("send orders")
    assert send.kind is trace.SpanKind.PRODUCER
    assert (send.attributes or {})["messaging.destination.name"] == "orders"
    assert_child(send, app.one("checkout"))
    process = app.one("process orders")
    assert_child(process, send)  # the consumer's parent: the producer span
    assert_child(app.one("handle"), process)
    stored = served.sql("select traceparent from orders")[0][0]
    assert stored.split("-")[2] == f"{send.context.span_id:016x}"


def test_the_server_traces_poll_send_and_ack(served: Served, server_spans: Spans):
    served.create_table("jobs", vt_poller_interval=0.1, vt_batch_size=10)
    served.sql("insert into jobs (id, message) values (1, 'a'), (2, 'b'), (3, 'c')")
    with served.client.subscribe("jobs") as sub:
        got = []
        for message in sub:
            got.append(message)
            if len(got) == 3:
                break
        assert sub.ack(got) == 3
    wait_until(
        lambda: server_spans.named("ack jobs"), 10, what="the server's ack span for table jobs"
    )

    def sent() -> int:
        spans = server_spans.named("send jobs")
        return sum(int((s.attributes or {})["messaging.batch.message_count"]) for s in spans)

    # A send's span ends after its commit, which lets the ack's UPDATE go on: on a busy
    # machine the ack's span can end first (CI's MariaDB run once saw none ended yet).
    wait_until(lambda: sent() >= 3, 10, what="the send spans of the 3 messages")
    assert sent() == 3
    sends = server_spans.named("send jobs")
    (ack,) = server_spans.named("ack jobs")
    assert (ack.attributes or {})["messaging.batch.message_count"] == 3
    assert (ack.attributes or {})["msgtable.acked"] == 3
    polls = server_spans.named("poll jobs")
    assert any((s.attributes or {})["msgtable.added"] == 3 for s in polls)
    assert {s.kind for s in [*sends, ack, *polls]} == {trace.SpanKind.INTERNAL}


def test_a_bad_traceparent_still_delivers_with_a_span_without_parent(served: Served, caplog):
    served.create_table("shaky", TRACE_COLUMNS, vt_poller_interval=0.1)
    served.sql(
        "insert into shaky (id, message, traceparent) values (1, 'a', 'garbage'), (2, 'b', null)"
    )
    app = Spans()
    caplog.set_level(logging.WARNING, logger="msgtable.core.tracing")
    with (
        Client(served.server.address, tracer_provider=app.provider) as client,
        client.subscribe("shaky") as sub,
    ):
        got = []
        for message in sub:
            got.append(message.id)
            message.ack()
            if len(got) == 2:
                break
    assert sorted(got) == [1, 2]  # type: ignore[type-var]
    spans = app.named("process shaky")
    assert len(spans) == 2 and all(s.parent is None for s in spans)
    said = [
        r for r in caplog.records if r.name == "msgtable.core.tracing" and "shaky" in r.getMessage()
    ]
    assert len(said) == 1, [r.getMessage() for r in said]


def test_a_batch_is_one_span_linked_to_each_producer_in_both_clients(served: Served):
    app = Spans()
    producers = {}
    for table in ("bulk_sync", "bulk_aio"):
        served.create_table(table, TRACE_COLUMNS, vt_poller_interval=0.1, vt_batch_size=10)
    for i in (1, 2, 3):
        with app.tracer.start_as_current_span(f"producer {i}") as span:
            producers[i] = span.get_span_context().span_id
            for table in ("bulk_sync", "bulk_aio"):
                served.sql(
                    f"insert into {table} (id, message, traceparent, tracestate) "
                    "values (:i, 'm', :tp, :ts)",
                    i=i,
                    tp=tracing.traceparent(),
                    ts=f"shop=p{i}",
                )

    def check(span: ReadableSpan) -> None:
        assert span.parent is None  # a batch has no single parent
        assert (span.attributes or {})["messaging.batch.message_count"] == 3
        assert sorted(link.context.span_id for link in span.links) == sorted(producers.values())
        assert {link.context.trace_state.get("shop") for link in span.links} == {"p1", "p2", "p3"}

    with (
        Client(served.server.address, tracer_provider=app.provider) as client,
        client.subscribe("bulk_sync") as sub,
    ):
        batch = sub.next_batch()
        assert len(batch) == 3, f"one batch of the 3 rows, not {len(batch)}"
        sub.ack(batch[:1])
        assert app.named("process bulk_sync") == []  # two of its messages are not settled
        sub.ack(batch[1:])
        check(app.one("process bulk_sync"))  # all settled: the span ended

    async def consume() -> None:
        async with (
            aio.Client(served.server.address, tracer_provider=app.provider) as client,
            client.subscribe("bulk_aio") as sub,
        ):
            batch = await sub.next_batch()
            assert len(batch) == 3, f"one batch of the 3 rows, not {len(batch)}"
            await sub.ack(batch)

    asyncio.run(consume())
    check(app.one("process bulk_aio"))


def test_a_sampled_producer_is_traced_where_roots_are_not_and_nothing_else_is(db_dsn: str):
    """ParentBased(ALWAYS_OFF) in the server and the subscriber: what the default one root in
    ten is for nine roots in ten. The message a sampled producer sent gets its span (and the
    handler's under it); an unsampled producer's, the batches and the server's roots none."""
    server_spans = Spans(ParentBased(ALWAYS_OFF))
    app = Spans(ParentBased(ALWAYS_OFF))
    shop = Spans()  # the producer samples everything
    unsampled = "00-" + "1" * 32 + "-" + "2" * 16 + "-00"
    with serve(db_dsn, tracer_provider=server_spans.provider) as served:
        served.create_table("sampled", TRACE_COLUMNS, vt_poller_interval=0.1, vt_batch_size=10)
        with shop.tracer.start_as_current_span("checkout"):
            sampled = tracing.traceparent()
        insert = "insert into sampled (id, message, traceparent) values (:i, 'm', :tp)"
        served.sql(insert, i=1, tp=sampled)
        served.sql(insert, i=2, tp=unsampled)
        with (
            Client(served.server.address, tracer_provider=app.provider) as client,
            client.subscribe("sampled") as sub,
        ):
            got = []
            for message in sub:
                with app.tracer.start_as_current_span(f"handle {message.id}"):
                    got.append(message.id)
                message.ack()
                if len(got) == 2:
                    break
            served.sql(insert, i=3, tp=sampled)
            batch = sub.next_batch()
            assert [m.id for m in batch] == [3], f"the third message alone, not {batch}"
            sub.ack(batch)
    assert sorted(got) == [1, 2]  # type: ignore[type-var]
    process = app.one("process sampled")  # the sampled producer's message only
    assert_child(process, shop.one("checkout"))
    assert (process.attributes or {})["messaging.message.id"] == "1"
    assert [s.name for s in app.named("handle 1")] == ["handle 1"]
    assert_child(app.one("handle 1"), process)
    assert len(app.exporter.get_finished_spans()) == 2, app.exporter.get_finished_spans()
    assert server_spans.exporter.get_finished_spans() == ()
