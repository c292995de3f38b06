"""The capture follower's reading of a stream, step by step, without a database: events
are kept until their transaction commits, written with the position after it (several
transactions together, never part of one), DDL is its own transaction unless an Xid ends
it, and a moved position stops the writing (fake events, a store that records)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from pymysqlreplication.event import QueryEvent, XidEvent
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from msgtable.core.events import KINDS, Capture
from msgtable.core.retry import Backoff, Retry
from msgtable.features.capture import follower as capture
from msgtable.features.capture.follower import CaptureFollower, CaptureTarget, _Reader
from msgtable.store.capture import PositionMoved


class Store:
    """Records writes; the position moves only from the one it holds."""

    def __init__(self, position: str) -> None:
        self.position = position
        self.writes: list[tuple[dict[str, list[tuple[Any, ...]]], str, str]] = []

    def write(self, events: Any, old: str, new: str, now_ns: int) -> None:
        if old != self.position:
            raise PositionMoved(f"the capture position is no longer {old}")
        self.writes.append(({t: list(r) for t, r in events.items()}, old, new))
        self.position = new

    def comment(self, table: str) -> str | None:
        return "vitess_message,..." if table == "queue" else ""


def fake(cls: type, **attrs: Any) -> Any:
    """A library event without a packet: only the attributes the reader uses."""

    class Fake(cls):  # type: ignore[misc, valid-type]
        rows = attrs.pop("rows", None)

        def __init__(self) -> None:
            pass

    event = Fake()
    event.packet = SimpleNamespace(log_pos=attrs.pop("log_pos", 100))
    event.timestamp = 1_700_000_000
    for k, v in attrs.items():
        setattr(event, k, v)
    return event


def insert(table: str, *ids: int) -> Any:
    return fake(
        WriteRowsEvent, table=table, primary_key="id", rows=[{"values": {"id": i}} for i in ids]
    )


def update(table: str, i: int, a: int, b: int) -> Any:
    row = {"before_values": {"id": i, "n": a}, "after_values": {"id": i, "n": b}}
    return fake(UpdateRowsEvent, table=table, primary_key="id", rows=[row])


def delete(table: str, i: int) -> Any:
    return fake(DeleteRowsEvent, table=table, primary_key="id", rows=[{"values": {"id": i}}])


def ddl(text: str) -> Any:
    return fake(QueryEvent, query=text, schema=b"db")


@pytest.fixture
def reader(monkeypatch: pytest.MonkeyPatch) -> _Reader:
    monkeypatch.setattr(capture, "FLUSH_S", 3600.0)  # written when the test says (quiet)
    targets = (
        CaptureTarget("events", Capture(("orders_*",), frozenset(KINDS))),
        CaptureTarget("creates", Capture(("orders_*", "queue"), frozenset({"create"}))),
    )
    f = CaptureFollower({}, "db", lambda: targets, exclude=lambda t: t == "served_queue")
    f._store = Store("gtid:0-1-5")  # type: ignore[assignment]
    stream = SimpleNamespace(log_file="binlog.000001")
    retry = Retry("test", __import__("logging").getLogger("test"), Backoff(0.1, 1))
    return _Reader(f, stream, True, "gtid:0-1-5", retry)


def begin(r: _Reader, gtid: str, standalone: bool = False) -> None:
    r.trx, r.trx_ddl, r.trx_gtid, r.standalone = [], [], gtid, standalone


def test_a_transaction_s_rows_are_written_once_it_commits_with_the_position_after_it(
    reader: _Reader,
):
    r, store = reader, reader.f._store
    begin(r, "0-1-6")
    r.rows(insert("orders_1", 1, 2))
    r.rows(update("orders_1", 1, 0, 1))
    r.rows(insert("customers", 9))  # no capture table wants it
    r.flush(quiet=True)
    assert store.writes == []  # not committed yet
    r.commit(fake(XidEvent))
    begin(r, "0-1-7")
    r.rows(delete("orders_1", 2))
    r.flush(quiet=True)  # the stream went quiet mid-transaction: only the committed one
    ((events, old, new),) = store.writes
    assert (old, new) == ("gtid:0-1-5", "gtid:0-1-6")
    assert [(e[1], json.loads(e[2] or "null")) for e in events["events"]] == [
        ("insert", {"id": 1}),
        ("insert", {"id": 2}),
        ("update", {"id": 1}),
    ]
    assert json.loads(events["events"][2][4]) == {"id": 1, "n": 0}
    assert "creates" not in events
    r.commit(fake(XidEvent))
    r.flush(quiet=True)
    assert store.writes[-1][1:] == ("gtid:0-1-6", "gtid:0-1-7")
    assert [e[1] for e in store.writes[-1][0]["events"]] == ["delete"]
    assert r.f.position == "gtid:0-1-7" and r.f.events == 4


def test_transactions_are_written_together_once_enough_wait(
    reader: _Reader, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(capture, "FLUSH_ROWS", 5)
    r, store = reader, reader.f._store
    for n in range(3):
        begin(r, f"0-1-{6 + n}")
        r.rows(insert("orders_1", 2 * n, 2 * n + 1))
        r.commit(fake(XidEvent))
    ((events, old, new),) = store.writes  # the third made five: one write of three
    assert (old, new) == ("gtid:0-1-5", "gtid:0-1-8") and len(events["events"]) == 6


def test_ddl_is_its_own_transaction_and_each_capture_table_gets_what_it_wants(reader: _Reader):
    r, store = reader, reader.f._store
    begin(r, "0-1-6", standalone=True)
    r.query(ddl("create table orders_2 (id int)"))
    begin(r, "0-1-7", standalone=True)
    r.query(ddl("create table queue (id int)"))  # a message table: never captured
    begin(r, "0-1-8", standalone=True)
    r.query(ddl("rename table orders_2 to orders_3"))
    r.flush(quiet=True)
    ((events, _, new),) = store.writes
    assert new == "gtid:0-1-8"
    assert [(e[0], e[1]) for e in events["events"]] == [
        ("orders_2", "create"),
        ("orders_2", "rename"),
    ]
    assert [(e[0], e[1]) for e in events["creates"]] == [("orders_2", "create")]
    assert json.loads(events["events"][1][5]) == "rename table orders_2 to orders_3"


def test_create_select_waits_for_its_xid_and_its_rows(reader: _Reader):
    r, store = reader, reader.f._store
    begin(r, "0-1-6", standalone=False)
    r.query(ddl("CREATE TABLE `orders_4` (`id` int)"))
    r.rows(insert("orders_4", 1))
    r.flush(quiet=True)
    assert store.writes == []
    r.commit(fake(XidEvent))
    r.flush(quiet=True)
    ((events, _, new),) = store.writes
    assert new == "gtid:0-1-6"
    assert [e[1] for e in events["events"]] == ["create", "insert"]


def test_a_moved_position_stops_the_writing(reader: _Reader):
    r, store = reader, reader.f._store
    store.position = "gtid:0-1-99"  # another follower wrote
    begin(r, "0-1-6")
    r.rows(insert("orders_1", 1))
    r.commit(fake(XidEvent))
    with pytest.raises(PositionMoved):
        r.flush(quiet=True)
    assert store.writes == [] and r.f.events == 0


def test_only_other_tables_changes_move_the_position_at_most_once_a_second(
    reader: _Reader, monkeypatch: pytest.MonkeyPatch
):
    r, store = reader, reader.f._store
    clock = [1000.0]
    monkeypatch.setattr(capture.time, "monotonic", lambda: clock[0])
    r.pending_since = clock[0]
    begin(r, "0-1-6")
    r.rows(insert("customers", 1))
    r.commit(fake(XidEvent))
    assert store.writes == []
    clock[0] += capture.IDLE_POSITION_S
    begin(r, "0-1-7")
    r.commit(fake(XidEvent))
    ((events, _, new),) = store.writes
    assert events == {} and new == "gtid:0-1-7"
