"""OpenTelemetry through messages: the one module that imports opentelemetry (optional).

msgtable runs without opentelemetry installed; with only ``opentelemetry-api`` (the ``otel``
extra) and no SDK configured, nothing is traced either: ``tracer()`` answers None when the
tracer provider is the API's default (a proxy or no-op one), and every caller checks that once
(a subscriber when it is made, a table's manager when it opens, an enqueue once per call),
never per message. With a provider configured (an SDK's, or one passed in):

* producers: ``traceparent()`` / ``trace_headers()`` give the current context's W3C headers for
  a plain INSERT; ``msgtable.enqueue(..., traceparent=CURRENT)`` wraps its INSERT in a PRODUCER
  span "send TABLE" and stores that span's context in the table's ``traceparent`` (and
  ``tracestate``) column;
* consumers (both clients, ``ConsumerTracing``): a CONSUMER span "process TABLE" per message
  handed out by iteration, whose parent is the message's producer context (and linked to it),
  current while the loop body runs, ended once the message is settled (ack, ack_async,
  release, reject) or the next message is asked for or the subscriber closes; a batch from
  ``next_batch()`` / ``batches()`` gets one such span with a link to each message's context;
* the server (``ServerTracing``): INTERNAL spans "poll TABLE", "send TABLE" (a batch) and
  "ack TABLE".

A span the sampler leaves out costs its sampling decision and no more: one a batch (and one
a message handed out by iteration, whose producer's context a parent-based sampler follows).
No attributes beyond the fixed ones, no links (no traceparent parsed for a batch), nothing to
end when it is settled; its context is still made current, so a handler's spans follow the
decision. ``default_sampler()`` is the documented default: one root span in ten,
parent-based; ``msgtable serve`` samples with it unless OTEL_TRACES_SAMPLER says otherwise.

A traceparent column with a value that is not W3C trace context never breaks a delivery: the
span has no parent, and the table gets one warning in the log (once per process).
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import re
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

try:  # the otel extra; everything here is a no-op without it
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: TraceContextTextMapPropagator | None = TraceContextTextMapPropagator()
except ImportError:  # pragma: no cover - exercised by the no-otel test in a subprocess
    _PROPAGATOR = None

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace.sampling import Sampler
    from opentelemetry.trace import Span, SpanContext, Tracer, TracerProvider

log = logging.getLogger(__name__)

SYSTEM: Final = "msgtable"  # messaging.system: the intermediary subscribers talk to
TRACEPARENT_COLUMN: Final = "traceparent"
TRACESTATE_COLUMN: Final = "tracestate"
INSTRUMENTATION: Final = "msgtable"
# W3C trace context's traceparent: version-trace id-parent id-flags (more fields after a
# version other than 00)
_TRACEPARENT: Final = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")

# messaging semantic conventions' attribute names
SYSTEM_ATTR: Final = "messaging.system"
DESTINATION: Final = "messaging.destination.name"
OPERATION_TYPE: Final = "messaging.operation.type"
OPERATION_NAME: Final = "messaging.operation.name"
MESSAGE_ID: Final = "messaging.message.id"
CONSUMER_GROUP: Final = "messaging.consumer.group.name"
BATCH_COUNT: Final = "messaging.batch.message_count"
DEFAULT_GROUP: Final = "default"  # the consumer group of a table's own subscribers
# The documented default sampler: one root span in ten, and a span with a parent does as the
# parent did (ParentBased(TraceIdRatioBased(DEFAULT_SAMPLE_RATIO)))
DEFAULT_SAMPLE_RATIO: Final = 0.1


class Current:
    """The type of the sentinel ``CURRENT``: take the trace context from the current span."""

    def __repr__(self) -> str:
        return "msgtable.core.tracing.CURRENT"


CURRENT: Final = Current()

_warned: set[str] = set()
_warned_lock = threading.Lock()
# the parent of a span that continues no trace (not the current context: a consumer span
# without a producer context, a server span, starts a trace of its own)
_ROOT: Final = otel_context.Context() if _PROPAGATOR is not None else None


def available() -> bool:
    """Whether opentelemetry-api is installed."""
    return _PROPAGATOR is not None


def tracer(provider: TracerProvider | None = None) -> Tracer | None:
    """A tracer of ``provider`` (default: the global one), or None when nothing would record:
    opentelemetry is not installed, or no provider was configured (the API's default)."""
    if _PROPAGATOR is None:
        return None
    if provider is None:
        provider = trace.get_tracer_provider()
        if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            return None
    return provider.get_tracer(INSTRUMENTATION)


def trace_headers() -> dict[str, str]:
    """The current context's W3C headers: ``traceparent`` (and ``tracestate`` when it has
    one); {} without a valid current span or without opentelemetry. For a plain INSERT."""
    if _PROPAGATOR is None:
        return {}
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier


def traceparent() -> str | None:
    """The current context's ``traceparent`` header (None: no valid span, or no
    opentelemetry): what a plain INSERT puts into a message table's traceparent column."""
    return trace_headers().get(TRACEPARENT_COLUMN)


def producer_context(
    traceparent: object, tracestate: object = None, table: str = ""
) -> Context | None:
    """The context a producer stored with a message (None: none, or not W3C trace context:
    then ``table`` gets one warning per process)."""
    found = span_context(traceparent, tracestate, table)
    return trace.set_span_in_context(trace.NonRecordingSpan(found)) if found else None


def span_context(
    traceparent: object, tracestate: object = None, table: str = ""
) -> SpanContext | None:
    """The producer's span context from a traceparent (and tracestate) column, parsed as W3C
    trace context says (a version other than 00 may carry more fields; ff is invalid; ids
    not all zeros); None if there is none, or it is not that (one warning per table).

    Parsed here rather than by the propagator (which takes a carrier and builds a Context
    each time): a batch span links every message's context, a few times cheaper this way."""
    if _PROPAGATOR is None or traceparent is None or traceparent == "":
        return None
    if isinstance(traceparent, bytes):  # a binary / varbinary column
        traceparent = traceparent.decode("ascii", "replace")
    if isinstance(tracestate, bytes):
        tracestate = tracestate.decode("ascii", "replace")
    m = _TRACEPARENT.fullmatch(traceparent) if isinstance(traceparent, str) else None
    if m is not None and m[1] != "ff" and not (m[1] == "00" and m[5]):
        trace_id, span_id = int(m[2], 16), int(m[3], 16)
        if trace_id and span_id:
            state = None
            if tracestate:
                state = trace.TraceState.from_header([str(tracestate)])
            return trace.SpanContext(
                trace_id,
                span_id,
                is_remote=True,
                trace_flags=trace.TraceFlags(int(m[4], 16)),
                trace_state=state,
            )
    with _warned_lock:
        first = table not in _warned
        _warned.add(table)
    if first:
        log.warning(
            "table %s: a traceparent that is not W3C trace context (%.60r): its consumer "
            "span has no parent (said once per table)",
            table,
            traceparent,
        )
    return None


@contextlib.contextmanager
def producer_span(table: str, count: int) -> Iterator[None]:
    """A PRODUCER span "send TABLE" around an enqueue of ``count`` rows, current inside (no
    span when no tracer provider is configured)."""
    t = tracer()
    if t is None:
        yield
        return
    attributes: dict[str, Any] = {
        SYSTEM_ATTR: SYSTEM,
        DESTINATION: table,
        OPERATION_TYPE: "send",
        OPERATION_NAME: "send",
    }
    if count > 1:
        attributes[BATCH_COUNT] = count
    with t.start_as_current_span(
        f"send {table}", kind=trace.SpanKind.PRODUCER, attributes=attributes
    ):
        yield


class ConsumerTracing:
    """A subscriber's consumer spans (both clients; see the module docstring). Made by
    ``consumer()`` only when a tracer records; the subscriber calls ``adopt`` with each new
    stream's columns, ``message`` / ``batch`` when it hands messages out, ``settled`` and
    ``close``."""

    def __init__(self, tracer: Tracer, table: str, subscription: str) -> None:
        self._tracer = tracer
        self.table = table
        self._name = f"process {table}"
        self._attributes: dict[str, Any] = {
            SYSTEM_ATTR: SYSTEM,
            DESTINATION: table,
            OPERATION_TYPE: "process",
            OPERATION_NAME: "process",
            CONSUMER_GROUP: subscription or DEFAULT_GROUP,
        }
        self._tp: int | None = None  # where traceparent / tracestate are in a row
        self._ts: int | None = None
        self._span: Span | None = None  # the open span, and what it covers
        self._covers: Sequence[object] = ()  # the messages it covers
        self._left: set[int] | None = None  # id() of those not settled yet, after a part was
        self._token: object | None = None  # its context attached by the iterating code
        self._attached: Context | None = None  # that context

    def adopt(self, field_names: Sequence[str]) -> None:
        """A (new) stream's columns: where the producer's context is in a row."""
        names = list(field_names)
        self._tp = names.index(TRACEPARENT_COLUMN) if TRACEPARENT_COLUMN in names else None
        self._ts = names.index(TRACESTATE_COLUMN) if TRACESTATE_COLUMN in names else None

    def _context_of(self, row: Sequence[object]) -> SpanContext | None:
        if self._tp is None:
            return None
        state = row[self._ts] if self._ts is not None else None
        return span_context(row[self._tp], state, self.table)

    def message(self, message: Any) -> None:
        """Hand ``message`` out: end the last span, start its own (parent: its producer's
        context) and make it current until the next hand-out."""
        self.release_context()
        producer = self._context_of(message.row)  # the parent decides a parent-based sampler
        parent = _ROOT
        if producer is not None:
            parent = trace.set_span_in_context(trace.NonRecordingSpan(producer))
        span = self._start(parent, (message,))
        if span is not None:
            span.set_attribute(MESSAGE_ID, str(message.id))
            if producer is not None:
                span.add_link(producer)

    def batch(self, messages: Sequence[Any]) -> None:
        """Hand a batch out: one span (a root) linked to each message's producer context;
        the links are read only once the span is sampled (none of the work per message
        when it is not)."""
        self.release_context()
        if not messages:
            return
        span = self._start(_ROOT, messages)
        if span is not None:
            span.set_attribute(BATCH_COUNT, len(messages))
            if self._tp is not None:
                for m in messages:
                    producer = self._context_of(m.row)
                    if producer is not None:
                        span.add_link(producer)

    def _start(self, parent: Context | None, covers: Sequence[object]) -> Span | None:
        """Start the span of ``covers`` with the attributes every span of this subscriber
        has (what a sampler is given) and make it current; the span if it records, else
        None: a span not sampled has nothing to end or to add, and its context is still
        made current, so the handler's spans follow its decision (parent-based)."""
        span = self._tracer.start_span(
            self._name, context=parent, kind=trace.SpanKind.CONSUMER, attributes=self._attributes
        )
        self._attached = trace.set_span_in_context(span)
        self._token = otel_context.attach(self._attached)
        if not span.is_recording():
            return None
        self._span, self._covers, self._left = span, covers, None
        return span

    def settled(self, messages: Sequence[object]) -> None:
        """Messages were acked, released or rejected: the span covering them ends (it stays
        current until the next hand-out, so the handler's own spans still nest)."""
        span, covers = self._span, self._covers
        if span is None:
            return
        # the common case, a batch settled whole as it came: no set of ids to build
        whole = len(messages) == len(covers) and all(map(operator.is_, messages, covers))
        if not whole:
            if self._left is None:
                self._left = {id(m) for m in covers}
            self._left.difference_update(id(m) for m in messages)
            if self._left:
                return
        self._span = None
        span.end()

    def release_context(self) -> None:
        """End the open span and detach its context (from the iterating code only: the
        context was attached there)."""
        span, self._span = self._span, None
        if span is not None:
            span.end()
        token, self._token, self._attached = self._token, None, None
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]

    def end(self) -> None:
        """End the open span (close(), from any thread); detach its context if it is the
        current one here (a loop left by break, then close() in the same thread or task)."""
        if self._token is not None and otel_context.get_current() is self._attached:
            self.release_context()
            return
        span, self._span = self._span, None
        if span is not None:
            span.end()


def consumer(
    table: str, subscription: str, provider: TracerProvider | None = None
) -> ConsumerTracing | None:
    """A subscriber's consumer spans, or None when nothing would record."""
    t = tracer(provider)
    return ConsumerTracing(t, table, subscription) if t is not None else None


# the server's operations: messaging.operation.name -> messaging.operation.type
_SERVER_OPERATIONS: Final = {"poll": "receive", "send": "send", "ack": "settle"}


class ServerTracing:
    """A table manager's spans: poll, send (a batch), ack (see the module docstring)."""

    def __init__(self, tracer: Tracer, table: str) -> None:
        self._tracer = tracer
        self._names = {op: f"{op} {table}" for op in _SERVER_OPERATIONS}
        self._attributes: dict[str, dict[str, Any]] = {
            op: {
                SYSTEM_ATTR: SYSTEM,
                DESTINATION: table,
                OPERATION_TYPE: kind,
                OPERATION_NAME: op,
            }
            for op, kind in _SERVER_OPERATIONS.items()
        }

    def start(self, operation: str, count: int | None = None) -> Span:
        """A started span for one poll / send / ack (a root: it serves many producers'
        messages), not made current (it has no children); the caller ends it. Not a
        context manager: start_span and end cost a third of start_as_current_span. The
        batch's size is set only on a span that records (no dict made per call)."""
        span = self._tracer.start_span(
            self._names[operation],
            context=_ROOT,
            kind=trace.SpanKind.INTERNAL,
            attributes=self._attributes[operation],
        )
        if count is not None and span.is_recording():
            span.set_attribute(BATCH_COUNT, count)
        return span

    def failed(self, span: Span, exc: BaseException) -> None:
        """Mark ``span`` failed by ``exc`` (then the caller ends it)."""
        span.set_status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:200])


def server(table: str, provider: TracerProvider | None = None) -> ServerTracing | None:
    """A table's server spans, or None when nothing would record."""
    t = tracer(provider)
    return ServerTracing(t, table) if t is not None else None


def default_sampler() -> Sampler:
    """The documented default sampler (needs opentelemetry-sdk): one root span in ten, a span
    with a parent sampled as its parent was: ``ParentBased(TraceIdRatioBased(0.1))``. What
    ``msgtable serve`` samples with unless OTEL_TRACES_SAMPLER says otherwise, and what an
    application's tracer provider should use for the subscribers' spans to cost what
    docs/performance.md says (``TracerProvider(sampler=tracing.default_sampler())``)."""
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    return ParentBased(TraceIdRatioBased(DEFAULT_SAMPLE_RATIO))


def configure_from_env() -> bool:
    """For ``msgtable serve``: when opentelemetry-sdk is installed and OTEL_TRACES_EXPORTER
    names exporters (other than ``none``) and no provider is set yet, set a global SDK tracer
    provider (its resource from OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES) exporting in
    batches to those exporters (the ``opentelemetry_traces_exporter`` entry points, e.g.
    ``otlp`` with opentelemetry-exporter-otlp, ``console``), sampling with
    ``default_sampler()`` unless OTEL_TRACES_SAMPLER names another. Returns whether it did."""
    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")]
    names = [n for n in names if n and n != "none"]
    if not names or _PROPAGATOR is None or tracer() is not None:
        return False
    try:
        from importlib.metadata import entry_points

        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("OTEL_TRACES_EXPORTER is set but opentelemetry-sdk is not installed")
        return False
    found = {ep.name: ep for ep in entry_points(group="opentelemetry_traces_exporter")}
    missing = [n for n in names if n not in found]
    for name in missing:
        log.warning("OTEL_TRACES_EXPORTER: no exporter %r installed; skipped", name)
    exporters = [found[n].load()() for n in names if n in found]
    if not exporters:  # nothing would leave the process: trace nothing
        return False
    # the SDK reads OTEL_TRACES_SAMPLER (and _ARG) itself when given no sampler
    sampler = None if os.environ.get("OTEL_TRACES_SAMPLER") else default_sampler()
    provider = SdkTracerProvider(resource=Resource.create(), sampler=sampler)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return True
