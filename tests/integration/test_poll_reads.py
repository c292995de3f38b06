"""What the polls read for each message sent, counted (issue 42, item 1): rows inserted while
the subscriber keeps up come by the binlog's hint, and the pass the hint begins reads on after
the last row the table's passes read, not the rows sent (and not postponed yet) again from
the table's head. Rows a continued pass would miss (a better priority, an id before the last
row read, committed late) still arrive at once."""

from __future__ import annotations

from typing import Any

import pytest

from msgtable.store.mysqlstore import MySQLStore

from ..waiting import wait_until
from .helpers import Collector, Served, serve

POLL_S = 30  # anything faster than this came by the binlog's hint
FAST_S = 5.0  # "at once", with room for a loaded machine


@pytest.fixture
def followed(db_dsn: str):
    with serve(db_dsn, follow_binlog=True) as s:
        assert s.engine.binlog is not None
        wait_until(s.engine.binlog.following.is_set, what="the binlog follower to start")
        yield s


@pytest.fixture
def polled(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows each poll of a MySQLStore returned, in order."""
    counts: list[int] = []
    poll = MySQLStore.poll

    def counted(self: MySQLStore, *args: Any, **kwargs: Any) -> Any:
        rows, last = poll(self, *args, **kwargs)
        counts.append(len(rows))
        return rows, last

    monkeypatch.setattr(MySQLStore, "poll", counted)
    return counts


def test_rows_hinted_one_batch_after_another_are_read_about_once(
    followed: Served, polled: list[int]
) -> None:
    followed.create_table("hinted", vt_poller_interval=POLL_S, vt_ack_wait=60)
    c = Collector(followed.client, "hinted")
    wait_until(lambda: len(polled) >= 1, what="the first poll")
    batches, size = 40, 25
    for b in range(batches):
        values = ", ".join(f"({b * size + i + 1}, 'm')" for i in range(size))
        followed.sql(f"insert into hinted(id, message) values {values}")
        c.take(size, timeout_s=FAST_S)  # each batch by the hint: the cache is dry each time
    read = sum(polled)
    per_message = read / (batches * size)
    assert per_message <= 1.3, (
        f"the polls read {read} rows for {batches * size} messages ({per_message:.2f} a "
        f"message, in {len(polled)} polls): the rows sent were read again"
    )
    c.close()


def test_rows_a_continued_pass_would_miss_still_arrive_at_once(followed: Served) -> None:
    followed.create_table("misses", vt_poller_interval=POLL_S, vt_ack_wait=60)
    c = Collector(followed.client, "misses")
    followed.sql("insert into misses(id, priority, message) values (100, 5, 'a'), (101, 5, 'b')")
    assert sorted(m.id for m in c.take(2, timeout_s=FAST_S)) == [100, 101]
    followed.sql("insert into misses(id, priority, message) values (102, 5, 'c')")
    assert [m.id for m in c.take(1, timeout_s=FAST_S)] == [102]
    # an id before the last row read (committed late), then a better priority
    followed.sql("insert into misses(id, priority, message) values (7, 5, 'late')")
    assert [m.id for m in c.take(1, timeout_s=FAST_S)] == [7], "the late row was not sent"
    followed.sql("insert into misses(id, priority, message) values (500, 1, 'urgent')")
    assert [m.id for m in c.take(1, timeout_s=FAST_S)] == [500], "the better row was not sent"
    c.close()
