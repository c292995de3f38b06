"""The ODPS event mechanism end to end, on msgtable: a table's changes (rows and DDL),
committed by any client, are captured from the binlog into a capture table and pushed, signed,
to callback URLs: every event to one, only the creates of ``orders_*`` tables (a subscription
with a filter, the granularity ODPS lacked) to another, the events of one source row in commit
order (vt_order_key=row_key) even while the receiver answers 500 for a while."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from msgtable.features.push.allow import AllowList

from ..push_receiver import Receiver
from ..waiting import wait_until
from .helpers import Served, serve
from .test_capture import EVENTS, event_table_ddl

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(SECRET).start()
    yield r
    r.stop()


@pytest.fixture
def served(db_dsn: str) -> Iterator[Served]:
    allow = AllowList.parse("http://127.0.0.0/8")
    with serve(db_dsn, follow_binlog=True, push_allow=allow) as s:
        s.sql(
            event_table_ddl(
                vt_capture="orders_*",
                vt_order_key="row_key",
                vt_ack_wait=5,
                vt_min_backoff=0.1,
                vt_max_backoff=0.3,
            )
        )
        s.engine.refresh()
        assert s.engine.capture is not None
        wait_until(s.engine.capture.following.is_set, what="the capture follower to start")
        yield s


def pushed(receiver: Receiver, path: str) -> list[dict[str, Any]]:
    """The events that reached ``path``, first arrivals only, in arrival order."""
    seen: set[str] = set()
    out = []
    for r in receiver.received():
        if r.path == path and r.event["id"] not in seen:
            seen.add(r.event["id"])
            out.append(r.event)
    return out


def test_changes_are_captured_and_pushed_signed_in_order_per_row_and_filtered_by_kind(
    served: Served, receiver: Receiver
) -> None:
    s = served
    s.client.create_subscription(
        EVENTS, "creates", filter="kind = 'create' AND source_table LIKE 'orders%'"
    )
    s.client.set_endpoint(EVENTS, receiver.url("/all"), SECRET)
    s.client.set_endpoint(EVENTS, receiver.url("/creates"), SECRET, subscription="creates")
    receiver.answer(500, "/all")  # the callback fails for a while: nothing is lost, order holds
    s.sql("create table orders_a(id int primary key, state varchar(16))")
    s.sql("create table customers(id int primary key)")  # not captured
    with s.transaction() as tx:
        tx.exec_driver_sql("insert into orders_a values (1, 'new'), (2, 'new')")
    s.sql("update orders_a set state = 'paid' where id = 1")
    s.sql("update orders_a set state = 'shipped' where id = 1")
    s.sql("delete from orders_a where id = 2")
    s.sql("create table orders_b(id int primary key)")
    wait_until(
        lambda: len(s.sql(f"select id from {EVENTS}")) == 7,
        what=lambda: f"7 events captured, got {s.sql(f'select kind, row_key from {EVENTS}')}",
    )
    wait_until(lambda: len(receiver.received()) > 0, what="a first POST to /all (answered 500)")
    receiver.answer_ok("/all")
    wait_until(
        lambda: len(pushed(receiver, "/all")) == 7 and len(pushed(receiver, "/creates")) == 2,
        timeout_s=20,
        what=lambda: (
            f"7 events at /all and 2 at /creates, got {len(pushed(receiver, '/all'))} and "
            f"{len(pushed(receiver, '/creates'))}"
        ),
    )
    assert receiver.bad_signatures == [] and receiver.bad_bodies == []
    creates = [(e["data"]["kind"], e["data"]["source_table"]) for e in pushed(receiver, "/creates")]
    # (each table's create is a row_key of its own: the order holds per key, and the two may
    # go in batches in flight side by side, so they may arrive either way round)
    assert sorted(creates) == [("create", "orders_a"), ("create", "orders_b")]
    by_row: dict[str, list[tuple[str, Any]]] = {}
    for e in pushed(receiver, "/all"):
        d = e["data"]
        after = d["after_values"]
        state = json.loads(after).get("state") if after and d["kind"] != "create" else None
        by_row.setdefault(d["row_key"], []).append((d["kind"], state))
    rows = {k: v for k, v in by_row.items() if len(v) > 1}
    assert sorted(rows.values()) == [
        [("insert", "new"), ("delete", None)],
        [("insert", "new"), ("update", "paid"), ("update", "shipped")],
    ]
    wait_until(
        lambda: s.sql(f"select count(*) from {EVENTS} where time_acked is null") == [(0,)],
        what="every event acked by a 2xx",
    )
