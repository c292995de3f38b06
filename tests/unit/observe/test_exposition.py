"""msgtable.observe.exposition writes what prometheus_client's generate_latest writes, faster."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from msgtable.core.latency import LatencyHistogram
from msgtable.observe.exposition import COUNTER, GAUGE, HISTOGRAM, Family, render
from msgtable.observe.metrics import EngineCollector
from tests.unit.observe.test_metrics import _engine, traffic


class Families:
    """A collector of given families, for a registry."""

    def __init__(self, families: list[Family]) -> None:
        self.families = families

    def collect(self):
        return [f.metric() for f in self.families]


def library_text(families: list[Family]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families(families))
    return generate_latest(registry)


label_values = st.text(max_size=12) | st.sampled_from(['a"b', "c\\d", "e\nf", "", "é☃", "le"])
values = (
    st.floats(allow_nan=True)
    | st.integers(-(2**63), 2**63)
    | st.sampled_from([0, 1, 999_999.5, 1e6, 123456789.0, 1e-7, -1e300, math.inf, -math.inf])
)
label_names = st.lists(
    st.sampled_from(["keyspace", "table", "subscription", "via", "kind", "a", "z", "lf"]),
    unique=True,
    max_size=4,
)


@st.composite
def families(draw) -> list[Family]:
    out = []
    for n in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from([COUNTER, GAUGE, HISTOGRAM]))
        names = draw(label_names)
        doc = draw(st.text(max_size=30))
        f = Family(f"msgtable_f{n}", kind, doc, names)
        for _ in range(draw(st.integers(0, 3))):
            labels = [draw(label_values) for _ in names]
            if kind == HISTOGRAM:
                bounds = draw(st.lists(st.floats(0, 1e9), unique=True, max_size=4))
                counts = sorted(draw(st.lists(st.integers(0, 10**9), min_size=len(bounds) + 1)))
                buckets = [(repr(b), c) for b, c in zip(sorted(bounds), counts, strict=False)]
                buckets.append(("+Inf", counts[-1]))
                f.add_histogram(labels, (buckets, draw(st.floats(0, 1e12))))
            else:
                f.add(labels, draw(values))
        out.append(f)
    return out


@settings(max_examples=300, deadline=None)
@given(families())
def test_any_families_render_byte_for_byte_as_prometheus_client_writes_them(fs):
    assert render(fs) == library_text(fs)


def test_an_engines_families_render_as_prometheus_client_writes_them_and_parse_back():
    engine = _engine()
    try:
        traffic(engine)  # sent, acked, rejected, released, latencies
        collector = EngineCollector(engine, streams=lambda: 3)
        families = collector.families()
        text = collector.exposition()
        assert text == library_text(families)
        parsed = {f.name: f for f in text_string_to_metric_families(text.decode())}
        assert parsed["msgtable_messages_sent"].samples[0].value == 6
        latency = parsed["msgtable_message_ack_latency_seconds"].samples
        assert {s.value for s in latency if s.name.endswith("_count")} == {4}
        assert parsed["msgtable_streams"].samples[0].value == 3
    finally:
        engine.close()


def test_a_histogram_puts_le_among_its_labels_in_name_order():
    h = LatencyHistogram()
    h.observe_since(10**9, [10**9 - 3 * 10**6])
    f = Family("msgtable_x_seconds", HISTOGRAM, "x", ("table", "keyspace", "kind"))
    f.add_histogram(("t", "ks", "poll"), h.snapshot())
    text = render([f]).decode()
    assert 'msgtable_x_seconds_bucket{keyspace="ks",kind="poll",le="0.005",table="t"} 1.0' in text
    assert 'msgtable_x_seconds_count{keyspace="ks",kind="poll",table="t"} 1.0' in text
    assert text.encode() == library_text([f])


@pytest.mark.parametrize(
    ("name", "kind", "labels", "why"),
    [
        ("msgtable_x_total", COUNTER, (), "plain metric name"),
        ("msgtable-x", GAUGE, (), "plain metric name"),
        ("msgtable_x", "summary", (), "unknown kind"),
        ("msgtable_x", GAUGE, ("a b",), "plain name"),
        ("msgtable_x", GAUGE, ("__a",), "plain name"),
        ("msgtable_x", HISTOGRAM, ("le",), "repeat"),
        ("msgtable_x", GAUGE, ("a", "a"), "repeat"),
    ],
)
def test_a_family_a_name_the_text_format_would_quote_is_refused_when_made(name, kind, labels, why):
    with pytest.raises(ValueError, match=why):
        Family(name, kind, "doc", labels)


def test_a_row_with_another_number_of_labels_or_a_histogram_without_inf_is_refused():
    f = Family("msgtable_x", GAUGE, "doc", ("a", "b"))
    with pytest.raises(ValueError, match="1 label values for 2 label names"):
        f.add(("only",), 1)
    h = Family("msgtable_h", HISTOGRAM, "doc")
    with pytest.raises(ValueError, match=r"\+Inf"):
        h.add_histogram((), ([("1.0", 2)], 3.0))
