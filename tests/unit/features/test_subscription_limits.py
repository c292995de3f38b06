"""A subscription's own limits without a server: how they replace its table's (each limit
alone, "off" turning one off), how alter merges them, how the definitions table keeps them,
and the one-line errors naming the field."""

from __future__ import annotations

import pytest

from msgtable.core.flow import FlowControl, own_flow
from msgtable.core.subscriptions import (
    Subscription,
    check_settings,
    limits_text,
    load_subscription,
    merge_limits,
    parse_limits,
)
from msgtable.core.tables import load_table
from msgtable.errors import InvalidArgument, TableLoadError
from msgtable.store.subscriptions import row_to_subscription, subscription_params
from tests.unit.features.test_subscriptions import COMMENT, STATE_COLUMNS, TABLE_COLUMNS

LIMITED = COMMENT + ",vt_rate=100/s,vt_max_in_flight=50,vt_limit_key=region,vt_key_concurrency=2"


def table(comment: str = LIMITED):
    return load_table("orders", comment, TABLE_COLUMNS, [("id",)])


def flow_of(comment: str = LIMITED, **limits: str) -> FlowControl | None:
    sub = Subscription("orders", "s", limits=merge_limits((), limits))
    return load_subscription(table(comment), sub, STATE_COLUMNS).config.flow


def test_without_limits_of_its_own_a_subscription_has_its_tables():
    assert flow_of() == table().flow


def test_its_own_rate_replaces_the_tables_with_its_own_burst_and_keeps_the_other_limits():
    flow = flow_of(rate="5/s")
    assert flow is not None
    assert (flow.rate_per_s, flow.burst) == (5.0, 1)  # a tenth of a second's worth, at least 1
    assert (flow.max_in_flight, flow.key_column, flow.key_concurrency) == (50, "region", 2)
    flow = flow_of(rate="120/m", rate_burst="7")
    assert flow is not None and (flow.rate_per_s, flow.burst) == (2.0, 7)


def test_a_burst_alone_applies_to_the_tables_rate():
    flow = flow_of(rate_burst="3")
    assert flow is not None and (flow.rate_per_s, flow.burst) == (100.0, 3)


def test_off_turns_a_tables_limit_off_for_the_subscription_alone():
    flow = flow_of(rate="off", max_in_flight="OFF")
    assert flow is not None
    assert (flow.rate_per_s, flow.burst, flow.max_in_flight) == (0.0, 0, 0)
    assert flow.key_concurrency == 2
    assert flow_of(rate="off", max_in_flight="off", key_concurrency="off") is None


def test_a_subscription_of_a_table_without_limits_may_have_some():
    flow = flow_of(COMMENT, rate="10", max_in_flight="4")
    assert flow is not None
    assert (flow.rate_per_s, flow.burst, flow.max_in_flight) == (10.0, 1, 4)
    assert flow.describe() == "rate 10/s (burst 1), max in flight 4"


def test_per_key_limits_count_on_the_tables_vt_limit_key():
    flow = flow_of(key_rate="2/s", key_concurrency="1")
    assert flow is not None
    assert (flow.key_column, flow.key_rate_per_s, flow.key_burst, flow.key_concurrency) == (
        "region",
        2.0,
        1,
        1,
    )


@pytest.mark.parametrize(
    ("comment", "limits", "why"),
    [
        (LIMITED, {"rate": "fast"}, r"rate='fast' is not a rate \(N, N/s, N/m or N/h\)"),
        (LIMITED, {"rate": "0"}, "rate=0 must be above 0"),
        (LIMITED, {"rate": "nan/s"}, "is not a rate"),
        (LIMITED, {"rate": "1e400"}, "is not a rate"),
        (LIMITED, {"rate": "5/d"}, "is not a rate"),
        (LIMITED, {"rate": "2000000"}, "at most 1,000,000/s"),
        (LIMITED, {"max_in_flight": "-1"}, "max_in_flight=-1 must be between 1 and"),
        (LIMITED, {"max_in_flight": "2.5"}, "max_in_flight='2.5' is not a whole number"),
        (LIMITED, {"rate_burst": "0"}, "rate_burst=0 must be between 1 and"),
        (COMMENT, {"rate_burst": "5"}, "rate_burst needs rate"),
        (COMMENT, {"key_rate": "5/s"}, "key_rate needs the table's vt_limit_key"),
        (LIMITED, {"speed": "5"}, "unknown limit 'speed'"),
    ],
)
def test_a_bad_limit_is_a_load_error_naming_the_field(comment, limits, why):
    sub = Subscription("orders", "s", limits=merge_limits((), limits))
    with pytest.raises(TableLoadError, match=why) as caught:
        load_subscription(table(comment), sub, STATE_COLUMNS)
    assert str(caught.value).startswith("subscription orders/s: ")
    assert "\n" not in str(caught.value)


def test_an_ordered_tables_subscription_has_no_limits_per_key():
    problems: list[str] = []

    class Found:
        add = problems.append

    base = FlowControl(rate_per_s=5, burst=1)
    assert own_flow(base, {"key_concurrency": "1"}, True, Found()) is not None
    assert problems == ["key_concurrency needs an unordered table (not with vt_order_key)"]


def test_a_limit_longer_than_any_is_refused_before_it_is_parsed():
    with pytest.raises(InvalidArgument, match="limit 'max_in_flight' is over 64 characters"):
        check_settings(Subscription("orders", "s", limits=(("max_in_flight", "9" * 5000),)))


def test_alter_changes_the_limits_named_and_an_empty_value_puts_the_tables_back():
    own = merge_limits((), {"max_in_flight": " 5 ", "rate": "10/s"})
    assert own == (("rate", "10/s"), ("max_in_flight", "5"))
    assert merge_limits(own, {"rate": "", "key_rate": "1/s"}) == (
        ("max_in_flight", "5"),
        ("key_rate", "1/s"),
    )


def test_a_burst_goes_with_the_rate_it_was_set_with():
    own = merge_limits((), {"rate": "10/s", "rate_burst": "4", "key_rate": "1", "key_burst": "2"})
    assert merge_limits(own, {"rate": "off"}) == (
        ("rate", "off"),
        ("key_rate", "1"),
        ("key_burst", "2"),
    )
    assert merge_limits(own, {"rate_burst": "9"})[:2] == (("rate", "10/s"), ("rate_burst", "9"))


def test_the_definitions_table_keeps_the_limits_as_written():
    sub = Subscription("orders", "s", limits=(("rate", "10/s"), ("rate_burst", "2")))
    params = subscription_params(sub)
    assert params[11] == limits_text(sub.limits) == "rate=10/s,rate_burst=2"
    assert params[12] == sub.state_rows == "eager"  # then how its state rows are kept
    assert row_to_subscription(params).limits == sub.limits
    assert row_to_subscription(params[:11]).limits == ()  # a definitions table before limits
    assert parse_limits("") == () and parse_limits(None) == ()  # type: ignore[arg-type]
