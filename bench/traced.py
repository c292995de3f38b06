"""Tracing on, as the bench measures it (bench.metrics): an SDK tracer provider with a
BatchSpanProcessor and an exporter that counts and drops what it gets, so what is measured
is msgtable's spans and the SDK's batching, not an exporter's network.

``python -m bench.traced serve ... --spans-file PATH [--sample RATIO]`` is ``msgtable serve
...`` with that provider set first (the server side; with RATIO it samples that share of its
root spans, parent-based: msgtable.core.tracing.default_sampler() when RATIO is its ratio); at
exit it writes the spans it exported to PATH, by operation, as JSON.
``install()`` sets it in a subscriber's process (the client side).
"""

from __future__ import annotations

import atexit
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased

from msgtable.core import tracing


class DroppingExporter(SpanExporter):
    """Counts the spans it is given, by operation (the first word of the name), and drops
    them."""

    def __init__(self) -> None:
        self.spans: Counter[str] = Counter()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.update(s.name.split(" ", 1)[0] for s in spans)
        return SpanExportResult.SUCCESS


def install(sample: float | None = None) -> tuple[TracerProvider, DroppingExporter]:
    """Set the global tracer provider of this process (once). ``sample``: trace that share of
    the root spans (ParentBased(TraceIdRatioBased); the product's default_sampler() at its
    ratio); None: all of them (ParentBased(ALWAYS_ON))."""
    exporter = DroppingExporter()
    if sample is None:
        sampler: Sampler = ParentBased(ALWAYS_ON)
    elif sample == tracing.DEFAULT_SAMPLE_RATIO:
        sampler = tracing.default_sampler()
    else:
        sampler = ParentBased(TraceIdRatioBased(sample))
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider, exporter


def _main() -> int:
    args = sys.argv[1:]
    at = args.index("--spans-file")
    path = Path(args[at + 1])
    del args[at : at + 2]
    sample = None
    if "--sample" in args:
        at = args.index("--sample")
        sample = float(args[at + 1])
        del args[at : at + 2]
    provider, exporter = install(sample)

    def write() -> None:
        provider.force_flush()
        path.write_text(json.dumps(dict(exporter.spans)))

    atexit.register(write)
    from msgtable.cli import main

    return main(args)


if __name__ == "__main__":
    raise SystemExit(_main())
