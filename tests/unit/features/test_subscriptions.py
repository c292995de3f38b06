"""Subscriptions without a server: names, settings, how one is loaded onto its table, the
holding rule, and the exact SQL of the fan-out and of a subscription's poll and purge."""

from __future__ import annotations

import dataclasses

import pytest

from msgtable.core.filters import parse_filter
from msgtable.core.subscriptions import (
    Subscription,
    SubscriptionState,
    check_settings,
    filter_index_advice,
    holding,
    load_subscription,
    state_table_name,
)
from msgtable.core.tables import Column, load_table
from msgtable.errors import InvalidArgument, TableLoadError
from msgtable.store.statements import TableStatements
from msgtable.store.subscriptions import FanoutStatements, lag_sql, state_table_ddl

NS = 10**9


def col(name: str, data_type: str = "bigint", column_type: str | None = None) -> Column:
    return Column(name, data_type, column_type or data_type)


TABLE_COLUMNS = (
    col("id"),
    col("priority"),
    col("time_next"),
    col("epoch"),
    col("time_acked"),
    col("time_created"),
    col("time_fanout"),
    col("region", "varchar", "varchar(16)"),
    col("amount"),
    col("note", "text", "text"),
)
STATE_COLUMNS = (
    *(
        col(n)
        for n in ("id", "priority", "time_next", "epoch", "time_acked", "time_created", "time_dead")
    ),
    col("last_error", "varchar", "varchar(1000)"),
)
COMMENT = (
    "vitess_message,vt_ack_wait=30,vt_purge_after=60,vt_batch_size=10,vt_cache_size=100,"
    "vt_poller_interval=1,vt_max_attempts=5"
)


def orders(**changes: object):
    cfg = load_table("orders", COMMENT, TABLE_COLUMNS, [("id",)])
    return dataclasses.replace(cfg, **changes)


def test_time_fanout_is_an_engine_column_never_streamed():
    assert [c.name for c in orders().message_columns] == ["id", "region", "amount", "note"]


def test_a_subscription_is_served_from_its_state_table_with_the_tables_settings():
    sub = Subscription("orders", "billing", filter="region = 'eu'", columns=("amount",))
    ls = load_subscription(orders(), sub, STATE_COLUMNS)
    cfg = ls.config
    assert (cfg.name, cfg.source, cfg.subscription, cfg.label) == (
        "orders__billing",
        "orders",
        "billing",
        "orders/billing",
    )
    assert [c.name for c in cfg.message_columns] == ["id", "amount"]
    assert (cfg.ack_wait_s, cfg.max_attempts, cfg.dead_letter) == (30, 5, "")
    assert cfg.keeps_errors and ls.filter is not None


def test_a_subscription_may_have_its_own_ack_wait_and_attempts():
    sub = Subscription("orders", "s", ack_wait_s=5, max_attempts=0)
    cfg = load_subscription(orders(), sub, STATE_COLUMNS).config
    assert (cfg.ack_wait_s, cfg.max_attempts) == (5, 0)


@pytest.mark.parametrize(
    ("sub", "state", "why"),
    [
        (Subscription("orders", "s", filter="regoin = 'eu'"), STATE_COLUMNS, "unknown column"),
        (Subscription("orders", "s", columns=("nope",)), STATE_COLUMNS, "unknown column 'nope'"),
        (Subscription("orders", "s"), None, "state table orders__s is missing"),
        (Subscription("orders", "s"), STATE_COLUMNS[:2], "lacks column time_next"),
        (Subscription("orders", "s", max_lag=0), STATE_COLUMNS, "max_lag"),
    ],
)
def test_a_subscription_that_cannot_load_says_why(sub, state, why):
    with pytest.raises(TableLoadError, match=why):
        load_subscription(orders(), sub, state)


def test_a_table_without_time_fanout_cannot_serve_subscriptions():
    table = orders(columns=tuple(c for c in TABLE_COLUMNS if c.name != "time_fanout"))
    with pytest.raises(TableLoadError, match="no time_fanout column"):
        load_subscription(table, Subscription("orders", "s"), STATE_COLUMNS)


@pytest.mark.parametrize("name", ["", "a b", "x;y", "é", "a" * 65, "a`b"])
def test_a_bad_subscription_name_is_invalid(name):
    with pytest.raises(InvalidArgument, match="invalid subscription name"):
        state_table_name("orders", name)


def test_a_state_table_name_longer_than_mysql_allows_is_invalid():
    with pytest.raises(InvalidArgument, match="longer than 64"):
        state_table_name("t" * 40, "s" * 30)


@pytest.mark.parametrize(
    "changes",
    [
        dict(ack_wait_s=0),
        dict(max_attempts=-1),
        dict(max_lag=-5),
        dict(expire_after_s=float("inf")),
        dict(expire_after_s=0),
        dict(filter="x" * 4001),
    ],
)
def test_bad_settings_are_invalid(changes):
    with pytest.raises(InvalidArgument):
        check_settings(Subscription("orders", "s", **changes))


def test_an_expired_or_over_lag_subscription_no_longer_holds_its_table():
    sub = Subscription("orders", "s", max_lag=10)
    assert holding(sub, 10) == (True, "")
    assert holding(sub, 11) == (False, "lag 11 over max_lag 10")
    expired = dataclasses.replace(sub, state=SubscriptionState.EXPIRED)
    assert holding(expired, 0) == (False, "expired")


def test_expiry_counts_from_the_last_subscriber_or_the_creation():
    sub = Subscription("orders", "s", expire_after_s=10, time_created_ns=100 * NS)
    assert not sub.expired_at(110 * NS)
    assert sub.expired_at(111 * NS)
    active = dataclasses.replace(sub, time_active_ns=105 * NS)
    assert not active.expired_at(114 * NS)
    assert Subscription("orders", "s").expired_at(10**20) is False


def test_the_fanout_reads_each_row_once_with_each_filters_verdict():
    f = FanoutStatements(orders())
    ls = load_subscription(
        orders(), Subscription("orders", "eu", filter="region = 'eu'"), STATE_COLUMNS
    )
    assert f.pick([None, ls.filter], 2000) == (
        "SELECT `id`, `priority`, IF(`epoch` = 0, `time_next`, NULL), `time_created`, "
        "((`region` = %s)) IS TRUE FROM `orders` WHERE `time_fanout` IS NULL "
        "ORDER BY `id` LIMIT %s FOR UPDATE SKIP LOCKED",
        ["eu", 2000],
    )
    sql, params = f.insert("orders__eu", [(3, 0, None, None), ("x'y", 1, 5, 6)], 7)
    assert sql == (
        "/* msgtable */ INSERT INTO `orders__eu` (`id`, `priority`, `time_next`, `epoch`, "
        "`time_created`) VALUES (3, 0, NULL, 0, 7), (%s, 1, 5, 0, 6) "
        "ON DUPLICATE KEY UPDATE `orders__eu`.`id` = `orders__eu`.`id`"
    )
    assert params == ["x'y"]
    # each row its own number of the table's fan-out sequence: 41 and 42 of a batch whose
    # last number is 42 (msgtable.store.sequences)
    assert f.mark_sql([3, 4], 42, 7) == (
        "/* msgtable */ UPDATE `orders` FORCE INDEX (PRIMARY) SET `time_fanout` = "
        "%s + FIELD(`id`, 3,4) WHERE `id` IN (3,4)",
        [40],
    )
    assert f.mark_sql(["a", "b"], 42, 7)[1] == [40, "a", "b", "a", "b"]
    assert f.retained(ls.filter, 9, 10) == (
        "SELECT `id`, `priority`, IF(`epoch` = 0, `time_next`, NULL), `time_created` FROM "
        "`orders` WHERE `time_fanout` IS NOT NULL AND `time_acked` IS NULL AND (`region` = %s) "
        "AND `id` > %s ORDER BY `id` LIMIT %s",
        ["eu", 9, 10],
    )


def test_without_a_default_group_the_fanout_acks_the_rows_for_it():
    f = FanoutStatements(orders(default_group=False))
    sql, params = f.mark_sql([1], 5, 9)
    assert "`time_acked` = COALESCE(`time_acked`, %s)" in sql
    assert params == [4, 9]


def test_a_subscriptions_poll_joins_the_table_for_its_columns():
    cfg = load_subscription(
        orders(), Subscription("orders", "s", columns=("amount",)), STATE_COLUMNS
    ).config
    s = TableStatements(cfg)
    assert s.poll == (
        "SELECT s.`priority`, s.`time_next`, s.`epoch`, m.`id`, m.`amount` FROM `orders__s` s "
        "FORCE INDEX (`poller_idx`) JOIN `orders` m ON m.`id` = s.`id` "
        "WHERE s.`time_acked` IS NULL AND (s.`time_next` IS NULL OR s.`time_next` <= %s) "
        "ORDER BY s.`priority`, s.`time_next`, s.`id` LIMIT %s"
    )
    assert s.purge_pick == "SELECT `id` FROM `orders__s` WHERE `time_acked` < %s LIMIT %s"
    assert s.purge == (
        "/* msgtable */ DELETE `orders__s` FROM `orders__s` FORCE INDEX (PRIMARY) "
        "WHERE `id` IN ({ids}) AND `time_acked` < %s"
    )


def test_a_tables_purge_waits_for_every_subscription_that_holds_it():
    s = TableStatements(orders(fanout=True, holders=("orders__a", "orders__b")))
    # the pick is a plain read: it locks no row of the state tables (no deadlock with their
    # acks); the DELETE takes the rows picked by primary key
    assert s.purge_pick == (
        "SELECT `id` FROM `orders` WHERE `time_acked` < %s AND `time_fanout` IS NOT "
        "NULL AND NOT EXISTS (SELECT 1 FROM `orders__a` h WHERE h.`id` = `orders`.`id` AND "
        "(h.`time_acked` IS NULL OR h.`time_acked` >= %s)) AND NOT EXISTS (SELECT 1 FROM "
        "`orders__b` h WHERE h.`id` = `orders`.`id` AND (h.`time_acked` IS NULL OR "
        "h.`time_acked` >= %s)) LIMIT %s"
    )
    assert s.purge == (
        "/* msgtable */ DELETE `orders` FROM `orders` FORCE INDEX (PRIMARY) "
        "WHERE `id` IN ({ids}) AND `time_acked` < %s"
    )
    assert s.purge_holders == 2


def test_a_table_without_subscriptions_keeps_its_statements():
    assert TableStatements(orders()).purge_pick == (
        "SELECT `id` FROM `orders` WHERE `time_acked` < %s LIMIT %s"
    )


def test_the_state_table_takes_the_id_type_of_its_table():
    ddl = state_table_ddl("t__s", col("id", "varchar", "varchar(64)"))
    assert "  id varchar(64) NOT NULL," in ddl
    assert "COMMENT 'msgtable_subscription'" in ddl
    assert "LIMIT 1000" in lag_sql("t__s", "t", 1000)


def test_a_definitions_projection_is_read_as_written_by_sql():
    from msgtable.store.subscriptions import row_to_subscription

    row = ("orders", "s", None, " id , kind|amount ", None, None, None, None, "active", 1, None)
    assert row_to_subscription(row).columns == ("id", "kind", "amount")


ADD_REGION = (
    "its filter reads every message above its cursor to find its matches: ALTER TABLE "
    "`orders` ADD INDEX `region_fanout_idx` (`region`, time_fanout)"
)


@pytest.mark.parametrize(
    ("flt", "indexes", "advice"),
    [
        ("region = 'eu'", [("PRIMARY",), ("time_fanout",)], ADD_REGION),
        ("region = 'eu'", [("region", "time_fanout")], ""),
        ("REGION = 'eu'", [("Region", "TIME_FANOUT")], ""),  # names are not case-sensitive
        ("region = 'eu'", [("region",), ("time_fanout", "region")], ADD_REGION),
        ("region = 'eu'", [("region", "amount", "time_fanout")], ADD_REGION),  # amount: a range
        ("region = 'eu' AND amount IN (1, 2)", [("region", "amount", "time_fanout")], ""),
        ("region=eu|us,amount=3", [("amount", "time_fanout", "id")], ""),
        ("amount > 3 AND region IN ('eu', 'us')", [], ADD_REGION),
        ("note = 'x' AND region = 'eu'", [], ADD_REGION),  # a text column: not the index's
    ],
)
def test_a_lazy_filter_is_advised_the_index_that_finds_its_matches(flt, indexes, advice):
    table = orders()
    assert filter_index_advice(table, parse_filter(flt, table.columns), indexes) == advice


@pytest.mark.parametrize(
    ("flt", "why"),
    [
        ("region = 'eu' OR amount = 3", "no AND term of it compares a column with = or IN"),
        ("amount > 3", "no AND term of it compares a column with = or IN"),
        ("note = 'x'", "its AND terms compare with = or IN only text, blob or json columns"),
    ],
)
def test_a_lazy_filter_no_index_can_serve_is_advised_the_eager_mode(flt, why):
    table = orders()
    advice = filter_index_advice(table, parse_filter(flt, table.columns), [("time_fanout",)])
    reads = "its filter reads every message above its cursor to find its matches"
    assert advice.startswith(f"{reads}: {why}"), advice
    assert advice.endswith("; or create it with state_rows=eager"), advice
