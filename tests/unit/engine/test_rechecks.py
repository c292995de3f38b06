"""A pass the binlog asked for that found nothing goes again soon (msgtable.engine.rechecks):
the binlog shows an INSERT a moment before other sessions see its row."""

from __future__ import annotations

import random
import threading
from typing import Any

from msgtable.core.tables import DEMO_COMMENT, Column
from msgtable.engine.engine import MessageEngine
from msgtable.engine.rechecks import RECHECK_S, Rechecks
from msgtable.testing import InMemoryStore
from msgtable.testing.memory import CURRENT_COLUMNS

INTERVAL_S = 30.0  # the poll interval: far past the test's wait


class LateStore(InMemoryStore):
    """A store whose row ``late`` becomes visible just after the next pass read the table
    (as a commit that the binlog showed before the storage engine made it visible)."""

    def __init__(self) -> None:
        super().__init__()
        self.late: dict[str, Any] | None = None
        self.read = threading.Event()

    def poll(self, *args: Any, **kwargs: Any) -> Any:
        got = super().poll(*args, **kwargs)
        self._commit_late()
        return got

    def order_keys(self, *args: Any, **kwargs: Any) -> Any:  # an ordered table's pass
        got = super().order_keys(*args, **kwargs)
        self._commit_late()
        return got

    def _commit_late(self) -> None:
        late, self.late = self.late, None
        if late is not None:
            self.insert("q", **late)
            self.read.set()


def test_an_insert_the_binlog_shows_before_its_row_is_visible_arrives_at_once():
    store = LateStore()
    store.create_table("q", DEMO_COMMENT)  # vt_poller_interval=30
    e = MessageEngine(store, rng=random.Random(1), discovery_interval_s=3600)
    e.open()
    try:
        sub = e.subscribe("q")
        m = e._manager("q", "")
        assert m.config.poller_interval_s == INTERVAL_S
        assert sub.next_batch(0.5) == [], "a message in an empty table"
        store.late = {"id": 1, "message": "late"}
        m.binlog_insert(1)  # the binlog shows the INSERT; its pass finds nothing
        assert store.read.wait(10), "the binlog's hint began no pass"
        assert sub.next_batch(5) == [(1, "late")], (
            "the row visible just after the hinted pass waited for the poll interval"
        )
    finally:
        e.close()


def test_an_ordered_tables_insert_the_binlog_shows_before_its_row_is_visible_arrives_at_once():
    """An ordered table (a FIFO queue) schedules its own passes: the pass an INSERT's hint
    brings forward that finds nothing is tried again soon, not a poll interval later."""
    store = LateStore()
    keyed = (*CURRENT_COLUMNS, Column("k", "varchar", "varchar(64)"))
    index = (("order_idx", ("k", "time_acked", "id")),)
    store.create_table("q", f"{DEMO_COMMENT},vt_order_key=k", keyed, indexes=index)
    e = MessageEngine(store, rng=random.Random(1), discovery_interval_s=3600)
    e.open()
    try:
        sub = e.subscribe("q")
        m = e._manager("q", "")
        assert m.config.poller_interval_s == INTERVAL_S and m.cache.ordered is not None
        assert sub.next_batch(0.5) == [], "a message in an empty table"
        store.late = {"id": 1, "message": "late", "k": "g1"}
        m.binlog_insert(1)  # the binlog shows the INSERT; the pass it brings finds nothing
        assert store.read.wait(10), "the binlog's hint began no pass"
        assert sub.next_batch(5) == [(1, "late", "g1")], (
            "the ordered table's row visible just after the hinted pass waited for the poll "
            "interval"
        )
    finally:
        e.close()


def test_rechecks_follow_a_hinted_pass_that_found_nothing_then_the_interval():
    r = Rechecks()
    waits = [r.wait_s(True, 0, INTERVAL_S)]
    waits += [r.wait_s(False, 0, INTERVAL_S) for _ in RECHECK_S]
    assert waits == [*RECHECK_S, INTERVAL_S]
    assert r.wait_s(False, 0, INTERVAL_S) == INTERVAL_S  # no hint: the interval


def test_a_recheck_that_finds_rows_ends_the_rechecks():
    r = Rechecks()
    assert r.wait_s(True, 0, INTERVAL_S) == RECHECK_S[0]
    assert r.wait_s(False, 3, INTERVAL_S) == INTERVAL_S
    assert r.wait_s(False, 0, INTERVAL_S) == INTERVAL_S
    assert r.wait_s(True, 2, INTERVAL_S) == INTERVAL_S  # a hinted pass that read its rows


def test_a_recheck_never_waits_past_the_poll_interval():
    assert Rechecks().wait_s(True, 0, 0.001) == 0.001


def test_a_hint_for_later_belongs_to_the_first_poll_from_then_on():
    """An ordered table's hint names when its pass may begin: polls before that time (which
    begin no pass) are not hinted, and do not start the rechecks."""
    r = Rechecks()
    r.hint(100)
    r.hint(200)  # a later hint does not put the earlier one off
    assert not r.take(99)
    assert r.take(100)
    assert not r.take(300), "one hint, one hinted poll"
    r.hint()
    assert r.take(0)
