"""The Store contract: every case runs on InMemoryStore and on MySQLStore, so the fake cannot
drift from the real store (msgtable.testing.memory says it mirrors it statement by statement).

Each case sets up its table through a small adapter (``Tables``, in contract_tables.py): on
MySQL real DDL and DML on the test's own connection, in memory InMemoryStore's helpers; then it
asks the store and reads the rows back. A case that passes on one store and fails on the other
is a drift: fix the fake (or the real store), never the case.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any

import pytest

from msgtable.core.rows import CachedRow, PollKey
from msgtable.core.tables import (
    DEAD_TIME_NEXT,
    DEMO_COMMENT,
    Column,
    Layout,
    TableConfig,
    load_table,
)
from msgtable.errors import NotLeader, TableNotFound, Unavailable
from msgtable.store.backlog import BacklogCounts
from msgtable.store.protocol import Store
from msgtable.testing import CURRENT_COLUMNS

from .contract_tables import (
    V2018_COLUMNS,
    V2018_UNIQUE,
    Tables,
    both_stores,  # noqa: F401 (the tables fixture)
)

NS = 10**9
NOW = 1_700_000_000 * NS
LATER = NOW + 600 * NS  # a new time_next the cases write
CREATED = NOW - 90 * NS  # a time_created the cases write


# -- helpers of the cases -------------------------------------------------------------------
def poll_all(t: Tables, cfg: TableConfig, now_ns: int = NOW) -> list[CachedRow]:
    rows, _ = t.store.poll(cfg, now_ns, 1000)
    return [CachedRow(r[0], r[1], r[2], tuple(r[3:])) for r in rows]


def one_pass(t: Tables, cfg: TableConfig, limit: int) -> tuple[list[Any], list[PollKey]]:
    """A pass of polls of ``limit`` rows each: the ids read, and the key each poll returned."""
    read: list[Any] = []
    keys: list[PollKey] = []
    after: PollKey | None = None
    while True:
        rows, after = t.store.poll(cfg, NOW, limit, after)
        if after is None:
            assert rows == []
            return read, keys
        assert 0 < len(rows) <= limit
        read.extend(r[3] for r in rows)
        keys.append(after)


def ids(rows: list[CachedRow]) -> list[Hashable]:
    return [r.id for r in rows]


class Deliveries:
    """A deliver callback that records what it got and whether the rows were held then."""

    def __init__(self, t: Tables, table: str) -> None:
        self.t, self.table = t, table
        self.calls: list[list[Hashable]] = []
        self.held: list[bool] = []

    def __call__(self, rows: list[CachedRow]) -> None:
        self.calls.append(ids(rows))
        self.held.extend(self.t.held(self.table, r.id) for r in rows)


FRESH = {"priority": 0, "time_next": 0, "epoch": 0, "time_acked": None, "message": None}


def fresh(i: int, **engine: Any) -> dict[str, Any]:
    """Row i of a current-layout table as an insert of its id makes it, with ``engine``."""
    return {"id": i, **FRESH, **engine}


def rows_of(t: Tables, table: str, span: range) -> dict[int, dict[str, Any] | None]:
    return {i: t.row(table, i) for i in span}


def stale_batch(t: Tables) -> tuple[TableConfig, list[CachedRow]]:
    """Table q's rows 1-5 as a poll read them; since then another client acked row 2,
    rescheduled row 3, re-versioned row 4 and deleted row 5."""
    cfg = t.create("q")
    for i in range(1, 6):
        t.insert("q", i)
    batch = poll_all(t, cfg)
    t.update("q", 2, time_acked=NOW - 1, time_next=None)
    t.update("q", 3, time_next=NOW + 1)
    t.update("q", 4, epoch=7)
    t.delete("q", 5)
    return cfg, batch


def kinds(columns: tuple[Column, ...]) -> list[tuple[str, str]]:
    return [(c.name, c.data_type) for c in columns]


def raised(call: Callable[[], object]) -> str:
    try:
        call()
    except Exception as exc:
        return type(exc).__name__
    return "nothing"


def outcomes(store: Store, cfg: TableConfig, batch: list[CachedRow]) -> dict[str, str]:
    """What each statement of STATEMENTS raised (by name)."""
    return {n: raised(lambda c=c: c(store, cfg, batch)) for n, c in STATEMENTS.items()}


# -- the adapter itself: rows as the schema files make them ----------------------------------
@pytest.mark.parametrize("layout", [Layout.CURRENT, Layout.V2018])
def test_a_row_inserted_with_its_message_only_gets_the_schema_defaults(
    tables: Tables, layout: Layout
):
    tables.create("q", layout)
    if layout is Layout.CURRENT:
        tables.insert("q", 1, message="hi")
        assert tables.row("q", 1) == fresh(1, message="hi")
        created = tables.created("q", 1)
        assert created is not None and abs(created - time.time_ns()) < 60 * 10**9  # now
    else:  # time_scheduled is part of the 2018 primary key: an insert must set it
        tables.insert("q", 1, message="hi", time_scheduled=NOW)
        nulls = dict.fromkeys(("time_next", "epoch", "time_acked"))
        assert tables.row("q", 1) == {"id": 1, "message": "hi", "time_scheduled": NOW, **nulls}
        assert tables.created("q", 1) is None


# -- discover ---------------------------------------------------------------------------------
def test_discover_describes_message_tables_only_as_load_table_needs_them(tables: Tables):
    tables.create("q")
    tables.create("old", Layout.V2018)
    tables.create_plain("plain", "just a table")
    tables.create_plain("near", DEMO_COMMENT.replace("vitess_message", "vitess_messages"))
    tables.create_plain("upper", DEMO_COMMENT.replace("vitess_message", "VITESS_MESSAGE"))
    tables.create_plain("spaced", " " + DEMO_COMMENT)  # MySQLStore's LIKE 'vitess%'
    found = tables.store.discover()
    assert [d.name for d in found] == ["old", "q"]
    old, q = found
    assert q.comment == old.comment == DEMO_COMMENT
    # column_type is the server's spelling ("bigint(20)" on MariaDB): load_table reads the rest
    assert kinds(q.columns) == kinds(CURRENT_COLUMNS)
    assert kinds(old.columns) == kinds(V2018_COLUMNS)
    assert set(q.unique_indexes) == {("id",)}
    assert set(old.unique_indexes) == set(V2018_UNIQUE)
    configs = [load_table(d.name, d.comment, d.columns, d.unique_indexes) for d in found]
    assert [c.layout for c in configs] == [Layout.V2018, Layout.CURRENT]
    assert [[m.name for m in c.message_columns] for c in configs] == [["id", "message"]] * 2


# -- poll -------------------------------------------------------------------------------------
def test_poll_reads_unacked_rows_whose_time_next_is_null_zero_or_not_after_now(tables: Tables):
    cfg = tables.create("q")
    tables.insert("q", 1, time_next=None)
    tables.insert("q", 2, time_next=0)
    tables.insert("q", 3, time_next=NOW - NS)
    tables.insert("q", 4, time_next=NOW)
    tables.insert("q", 5, time_next=NOW + NS)  # within a poll's 30 s lookahead
    tables.insert("q", 6, time_next=NOW + 60 * NS)
    tables.insert("q", 7, time_next=None, time_acked=NOW - NS)
    tables.insert("q", 8, time_next=0, time_acked=NOW - NS)  # acked rows never, however due
    assert sorted(ids(poll_all(tables, cfg))) == [1, 2, 3, 4]
    assert sorted(ids(poll_all(tables, cfg, NOW + 30 * NS))) == [1, 2, 3, 4, 5]


ORDER_CASE = [(1, 1, None), (2, 0, 5), (3, 0, None), (4, 0, 0), (5, 0, 5), (6, 1, 0), (7, 0, None)]
IN_ORDER = [3, 7, 4, 2, 5, 1, 6]  # priority, then time_next with NULL first, then id


def insert_order_case(tables: Tables) -> TableConfig:
    cfg = tables.create("q")
    for i, priority, time_next in ORDER_CASE:
        tables.insert("q", i, priority=priority, time_next=time_next, epoch=i, message=f"m{i}")
    tables.insert("q", 8, time_next=NOW + NS)  # not due: never read
    return cfg


def test_a_poll_asked_for_time_created_reads_it_last(tables: Tables):
    cfg = tables.create("q")
    tables.insert("q", 1, time_created=NOW - NS, message="a")
    tables.insert("q", 2, time_created=None)
    rows, key = tables.store.poll(cfg, NOW, 10, created=True)
    assert [tuple(r) for r in rows] == [(0, 0, 0, 1, "a", NOW - NS), (0, 0, 0, 2, None, None)]
    assert key == (0, 0, 2)


def test_poll_orders_by_priority_then_time_next_null_first_then_id(tables: Tables):
    cfg = insert_order_case(tables)
    rows, key = tables.store.poll(cfg, NOW, 100)
    by_id = {i: (p, t) for i, p, t in ORDER_CASE}
    assert [tuple(r) for r in rows] == [(*by_id[i], i, i, f"m{i}") for i in IN_ORDER]
    assert key == (1, 0, 6)
    assert tables.store.poll(cfg, NOW, 3) == (rows[:3], (0, 0, 4))


def test_a_pass_of_limited_polls_reads_each_due_row_once(tables: Tables):
    cfg = insert_order_case(tables)
    keys = [(0, None, 7), (0, 5, 2), (1, None, 1), (1, 0, 6)]  # two continue after a NULL
    assert one_pass(tables, cfg, 2) == (IN_ORDER, keys)
    rows, _ = tables.store.poll(cfg, NOW, 1, (0, None, 3))
    assert [r[3] for r in rows] == [7]


def test_the_redelivery_poll_reads_the_due_rows_given_a_time_of_each_priority(tables: Tables):
    cfg = insert_order_case(tables)  # given a time: 2 and 5 (priority 0, at 5), 8 (not due)
    tables.insert("q", 9, priority=3, time_next=NOW - NS, time_created=NOW - 2 * NS)
    tables.insert("q", 10, priority=2, time_next=NOW - NS, time_acked=NOW)  # acked: never
    rows = tables.store.poll_timed(cfg, NOW, 10)
    assert [r[3] for r in rows] == [2, 5, 9]  # as a poll reads them, best first
    assert tuple(rows[-1]) == (3, NOW - NS, 0, 9, None, NOW - 2 * NS)  # time_created last
    assert [r[3] for r in tables.store.poll_timed(cfg, NOW + NS, 10)] == [2, 5, 8, 9]
    assert [r[3] for r in tables.store.poll_timed(cfg, NOW + NS, 2)] == [2, 5]
    old = tables.create("old", Layout.V2018)  # its passes read every row in time order
    tables.insert("old", 1, time_scheduled=NOW - 2, time_next=NOW - 1, epoch=1)
    assert tables.store.poll_timed(old, NOW, 10) == []


def test_the_2018_layout_polls_time_scheduled_where_time_next_is_null(tables: Tables):
    cfg = tables.create("old", Layout.V2018)
    tables.insert("old", 1, time_scheduled=NOW - 2, time_next=None, epoch=1, message="a")
    tables.insert("old", 2, time_scheduled=NOW + NS, time_next=None, epoch=1)  # not yet
    tables.insert("old", 3, time_scheduled=NOW + NS, time_next=NOW - 3, epoch=None)
    tables.insert("old", 4, time_scheduled=0, time_next=None, epoch=0)
    tables.insert("old", 5, time_scheduled=NOW - 2, time_next=None, time_acked=NOW)
    rows, key = tables.store.poll(cfg, NOW, 10)
    assert [tuple(r) for r in rows] == [
        (0, 0, 0, 4, None),
        (0, NOW - 3, None, 3, None),
        (0, NOW - 2, 1, 1, "a"),
    ]
    assert key == (0, NOW - 2, 1)
    assert one_pass(tables, cfg, 1) == ([4, 3, 1], [(0, 0, 4), (0, NOW - 3, 3), (0, NOW - 2, 1)])


FLOOR = NOW - 10 * NS  # an old lease's end (msgtable.engine.tenure.Tenure.hold_floor_ns)


def test_a_poll_with_a_floor_reads_only_rows_due_or_created_after_it(tables: Tables):
    cfg = tables.create("q")
    tables.insert("q", 1, time_next=0, time_created=FLOOR - NS)  # there and due before it
    tables.insert("q", 2, time_next=None, time_created=FLOOR)  # at it: held
    tables.insert("q", 3, time_next=0, time_created=FLOOR + 1)  # inserted after it
    tables.insert("q", 4, time_next=FLOOR + 1, time_created=FLOOR - NS)  # due after it
    tables.insert("q", 5, time_next=0, time_created=None)  # age unknown, due since ever
    tables.insert("q", 6, priority=1, time_next=None, time_created=NOW)  # NULL time_next
    rows, key = tables.store.poll(cfg, NOW, 10, floor_ns=FLOOR)
    assert [r[3] for r in rows] == [3, 4, 6]
    assert key == (1, None, 6)
    # a pass with the floor continues after its key, and created=True reads the same rows
    rows, _ = tables.store.poll(cfg, NOW, 1, (0, 0, 3), created=True, floor_ns=FLOOR)
    assert [(r[3], r[-1]) for r in rows] == [(4, FLOOR - NS)]
    assert sorted(ids(poll_all(tables, cfg))) == [1, 2, 3, 4, 5, 6]  # no floor: all


def test_a_poll_with_a_floor_on_the_2018_layout_goes_by_time_scheduled(tables: Tables):
    cfg = tables.create("old", Layout.V2018)
    tables.insert("old", 1, time_scheduled=FLOOR - NS, time_next=None, epoch=0)
    tables.insert("old", 2, time_scheduled=FLOOR + NS, time_next=None, epoch=0)
    tables.insert("old", 3, time_scheduled=FLOOR - NS, time_next=FLOOR + 2 * NS, epoch=1)
    rows, _ = tables.store.poll(cfg, NOW, 10, floor_ns=FLOOR)
    assert [r[3] for r in rows] == [2, 3]


# -- claim and send ---------------------------------------------------------------------------
def test_claim_writes_time_next_and_epoch_plus_one_and_delivers_inside_its_transaction(
    tables: Tables,
):
    cfg = tables.create("q")
    for i, epoch in [(1, 0), (2, 3), (3, 0)]:
        tables.insert("q", i, epoch=epoch)
    asked: list[int] = []

    def next_ns(epoch: int) -> int:
        asked.append(epoch)
        return LATER + epoch

    deliver = Deliveries(tables, "q")
    claimed = tables.store.claim(cfg, poll_all(tables, cfg), NOW, next_ns, deliver)
    assert sorted(ids(claimed)) == [1, 2, 3]
    assert deliver.calls == [ids(claimed)] and deliver.held == [True] * 3
    assert not tables.held("q", 1)  # committed
    assert sorted(asked) == [0, 3]
    new = {i: (r["time_next"], r["epoch"]) for i in (1, 2, 3) if (r := tables.row("q", i))}
    assert new == {1: (LATER, 1), 2: (LATER + 3, 4), 3: (LATER, 1)}


def test_claim_leaves_rows_acked_rescheduled_re_versioned_or_deleted_since_the_poll(
    tables: Tables,
):
    cfg, batch = stale_batch(tables)
    before = rows_of(tables, "q", range(2, 6))
    deliver = Deliveries(tables, "q")
    assert ids(tables.store.claim(cfg, batch, NOW, lambda e: LATER, deliver)) == [1]
    assert deliver.calls == [[1]]
    assert rows_of(tables, "q", range(2, 6)) == before
    assert tables.row("q", 1) == fresh(1, time_next=LATER, epoch=1)


def test_claim_leaves_a_stale_copy_of_a_row_it_claimed_already_for_the_same_time(
    tables: Tables,
):
    # Row 1 was claimed (epoch 1, time_next LATER) since this batch read it at epoch 0.
    cfg = tables.create("q")
    for i in (1, 2):
        tables.insert("q", i)
    batch = poll_all(tables, cfg)
    tables.store.claim(cfg, batch[:1], NOW, lambda e: LATER, lambda r: None)  # row 1: epoch 1
    deliver = Deliveries(tables, "q")
    assert ids(tables.store.claim(cfg, batch, NOW, lambda e: LATER, deliver)) == [2]
    assert deliver.calls == [[2]]


def test_a_claim_or_send_that_matches_no_row_delivers_nothing(tables: Tables):
    cfg = tables.create("q")
    tables.insert("q", 1)
    batch = poll_all(tables, cfg)
    tables.update("q", 1, time_acked=NOW, time_next=None)
    deliver = Deliveries(tables, "q")
    assert tables.store.claim(cfg, batch, NOW, lambda e: LATER, deliver) == []
    assert tables.store.send(cfg, batch, NOW, deliver) == []
    assert deliver.calls == []


def test_a_claim_whose_deliver_raises_writes_nothing(tables: Tables):
    cfg = tables.create("q")
    for i in (1, 2):
        tables.insert("q", i)
    batch = poll_all(tables, cfg)

    def deliver(rows: list[CachedRow]) -> None:
        raise NotLeader("the lease ended during the claim")

    with pytest.raises(NotLeader):
        tables.store.claim(cfg, batch, NOW, lambda e: LATER, deliver)
    assert [tables.row("q", i) for i in (1, 2)] == [fresh(1), fresh(2)]
    assert not tables.held("q", 1)
    assert ids(tables.store.claim(cfg, batch, NOW, lambda e: LATER, lambda r: None)) == [1, 2]


def test_send_delivers_inside_a_lock_the_rows_still_due_and_unchanged_and_writes_nothing(
    tables: Tables,
):
    cfg, batch = stale_batch(tables)
    before = rows_of(tables, "q", range(1, 6))
    deliver = Deliveries(tables, "q")
    assert ids(tables.store.send(cfg, batch, NOW, deliver)) == [1]
    assert deliver.calls == [[1]] and deliver.held == [True]
    assert not tables.held("q", 1)
    assert rows_of(tables, "q", range(1, 6)) == before


def test_the_2018_layout_sends_and_claims_by_time_scheduled_and_a_null_epoch(tables: Tables):
    cfg = tables.create("old", Layout.V2018)
    for i in (1, 2, 3):
        tables.insert("old", i, time_scheduled=NOW - 1, time_next=None, epoch=None)
    batch = poll_all(tables, cfg)
    assert [r.epoch for r in batch] == [None] * 3
    tables.update("old", 2, epoch=0)  # NULL -> 0 is a new version
    tables.update("old", 3, time_scheduled=NOW + NS)  # no longer due
    deliver = Deliveries(tables, "old")
    assert ids(tables.store.send(cfg, batch, NOW, deliver)) == [1]
    asked: list[int] = []
    claimed = tables.store.claim(cfg, batch, NOW, lambda e: asked.append(e) or LATER, deliver)
    assert ids(claimed) == [1] and asked == [0] and deliver.calls == [[1], [1]]
    row = tables.row("old", 1)
    assert row is not None and (row["time_next"], row["epoch"]) == (LATER, 1)
    assert row["time_scheduled"] == NOW - 1


# -- postpone ---------------------------------------------------------------------------------
def test_postpone_moves_only_rows_still_due_at_the_send_and_at_the_epoch_sent(tables: Tables):
    cfg = tables.create("q")
    tables.insert("q", 1, time_next=NOW, epoch=2)  # due at the send: moved
    tables.insert("q", 2, time_next=None, epoch=2)  # due (NULL): moved
    tables.insert("q", 3, time_next=None, epoch=2, time_acked=NOW)  # acked first: counted only
    tables.insert("q", 4, time_next=NOW + 1, epoch=2)  # rescheduled since the send
    tables.insert("q", 5, time_next=NOW - 1, epoch=3)  # re-versioned since the send
    before = rows_of(tables, "q", range(1, 6))
    assert tables.store.postpone(cfg, [1, 2, 3, 4, 5, 6], 2, NOW, LATER) == 3
    after = rows_of(tables, "q", range(1, 6))
    assert after[1] == fresh(1, time_next=LATER, epoch=3)
    assert after[2] == fresh(2, time_next=LATER, epoch=3)
    assert after[3] == fresh(3, time_next=None, epoch=3, time_acked=NOW)
    assert (after[4], after[5]) == (before[4], before[5])


def test_the_2018_layout_postpones_by_time_scheduled_and_a_null_epoch(tables: Tables):
    cfg = tables.create("old", Layout.V2018)
    tables.insert("old", 1, time_scheduled=NOW - 1, time_next=None, epoch=None)  # moved
    tables.insert("old", 2, time_scheduled=NOW + 1, time_next=None, epoch=None)  # not due
    tables.insert("old", 3, time_scheduled=NOW + 1, time_next=NOW - 1, epoch=None)  # moved
    tables.insert("old", 4, time_scheduled=NOW - 1, time_next=None, epoch=0)  # not at NULL
    before = rows_of(tables, "old", range(1, 5))
    assert tables.store.postpone(cfg, [1, 2, 3, 4], None, NOW, LATER) == 2
    after = rows_of(tables, "old", range(1, 5))
    for i in (1, 3):
        assert after[i] == {**before[i], "time_next": LATER, "epoch": 1}
    assert (after[2], after[4]) == (before[2], before[4])


# -- ack --------------------------------------------------------------------------------------
def test_ack_acks_only_rows_unacked_before_and_clears_their_time_next(tables: Tables):
    cfg = tables.create("q")
    tables.insert("q", 1, time_next=NOW - 1, epoch=4)
    tables.insert("q", 2, time_next=None, epoch=4, time_acked=NOW - NS)
    tables.insert("q", 3, time_next=NOW + NS, epoch=4)
    assert tables.store.ack(cfg, [1, 2, 9], NOW) == 1
    assert tables.row("q", 1) == fresh(1, time_next=None, epoch=4, time_acked=NOW)
    assert tables.row("q", 2) == fresh(2, time_next=None, epoch=4, time_acked=NOW - NS)
    assert tables.store.acked_ids(cfg, [1, 2, 3, 9], NOW) == {1}
    assert tables.store.acked_ids(cfg, [1, 2, 3, 9], NOW - NS) == {2}
    assert tables.store.unacked_ids(cfg, [1, 2, 3, 9]) == {3}
    assert tables.store.ack(cfg, [1, 3], NOW + 1) == 1


@pytest.mark.parametrize(
    "first",
    [{}, dict.fromkeys((1, 2, 3, 4), 4), dict.fromkeys((2, 4), 4)],
    ids=["none", "all", "some"],
)
def test_an_ack_counts_the_send_of_its_first_rows_that_it_acks(
    tables: Tables, first: dict[int, int]
):
    cfg = tables.create("q")
    for i in (1, 2, 3):
        tables.insert("q", i, epoch=4)
    tables.insert("q", 4, epoch=4, time_next=None, time_acked=NOW - 1)  # acked before
    assert tables.store.ack(cfg, [1, 2, 3, 4], NOW, first=first) == 3
    epochs = {i: r["epoch"] for i in (1, 2, 3, 4) if (r := tables.row("q", i))}
    assert epochs == {i: 5 if i in first and i != 4 else 4 for i in (1, 2, 3, 4)}
    assert tables.store.acked_ids(cfg, [1, 2, 3, 4], NOW) == {1, 2, 3}


# -- purge ------------------------------------------------------------------------------------
def test_purge_deletes_at_most_limit_rows_acked_before_the_cutoff_a_call(tables: Tables):
    cfg = tables.create("q")
    for i in range(1, 6):
        tables.insert("q", i, time_next=None, time_acked=NOW - i * NS)
    tables.insert("q", 6, time_next=None, time_acked=NOW)  # at the cutoff: kept
    tables.insert("q", 7)  # unacked
    tables.insert("q", 8, time_next=None, time_acked=NOW + NS)
    assert [tables.store.purge(cfg, NOW, 2) for _ in range(4)] == [2, 2, 1, 0]
    assert [i for i in range(1, 9) if tables.row("q", i) is not None] == [6, 7, 8]


# -- a dropped table, a database away ---------------------------------------------------------
Call = Callable[[Store, TableConfig, list[CachedRow]], object]
STATEMENTS: dict[str, Call] = {
    "poll": lambda s, cfg, batch: s.poll(cfg, NOW, 10),
    "poll after": lambda s, cfg, batch: s.poll(cfg, NOW, 10, (0, None, 1)),
    "claim": lambda s, cfg, batch: s.claim(cfg, batch, NOW, lambda e: LATER, lambda r: None),
    "send": lambda s, cfg, batch: s.send(cfg, batch, NOW, lambda r: None),
    "postpone": lambda s, cfg, batch: s.postpone(cfg, [1], 0, NOW, LATER),
    "ack": lambda s, cfg, batch: s.ack(cfg, [1], NOW),
    "ack first": lambda s, cfg, batch: s.ack(cfg, [1], NOW, first={1: 0}),
    "ack some first": lambda s, cfg, batch: s.ack(cfg, [1, 2], NOW, first={1: 0}),
    "acked_ids": lambda s, cfg, batch: s.acked_ids(cfg, [1], NOW),
    "unacked_ids": lambda s, cfg, batch: s.unacked_ids(cfg, [1]),
    "purge": lambda s, cfg, batch: s.purge(cfg, NOW, 10),
}


def test_every_statement_on_a_dropped_table_raises_table_not_found(tables: Tables):
    cfg = tables.create("q")
    tables.insert("q", 1)
    batch = poll_all(tables, cfg)
    tables.drop("q")
    assert tables.store.discover() == []
    assert outcomes(tables.store, cfg, batch) == dict.fromkeys(STATEMENTS, "TableNotFound")
    with pytest.raises(TableNotFound, match="'q'"):
        tables.store.poll(cfg, NOW, 10)


def test_every_statement_of_an_unreachable_database_raises_unavailable(tables: Tables):
    cfg = tables.create("q")
    tables.insert("q", 1)
    batch = poll_all(tables, cfg)
    down = tables.unreachable()
    try:
        assert outcomes(down, cfg, batch) == dict.fromkeys(STATEMENTS, "DatabaseUnavailable")
        with pytest.raises(Unavailable):
            down.discover()
    finally:
        down.close()


# -- the backlog (msgtable.store.backlog) ---------------------------------------------------------
def test_the_backlog_counts_unacked_live_rows_due_or_not_aged_by_time_created(tables: Tables):
    cfg = tables.create("q")
    tables.insert("q", 1, time_next=None, time_created=NOW - 10 * NS)
    tables.insert("q", 2, time_next=NOW + NS, time_created=NOW - 400 * NS)
    tables.insert("q", 3, time_next=NOW, time_created=None)  # due; no age but in +inf
    tables.insert("q", 4, time_next=None, time_acked=NOW - NS, time_created=NOW - 10**6 * NS)
    tables.insert("q", 5, time_next=DEAD_TIME_NEXT, time_created=NOW - 10**6 * NS)
    old = tables.create("old", Layout.V2018)
    tables.insert("old", 1, time_scheduled=NOW - 2, time_next=None, time_created=NOW - 90 * NS)
    tables.insert("old", 2, time_scheduled=NOW + NS, time_next=None)  # due later
    tables.insert("old", 3, time_scheduled=NOW + NS, time_next=NOW - 3)  # due: time_next
    gone = tables.create("gone")
    tables.drop("gone")
    got = tables.store.backlog([cfg, old, gone], NOW)
    assert got == {
        "q": BacklogCounts(2, 1, NOW - 400 * NS, (1, 1, 2, 2, 2, 2)),
        "old": BacklogCounts(2, 1, NOW - 90 * NS, (0, 1, 1, 1, 1, 1)),
    }, "a dropped table is left out"
    assert tables.store.backlog([], NOW) == {}


# -- settlement and dead letters (msgtable.core.settlement, msgtable.core.deadletters)
# -----------------
ERR = {"last_error": "varchar(40)"}
DEAD_COLS = {"time_dead": "bigint", "attempts": "bigint", "last_error": "varchar(40)"}


def settled_pair(t: Tables, dead: bool = True) -> tuple[TableConfig, TableConfig | None]:
    """Table s (with last_error; vt_dead_letter=s_dead when ``dead``) and s_dead; rows 1-6:
    1 never sent, 2 sent and postponed (epoch 1, due later), 3 sent and due again (epoch 1),
    4 acked, 5 dead in place, 6 sent and not postponed yet (epoch 0, due)."""
    d = t.create_with("s_dead", DEMO_COMMENT, DEAD_COLS) if dead else None
    extra = ",vt_dead_letter=s_dead" if dead else ""
    cfg = t.create_with(
        "s", DEMO_COMMENT + ",vt_max_attempts=3" + extra, {**ERR, "time_dead": "bigint"}
    )
    t.insert("s", 1, epoch=0, time_next=0, message="one")
    t.insert("s", 2, epoch=1, time_next=LATER)
    t.insert("s", 3, epoch=1, time_next=NOW - 1)
    t.insert("s", 4, epoch=1, time_next=None, time_acked=NOW - 5)
    t.insert("s", 5, epoch=2, time_next=DEAD_TIME_NEXT)
    t.insert("s", 6, epoch=0, time_next=0)
    return cfg, d


def test_release_moves_sent_live_rows_and_counts_an_uncounted_send(tables: Tables):
    cfg, _ = settled_pair(tables, dead=False)
    n = tables.store.release(cfg, [1, 2, 3, 4, 5, 6, 99], NOW + 5, "busy", first={6: 0})
    assert n == 3  # 2 and 3 (sent), 6 (its send counted now); not 1, 4, 5, 99
    got = {
        i: (r["epoch"], r["time_next"], r["last_error"])
        for i in range(1, 7)
        if (r := tables.row("s", i))
    }
    assert got == {
        1: (0, 0, None),
        2: (1, NOW + 5, "busy"),
        3: (1, NOW + 5, "busy"),
        4: (1, None, None),
        5: (2, DEAD_TIME_NEXT, None),
        6: (1, NOW + 5, "busy"),
    }


def test_renew_keeps_rows_in_their_wait_and_never_shortens_it(tables: Tables):
    cfg, _ = settled_pair(tables, dead=False)
    n = tables.store.renew(cfg, [1, 2, 3, 4, 5, 6], NOW, NOW + 10, None, first={6: 0})
    assert n == 2  # 2 (not due yet: LATER stays, the later time) and 6 (uncounted send)
    assert (tables.row("s", 2)["time_next"], tables.row("s", 2)["epoch"]) == (LATER, 1)  # type: ignore[index]
    assert (tables.row("s", 6)["time_next"], tables.row("s", 6)["epoch"]) == (NOW + 10, 1)  # type: ignore[index]
    assert tables.row("s", 3)["time_next"] == NOW - 1  # type: ignore[index]  # due again: not renewed
    assert tables.store.renew(cfg, [2], NOW, LATER + 7, "still", {}) == 1
    assert tables.row("s", 2)["time_next"] == LATER + 7  # type: ignore[index]


def test_a_renew_writes_its_first_rows_due_time_apart_from_the_others(tables: Tables):
    """first_until_ns: the due time of the sends the renew counts (the engine passes the
    later of the renew's and their postpone's), the others keep the GREATEST rule."""
    cfg, _ = settled_pair(tables, dead=False)
    n = tables.store.renew(cfg, [2, 6], NOW, NOW + 10, None, {6: 0}, None, NOW + 99)
    assert n == 2
    assert (tables.row("s", 6)["time_next"], tables.row("s", 6)["epoch"]) == (NOW + 99, 1)  # type: ignore[index]
    assert tables.row("s", 2)["time_next"] == LATER  # type: ignore[index]


def test_an_exact_renew_brings_a_due_time_in_as_well_as_out(tables: Tables):
    """exact (SQS's visibility timeout, counted from the call): every row renewed is due at
    the time given, sooner than it was or later."""
    cfg, _ = settled_pair(tables, dead=False)
    n = tables.store.renew(cfg, [2, 6], NOW, NOW + 10, None, {6: 0}, None, None, True)
    assert n == 2
    assert tables.row("s", 2)["time_next"] == NOW + 10  # type: ignore[index]  # was LATER
    assert (tables.row("s", 6)["time_next"], tables.row("s", 6)["epoch"]) == (NOW + 10, 1)  # type: ignore[index]


def test_a_reject_moves_live_rows_to_the_dead_letter_table_in_one_piece(tables: Tables):
    cfg, dead = settled_pair(tables)
    tables.update("s", 3, last_error="timeout")
    buried = tables.store.bury(cfg, dead, [1, 3, 4, 5, 6], NOW, None, first={6: 0})
    assert sorted(buried) == [1, 3, 6]  # 4 acked, 5 dead already
    assert [tables.row("s", i) is None for i in (1, 3, 6)] == [True] * 3
    got = {i: tables.row("s_dead", i) for i in (1, 3, 6)}
    assert {
        i: (r["message"], r["attempts"], r["last_error"], r["time_dead"])
        for i, r in got.items()
        if r
    } == {
        1: ("one", 0, "rejected", NOW),
        3: (None, 1, "timeout", NOW),
        6: (None, 1, "rejected", NOW),
    }
    assert {(r["epoch"], r["time_next"], r["time_acked"]) for r in got.values() if r} == {
        (0, NOW, None)
    }
    assert tables.store.bury(cfg, dead, [1], NOW, "again") == []


def test_an_expiry_buries_only_rows_still_at_the_epoch_read_and_due(tables: Tables):
    cfg, dead = settled_pair(tables)
    assert tables.store.bury(cfg, dead, [2, 3], NOW, None, {}, (1,)) == [3]  # 2 not due
    assert tables.store.bury(cfg, dead, [1], NOW, None, {}, (1,)) == []  # 1 at epoch 0
    # the reason, cut to fit last_error's varchar(40)
    reason = "no ack after 3 attempts (vt_max_attempts=3)"[:40]
    assert tables.row("s_dead", 3)["last_error"] == reason  # type: ignore[index]


def test_dead_in_place_is_marked_listed_counted_and_redriven(tables: Tables):
    cfg, _ = settled_pair(tables, dead=False)
    assert tables.store.bury(cfg, None, [1, 6], NOW, "bad", first={6: 0}) == [1, 6]
    row = tables.row("s", 6)
    assert row is not None
    assert (row["epoch"], row["time_next"], row["last_error"], row["time_dead"]) == (
        1,
        DEAD_TIME_NEXT,
        "bad",
        NOW,
    )
    listed = tables.store.dead_letters(cfg, None, None, 10)
    assert [(d.id, d.attempts, d.last_error) for d in listed] == [
        (1, 0, "bad"),
        (5, 2, None),
        (6, 1, "bad"),
    ]
    assert [d.id for d in tables.store.dead_letters(cfg, None, 1, 1)] == [5]
    assert tables.store.count_dead([(cfg, None)]) == {"s": 3}
    batch = tables.store.redrive(cfg, cfg, None, None, 2, NOW + 1)
    assert (batch.moved, batch.skipped, batch.last) == (2, (), 5)
    assert (tables.row("s", 5)["epoch"], tables.row("s", 5)["time_next"]) == (0, NOW + 1)  # type: ignore[index]
    assert tables.store.redrive(cfg, cfg, None, 5, 2, NOW + 1).last == 6
    assert tables.store.redrive(cfg, cfg, None, 6, 2, NOW + 1).last is None


# A send's count must be written once: an ack or settlement counts the send of its ``first``
# rows (sent, postpone not written) only where the row is still at the epoch that send read. A
# postpone whose UPDATE committed but whose answer was lost (a database link cut) leaves its rows
# in the server's hands as uncounted; the verb that comes next must not count them again (a
# dead letter then said 6 attempts of 5, in the fault suite), nor, counting them twice, take the
# current delivery for a later one.
COUNTS_ONCE: dict[str, Callable[[Store, TableConfig, TableConfig | None], object]] = {
    "ack": lambda s, cfg, dead: s.ack(cfg, [6, 7], NOW, first={6: 0, 7: 0}),
    "release": lambda s, cfg, dead: s.release(cfg, [6, 7], NOW + 5, None, first={6: 0, 7: 0}),
    "release of attempt 1": lambda s, cfg, dead: s.release(
        cfg, [6, 7], NOW + 5, None, first={6: 0, 7: 0}, attempts=[1, 1]
    ),
    "renew": lambda s, cfg, dead: s.renew(cfg, [6, 7], NOW, NOW + 10, None, first={6: 0, 7: 0}),
    "renew of attempt 1": lambda s, cfg, dead: s.renew(
        cfg, [6, 7], NOW, NOW + 10, None, first={6: 0, 7: 0}, attempts=[1, 1]
    ),
    "exact renew": lambda s, cfg, dead: s.renew(
        cfg, [6, 7], NOW, NOW + 10, None, {6: 0, 7: 0}, None, None, True
    ),
    "reject in place": lambda s, cfg, dead: len(
        s.bury(cfg, None, [6, 7], NOW, None, first={6: 0, 7: 0})
    ),
    "reject": lambda s, cfg, dead: len(s.bury(cfg, dead, [6, 7], NOW, None, first={6: 0, 7: 0})),
}


@pytest.mark.parametrize("verb", COUNTS_ONCE)
def test_a_send_its_postpone_counted_is_not_counted_again(tables: Tables, verb: str):
    """6 and 7 were sent at epoch 0; 6's postpone wrote epoch 1, but its server did not hear
    so and names it among the first rows: each verb takes both, and both end at epoch 1 (a
    reject's dead letters with 1 attempt)."""
    dead_table = verb == "reject"
    cfg, dead = settled_pair(tables, dead=dead_table)
    tables.insert("s", 7, epoch=0, time_next=0)
    assert tables.store.postpone(cfg, [6], 0, NOW - 1, LATER) == 1
    assert COUNTS_ONCE[verb](tables.store, cfg, dead) == 2
    table = "s_dead" if dead_table else "s"
    column = "attempts" if dead_table else "epoch"
    got = {i: r[column] for i in (6, 7) if (r := tables.row(table, i))}
    assert got == {6: 1, 7: 1}


def test_a_redrive_moves_dead_letters_back_fresh_and_skips_ids_taken_again(tables: Tables):
    cfg, dead = settled_pair(tables)
    assert dead is not None
    assert sorted(tables.store.bury(cfg, dead, [1, 3], NOW, "x")) == [1, 3]
    tables.insert("s", 3, message="new three")
    assert tables.store.count_dead([(cfg, dead)]) == {"s": 2}
    batch = tables.store.redrive(dead, cfg, None, None, 10, NOW + 2)
    assert (batch.moved, batch.skipped, batch.last) == (1, (3,), 3)
    row = tables.row("s", 1)
    assert row is not None
    assert (
        row["message"],
        row["epoch"],
        row["time_next"],
        row["time_acked"],
        row["last_error"],
    ) == (
        "one",
        0,
        NOW + 2,
        None,
        "x",
    )
    assert tables.row("s_dead", 1) is None and tables.row("s_dead", 3) is not None
    assert tables.store.redrive(dead, cfg, [3], 3, 10, NOW).last is None


# -- ordering per key (msgtable.engine.ordered)
# --------------------------------------------------------
def ordered_rows(t: Tables) -> TableConfig:
    """Table o: keys a (1, 3, 5 acked, 6 dead, 7), b (2, 4 due later), c (8 acked only), and
    NULL (9 due, 10 due later)."""
    cfg = t.create_ordered("o")
    for i, k in [(1, "a"), (2, "b"), (3, "a"), (4, "b"), (5, "a"), (6, "a"), (7, "a")]:
        t.insert("o", i, k=k)
    t.insert("o", 8, k="c")
    t.insert("o", 9)
    t.insert("o", 10)
    t.update("o", 5, time_acked=NOW - 1, time_next=None)
    t.update("o", 6, time_next=DEAD_TIME_NEXT, epoch=3)
    t.update("o", 4, time_next=LATER)
    t.update("o", 8, time_acked=NOW - 1, time_next=None)
    t.update("o", 10, time_next=LATER)
    return cfg


def test_order_keys_lists_the_keys_with_unsettled_rows_in_key_order_after_a_cursor(
    tables: Tables,
):
    cfg = ordered_rows(tables)
    assert [v for v, _ in tables.store.order_keys(cfg, None, 10)] == ["a", "b"]
    assert [v for v, _ in tables.store.order_keys(cfg, None, 1)] == ["a"]
    assert [v for v, _ in tables.store.order_keys(cfg, "a", 10)] == ["b"]
    # a key whose only unsettled row is dead in place is listed; its run is empty
    tables.insert("o", 12, k="d", time_next=DEAD_TIME_NEXT, epoch=3)
    assert [v for v, _ in tables.store.order_keys(cfg, "b", 10)] == ["d"]
    assert tables.store.runs(cfg, ["d"], 3) == []


def test_runs_read_each_keys_first_unsettled_live_rows_in_order_due_or_not(tables: Tables):
    cfg = ordered_rows(tables)
    rows = tables.store.runs(cfg, ["b", "a", "zz"], 3)
    by_key: dict[Any, list[Any]] = {}
    for r in rows:
        by_key.setdefault(r[-2], []).append(r[3])
        assert r[-3] == r[3]  # ordered by id: the order value is the id
    assert {k: sorted(v) for k, v in by_key.items()} == {"a": [1, 3, 7], "b": [2, 4]}
    identity = {r[-2]: r[-1] for r in rows}
    assert identity["a"] != identity["b"]
    assert len({r[-1] for r in rows if r[-2] == "a"}) == 1
    (four,) = [r for r in rows if r[3] == 4]
    assert four[1] == LATER  # a run carries its rows' time_next: the cache decides
    tables.update("o", 7, time_created=CREATED)
    (seven,) = [r for r in tables.store.runs(cfg, ["a"], 3) if r[3] == 7]
    assert seven[-4] == CREATED  # its time_created, before the order value (created -> sent)
    assert len(tables.store.runs(cfg, ["a"], 1)) == 1


def test_unkeyed_reads_the_due_rows_of_no_key_by_id_after_a_cursor(tables: Tables):
    cfg = ordered_rows(tables)
    tables.insert("o", 11)
    assert [r[3] for r in tables.store.unkeyed(cfg, NOW, None, 10)] == [9, 11]
    assert [r[3] for r in tables.store.unkeyed(cfg, NOW, 9, 10)] == [11]
    assert [r[3] for r in tables.store.unkeyed(cfg, LATER, None, 1)] == [9]
    assert [r[-1] for r in tables.store.unkeyed(cfg, NOW, None, 10)] == [None, None]
    tables.update("o", 9, time_created=CREATED)
    assert tables.store.unkeyed(cfg, NOW, None, 1)[0][-4] == CREATED
