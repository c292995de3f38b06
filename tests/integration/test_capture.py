"""Table events captured from the binlog, against the real server (the fixture's has a ROW
binlog with full row metadata): each kind of change becomes exactly the expected event, a
transaction's events are written with the follower's position, a restart neither loses nor
repeats, a filtered subscription gets only its kind, and a captured table created later is
picked up."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from msgtable.capturestore import POSITION_TABLE

from ..waiting import wait_until
from .helpers import Served, comment, serve

EVENTS = "table_events"


def event_table_ddl(name: str = EVENTS, **fields: Any) -> str:
    """schema/events.sql's table under ``name`` with comment ``fields``."""
    fields.setdefault("vt_capture", "orders_*|customers")
    fields.setdefault("vt_poller_interval", 0.2)
    return f"""create table `{name}`(
  id bigint not null auto_increment,
  priority bigint not null default 0,
  time_next bigint default 0,
  epoch bigint not null default 0,
  time_acked bigint,
  time_created bigint,
  source_table varchar(64) not null,
  kind varchar(16) not null,
  pk json,
  row_key varchar(255) not null,
  before_values json,
  after_values json,
  time_commit bigint not null,
  position varchar(255) not null,
  primary key(id),
  index poller_idx(time_acked, priority, time_next),
  index order_idx(row_key, time_acked, id)
) engine=InnoDB comment '{comment(**fields)}'"""


@pytest.fixture
def captured(db_dsn: str) -> Iterator[Served]:
    with serve(db_dsn) as s:
        s.sql(event_table_ddl())
        s.engine.refresh()
        assert s.engine.capture is not None
        wait_until(s.engine.capture.following.is_set, what="the capture follower to start")
        yield s


def events(s: Served, table: str = EVENTS) -> list[dict[str, Any]]:
    rows = s.sql(
        f"select source_table, kind, pk, row_key, before_values, after_values, time_commit, "
        f"position from `{table}` order by id"
    )
    out = []
    for r in rows:
        out.append(
            {
                "source_table": r[0],
                "kind": r[1],
                "pk": None if r[2] is None else json.loads(r[2]),
                "row_key": r[3],
                "before": None if r[4] is None else json.loads(r[4]),
                "after": None if r[5] is None else json.loads(r[5]),
                "time_commit": r[6],
                "position": r[7],
            }
        )
    return out


def wait_events(s: Served, n: int, table: str = EVENTS, timeout_s: float = 10.0) -> list[dict]:
    got: list[dict[str, Any]] = []

    def enough() -> bool:
        got[:] = events(s, table)
        return len(got) >= n

    wait_until(enough, timeout_s, what=lambda: f"{n} events in {table}, got {got}")
    return got


def test_insert_update_delete_become_one_event_each_with_before_and_after(captured: Served):
    s = captured
    s.sql("create table orders_a(id int primary key, name varchar(20), qty int)")
    s.sql("insert into orders_a values (1, 'one', 5)")
    s.sql("update orders_a set qty = 6 where id = 1")
    s.sql("delete from orders_a where id = 1")
    got = wait_events(s, 4)
    assert [e["kind"] for e in got] == ["create", "insert", "update", "delete"]
    create, ins, upd, dele = got
    assert create["source_table"] == "orders_a" and create["pk"] is None
    assert "create table orders_a" in create["after"]
    assert ins["pk"] == {"id": 1} and ins["before"] is None
    assert ins["after"] == {"id": 1, "name": "one", "qty": 5}
    assert upd["before"] == {"id": 1, "name": "one", "qty": 5}
    assert upd["after"] == {"id": 1, "name": "one", "qty": 6}
    assert dele["before"] == {"id": 1, "name": "one", "qty": 6} and dele["after"] is None
    assert {e["row_key"] for e in got[1:]} == {'orders_a:{"id": 1}'}
    assert all(e["time_commit"] > 1.7e18 for e in got)
    assert len({e["position"] for e in got}) == 4
    (stored,) = s.sql(f"select position from {POSITION_TABLE}")
    assert stored[0] == s.engine.capture.position  # type: ignore[union-attr]
