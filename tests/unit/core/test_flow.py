from __future__ import annotations

import pytest

from msgtable.core.flow import FlowControl, TokenBucket, fair_index_hint, rate_violations
from msgtable.core.tables import Column, load_table
from msgtable.errors import TableLoadError
from msgtable.testing import CURRENT_COLUMNS

GOOD = (
    "vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=10,"
    "vt_cache_size=10000,vt_poller_interval=30"
)
COLUMNS = (*CURRENT_COLUMNS, Column("tenant", "varchar", "varchar(64)"))
ORDER_INDEX = (("order_idx", ("tenant", "time_acked", "id")),)


def load(extra: str, columns=COLUMNS, indexes=()):
    return load_table("q", f"{GOOD},{extra}" if extra else GOOD, columns, (("id",),), indexes)


def test_a_table_without_limits_has_no_flow_control():
    assert load("").flow is None


def test_the_limits_are_read_with_their_units_and_default_bursts():
    cfg = load(
        "vt_rate=1000/s,vt_key_rate=30/m,vt_limit_key=tenant,vt_max_in_flight=50,"
        "vt_key_concurrency=2,vt_fair_key=tenant"
    )
    assert cfg.flow == FlowControl(
        rate_per_s=1000.0,
        burst=100,
        key_column="tenant",
        key_rate_per_s=0.5,
        key_burst=1,
        max_in_flight=50,
        key_concurrency=2,
        fair_key="tenant",
    )
    assert cfg.flow.per_key and cfg.flow.capped and cfg.flow.keyed_column == "tenant"
    assert load("vt_rate=7200/h,vt_rate_burst=3").flow == FlowControl(rate_per_s=2.0, burst=3)
    assert load("vt_rate=5").flow == FlowControl(rate_per_s=5.0, burst=1)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ("vt_rate=0", "vt_rate=0 must be above 0"),
        ("vt_rate=-3/s", "vt_rate=-3/s must be above 0"),
        ("vt_rate=fast", "vt_rate='fast' is not a rate"),
        ("vt_rate=10/d", "vt_rate='10/d' is not a rate"),
        ("vt_rate=nan", "vt_rate='nan' is not a rate"),
        ("vt_rate=1e9", "vt_rate=1e9 must be above 0 and at most 1,000,000/s"),
        ("vt_rate_burst=5", "vt_rate_burst needs vt_rate"),
        ("vt_rate=5,vt_rate_burst=0", "vt_rate_burst=0 must be between 1"),
        ("vt_max_in_flight=0", "vt_max_in_flight=0 must be between 1"),
        ("vt_max_in_flight=1.5", "vt_max_in_flight='1.5' is not a whole number"),
        ("vt_key_concurrency=2", "vt_key_concurrency needs vt_limit_key"),
        ("vt_key_rate=2", "vt_key_rate needs vt_limit_key"),
        ("vt_limit_key=tenant", "vt_limit_key needs vt_key_rate or vt_key_concurrency"),
        ("vt_limit_key=nope,vt_key_concurrency=1", "vt_limit_key names unknown column 'nope'"),
        ("vt_limit_key=epoch,vt_key_concurrency=1", "vt_limit_key=epoch is an engine column"),
        ("vt_fair_key=", "vt_fair_key must name a column"),
        ("vt_fair_key=id", "vt_fair_key=id is an engine column"),
        (
            "vt_message_cols=id|message,vt_fair_key=tenant",
            "vt_fair_key=tenant must be one of the message columns",
        ),
    ],
)
def test_a_bad_limit_is_a_load_error_naming_the_field(extra, named):
    with pytest.raises(TableLoadError, match="table q: .*" + named.replace("(", r"\(")):
        load(extra)


def test_an_ordered_table_takes_group_limits_and_one_in_flight_per_key_only():
    cfg = load(
        "vt_order_key=tenant,vt_rate=10,vt_max_in_flight=4,vt_key_concurrency=1",
        indexes=ORDER_INDEX,
    )
    assert cfg.flow == FlowControl(rate_per_s=10.0, burst=1, max_in_flight=4)
    with pytest.raises(TableLoadError, match="vt_key_concurrency=2 with vt_order_key"):
        load("vt_order_key=tenant,vt_key_concurrency=2", indexes=ORDER_INDEX)
    with pytest.raises(TableLoadError, match="vt_fair_key needs an unordered table"):
        load("vt_order_key=tenant,vt_fair_key=tenant", indexes=ORDER_INDEX)


def test_every_bad_limit_is_reported_at_once():
    with pytest.raises(TableLoadError) as err:
        load("vt_rate=0,vt_max_in_flight=x,vt_fair_key=nope")
    text = str(err.value)
    assert "vt_rate=0" in text and "vt_max_in_flight='x'" in text and "'nope'" in text


def test_a_token_bucket_starts_empty_fills_at_its_rate_and_stops_at_its_burst():
    b = TokenBucket(10.0, 5, start_ns=0)
    assert b.available(0) == 0 and b.next_ns() == 100_000_000
    assert b.available(250_000_000) == 2
    b.spend(2, 250_000_000)
    assert b.available(250_000_000) == 0
    assert b.available(10**10) == 5  # never more than the burst
    b.spend(5, 10**10)
    assert b.available(10**10) == 0
    assert b.full_at_ns() == 10**10 + 500_000_000


def test_tokens_are_spent_when_the_messages_go_not_when_they_were_counted():
    """Asked at 0 (full), spent at 0.5 s: the refill between was wasted on a full bucket,
    so at 0.6 s one token is there, not six."""
    b = TokenBucket(10.0, 5, start_ns=0, tokens=5.0)
    assert b.available(0) == 5
    b.spend(5, 500_000_000)
    assert b.available(600_000_000) == 1


def test_rate_violations_finds_the_worst_interval_and_nothing_when_the_rate_held():
    second = 10**9
    steady = [i * second // 10 for i in range(100)]  # 10/s for 10 s
    assert rate_violations(steady, 10.0, 1) == []
    burst = [0, 1, 2, *steady[1:]]  # three at once, then the steady rate
    assert rate_violations(burst, 10.0, 3) == []
    assert rate_violations(burst, 10.0, 2)[0][2] >= 3


def test_a_subscription_has_its_tables_limits_and_its_projection_must_carry_their_key():
    from msgtable.core.subscriptions import Subscription, load_subscription

    columns = (*COLUMNS, Column("time_fanout", "bigint", "bigint"))
    table = load_table("q", f"{GOOD},vt_limit_key=tenant,vt_key_concurrency=2", columns, [("id",)])
    state = tuple(
        Column(n, "bigint", "bigint")
        for n in ("id", "priority", "time_next", "epoch", "time_acked", "time_created")
    )
    kept = load_subscription(table, Subscription("q", "all"), state).config
    assert kept.flow == table.flow and kept.label == "q/all"
    with pytest.raises(TableLoadError, match="its columns must include tenant"):
        load_subscription(table, Subscription("q", "narrow", columns=("message",)), state)


def test_a_fair_table_finds_its_index_on_time_acked_and_the_key_and_hints_at_it_if_missing():
    fair_idx = ("fair_idx", ("time_acked", "tenant", "priority", "time_next"))
    other = ("other_idx", ("tenant", "time_acked"))
    cfg = load("vt_fair_key=tenant", indexes=(other, fair_idx))
    assert cfg.flow is not None and cfg.flow.fair_index == "fair_idx"
    assert fair_index_hint("q", cfg.flow) == ""
    short = load("vt_fair_key=tenant", indexes=(("t_idx", ("time_acked", "tenant")),))
    assert short.flow is not None and short.flow.fair_index == "t_idx"
    bare = load("vt_fair_key=tenant", indexes=(other,))
    assert bare.flow is not None and bare.flow.fair_index == ""
    hint = fair_index_hint("q", bare.flow)
    assert hint.startswith("vt_fair_key=tenant without an index on (time_acked, tenant")
    assert hint.endswith(
        "ALTER TABLE q ADD INDEX fair_idx (time_acked, tenant, priority, time_next)"
    )
    assert "\n" not in hint
    assert fair_index_hint("q", load("vt_rate=5/s").flow) == ""
    assert fair_index_hint("q", None) == ""
