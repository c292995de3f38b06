"""Tracing through the fault suite: each message's producer context reaches its consumer span.

The chaos table has a ``traceparent`` column; its producer stores ``producer_traceparent(i)``
with message ``i``: a W3C traceparent whose span id is the message's id and whose trace id is
made from it (``trace_of``), so a context seen anywhere names its message. Each subscriber of
the chaos table traces to a SpanLedger of its own: an SDK tracer provider whose processor
keeps what every consumer span it started says. ``judge`` holds them, over every fault, to:

* a batch span links exactly its batch's producer contexts: as many links as its
  ``messaging.batch.message_count``, each one a context the producer stored, none twice;
* a message span (a subscriber closing mid-batch hands out one message) has its message's
  context as its parent, and its ``messaging.message.id``;
* every message handed out to a subscriber (its checker's record of deliveries) is in one of
  that subscriber's spans;
* a subscriber that closed ended every span it started; one killed or stalled out, as a
  process that died, leaves at most its last batch's span open (it dies with the process).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider

from msgtable.core.tracing import BATCH_COUNT, MESSAGE_ID

TRACE_BASE = 0x5EED << 64  # a trace id's high bits: ``trace_of(i)`` is this plus i


def trace_of(message_id: int) -> int:
    return TRACE_BASE + message_id


def producer_traceparent(message_id: int) -> str:
    """What the producer stores with message ``message_id`` (sampled)."""
    return f"00-{trace_of(message_id):032x}-{message_id:016x}-01"


class SpanLedger(SpanProcessor):
    """One subscriber's consumer spans: counted as they start and end, and for each ended
    one, the message ids its links (a batch) or its parent (a message) name, and the count
    it says."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.provider = TracerProvider()
        self.provider.add_span_processor(self)
        self._lock = threading.Lock()
        self.started = 0
        self.ended: list[SpanRecord] = []

    def on_start(self, span: Span, parent_context: object = None) -> None:
        with self._lock:
            self.started += 1

    def on_end(self, span: ReadableSpan) -> None:
        record = SpanRecord.of(span)
        with self._lock:
            self.ended.append(record)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


@dataclass
class SpanRecord:
    name: str
    count: int | None  # messaging.batch.message_count (a batch span)
    message: str | None  # messaging.message.id (a message span)
    linked: list[int]  # the message ids of its links' contexts (-1: a context not stored)
    parent: int | None  # the message id of its parent's context (-1: not stored; None: none)

    @classmethod
    def of(cls, span: ReadableSpan) -> SpanRecord:
        attributes = span.attributes or {}
        count = attributes.get(BATCH_COUNT)
        message = attributes.get(MESSAGE_ID)
        parent = span.parent
        return cls(
            span.name,
            int(count) if isinstance(count, int) else None,
            str(message) if message is not None else None,
            [_message_of(link.context.trace_id, link.context.span_id) for link in span.links],
            None if parent is None else _message_of(parent.trace_id, parent.span_id),
        )


def _message_of(trace_id: int, span_id: int) -> int:
    """The message a producer context names (-1: not one the producer stored)."""
    return span_id if trace_id == trace_of(span_id) else -1


@dataclass
class TraceReport:
    spans: int = 0  # consumer spans ended
    batch_spans: int = 0
    message_spans: int = 0
    links: int = 0  # producer contexts linked
    open_spans: dict[str, int] = field(default_factory=dict)  # closed subscriber -> still open
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"tracing: {self.spans} consumer spans ({self.batch_spans} batches, "
            f"{self.message_spans} messages), {self.links} producer contexts linked; "
            f"{len(self.problems)} problems" + "".join(f"\n  {p}" for p in self.problems[:20])
        )


@dataclass
class Traced:
    """One subscriber's spans and what the run knows of it: the ids handed out to it (its
    checker's deliveries, less what a close mid-batch received and never handed out) and
    whether it ended as a killed process does (its open span, its last batch's, dies with it)."""

    ledger: SpanLedger
    handed_out: set[int]
    died: bool


def judge(traced: Iterable[Traced], batch_size: int) -> TraceReport:
    """The rules of the module docstring, over every subscriber."""
    report = TraceReport()
    for t in traced:
        ledger = t.ledger
        seen: set[int] = set()
        for r in ledger.ended:
            report.spans += 1
            where = f"{ledger.name}: span {r.name!r}"
            if r.count is not None:
                report.batch_spans += 1
                report.links += len(r.linked)
                if len(r.linked) != r.count:
                    report.problems.append(
                        f"{where} of {r.count} messages has {len(r.linked)} links"
                    )
                if -1 in r.linked:
                    report.problems.append(f"{where} links a context the producer never stored")
                twice = [i for i, n in Counter(r.linked).items() if n > 1]
                if twice:
                    report.problems.append(f"{where} links messages {twice[:5]} twice")
                seen.update(r.linked)
            elif r.message is not None:
                report.message_spans += 1
                if r.parent is None or str(r.parent) != r.message:
                    report.problems.append(
                        f"{where} of message {r.message} has parent {r.parent}, not its context"
                    )
                seen.add(int(r.message))
            else:
                report.problems.append(f"{where} says neither a batch count nor a message id")
        still_open = ledger.started - len(ledger.ended)
        missing = t.handed_out - seen
        # a dead process's last batch: one span open, its messages in no ended span
        allowed_open, allowed_missing = (1, batch_size) if t.died else (0, 0)
        if len(missing) > allowed_missing:
            report.problems.append(
                f"{ledger.name}: {len(missing)} messages handed out in no span of its, e.g. "
                f"{sorted(missing)[:5]}"
            )
        if still_open > allowed_open:
            report.open_spans[ledger.name] = still_open
            report.problems.append(f"{ledger.name} ended with {still_open} spans never ended")
    return report
