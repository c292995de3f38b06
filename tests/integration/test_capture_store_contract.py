"""The CaptureStore contract: every case runs on the in-memory capture writes
(msgtable.testing.capture.InMemoryCapture over an InMemoryStore) and on MySQL's
(msgtable.store.capture.CaptureSQL, from MySQLStore's connections). A case failing on one side
is a drift: fix the fake, never the case."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from msgtable.core.events import CAPTURE_DEMO_COMMENT, EVENT_COLUMNS, capture_table_ddl
from msgtable.core.tables import Column
from msgtable.store.capture import PositionMoved
from msgtable.store.protocol import CaptureStore
from msgtable.testing import CURRENT_COLUMNS
from msgtable.testing.capture import InMemoryCapture

from .contract_tables import MemoryTables, MySQLTables, Tables

NOW = 1_700_000_000 * 10**9
EVENT_TYPES = {"time_commit": ("bigint", "bigint")}


@pytest.fixture(params=["memory", "mysql"])
def capture(request: pytest.FixtureRequest) -> Iterator[tuple[Tables, CaptureStore]]:
    """The same cases on InMemoryCapture and on CaptureSQL (a fresh database per test)."""
    if request.param == "memory":
        t = MemoryTables()
        store = InMemoryCapture(t.memory)
        yield t, store
        store.close()
        return
    m = MySQLTables(request.getfixturevalue("sql"), request.getfixturevalue("db_dsn"))
    connections = m.store.connections()
    assert connections is not None, "MySQLStore has connections of its own"
    sql = connections.capture_store()
    yield m, sql
    sql.close()
    m.store.close()


def create_events(t: Tables, name: str) -> None:
    """A capture table of the recommended DDL (msgtable.core.events.capture_table_ddl)."""
    if isinstance(t, MemoryTables):
        extra = (Column(c, *EVENT_TYPES.get(c, ("varchar", "varchar(255)"))) for c in EVENT_COLUMNS)
        columns = (*CURRENT_COLUMNS[:-1], *extra)  # no message column
        t.memory.create_table(name, CAPTURE_DEMO_COMMENT, columns)
    else:
        assert isinstance(t, MySQLTables)
        t.sql.execute(capture_table_ddl(name))


def event(kind: str, pk: int) -> tuple[Any, ...]:
    return ("orders_1", kind, f"[{pk}]", str(pk), None, f'{{"id": {pk}}}', NOW - 5, "gtid:0-1-9")


def events_in(t: Tables, table: str) -> list[dict[str, Any]]:
    out = []
    for i in range(1, 10):
        row = t.row(table, i)
        if row is not None:
            out.append(
                {
                    k: row[k]
                    for k in ("id", "priority", "time_next", "epoch", "time_acked", *EVENT_COLUMNS)
                }
            )
    return out


def test_the_first_position_is_stored_and_kept(capture: tuple[Tables, CaptureStore]):
    _, store = capture
    assert store.start("gtid:0-1-5", NOW) == "gtid:0-1-5"
    assert store.start("gtid:0-1-9", NOW) == "gtid:0-1-5"
    assert store.stored() == "gtid:0-1-5"


def test_a_write_adds_the_events_and_moves_the_position(capture: tuple[Tables, CaptureStore]):
    t, store = capture
    create_events(t, "ev")
    create_events(t, "ev2")
    store.start("p1", NOW)
    store.write(
        {"ev": [event("insert", 1), event("update", 1)], "ev2": [event("delete", 2)]},
        "p1",
        "p2",
        NOW,
    )
    assert store.stored() == "p2"
    head = {"priority": 0, "time_next": NOW, "epoch": 0, "time_acked": None}
    assert events_in(t, "ev") == [
        {"id": 1, **head, **dict(zip(EVENT_COLUMNS, event("insert", 1), strict=True))},
        {"id": 2, **head, **dict(zip(EVENT_COLUMNS, event("update", 1), strict=True))},
    ]
    assert [e["kind"] for e in events_in(t, "ev2")] == ["delete"]
    store.write({"ev": [event("insert", 3)]}, "p2", "p3", NOW)
    assert [e["id"] for e in events_in(t, "ev")] == [1, 2, 3]


def test_a_moved_position_writes_nothing(capture: tuple[Tables, CaptureStore]):
    t, store = capture
    create_events(t, "ev")
    store.start("p1", NOW)
    with pytest.raises(PositionMoved):
        store.write({"ev": [event("insert", 1)]}, "p0", "p2", NOW)
    assert store.stored() == "p1"
    assert events_in(t, "ev") == []


def test_a_write_to_a_table_that_is_gone_writes_nothing(capture: tuple[Tables, CaptureStore]):
    t, store = capture
    create_events(t, "ev")
    store.start("p1", NOW)
    with pytest.raises(Exception):  # noqa: B017 (the driver's own error on MySQL)
        store.write({"ev": [event("insert", 1)], "gone": [event("insert", 2)]}, "p1", "p2", NOW)
    assert store.stored() == "p1"
    assert events_in(t, "ev") == []


def test_a_tables_comment_is_read_now(capture: tuple[Tables, CaptureStore]):
    t, store = capture
    create_events(t, "ev")
    assert store.comment("ev") == CAPTURE_DEMO_COMMENT
    assert store.comment("nothing") is None
