"""msgtable.core.tracing with an SDK tracer provider and an in-memory exporter: a consumer span's
parent is its producer's context, its attributes follow the messaging conventions, a bad
traceparent costs the parent (and one warning per table), never the message; and msgtable
runs without opentelemetry installed."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased

from msgtable.core import tracing


@dataclass
class FakeMessage:
    row: tuple[object, ...]

    @property
    def id(self) -> object:
        return self.row[0]


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def by_name(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_a_consumer_span_is_a_child_of_the_producer_span_and_current_in_the_handler(spans):
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("checkout"):
        header = tracing.traceparent()
    consumer = tracing.consumer("orders", "billing", provider)
    assert consumer is not None
    consumer.adopt(("id", "message", "traceparent"))
    message = FakeMessage((7, "paid", header))
    consumer.message(message)
    with tracer.start_as_current_span("handle"):  # the user's own span
        pass
    consumer.settled([message])
    consumer.release_context()
    (checkout,) = by_name(exporter, "checkout")
    (process,) = by_name(exporter, "process orders")
    (handle,) = by_name(exporter, "handle")
    assert process.parent is not None
    assert process.parent.span_id == checkout.context.span_id
    assert process.context.trace_id == checkout.context.trace_id
    assert [link.context.span_id for link in process.links] == [checkout.context.span_id]
    assert handle.parent is not None and handle.parent.span_id == process.context.span_id
    assert process.kind is trace.SpanKind.CONSUMER
    assert dict(process.attributes or {}) == {
        "messaging.system": "msgtable",
        "messaging.destination.name": "orders",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.consumer.group.name": "billing",
        "messaging.message.id": "7",
    }
    assert trace.get_current_span() is trace.INVALID_SPAN  # detached again


def test_the_span_ends_at_the_next_message_when_the_handler_did_not_settle(spans):
    provider, exporter = spans
    consumer = tracing.consumer("orders", "", provider)
    assert consumer is not None
    consumer.adopt(("id", "message"))
    consumer.message(FakeMessage((1, "a")))
    assert by_name(exporter, "process orders") == []
    consumer.message(FakeMessage((2, "b")))
    (first,) = by_name(exporter, "process orders")
    assert first.attributes is not None
    assert first.attributes["messaging.message.id"] == "1"
    assert first.attributes["messaging.consumer.group.name"] == "default"
    assert first.parent is None  # the table has no traceparent column
    consumer.end()  # close(), from any thread
    assert len(by_name(exporter, "process orders")) == 2
    consumer.release_context()
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_a_bad_traceparent_costs_the_parent_and_one_warning_per_table(spans, caplog):
    provider, exporter = spans
    consumer = tracing.consumer("bad_tp", "", provider)
    assert consumer is not None
    consumer.adopt(("id", "traceparent", "tracestate"))
    caplog.set_level(logging.WARNING, logger="msgtable.core.tracing")
    for i, value in enumerate(["not-a-trace", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", 42]):
        consumer.message(FakeMessage((i, value, "k=v")))
    consumer.release_context()
    finished = by_name(exporter, "process bad_tp")
    assert len(finished) == 3
    assert all(s.parent is None and not s.links for s in finished)
    warnings = [r for r in caplog.records if "bad_tp" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "W3C" in warnings[0].getMessage()


def test_a_batch_span_links_each_messages_producer_context(spans):
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    parents = []
    for name in ("a", "b"):
        with tracer.start_as_current_span(name):
            parents.append(tracing.traceparent())
    consumer = tracing.consumer("orders", "", provider)
    assert consumer is not None
    consumer.adopt(("id", "traceparent"))
    batch = [FakeMessage((1, parents[0])), FakeMessage((2, None)), FakeMessage((3, parents[1]))]
    consumer.batch(batch)
    consumer.settled(batch[:2])  # not all of them: still open
    assert by_name(exporter, "process orders") == []
    consumer.settled(batch[2:])
    (span,) = by_name(exporter, "process orders")
    assert span.attributes is not None
    assert span.attributes["messaging.batch.message_count"] == 3
    linked = [link.context.span_id for link in span.links]
    assert linked == [s.context.span_id for n in "ab" for s in by_name(exporter, n)]
    consumer.release_context()


def test_traceparent_and_headers_come_from_the_current_span(spans):
    provider, _ = spans
    assert tracing.traceparent() is None
    assert tracing.trace_headers() == {}
    with provider.get_tracer("test").start_as_current_span("work") as span:
        ctx = span.get_span_context()
        flags = int(ctx.trace_flags)  # sampled, and (W3C level 2) a random trace id
        assert tracing.traceparent() == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{flags:02x}"
        assert tracing.trace_headers() == {"traceparent": tracing.traceparent()}


def test_nothing_records_without_a_configured_provider():
    # the API's default provider (no SDK configured in this process): no tracer, no spans
    assert tracing.tracer() is None
    assert tracing.consumer("t", "") is None
    assert tracing.server("t") is None


def test_server_spans_carry_the_operation_and_batch_size(spans):
    provider, exporter = spans
    server = tracing.server("orders", provider)
    assert server is not None
    server.start("send", 100).end()
    ack = server.start("ack", 3)
    server.failed(ack, TimeoutError("lock wait"))
    ack.end()
    server.start("poll").end()
    send, ack, poll = exporter.get_finished_spans()
    assert (send.name, ack.name, poll.name) == ("send orders", "ack orders", "poll orders")
    assert send.attributes is not None and send.attributes["messaging.batch.message_count"] == 100
    assert ack.attributes is not None and ack.attributes["messaging.operation.type"] == "settle"
    assert ack.status.status_code is trace.StatusCode.ERROR
    assert ack.status.description == "TimeoutError: lock wait"
    assert send.status.status_code is trace.StatusCode.UNSET
    assert poll.attributes is not None and "messaging.batch.message_count" not in poll.attributes
    assert {s.kind for s in (send, ack, poll)} == {trace.SpanKind.INTERNAL}


def test_msgtable_runs_without_opentelemetry_installed():
    script = textwrap.dedent(
        """
        import sys

        class NoOtel:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ImportError("no opentelemetry here")
                return None

        sys.meta_path.insert(0, NoOtel())
        import msgtable.aio, msgtable.client, msgtable.engine.engine, msgtable.enqueue
        from msgtable.core import tracing
        assert not tracing.available()
        assert tracing.traceparent() is None and tracing.trace_headers() == {}
        assert tracing.consumer("t", "") is None and tracing.server("t") is None
        assert tracing.producer_context("00-" + "1" * 32 + "-" + "1" * 16 + "-01") is None
        with tracing.producer_span("t", 1):
            pass
        assert not any(m.startswith("opentelemetry") for m in sys.modules)
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def run_configure(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """configure_from_env() in a fresh process (the global provider is set once a process)."""
    script = textwrap.dedent(
        """
        import logging
        from opentelemetry import trace
        from msgtable.core import tracing

        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        print("configured", tracing.configure_from_env())
        provider = trace.get_tracer_provider()
        print("records", tracing.tracer() is not None)
        if tracing.tracer() is not None:
            print("service", provider.resource.attributes["service.name"])
            print("sampler", provider.sampler.get_description())
        """
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **env},
    )


def test_serve_samples_one_root_span_in_ten_parent_based_unless_told_otherwise():
    done = run_configure({"OTEL_TRACES_EXPORTER": "console"})
    sampler = ParentBased(TraceIdRatioBased(0.1)).get_description()
    assert done.stdout.split("\n")[3] == f"sampler {sampler}", done.stdout + done.stderr
    # the standard variables still choose another
    told = run_configure({"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "always_on"})
    assert told.stdout.split("\n")[3] == "sampler AlwaysOnSampler", told.stdout + told.stderr


def test_serve_takes_its_tracer_provider_from_the_standard_variables():
    done = run_configure({"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "queue-1"})
    assert done.stdout.split("\n")[:3] == ["configured True", "records True", "service queue-1"]
    none = run_configure({"OTEL_TRACES_EXPORTER": "none"})
    assert none.stdout.split("\n")[:2] == ["configured False", "records False"], none.stderr
    unset = run_configure({})
    assert unset.stdout.split("\n")[:2] == ["configured False", "records False"], unset.stderr
    unknown = run_configure({"OTEL_TRACES_EXPORTER": "nosuch"})
    assert "no exporter 'nosuch' installed" in unknown.stderr
    assert unknown.stdout.split("\n")[:2] == ["configured False", "records False"]


@pytest.mark.parametrize(
    "value, valid",
    [
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", True),
        ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-future", True),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", False),
        ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", False),
        ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", False),
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", True),  # varbinary
    ],
)
def test_the_producer_context_is_read_as_the_w3c_propagator_reads_it(value, valid):
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    ours = tracing.span_context(value, "vendor=abc", "w3c_cases")
    assert (ours is not None) == valid
    if isinstance(value, str):
        ctx = TraceContextTextMapPropagator().extract(
            {"traceparent": value, "tracestate": "vendor=abc"}
        )
        theirs = trace.get_current_span(ctx).get_span_context()
        assert theirs.is_valid == valid
        if valid:
            assert ours == theirs


@pytest.fixture
def roots_off() -> tuple[TracerProvider, InMemorySpanExporter]:
    """A provider that samples no root span and follows a parent's decision (what one root
    in ten is for nine roots in ten)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def calls_made(work: Callable[[], object]) -> int:
    """The Python and C function calls ``work`` makes (a counting profiler, not a clock).
    The collector is off meanwhile: a collection that happens to fall inside ``work`` runs
    the gc callbacks a process has registered, calls that are not ``work``'s."""
    count = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal count
        count += event in ("call", "c_call")

    enabled = gc.isenabled()
    gc.disable()
    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
        if enabled:
            gc.enable()
    return count


def test_an_unsampled_batch_makes_no_span_and_does_no_work_per_message(roots_off):
    provider, exporter = roots_off
    with provider.get_tracer("test").start_as_current_span("checkout"):
        header = tracing.traceparent()  # not sampled either: no producer is traced
    assert header is not None and not int(header[-2:], 16) & 1  # the sampled flag: off
    consumer = tracing.consumer("orders", "", provider)
    assert consumer is not None
    consumer.adopt(("id", "traceparent", "tracestate"))

    def one_batch(size: int) -> Callable[[], None]:
        batch = [FakeMessage((i, header, "k=v")) for i in range(size)]

        def work() -> None:
            consumer.batch(batch)
            consumer.settled(batch)
            consumer.release_context()

        return work

    one_batch(3)()  # the first batch's one-time work (lazy imports, caches)
    one, hundred = calls_made(one_batch(1)), calls_made(one_batch(100))
    assert hundred == one, f"a batch of 100 made {hundred} calls, of 1 {one}: work per message"
    assert exporter.get_finished_spans() == ()
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_a_sampled_producer_is_still_traced_when_roots_are_not(roots_off):
    provider, exporter = roots_off
    app = TracerProvider()  # the producer samples everything
    app_spans = InMemorySpanExporter()
    app.add_span_processor(SimpleSpanProcessor(app_spans))
    with app.get_tracer("shop").start_as_current_span("checkout") as checkout:
        sampled = tracing.traceparent()
    unsampled = "00-" + "1" * 32 + "-" + "2" * 16 + "-00"
    consumer = tracing.consumer("orders", "", provider)
    assert consumer is not None
    consumer.adopt(("id", "traceparent"))
    handler = provider.get_tracer("handler")
    for i, header in enumerate([sampled, unsampled, None]):
        message = FakeMessage((i, header))
        consumer.message(message)
        with handler.start_as_current_span(f"handle {i}"):  # follows the consumer span
            pass
        consumer.settled([message])
    consumer.batch([FakeMessage((3, sampled))])  # a batch is a root: not sampled
    consumer.release_context()
    (process,) = by_name(exporter, "process orders")
    assert process.parent is not None
    assert process.parent.span_id == checkout.get_span_context().span_id
    assert [link.context.span_id for link in process.links] == [process.parent.span_id]
    assert dict(process.attributes or {})["messaging.message.id"] == "0"
    (handle,) = [s for s in exporter.get_finished_spans() if s.name.startswith("handle")]
    assert handle.name == "handle 0"
    assert handle.parent is not None and handle.parent.span_id == process.context.span_id
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_unsampled_server_spans_record_nothing_and_sampled_ones_their_batch(roots_off):
    provider, exporter = roots_off
    server = tracing.server("orders", provider)
    assert server is not None
    span = server.start("send", 100)
    assert not span.is_recording()
    server.failed(span, TimeoutError("lock wait"))
    span.end()
    assert exporter.get_finished_spans() == ()
