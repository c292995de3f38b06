"""The trace checker's verdicts on spans made by msgtable's own consumer tracing (an SDK
provider, no server): it passes a healthy subscriber and names each kind of breakage
(tests/faults/tracecheck.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import context as otel_context

from msgtable.core import tracing
from tests.unit.core.test_tracing import FakeMessage

from .tracecheck import SpanLedger, Traced, judge, producer_traceparent, trace_of

COLUMNS = ("id", "message", "traceparent")


@pytest.fixture(autouse=True)
def _context_put_back() -> Iterator[None]:
    """These tests leave spans open and their contexts attached, as a dead subscriber does:
    the test's thread gets back the context it had (a later test saw one of them current)."""
    before = otel_context.get_current()
    yield
    otel_context.attach(before)


def message(i: int, context: str | None = "stored") -> FakeMessage:
    stored = producer_traceparent(i) if context == "stored" else context
    return FakeMessage((i, f"m{i}", stored))


def consumer(ledger: SpanLedger) -> tracing.ConsumerTracing:
    c = tracing.consumer("chaos", "", ledger.provider)
    assert c is not None
    c.adopt(COLUMNS)
    return c


def test_the_producers_contexts_name_their_messages():
    tp = producer_traceparent(42)
    assert tp == f"00-{trace_of(42):032x}-{42:016x}-01"
    assert tracing.span_context(tp) is not None


def test_batches_and_messages_that_carry_their_contexts_pass():
    ledger = SpanLedger("sub1")
    c = consumer(ledger)
    batch = [message(i) for i in (1, 2, 3)]
    c.batch(batch)
    c.settled(batch)
    c.message(message(7))  # a close mid-batch hands one out
    c.end()
    report = judge([Traced(ledger, {1, 2, 3, 7}, died=False)], batch_size=100)
    assert report.problems == [], report.summary()
    assert (report.spans, report.batch_spans, report.message_spans, report.links) == (2, 1, 1, 3)


def test_a_message_whose_context_was_lost_is_named():
    ledger = SpanLedger("sub1")
    c = consumer(ledger)
    batch = [message(1), message(2, context=None), message(3, context=producer_traceparent(9))]
    c.batch(batch)
    c.settled(batch)
    (problem, foreign) = judge([Traced(ledger, {1, 2, 3}, False)], 100).problems[:2]
    assert "of 3 messages has 2 links" in problem
    assert "2 messages handed out in no span" in foreign  # 2 (no context) and 3 (9's)


def test_a_context_the_producer_never_stored_is_named():
    ledger = SpanLedger("sub1")
    c = consumer(ledger)
    stranger = f"00-{'ab' * 16}-{5:016x}-01"
    batch = [message(5, context=stranger)]
    c.batch(batch)
    c.settled(batch)
    problems = judge([Traced(ledger, {5}, False)], 100).problems
    assert any("never stored" in p for p in problems), problems


def test_a_closed_subscribers_open_span_is_named_a_dead_ones_last_is_not():
    closed, dead, worse = SpanLedger("closed"), SpanLedger("dead"), SpanLedger("worse")
    for ledger in (closed, dead):
        consumer(ledger).batch([message(1), message(2)])  # never settled, never closed
    for _ in range(2):  # two open spans: more than a dead process's last batch
        consumer(worse).batch([message(3)])
    report = judge(
        [Traced(closed, {1, 2}, False), Traced(dead, {1, 2}, True), Traced(worse, {3}, True)],
        batch_size=100,
    )
    assert report.open_spans == {"closed": 1, "worse": 2}
    assert any(p.startswith("closed: 2 messages handed out in no span") for p in report.problems)
    assert not any(p.startswith("dead") for p in report.problems), report.problems
