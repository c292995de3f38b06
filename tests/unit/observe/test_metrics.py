from __future__ import annotations

import random
import re
import threading
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from msgtable.core.clock import FakeClock
from msgtable.core.latency import LatencyHistogram
from msgtable.core.tables import DEMO_COMMENT, Column
from msgtable.engine.engine import MessageEngine
from msgtable.errors import InvalidArgument, MsgtableError
from msgtable.observe.metrics import LABELS, MetricsServer, parse_listen, registry_for
from msgtable.testing import InMemoryStore
from msgtable.testing.memory import CURRENT_COLUMNS
from tests.unit.engine.test_lease import gain, lose

COMMENT = DEMO_COMMENT.replace("vt_batch_size=10", "vt_batch_size=2")
# Prometheus's rules (https://prometheus.io/docs/practices/naming/), as promtool checks them
NAME = re.compile(r"^msgtable_[a-z][a-z0-9_]*$")
UNIT_WORDS = ("milliseconds", "microseconds", "minutes", "hours", "kilobytes", "megabytes")


@pytest.fixture
def engine():
    e = _engine()
    yield e
    e.close()


@pytest.fixture
def leased_engine():
    """An engine that shares its database (a lease period), its tables' leases gained and
    lost by hand (tests.unit.test_lease's gain and lose)."""
    e = _engine(lease_period_s=1.0)
    yield e
    e.close()


def _engine(lease_period_s: float | None = None) -> MessageEngine:
    store = InMemoryStore()
    store.create_table("q", COMMENT)
    for i in range(5):
        store.insert("q", i, message=str(i))
    e = MessageEngine(
        store,
        clock=FakeClock(),
        rng=random.Random(1),
        discovery_interval_s=3600,
        run_loops=False,
        lease_period_s=lease_period_s,
    )
    e.refresh()
    return e


def scrape(engine) -> dict[str, object]:
    text = generate_latest(registry_for(engine)).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(
    families, name: str, table: str = "q", subscription: str = "", via: str | None = None
) -> float:
    """A family's sample for the table (and subscription), summed over ``via`` unless given."""
    family = families[name]
    got = [
        s.value
        for s in family.samples
        if s.labels.get("table") == table
        and s.labels.get("subscription") == subscription
        and via in (None, s.labels.get("via"))
    ]
    if not got:
        raise AssertionError(f"{name}: no sample for {table!r} subscription {subscription!r}")
    return sum(got)


def drain(sub) -> list:
    got = []
    while batch := sub.next_batch(0):
        got.extend(r[0] for r in batch)
    return got


def traffic(engine) -> None:
    """5 rows, batches of 2: 4 sent; 2 acked 0.2 s later, 1 rejected, 1 released at once;
    then the released one is sent again (a redelivery) with the fifth, both acked 0.03 s
    later."""
    m = engine._manager("q", "")
    sub = m.subscribe()
    m.poll_once()
    m.send_once()
    m.send_once()
    got = drain(sub)
    assert len(got) == 4
    engine.clock.advance(0.2)
    engine.ack("q", "", got[:2])
    engine.reject("q", "", [got[2]], "bad")
    engine.release("q", "", [got[3]], 0, None)
    m.poll_once()
    m.send_once()
    again = drain(sub)
    assert sorted(again) == sorted([got[3], 4]), again
    engine.clock.advance(0.03)
    engine.ack("q", "", again)


def test_counters_after_known_traffic_are_exact(engine):
    traffic(engine)
    f = scrape(engine)
    # the parser names a counter's family without its _total
    assert value(f, "msgtable_messages_sent") == 6
    assert value(f, "msgtable_messages_redelivered") == 1
    assert value(f, "msgtable_messages_acked") == 4
    assert value(f, "msgtable_messages_acked", via="grpc") == 4
    assert value(f, "msgtable_messages_acked", via="dml") == 0
    assert value(f, "msgtable_messages_released") == 1
    assert value(f, "msgtable_messages_rejected") == 1
    assert value(f, "msgtable_messages_dead_lettered") == 1
    assert value(f, "msgtable_messages_renewed") == 0
    assert value(f, "msgtable_filter_reads") == 0  # no filter, no lag: no read for one
    assert value(f, "msgtable_messages_in_flight") == 0
    assert value(f, "msgtable_messages_cached") == 0
    assert value(f, "msgtable_subscribers") == 1
    assert f["msgtable_lease_holder"].samples[0].value == 1


def test_the_send_to_ack_histogram_has_each_ack_in_its_bucket(engine):
    traffic(engine)
    f = scrape(engine)
    buckets = {
        s.labels["le"]: s.value
        for s in f["msgtable_message_ack_latency_seconds"].samples
        if s.name.endswith("_bucket") and s.labels["table"] == "q"
    }
    assert buckets["0.025"] == 0 and buckets["0.05"] == 2  # the two acked after 0.03 s
    assert buckets["0.1"] == 2 and buckets["0.25"] == 4 and buckets["+Inf"] == 4
    samples = {s.name: s.value for s in f["msgtable_message_ack_latency_seconds"].samples}
    assert samples["msgtable_message_ack_latency_seconds_count"] == 4
    assert samples["msgtable_message_ack_latency_seconds_sum"] == pytest.approx(0.46)


def test_latency_buckets_follow_the_le_rule():
    h = LatencyHistogram((0.1, 1.0))
    h.observe_since(10**9, [10**9, 9 * 10**8, 0, 2 * 10**9])  # 0, 0.1, 1, and "-1": 0
    assert h.snapshot() == ([("0.1", 3), ("1.0", 4), ("+Inf", 4)], 1.1)


def test_server_families_say_streams_database_and_no_binlog_family_without_a_follower(engine):
    f = {
        name: family.samples[0].value
        for name, family in (
            (f.name, f)
            for f in text_string_to_metric_families(
                generate_latest(registry_for(engine, streams=lambda: 3)).decode()
            )
        )
        if family.samples
    }
    assert f["msgtable_streams"] == 3 and f["msgtable_database_up"] == 1
    assert "msgtable_binlog_following" not in f and "msgtable_capture_lag_seconds" not in f
    assert "msgtable_streams" not in scrape(engine)  # no gRPC server: no family


def test_every_family_follows_the_prometheus_naming_rules(engine):
    traffic(engine)
    text = generate_latest(registry_for(engine)).decode()
    families = list(text_string_to_metric_families(text))
    assert families, "no family at all"
    for f in families:
        assert NAME.match(f.name), f"{f.name}: not msgtable_ snake case"
        assert f.documentation.endswith("."), f"{f.name}: no help sentence"
        assert f.type in ("counter", "gauge", "histogram"), f"{f.name}: type {f.type}"
        assert not any(w in f.name for w in UNIT_WORDS), f"{f.name}: not a base unit"
        for s in f.samples:
            if f.type == "counter":
                assert s.name.endswith(("_total", "_created")), f"{s.name}: counter without _total"
            else:
                assert not s.name.endswith("_total"), f"{s.name}: _total on a {f.type}"
            allowed = set(LABELS) | {"le", "kind", "via"}
            assert set(s.labels) <= allowed, f"{s.name}: labels {set(s.labels)}"


def test_a_scrape_answers_while_the_database_is_down_with_the_last_backlog_read(engine):
    assert value(scrape(engine), "msgtable_messages_due") == 5
    traffic(engine)
    engine.store.down = True
    f = scrape(engine)
    assert value(f, "msgtable_messages_acked") == 4
    assert value(f, "msgtable_messages_due") == 5  # read before the traffic, 5 s ago at most


@pytest.mark.parametrize("listen", ["9464", "host:", "host:port", ":70000", ""])
def test_a_bad_listen_address_is_one_clear_line(listen):
    with pytest.raises(InvalidArgument, match="expected HOST:PORT") as e:
        parse_listen(listen)
    assert "\n" not in str(e.value)


def test_listen_addresses_parse():
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen(":9464") == ("0.0.0.0", 9464)
    assert parse_listen("[::1]:0") == ("::1", 0)


def test_a_port_in_use_is_one_clear_line(engine):
    first = MetricsServer(engine, "127.0.0.1:0")
    first.open()
    try:
        second = MetricsServer(engine, first.address)
        with pytest.raises(InvalidArgument, match="cannot listen there"):
            second.open()
    finally:
        first.close()
        first.close()  # idempotent


@pytest.mark.parametrize("postpone_after", [1, 0])
def test_a_redelivery_its_subscriber_never_got_counts_neither_as_sent_nor_redelivered(
    postpone_after,
):
    store = InMemoryStore()
    store.create_table("q", f"{COMMENT},vt_postpone_after={postpone_after}")
    store.insert("q", 1, message="a")
    e = MessageEngine(
        store, clock=FakeClock(), rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    e.refresh()
    try:
        m = e._manager("q", "")
        a = m.subscribe()
        m.poll_once()
        m.send_once()
        assert drain(a) == [1]
        e.release("q", "", [1], 0, None)
        m.poll_once()
        m.send_once()  # the redelivery waits in a's queue
        a.close()  # ...and never goes out
        f = scrape(e)
        # a send counts as its stream takes the batch: this one never went out, with
        # vt_postpone_after=0 too (where its postpone, epoch + 1, was written before)
        assert value(f, "msgtable_messages_sent") == 1
        assert value(f, "msgtable_messages_redelivered") == 0
    finally:
        e.close()


ORDERED_COLUMNS = (*CURRENT_COLUMNS, Column("k", "varchar", "varchar(64)"))
ORDER_INDEX = (("order_idx", ("k", "time_acked", "id")),)


@pytest.mark.parametrize("ordered", [False, True], ids=["plain", "ordered"])
def test_the_created_to_sent_histogram_has_each_first_send_and_no_redelivery(ordered: bool):
    store = InMemoryStore()
    if ordered:  # an ordered table's poll reads time_created too (each id its own key)
        store.create_table("q", COMMENT + ",vt_order_key=k", ORDERED_COLUMNS, indexes=ORDER_INDEX)
    else:
        store.create_table("q", COMMENT)
    clock = FakeClock()
    now = clock.now_ns()

    def key(k: str) -> dict[str, str]:
        return {"k": k} if ordered else {}

    store.insert("q", 1, time_created=now - 2 * 10**9, **key("a"))  # 2 s old at its send
    store.insert("q", 2, time_created=now - 20 * 10**9, **key("b"))  # 20 s
    store.insert("q", 3, time_created=now - 10**9, epoch=1, **key("c"))  # a redelivery
    store.insert("q", 4, time_created=None, **key("d"))  # unknown: not observed
    e = MessageEngine(
        store, clock=clock, rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    e.refresh()
    try:
        m = e._manager("q", "")
        sub = m.subscribe()
        m.poll_once()
        m.send_once()
        m.send_once()
        assert sorted(drain(sub)) == [1, 2, 3, 4]
        samples = {
            (s.name, s.labels.get("le")): s.value
            for s in scrape(e)["msgtable_message_delivery_delay_seconds"].samples
            if s.labels["table"] == "q"
        }
        name = "msgtable_message_delivery_delay_seconds"
        assert samples[(name + "_count", None)] == 2
        assert samples[(name + "_sum", None)] == pytest.approx(22.0)
        assert samples[(name + "_bucket", "1.0")] == 0
        assert samples[(name + "_bucket", "2.5")] == 1 and samples[(name + "_bucket", "30.0")] == 2
    finally:
        e.close()


class StubBinlog:
    """A binlog follower as the collector reads it."""

    def __init__(self) -> None:
        self.following = threading.Event()
        self.following.set()
        self.events = 7
        self.lag_s: float | None = 2.5
        self.count_rows = False


def test_enqueued_rows_and_the_binlog_lag_are_served_from_the_follower(engine):
    engine.binlog = StubBinlog()
    engine.binlog_insert("q", 3)
    engine.binlog_insert("q", 1)
    engine.binlog_insert("q")  # a hint only (the follower does not count rows): no row
    f = scrape(engine)
    assert value(f, "msgtable_messages_enqueued") == 4
    assert f["msgtable_binlog_lag_seconds"].samples[0].value == 2.5
    engine.binlog.lag_s = None  # not following: no lag family
    assert "msgtable_binlog_lag_seconds" not in scrape(engine)
    m = MetricsServer(engine, "127.0.0.1:0")
    m.open()  # a metrics server has the follower count rows
    m.close()
    assert engine.binlog.count_rows
    engine.binlog = None


def test_every_statement_the_store_runs_names_its_kind():
    """A statement timed without a kind would be counted as "other" (README: Metrics)."""
    from pathlib import Path

    import msgtable

    untimed = []
    for path in Path(msgtable.__file__).parent.rglob("*.py"):
        if "proto" in path.parts:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            call = re.search(r"\b_errors\(([^)]*)\)", line)
            if call and "def _errors" not in line:
                args = [a.strip() for a in call.group(1).split(",") if a.strip()]
                if not any(a.startswith("kind=") or a.startswith('"') for a in args):
                    untimed.append(f"{path.name}:{n}: {line.strip()}")
    assert not untimed, "statements without a kind:\n" + "\n".join(untimed)


def test_the_lease_times_its_statements_by_kind():
    import contextlib

    from msgtable.engine.placement import Placement

    seen: list[str] = []

    @contextlib.contextmanager
    def timed(kind: str):
        seen.append(kind)
        yield

    class Refused:
        def cursor(self):
            raise OSError("no database here")

    lease = Placement(
        lambda: Refused(),
        "here:1",
        units=set,
        on_gain=lambda u, t: None,
        on_loss=lambda u, s: True,
        timed=timed,
    )
    with pytest.raises(MsgtableError):  # the database away: Unavailable
        lease.prepare()
    assert seen == ["lease_prepare"]


def test_lease_gains_count_each_tenure_so_a_reset_between_two_scrapes_shows(leased_engine):
    """A server that loses the lease and gains it back between two scrapes reopens its
    tables (their counters start again at 0) while msgtable_lease_holder reads 1 both
    times: msgtable_lease_gains_total tells the two tenures apart."""
    from msgtable.engine.lease import Takeover

    gains = "msgtable_lease_gains"  # the parser names a counter family without _total
    assert scrape(leased_engine)[gains].samples[0].value == 0  # nothing gained yet
    took = Takeover(previous="", ended_s_ago=float("inf"), released=True, by_me=False)
    gain(leased_engine, took)
    assert scrape(leased_engine)[gains].samples[0].value == 1
    lose(leased_engine, "")
    gain(leased_engine, Takeover("me", 0.0, released=False, by_me=True))
    f = scrape(leased_engine)
    assert f[gains].samples[0].value == 2 and f["msgtable_lease_holder"].samples[0].value == 1


def test_late_renewals_and_skipped_postpones_are_counted_for_the_operator(engine):
    """Two signs of a lease too short for a loaded machine: renewals that came back after
    the validity they gave (sends paused), and postpones not written on a demotion noticed
    too late (their counts lost, the rows sent again after the next holder's hold)."""
    late, skipped = "msgtable_lease_late_renewals", "msgtable_postpones_skipped"
    f = scrape(engine)
    assert f[late].samples[0].value == 0 and f[skipped].samples == [], "none skipped yet"

    class Late:
        late_renewals = 3
        address = "me:1"

        def valid(self, unit: str) -> bool:
            return True

        def sender(self, unit: str) -> str:
            return self.address

    engine._tenure.lease = Late()
    engine._tenure.skip("orders", 7)
    f = scrape(engine)
    assert f[late].samples[0].value == 3
    assert [(s.labels["table"], s.value) for s in f[skipped].samples] == [("orders", 7)]
    # the fence kept out 2 of orders' and 1 of jobs' (the store's counts)
    engine._tenure.fenced = SimpleNamespace(postpones_fenced={"orders": 2, "jobs": 1})
    got = {s.labels["table"]: s.value for s in scrape(engine)[skipped].samples}
    assert got == {"orders": 9, "jobs": 1}
    engine._tenure.fenced = None
    engine._tenure.lease = None


def test_a_scrape_never_pairs_one_tenures_counters_with_anothers_lease_gauge(leased_engine):
    """A loss of the lease while a scrape reads the tables (their counters start again
    with the new managers) must not give counters of the old tenure beside the new
    tenure's lease gauge: the fault suite's checker tells tenures apart by that gauge."""
    sub = sent_in_a_tenure(leased_engine)
    read = leased_engine.live_statuses
    lost = []

    def racing() -> list:
        statuses = read()  # the old tenure's managers, then the loss lands
        if not lost:
            lost.append(True)
            lose(leased_engine, "")
        return statuses

    leased_engine.live_statuses = racing  # type: ignore[method-assign]
    f = scrape(leased_engine)
    assert lost and f["msgtable_lease_holder"].samples[0].value == 0
    assert value(f, "msgtable_messages_sent") == 0  # the new tenure's, as the gauge says
    sub.close()


def test_each_table_says_whether_this_server_sends_it(leased_engine):
    """The servers of a database share its tables (msgtable.engine.placement): per table, 1 on the
    server that sends it, 0 on the others; msgtable_lease_holder is 1 while it sends any."""
    from msgtable.engine.lease import Takeover

    engine = leased_engine
    engine.store.create_table("r", COMMENT)
    engine.refresh()
    f = scrape(engine)
    assert value(f, "msgtable_table_sender") == 0 and value(f, "msgtable_table_sender", "r") == 0
    assert f["msgtable_lease_holder"].samples[0].value == 0
    engine._gain("r", Takeover(previous="", ended_s_ago=float("inf"), released=True, by_me=False))
    f = scrape(engine)
    assert value(f, "msgtable_table_sender") == 0 and value(f, "msgtable_table_sender", "r") == 1
    assert f["msgtable_lease_holder"].samples[0].value == 1
    engine._lose("r", "10.0.0.2:50051")
    f = scrape(engine)
    assert value(f, "msgtable_table_sender", "r") == 0
    assert f["msgtable_lease_holder"].samples[0].value == 0


def test_a_loss_between_the_counters_and_the_sender_gauge_reads_both_again(leased_engine):
    """The fault suite judges a table's counters by its msgtable_table_sender: a scrape must
    not give the counters of the tenure before a hand-over beside the gauge after it."""
    engine = leased_engine
    sub = sent_in_a_tenure(engine)
    real = engine.sends
    lost = []

    def racing(table: str) -> bool:
        if not lost:  # the hand-over lands after the counters were read
            lost.append(True)
            engine._lose("q", "10.0.0.2:50051")
        return real(table)

    engine.sends = racing  # type: ignore[method-assign]
    f = scrape(engine)
    assert lost
    assert value(f, "msgtable_table_sender") == 0
    assert value(f, "msgtable_messages_sent") == 0  # the new tenure's, as the gauge says
    sub.close()


def sent_in_a_tenure(engine):
    """The engine gains table q's lease and sends a batch of it, taken by a subscriber
    (returned): a tenure whose sent counter is above 0."""
    from msgtable.engine.lease import Takeover

    gain(engine, Takeover(previous="", ended_s_ago=float("inf"), released=True, by_me=False))
    m = engine._manager("q", "")
    sub = engine.subscribe("q")
    m.poll_once()
    assert m.send_once() > 0 and drain(sub)
    assert value(scrape(engine), "msgtable_messages_sent") > 0
    return sub
