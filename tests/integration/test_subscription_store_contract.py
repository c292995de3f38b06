"""The SubscriptionStore contract: every case runs on the in-memory subscriptions
(msgtable.testing.subscriptions, InMemoryStore's subscription_store) and on MySQL's
(msgtable.store.subscriptions.SubscriptionSQL, MySQLStore's), so the fake cannot drift from
the real one. The tables are set up as another client would (contract_tables.py, as in
test_store_contract.py); a case failing on one side is a drift: fix the fake, never the case.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from msgtable.core.subscriptions import (
    FANOUT_COLUMN,
    STATE_COLUMNS,
    LoadedSubscription,
    Subscription,
    SubscriptionState,
    load_subscription,
)
from msgtable.core.tables import DEAD_TIME_NEXT, DEMO_COMMENT, Column, TableConfig, load_table
from msgtable.errors import InvalidArgument, TableNotFound
from msgtable.store.protocol import SubscriptionStore

from .contract_tables import (
    Tables,
    both_stores,  # noqa: F401 (the tables fixture)
)

NS = 10**9
NOW = 1_700_000_000 * NS
LATER = NOW + 60 * NS


def subs_of(t: Tables) -> SubscriptionStore:
    store = t.store.subscription_store
    assert store is not None, "the store offers no subscriptions"
    return store


def config(t: Tables, name: str) -> TableConfig:
    """The table's config as the engine loads it now (with its subscriptions: fanout, and
    every active one holding it)."""
    (d,) = [d for d in t.store.discover() if d.name == name]
    cfg = load_table(d.name, d.comment, d.columns, d.unique_indexes, d.indexes)
    defs = [s for s in subs_of(t).subscriptions()[0] if s.table == name]
    if not defs:
        return cfg
    holders = tuple(sorted(s.state_table for s in defs if s.state is SubscriptionState.ACTIVE))
    return dataclasses.replace(cfg, fanout=True, holders=holders)


def probe(cfg: TableConfig, sub: Subscription) -> LoadedSubscription:
    """``sub`` loaded as it will be once created (the registry's check before it creates)."""
    cols = cfg.columns
    if not cfg.has_column(FANOUT_COLUMN):
        cols = (*cols, Column(FANOUT_COLUMN, "bigint", "bigint"))
    state = tuple(Column(c, "bigint", "bigint") for c in STATE_COLUMNS)
    return load_subscription(dataclasses.replace(cfg, columns=cols), sub, state)


def create(
    t: Tables, table: str, name: str, from_start: bool = False, **settings: Any
) -> tuple[int, Subscription]:
    sub = Subscription(table, name, time_created_ns=NOW, **settings)
    n = subs_of(t).create_subscription(
        config(t, table), probe(config(t, table), sub), from_start, NOW
    )
    return n, sub


def loaded(t: Tables, table: str) -> dict[str, LoadedSubscription]:
    """The table's subscriptions loaded on their state tables (by name)."""
    defs, columns = subs_of(t).subscriptions()
    cfg = config(t, table)
    return {
        s.name: load_subscription(cfg, s, columns.get(s.state_table))
        for s in defs
        if s.table == table
    }


def state_ids(t: Tables, sub: Subscription, upto: int = 20) -> list[int]:
    return [i for i in range(1, upto) if t.row(sub.state_table, i) is not None]


def test_a_database_without_subscriptions_has_none(tables: Tables):
    assert subs_of(tables).subscriptions() == ([], {})


def test_a_subscription_is_created_with_its_state_table_and_read_back(tables: Tables):
    tables.create("q")
    n, sub = create(tables, "q", "s", ack_wait_s=5.0, max_attempts=3, expire_after_s=60.0)
    assert n == 0
    defs, columns = subs_of(tables).subscriptions()
    assert defs == [sub]
    assert set(STATE_COLUMNS) <= {c.name for c in columns[sub.state_table]}
    assert {"time_created", "last_error", "time_dead"} <= {c.name for c in columns[sub.state_table]}
    assert config(tables, "q").has_column(FANOUT_COLUMN)


def test_rows_before_the_first_subscription_are_seen_by_none(tables: Tables):
    tables.create("q")
    tables.insert("q", 1)
    _, sub = create(tables, "q", "s")
    row = tables.row("q", 1)
    assert row is not None and row[FANOUT_COLUMN] == NOW
    assert row["time_acked"] is None  # the default group still has it
    assert subs_of(tables).fanout(config(tables, "q"), loaded(tables, "q"), LATER, 100) == (
        {"": 0},
        set(),
    )
    assert state_ids(tables, sub) == []


def test_the_sequence_starts_above_every_time_fanout_there(tables: Tables):
    """The fan-out sequence (msgtable.store.sequences) numbers the first rows it hands
    over above what the table's time_fanout holds already (here a row seen by none, marked
    with the time of the first subscription), one number each, and goes on from there."""
    tables.create("q")
    tables.insert("q", 1)
    _, sub = create(tables, "q", "s")
    tables.insert("q", 3)
    tables.insert("q", 2)
    store, cfg = subs_of(tables), config(tables, "q")
    assert store.fanout(cfg, loaded(tables, "q"), LATER, 100) == ({"s": 2, "": 2}, set())
    tables.insert("q", 4)
    assert store.fanout(cfg, loaded(tables, "q"), LATER, 100) == ({"s": 1, "": 1}, set())
    numbers = [(tables.row("q", i) or {}).get(FANOUT_COLUMN) for i in (1, 2, 3, 4)]
    assert numbers == [NOW, NOW + 1, NOW + 2, NOW + 3]
    assert state_ids(tables, sub) == [2, 3, 4]


def test_the_fanout_hands_new_rows_to_each_subscription_once(tables: Tables):
    tables.create("q")
    _, a = create(tables, "q", "a")
    _, b = create(tables, "q", "b")
    tables.insert("q", 1, priority=2, time_next=NOW + 5)
    tables.insert("q", 2, epoch=3, time_next=NOW + 7)  # sent by the default group already
    tables.insert("q", 3)
    store, cfg = subs_of(tables), config(tables, "q")
    assert store.pending_fanout("q", 100) == 3
    assert store.pending_fanout("q", 2) == 2
    got, unknown = store.fanout(cfg, loaded(tables, "q"), LATER, 2)  # by id: 1 and 2
    assert (got, unknown) == ({"a": 2, "b": 2, "": 2}, set())
    assert store.fanout(cfg, loaded(tables, "q"), LATER, 100) == ({"a": 1, "b": 1, "": 1}, set())
    assert store.fanout(cfg, loaded(tables, "q"), LATER, 100) == ({"": 0}, set())
    assert store.pending_fanout("q", 100) == 0
    assert state_ids(tables, a) == state_ids(tables, b) == [1, 2, 3]
    one, two = tables.row(a.state_table, 1), tables.row(a.state_table, 2)
    assert one is not None and two is not None
    # a delayed message stays delayed; one the default group sent is due at once
    assert (one["priority"], one["time_next"], one["epoch"], one["time_acked"]) == (
        2,
        NOW + 5,
        0,
        None,
    )
    assert (two["time_next"], two["epoch"]) == (None, 0)
    # numbered by the table's sequence, in id order (no row was there before: from 1)
    numbers = [(r or {}).get(FANOUT_COLUMN) for r in (tables.row("q", i) for i in (1, 2, 3))]
    assert numbers == [1, 2, 3]
    seen = tables.row("q", 1)
    assert seen is not None and seen["time_acked"] is None


def test_without_a_default_group_the_fanout_acks_what_it_hands_over(tables: Tables):
    tables.create_with("q", DEMO_COMMENT + ",vt_default_group=off", {"region": "varchar(16)"})
    tables.insert("q", 1)
    create(tables, "q", "s")
    assert tables.row("q", 1)["time_acked"] == NOW  # type: ignore[index]
    tables.insert("q", 2)
    subs_of(tables).fanout(config(tables, "q"), loaded(tables, "q"), LATER, 100)
    assert tables.row("q", 2)["time_acked"] == LATER  # type: ignore[index]


def test_a_cursor_starts_at_the_sequences_last_and_moves_only_from_where_it_is(tables: Tables):
    """A subscription's cursor over its table's fan-out sequence (design.md (b)): made at the
    sequence's last number when it is created (it gets what is handed over after it), moved
    only by a writer that names where it is, gone with the subscription."""
    tables.create("q")
    tables.insert("q", 1)  # seen by none: marked with the time of the first subscription
    create(tables, "q", "a")
    store, cfg = subs_of(tables), config(tables, "q")
    assert store.subscription_cursor("q", "a") == NOW
    tables.insert("q", 2)
    tables.insert("q", 3)
    store.fanout(cfg, loaded(tables, "q"), LATER, 100)  # numbered NOW + 1, NOW + 2
    create(tables, "q", "late")
    assert store.subscription_cursor("q", "late") == NOW + 2
    assert store.advance_cursor("q", "a", NOW, NOW + 1)
    assert not store.advance_cursor("q", "a", NOW, NOW + 2), "moved from where it is not"
    assert store.subscription_cursor("q", "a") == NOW + 1
    assert store.subscription_cursor("q", "nope") is None
    store.drop_subscription("q", "late", "q__late")
    assert store.subscription_cursor("q", "late") is None


def test_the_cursor_scan_reads_what_was_never_sent_in_sequence_order(tables: Tables):
    """The messages a subscription was never sent (design.md (b)): the rows numbered above
    its cursor that its filter passes and that have no state row, in sequence order (here
    the state rows of the fan-out's hand-over, taken away as the cursor's fan-out will not
    write them)."""
    tables.create_with("q", DEMO_COMMENT, {"region": "varchar(16)"})
    _, every = create(tables, "q", "every")
    _, eu = create(tables, "q", "eu", filter="region = 'eu'")
    for i, region in ((4, "eu"), (2, "us"), (1, "eu"), (3, None), (5, "eu")):
        tables.insert("q", i, region=region)
    store, cfg = subs_of(tables), config(tables, "q")
    store.fanout(cfg, loaded(tables, "q"), LATER, 100)  # numbered 1-5 in id order
    for i in (2, 3, 4, 5):
        tables.delete(every.state_table, i)
    for i in (1, 5):
        tables.delete(eu.state_table, i)
    subs = loaded(tables, "q")
    assert store.unsent(cfg, subs["every"], 0, 100) == [(2, 2), (3, 3), (4, 4), (5, 5)]
    assert store.unsent(cfg, subs["every"], 0, 2) == [(2, 2), (3, 3)]
    assert store.unsent(cfg, subs["every"], 3, 100) == [(4, 4), (5, 5)]
    # the filter's (4 is eu, but has its state row: sent, or acked by DML)
    assert store.unsent(cfg, subs["eu"], 0, 100) == [(1, 1), (5, 5)]
    assert store.unsent(cfg, subs["eu"], 5, 100) == []


def test_a_filter_decides_which_rows_a_subscription_gets(tables: Tables):
    tables.create_with("q", DEMO_COMMENT, {"region": "varchar(16)"})
    _, eu = create(tables, "q", "eu", filter="region = 'eu'")
    _, every = create(tables, "q", "every")
    tables.insert("q", 1, region="eu")
    tables.insert("q", 2, region="us")
    tables.insert("q", 3)  # NULL: unknown, not matched
    got, _ = subs_of(tables).fanout(config(tables, "q"), loaded(tables, "q"), LATER, 100)
    assert got == {"eu": 1, "every": 3, "": 3}
    assert state_ids(tables, eu) == [1]
    assert state_ids(tables, every) == [1, 2, 3]


def test_from_start_hands_over_the_retained_unacked_rows_its_filter_passes(tables: Tables):
    tables.create_with("q", DEMO_COMMENT, {"region": "varchar(16)"})
    create(tables, "q", "first")
    for i, region in ((1, "eu"), (2, "eu"), (3, "us"), (4, "eu")):
        tables.insert("q", i, region=region)
    subs_of(tables).fanout(config(tables, "q"), loaded(tables, "q"), LATER, 100)
    tables.update("q", 2, time_acked=LATER)
    tables.insert("q", 5, region="eu")  # not handed over yet: the fan-out brings it
    n, late = create(tables, "q", "late", from_start=True, filter="region = 'eu'")
    assert n == 2
    assert state_ids(tables, late) == [1, 4]


def test_an_active_subscription_not_loaded_stops_the_fanout(tables: Tables):
    tables.create("q")
    create(tables, "q", "a")
    create(tables, "q", "b")
    tables.insert("q", 1)
    only_a = {"a": loaded(tables, "q")["a"]}
    store = subs_of(tables)
    assert store.fanout(config(tables, "q"), only_a, LATER, 100) == ({"": 0}, {"b"})
    assert store.pending_fanout("q", 100) == 1  # nothing was handed over


def test_an_expired_subscription_gets_nothing(tables: Tables):
    tables.create("q")
    create(tables, "q", "a")
    _, b = create(tables, "q", "b")
    store = subs_of(tables)
    store.set_subscription_state(b, SubscriptionState.EXPIRED, LATER)
    defs = {s.name: s for s in store.subscriptions()[0]}
    assert (defs["b"].state, defs["b"].time_active_ns) == (SubscriptionState.EXPIRED, LATER)
    tables.insert("q", 1)
    got, _ = store.fanout(config(tables, "q"), {"a": loaded(tables, "q")["a"]}, LATER, 100)
    assert got == {"a": 1, "": 1}
    assert state_ids(tables, b) == []


def test_a_subscription_or_its_state_table_made_twice_is_invalid(tables: Tables):
    tables.create("q")
    create(tables, "q", "s")
    with pytest.raises(InvalidArgument, match="exists already"):
        create(tables, "q", "s")
    assert len(subs_of(tables).subscriptions()[0]) == 1


def test_alter_changes_the_settings_and_touch_the_activity(tables: Tables):
    tables.create("q")
    _, sub = create(tables, "q", "s")
    store = subs_of(tables)
    changed = dataclasses.replace(sub, filter="id > 3", max_lag=10, expire_after_s=30.0)
    store.alter_subscription(changed)
    store.touch_subscriptions([sub], LATER)
    store.touch_subscriptions([], LATER + 1)
    (got,) = store.subscriptions()[0]
    assert got == dataclasses.replace(changed, time_active_ns=LATER)


def test_a_missing_subscription_is_not_found(tables: Tables):
    tables.create("q")
    store = subs_of(tables)
    ghost = Subscription("q", "ghost")
    with pytest.raises(TableNotFound):
        store.alter_subscription(ghost)
    with pytest.raises(TableNotFound):
        store.drop_subscription("q", "ghost", ghost.state_table)
    create(tables, "q", "s")
    with pytest.raises(TableNotFound):
        store.alter_subscription(ghost)
    with pytest.raises(TableNotFound):
        store.drop_subscription("q", "ghost", ghost.state_table)


def test_drop_removes_the_definition_and_its_state_table(tables: Tables):
    tables.create("q")
    _, a = create(tables, "q", "a")
    _, b = create(tables, "q", "b")
    store = subs_of(tables)
    store.drop_subscription("q", "a", a.state_table)
    defs, columns = store.subscriptions()
    assert [s.name for s in defs] == ["b"]
    assert a.state_table not in columns and b.state_table in columns


def test_lag_counts_unsettled_rows_whose_message_row_is_there(tables: Tables):
    tables.create("q")
    _, sub = create(tables, "q", "s")
    for i in range(1, 6):
        tables.insert("q", i)
    subs_of(tables).fanout(config(tables, "q"), loaded(tables, "q"), LATER, 100)
    for i in range(1, 6):
        tables.update(sub.state_table, i, time_created=NOW + i)
    tables.update(sub.state_table, 1, time_acked=LATER)  # settled
    tables.update(sub.state_table, 2, time_next=DEAD_TIME_NEXT)  # dead in place
    tables.delete("q", 3)  # purged meanwhile: nothing left to deliver
    store = subs_of(tables)
    lag = store.subscription_lag({sub.state_table: "q", "q__gone": "q"}, 100)
    assert lag == {sub.state_table: (2, NOW + 4)}
    assert store.subscription_lag({sub.state_table: "q"}, 1)[sub.state_table][0] == 1


def test_orphans_are_deleted_step_by_step(tables: Tables):
    tables.create("q")
    _, sub = create(tables, "q", "s")
    for i in range(1, 6):
        tables.insert("q", i)
    store = subs_of(tables)
    store.fanout(config(tables, "q"), loaded(tables, "q"), LATER, 100)
    tables.update(sub.state_table, 1, time_acked=LATER)  # settled: not looked at
    tables.delete("q", 1)
    tables.delete("q", 2)
    tables.delete("q", 4)
    assert store.delete_orphans(sub.state_table, "q", None, 2) == (1, 3)  # rows 2, 3
    assert store.delete_orphans(sub.state_table, "q", 3, 2) == (1, 5)  # rows 4, 5
    assert store.delete_orphans(sub.state_table, "q", 5, 2) == (0, None)
    assert state_ids(tables, sub) == [1, 3, 5]
    assert store.delete_orphans("q__gone", "q", None, 2) == (0, None)


def test_a_state_table_is_polled_with_its_message_rows_columns(tables: Tables):
    tables.create("q")
    create(tables, "q", "s")
    for i in (1, 2):
        tables.insert("q", i, message=f"m{i}")
    subs_of(tables).fanout(config(tables, "q"), loaded(tables, "q"), LATER, 100)
    tables.delete("q", 2)  # a state row whose message row is gone is not polled
    cfg = loaded(tables, "q")["s"].config
    rows, _ = tables.store.poll(cfg, LATER, 100)
    assert [tuple(r[3:]) for r in rows] == [(1, "m1")]


def test_the_purge_waits_for_every_subscription_that_holds_the_table(tables: Tables):
    tables.create("q")
    _, sub = create(tables, "q", "s")
    tables.insert("q", 1)
    tables.insert("q", 2)
    cfg = config(tables, "q")
    assert tables.store.purge(cfg, LATER, 100) == 0  # handed over to none yet
    tables.update("q", 1, time_acked=NOW)
    tables.update("q", 2, time_acked=NOW)
    assert tables.store.purge(cfg, LATER, 100) == 0  # not handed over yet
    subs_of(tables).fanout(cfg, loaded(tables, "q"), NOW, 100)
    assert tables.store.purge(cfg, LATER, 100) == 0  # the subscription has not settled them
    tables.update(sub.state_table, 1, time_acked=NOW)
    assert tables.store.purge(cfg, LATER, 100) == 1
    assert tables.row("q", 1) is None and tables.row("q", 2) is not None


# -- a lazy subscription's verbs (msgtable.features.subscriptions.lazy) ------------------------
def test_a_lazy_subscription_is_stored_lazy_and_gets_no_state_rows_from_the_fanout(
    tables: Tables,
):
    tables.create("q")
    _, lazy = create(tables, "q", "lazy", state_rows="lazy")
    _, eager = create(tables, "q", "eager")
    defs = {s.name: s for s in subs_of(tables).subscriptions()[0]}
    assert (defs["lazy"].state_rows, defs["eager"].state_rows) == ("lazy", "eager")
    tables.insert("q", 1)
    tables.insert("q", 2)
    got, _ = subs_of(tables).fanout(config(tables, "q"), loaded(tables, "q"), LATER, 100)
    assert got == {"lazy": 2, "eager": 2, "": 2}, "the lazy one is told of its rows"
    assert state_ids(tables, lazy) == []
    assert state_ids(tables, eager) == [1, 2]


def test_the_lazy_scan_reads_rows_as_the_eager_state_tables_poll_does(tables: Tables):
    """A lazy subscription's poll reads the rows it was never sent from the message table
    (unsent_rows) as an eager one's poll reads its state rows: priority, time_next (a
    delayed message stays delayed, one the default group sent is due), epoch 0, the
    projection, time_created; each with its number."""
    tables.create_with("q", DEMO_COMMENT, {"region": "varchar(16)"})
    create(tables, "q", "eager", columns=("id", "region"))
    create(tables, "q", "lazy", columns=("id", "region"), state_rows="lazy")
    create(tables, "q", "eu", filter="region = 'eu'", state_rows="lazy")
    tables.insert("q", 1, priority=2, time_next=NOW + 5, region="eu")
    tables.insert("q", 2, epoch=3, time_next=NOW + 7, region="us")
    tables.insert("q", 3, region="eu")
    store, cfg = subs_of(tables), config(tables, "q")
    store.fanout(cfg, loaded(tables, "q"), LATER, 100)
    subs = loaded(tables, "q")
    polled, _ = tables.store.poll(subs["eager"].config, LATER, 100, created=True)
    scanned = store.unsent_rows(cfg, subs["lazy"].config, None, 0, 100)
    assert [r[-1] for r in scanned] == [1, 2, 3], "each one's number last"
    assert [r[:-1] for r in scanned] == sorted(polled, key=lambda r: r[3])
    assert list(store.unsent_rows(cfg, subs["lazy"].config, None, 2, 100)) == [scanned[2]]
    eu = subs["eu"]
    assert [(r[3], r[-1]) for r in store.unsent_rows(cfg, eu.config, eu.filter, 0, 100)] == [
        (1, 1),
        (3, 3),
    ]


def test_lazy_state_rows_keep_a_row_there_and_ack_unless_dead(tables: Tables):
    tables.create("q")
    _, lazy = create(tables, "q", "lazy", state_rows="lazy")
    for i in (1, 2, 3, 4):
        tables.insert("q", i)
    store, cfg = subs_of(tables), config(tables, "q")
    store.fanout(cfg, loaded(tables, "q"), LATER, 100)
    state = loaded(tables, "q")["lazy"].config
    assert store.write_state_rows(state, [(1, 0, NOW + 5, 1, NOW), (3, 0, None, 0, NOW)]) == 2
    store.write_state_rows(state, [(1, 7, NOW + 9, 4, NOW)])  # there already: kept
    one = tables.row(lazy.state_table, 1)
    assert one is not None
    assert (one["priority"], one["time_next"], one["epoch"], one["time_acked"]) == (
        0,
        NOW + 5,
        1,
        None,
    )
    tables.update(lazy.state_table, 3, time_next=DEAD_TIME_NEXT)  # dead in place
    store.write_state_rows(state, [(1, 0, None, 1, NOW), (2, 0, None, 1, NOW)], LATER)
    store.write_state_rows(state, [(3, 0, None, 1, NOW)], LATER)
    rows = {i: tables.row(lazy.state_table, i) or {} for i in (1, 2, 3)}
    assert [(rows[i]["time_acked"], rows[i]["time_next"]) for i in (1, 2, 3)] == [
        (LATER, None),
        (LATER, None),
        (None, DEAD_TIME_NEXT),
    ], "acked where there was a row or none; a dead one stays dead"
    assert [r[-1] for r in store.unsent_rows(cfg, state, None, 0, 100)] == [4]
    assert store.written_of(state, [1, 2, 3, 4, 5]) == {1, 2, 3}, "the ids with a state row"
    assert store.written_of(state, []) == set()


def test_the_purge_waits_for_a_lazy_subscriptions_cursor(tables: Tables):
    """A lazy subscription has no state row for a message it was never sent: its cursor
    holds the purge until it passes the row (and a state row past it, as any holder's)."""
    tables.create("q")
    create(tables, "q", "lazy", state_rows="lazy")
    for i in (1, 2, 3):
        tables.insert("q", i)
    store = subs_of(tables)
    cfg = dataclasses.replace(config(tables, "q"), cursored=("lazy",))
    store.fanout(cfg, loaded(tables, "q"), NOW, 100)  # numbered 1, 2, 3
    for i in (1, 2, 3):
        tables.update("q", i, time_acked=NOW)
    assert tables.store.purge(cfg, LATER, 100) == 0, "purged what the cursor did not pass"
    state = loaded(tables, "q")["lazy"].config
    store.write_state_rows(state, [(2, 0, NOW + 5, 1, NOW)])  # postponed: unsettled
    assert store.advance_cursor("q", "lazy", 0, 2)
    assert tables.store.purge(cfg, LATER, 100) == 1
    assert [tables.row("q", i) is None for i in (1, 2, 3)] == [True, False, False]


def test_a_lazy_subscriptions_unsent_lag_counts_above_its_cursor(tables: Tables):
    tables.create_with("q", DEMO_COMMENT, {"region": "varchar(16)"})
    create(tables, "q", "lazy", state_rows="lazy")
    create(tables, "q", "eu", filter="region = 'eu'", state_rows="lazy")
    for i, region in ((1, "eu"), (2, "us"), (3, "eu"), (4, "us")):
        tables.insert("q", i, region=region)
    store, cfg = subs_of(tables), config(tables, "q")
    store.fanout(cfg, loaded(tables, "q"), LATER, 100)  # numbered 1-4
    subs = loaded(tables, "q")
    n, oldest = store.unsent_lag(cfg, subs["lazy"], 100)
    assert n == 4 and oldest == min(tables.created("q", i) or 0 for i in (1, 2, 3, 4))
    assert store.unsent_lag(cfg, subs["lazy"], 3)[0] == 3, "up to the cap"
    assert store.unsent_lag(cfg, subs["eu"], 100)[0] == 2
    store.write_state_rows(subs["lazy"].config, [(3, 0, None, 1, NOW)])  # held by its row
    assert store.advance_cursor("q", "lazy", 0, 1)
    assert store.unsent_lag(cfg, subs["lazy"], 100)[0] == 2  # 2 and 4


def test_a_lazy_subscriptions_settled_state_rows_wait_for_its_cursor(tables: Tables):
    """A settled state row of a message above a lazy subscription's cursor stays: purged,
    the cursor's scan would read the message again (it skips only rows that have one)."""
    tables.create("q")
    create(tables, "q", "lazy", state_rows="lazy")
    for i in (1, 2):
        tables.insert("q", i)
    store = subs_of(tables)
    store.fanout(config(tables, "q"), loaded(tables, "q"), NOW, 100)  # numbered 1, 2
    state = loaded(tables, "q")["lazy"].config
    assert state.cursored == ("lazy",)
    store.write_state_rows(state, [(1, 0, None, 1, NOW), (2, 0, None, 1, NOW)], NOW)
    assert tables.store.purge(state, LATER, 100) == 0, "purged above the cursor"
    assert [r[-1] for r in store.unsent_rows(config(tables, "q"), state, None, 0, 100)] == []
    assert store.advance_cursor("q", "lazy", 0, 1)
    assert tables.store.purge(state, LATER, 100) == 1
    assert tables.row(state.name, 1) is None and tables.row(state.name, 2) is not None


def test_a_cursor_restarts_at_the_sequences_last(tables: Tables):
    tables.create("q")
    create(tables, "q", "lazy", state_rows="lazy")
    for i in (1, 2, 3):
        tables.insert("q", i)
    store = subs_of(tables)
    store.fanout(config(tables, "q"), loaded(tables, "q"), NOW, 100)  # numbered 1-3
    assert store.subscription_cursor("q", "lazy") == 0
    store.restart_cursor("q", "lazy")
    assert store.subscription_cursor("q", "lazy") == 3
    store.restart_cursor("q", "nope")  # none: nothing made
    assert store.subscription_cursor("q", "nope") is None
