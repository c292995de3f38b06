"""Prometheus's text format (version 0.0.4) for msgtable's own metric families, made fast.

prometheus_client's ``generate_latest`` takes a family's samples one at a time, each a dict
of labels that it sorts, validates and escapes again: about 20 us a line on a 2-core machine,
140 ms of a server's CPU for one scrape of 100 tables (5,000 lines), 4 ms with one table.
Here a :class:`Family` is its label names once and rows of label values: a row's label text
is made once for all of its lines (a histogram's 17), names are checked once when a family
is made, and a value is formatted by ``repr`` where that is what prometheus_client writes.

Invariant: ``render(families)`` is byte for byte what ``generate_latest`` writes for the
same families (``Family.metric()``, the prometheus_client family of the same samples), so
Prometheus, promtool and prometheus_client's parser read the same thing either way;
tests/unit/observe/test_exposition.py checks it on an engine's families and on hostile label values.
prometheus_client stays what everything else uses: its families for a registry
(msgtable.observe.metrics' collector), its parser in the tests, ``generate_latest`` for registries
of
its own metric objects (the gateway's).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from msgtable.core.latency import LatencySnapshot

COUNTER: Final = "counter"
GAUGE: Final = "gauge"
HISTOGRAM: Final = "histogram"
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

# The names every Prometheus version reads without quoting (the "legacy" character sets):
# prometheus_client writes them as they are, which is what render() relies on.
_METRIC_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_PLAIN_UP_TO: Final = 1e6  # below this (and above -inf) a value is written as repr() writes it


class Family:
    """One metric family: its name (a counter's without ``_total``), kind, help text, label
    names, and rows of label values with a value (a counter or gauge) or cumulative
    ``(le, count)`` buckets ending with ``+Inf`` and a sum (a histogram)."""

    __slots__ = ("doc", "kind", "labelnames", "name", "rows")

    def __init__(self, name: str, kind: str, doc: str, labelnames: Sequence[str] = ()) -> None:
        if kind not in (COUNTER, GAUGE, HISTOGRAM):
            raise ValueError(f"metric family {name}: unknown kind {kind!r}")
        if not _METRIC_NAME.fullmatch(name) or name.endswith("_total"):
            raise ValueError(f"metric family {name!r}: not a plain metric name")
        for label in (*labelnames, "le") if kind == HISTOGRAM else labelnames:
            if not _LABEL_NAME.fullmatch(label) or label.startswith("__"):
                raise ValueError(f"metric family {name}: label {label!r} is not a plain name")
        if len(set(labelnames)) != len(labelnames) or (kind == HISTOGRAM and "le" in labelnames):
            raise ValueError(f"metric family {name}: label names {tuple(labelnames)} repeat")
        self.name = name
        self.kind = kind
        self.doc = doc
        self.labelnames = tuple(labelnames)
        self.rows: list[tuple[tuple[str, ...], float | LatencySnapshot]] = []

    def add(self, labels: Sequence[str], value: float) -> None:
        """A counter's or gauge's sample."""
        self.rows.append((self._values(labels), value))

    def add_histogram(self, labels: Sequence[str], buckets: LatencySnapshot) -> None:
        """A histogram's samples: ``buckets`` is ``([(le, cumulative count), ...], sum)``,
        the last ``le`` ``+Inf`` (msgtable.core.latency's snapshots)."""
        if not buckets[0] or buckets[0][-1][0] != "+Inf":
            raise ValueError(f"metric family {self.name}: buckets must end with +Inf")
        self.rows.append((self._values(labels), buckets))

    def _values(self, labels: Sequence[str]) -> tuple[str, ...]:
        values = tuple(labels)
        if len(values) != len(self.labelnames):
            raise ValueError(
                f"metric family {self.name}: {len(values)} label values for "
                f"{len(self.labelnames)} label names"
            )
        return values

    def metric(self) -> Metric:
        """The same samples as prometheus_client's family (for a registry)."""
        if self.kind == HISTOGRAM:
            h = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
            for values, snapshot in self.rows:
                assert isinstance(snapshot, tuple)
                h.add_metric(list(values), snapshot[0], snapshot[1])
            return h
        family = CounterMetricFamily if self.kind == COUNTER else GaugeMetricFamily
        m = family(self.name, self.doc, labels=self.labelnames)
        for values, value in self.rows:
            assert not isinstance(value, tuple)
            m.add_metric(list(values), value)
        return m


def render(families: Iterable[Family]) -> bytes:
    """The families in Prometheus's text format, as ``generate_latest`` writes them."""
    out: list[str] = []
    add = out.append
    for f in families:
        name = f"{f.name}_total" if f.kind == COUNTER else f.name
        doc = f.doc.replace("\\", r"\\").replace("\n", r"\n")
        add(f"# HELP {name} {doc}\n# TYPE {name} {f.kind}\n")
        # labels are written sorted by name; a histogram's bucket lines put ``le`` among them
        order = sorted(range(len(f.labelnames)), key=f.labelnames.__getitem__)
        names = [f.labelnames[i] for i in order]
        if f.kind != HISTOGRAM:
            for values, value in f.rows:
                assert not isinstance(value, tuple)
                add(f"{name}{_braced(names, order, values)} {_number(value)}\n")
            continue
        at = sum(1 for n in names if n < "le")  # where le goes among the sorted names
        for values, snapshot in f.rows:
            assert isinstance(snapshot, tuple)
            parts = [f'{n}="{_escape(values[i])}"' for n, i in zip(names, order, strict=True)]
            before = "".join(p + "," for p in parts[:at])
            after = "".join("," + p for p in parts[at:])
            buckets, total = snapshot
            for le, count in buckets:
                add(f'{name}_bucket{{{before}le="{_escape(le)}"{after}}} {_number(count)}\n')
            braced = "{" + ",".join(parts) + "}" if parts else ""
            add(f"{name}_count{braced} {_number(buckets[-1][1])}\n")
            add(f"{name}_sum{braced} {_number(total)}\n")
    return "".join(out).encode("utf-8")


def _braced(names: list[str], order: list[int], values: tuple[str, ...]) -> str:
    if not names:
        return ""
    pairs = ",".join(f'{n}="{_escape(values[i])}"' for n, i in zip(names, order, strict=True))
    return "{" + pairs + "}"


def _escape(value: str) -> str:
    """A label value as the text format quotes it: backslash, newline and quote escaped."""
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _number(value: float) -> str:
    """A sample's value as prometheus_client writes it (Go's float formatting)."""
    d = float(value)
    if -math.inf < d < _PLAIN_UP_TO:
        return repr(d)
    return str(floatToGoString(d))  # type: ignore[no-untyped-call]
