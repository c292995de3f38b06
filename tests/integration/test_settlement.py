"""Settlement end to end (README: Settlement and dead letters): release, reject, renew, max
attempts, dead-letter tables and redrive, on a real MySQL-family server through the real gRPC
server and client."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from msgtable.client import Client
from msgtable.core.subscriptions import state_table_name
from msgtable.core.tables import DEAD_TIME_NEXT, current_layout_ddl, load_table
from msgtable.errors import InvalidArgument, TableLoadError
from msgtable.store.statements import TableStatements
from msgtable.testing import CURRENT_COLUMNS

from ..waiting import wait_until
from .helpers import Collector, Served, comment, explain, serve

SCHEMA = Path(__file__).parents[2] / "schema"
DEAD_COLUMNS = "time_dead bigint, attempts bigint, last_error varchar(1000)"


@pytest.fixture
def served(db_dsn: str):
    with serve(db_dsn) as s:
        yield s


def make_pair(s: Served, name: str = "jobs", dead: str = "jobs_dead", **fields: Any) -> None:
    """A message table with last_error, and its dead-letter table."""
    s.create_table(dead, DEAD_COLUMNS)
    fields.setdefault("vt_dead_letter", dead)
    s.create_table(name, "last_error varchar(1000)", **fields)


def ids_in(s: Served, table: str, where: str = "1=1") -> list[int]:
    return [r[0] for r in s.sql(f"select id from {table} where {where} order by id")]


def enqueue(s: Served, table: str, ids: range | list[int]) -> None:
    values = ",".join(f"({i}, 'm{i}')" for i in ids)
    s.sql(f"insert into {table}(id, message) values {values}")


# -- max attempts and dead letters ---------------------------------------------------------
def test_a_poison_message_is_sent_exactly_max_attempts_times_then_is_a_dead_letter(
    served: Served,
):
    make_pair(
        served,
        vt_ack_wait=0.3,
        vt_min_backoff=0.05,
        vt_max_backoff=0.1,
        vt_poller_interval=0.2,
        vt_max_attempts=3,
    )
    enqueue(served, "jobs", [1])
    c = Collector(served.client, "jobs")
    try:
        attempts = []
        for n in range(3):
            (m,) = c.take(1)
            attempts.append(m.attempt)
            assert m.release(reason=f"failed #{n + 1}") == 1
        wait_until(lambda: ids_in(served, "jobs_dead") == [1], what="the dead letter")
        c.nothing_for(0.8)
    finally:
        c.close()
    assert attempts == [1, 2, 3]
    assert ids_in(served, "jobs") == []
    row = served.sql("select attempts, last_error, message, epoch, time_acked from jobs_dead")
    assert [tuple(r) for r in row] == [(3, "failed #3", "m1", 0, None)]
    (t,) = [t for t in served.client.list_tables() if t.name == "jobs"]
    assert (t.released, t.dead_lettered, t.rejected, t.dead) == (3, 1, 0, 1)


def test_a_message_unacked_after_its_last_ack_wait_dies_with_the_exhausted_reason(
    served: Served,
):
    make_pair(
        served,
        vt_ack_wait=0.3,
        vt_min_backoff=0.05,
        vt_poller_interval=0.2,
        vt_max_attempts=2,
        vt_postpone_after=0,
    )
    enqueue(served, "jobs", [7])
    c = Collector(served.client, "jobs")
    try:
        first, second = c.take(1), c.take(1)
        assert (first[0].attempt, second[0].attempt) == (1, 2)
        wait_until(lambda: ids_in(served, "jobs_dead") == [7], what="the dead letter")
    finally:
        c.close()
    (row,) = served.sql("select attempts, last_error from jobs_dead")
    assert tuple(row) == (2, "no ack after 2 attempts (vt_max_attempts=2)")


def test_without_a_dead_letter_table_a_dead_message_stays_in_place_never_sent(served: Served):
    served.create_table(
        "jobs",
        "last_error varchar(1000), time_dead bigint",
        vt_ack_wait=0.3,
        vt_min_backoff=0.05,
        vt_poller_interval=0.2,
        vt_max_attempts=1,
    )
    enqueue(served, "jobs", [1, 2])
    c = Collector(served.client, "jobs")
    try:
        got = {m.id: m for m in c.take(2)}
        assert got[2].reject("bad payload") == 1
        wait_until(
            lambda: (
                served.sql(f"select count(*) from jobs where time_next = {DEAD_TIME_NEXT}")[0][0]
                == 2
            ),
            what="both dead in place",
        )
        c.nothing_for(0.8)
    finally:
        c.close()
    rows = served.sql("select id, epoch, last_error, time_dead is not null, time_acked from jobs")
    assert [tuple(r) for r in rows] == [
        (1, 1, "no ack after 1 attempts (vt_max_attempts=1)", 1, None),
        (2, 1, "bad payload", 1, None),
    ]
    dead, total = served.client.dead_letters("jobs")
    assert total == 2
    assert [(d.id, d.attempts, d.last_error) for d in dead] == [
        (1, 1, "no ack after 1 attempts (vt_max_attempts=1)"),
        (2, 1, "bad payload"),
    ]


@pytest.mark.parametrize("subscription", ["", "audit"])
def test_a_late_ack_of_a_message_that_died_in_place_counts_0_and_leaves_it_dead(
    served: Served, subscription: str
):
    """Out of attempts while its handler still worked on it, a message died in place (its
    key, in an ordered table, went on without it). The handler's late ack finds it dead, as
    it would find nothing of one moved to a dead-letter table: it counts 0 and the message
    stays a dead letter (redrive it, or ack it by DML)."""
    served.create_table(
        "jobs",
        "last_error varchar(1000), time_dead bigint",
        vt_ack_wait=0.3,
        vt_min_backoff=0.05,
        vt_max_backoff=0.1,
        vt_poller_interval=0.1,
        vt_max_attempts=1,
    )
    table = "jobs"
    if subscription:
        served.client.create_subscription("jobs", subscription)
        table = state_table_name("jobs", subscription)
    enqueue(served, "jobs", [1])
    c = Collector(served.client, "jobs", subscription=subscription)
    try:
        (m,) = c.take(1)
        dead = f"time_acked is null and time_next = {DEAD_TIME_NEXT}"
        wait_until(lambda: ids_in(served, table, dead) == [1], what="its death in place")
        assert m.ack() == 0
    finally:
        c.close()
    assert ids_in(served, table, dead) == [1]


def test_reject_moves_the_message_to_the_dead_letter_table_now_with_its_reason(served: Served):
    make_pair(served)
    enqueue(served, "jobs", [1, 2, 3])
    c = Collector(served.client, "jobs")
    try:
        msgs = {m.id: m for m in c.take(3)}
        assert c.subscription.reject([msgs[1], msgs[2]], reason="schema v1") == 2
        assert msgs[1].reject() == 0  # dead already: not counted again
        assert msgs[3].ack() == 1
        assert msgs[3].reject() == 0  # acked: nothing changes
    finally:
        c.close()
    assert ids_in(served, "jobs") == [3]
    rows = served.sql("select id, attempts, last_error from jobs_dead order by id")
    assert [tuple(r) for r in rows] == [(1, 1, "schema v1"), (2, 1, "schema v1")]


# -- release ---------------------------------------------------------------------------------
def test_a_closing_subscriber_releases_what_it_received_and_never_handed_out(served: Served):
    """A worker that stops mid-batch (a break out of its loop, then close): the rest of the
    batch its iteration received goes back at once, to any subscriber, with its attempt
    counted and the reason why, instead of waiting out the ack wait (30 s here)."""
    make_pair(served, vt_batch_size=10, vt_ack_wait=30)
    enqueue(served, "jobs", range(1, 11))
    sub = served.client.subscribe("jobs")
    try:
        first = next(iter(sub))  # iteration received the batch of 10, handed out 1
        assert first.ack() == 1
    finally:
        sub.close()
    c = Collector(served.client, "jobs")
    try:
        again = c.take(9, timeout_s=10)
    finally:
        c.close()
    assert sorted(int(m.id) for m in again) == sorted(set(range(1, 11)) - {int(first.id)})
    assert {m.attempt for m in again} == {2}
    reasons = served.sql("select distinct last_error from jobs where time_acked is null")
    assert reasons == [("the subscriber closed before handing it out",)]


QUICK_BACKOFF = {"vt_min_backoff": 0.05, "vt_max_backoff": 0.1}


def test_a_closing_subscriber_releases_its_rest_late_but_never_a_later_delivery_of_it(
    served: Served,
):
    """The close's release names each message's delivery, so a close however late is safe:
    a rest whose ack wait (1 s) has nearly run out is released all the same, and one already
    sent again to another subscriber is left to that subscriber."""
    make_pair(served, vt_batch_size=10, vt_ack_wait=1, vt_min_backoff=30, vt_max_backoff=30)
    enqueue(served, "jobs", range(1, 11))
    late = served.client.subscribe("jobs")
    try:
        first = next(iter(late))  # the other 9 received, never handed out
        time.sleep(0.7)  # past half the ack wait, within it
    finally:
        late.close()
    rest = set(range(1, 11)) - {int(first.id)}
    released = "last_error = 'the subscriber closed before handing it out'"
    assert set(ids_in(served, "jobs", released)) == rest
    c = Collector(served.client, "jobs")
    try:
        again = c.take(9, timeout_s=10)  # at once, not after a backoff of 30 s
    finally:
        c.close()
    assert sorted(int(m.id) for m in again) == sorted(rest)
    assert {m.attempt for m in again} == {2}

    make_pair(served, "quick", "quick_dead", vt_batch_size=10, vt_ack_wait=1, **QUICK_BACKOFF)
    enqueue(served, "quick", range(11, 21))
    gone = served.client.subscribe("quick")
    taker: Collector | None = None
    try:
        first = next(iter(gone))
        rest = set(range(11, 21)) - {int(first.id)}
        taker = Collector(served.client, "quick")
        seen: set[int] = set()  # rest sent again to the taker (its ack wait over: 1 s)
        deadline = time.monotonic() + 10
        while not rest <= seen and time.monotonic() < deadline:
            seen.update(int(m.id) for m in taker.take(1, timeout_s=10) if m.attempt >= 2)
        assert rest <= seen, f"never sent again to another subscriber: {sorted(rest - seen)}"
        gone.close()  # releases its own deliveries, all replaced: nothing changes
        assert ids_in(served, "quick", "last_error is not null") == []
    finally:
        gone.close()
        if taker is not None:
            taker.close()


def test_a_released_message_comes_back_after_its_delay_to_any_subscriber(served: Served):
    served.create_table("jobs", "last_error varchar(1000)", vt_ack_wait=30, vt_poller_interval=30)
    enqueue(served, "jobs", [1])
    a = Collector(served.client, "jobs")
    (m,) = a.take(1)
    a.close()
    b = Collector(served.client, "jobs")
    try:
        released_ns = time.time_ns()
        assert served.client.release("jobs", [m.id], delay_s=0.5, reason="later") == 1
        (again,) = b.take(1, timeout_s=5)
        # when the server sent it again (its arrival may lag on a loaded machine)
        late_s = (again.sent_ns - released_ns) / 1e9
    finally:
        b.close()
    assert again.attempt == 2
    assert again.values["last_error"] == "later"
    assert 0.5 <= late_s <= 0.55, f"sent again {late_s:.3f}s after a release of 0.5s"


def test_a_release_at_once_counts_the_attempt_and_comes_back_at_once(served: Served):
    served.create_table("jobs", vt_ack_wait=30, vt_poller_interval=30)
    enqueue(served, "jobs", [1])
    c = Collector(served.client, "jobs")
    try:
        (m,) = c.take(1)
        assert m.release() == 1
        (again,) = c.take(1, timeout_s=2)
        assert again.attempt == 2
        assert again.ack() == 1
    finally:
        c.close()


# -- renew -----------------------------------------------------------------------------------
def test_a_renewed_message_is_not_redelivered_while_it_is_renewed(served: Served):
    served.create_table("jobs", vt_ack_wait=0.5, vt_min_backoff=0.05, vt_poller_interval=0.2)
    enqueue(served, "jobs", [1])
    a = Collector(served.client, "jobs")
    (m,) = a.take(1)
    b = Collector(served.client, "jobs")
    try:
        deadline = time.monotonic() + 2.0  # four ack waits
        while time.monotonic() < deadline:
            assert m.renew() == 1
            time.sleep(0.15)
        deliveries = [*a.arrived_ns.values(), *b.arrived_ns.values()]
        assert sum(map(len, deliveries)) == 1, "sent again while renewed"
        assert m.ack() == 1
        b.nothing_for(0.6)
    finally:
        a.close()
        b.close()


def test_a_renew_shorter_than_the_ack_wait_left_does_not_bring_the_message_back_early(
    served: Served,
):
    """'Not due again before extend_s from now; a later due time is kept': a renew of 0.2 s
    just after the send (not postponed yet: vt_postpone_after 5 s) leaves the ack wait of 4 s.
    It came back 0.2 s later (the renew wrote its time for the uncounted send)."""
    served.create_table(
        "jobs", vt_ack_wait=4, vt_postpone_after=5, vt_min_backoff=0.05, vt_poller_interval=0.2
    )
    enqueue(served, "jobs", [1])
    c = Collector(served.client, "jobs")
    try:
        (m,) = c.take(1)
        assert m.renew(extend_s=0.2) == 1
        c.nothing_for(2.0)  # ten renews' worth, half the ack wait
        (row,) = served.sql("select epoch, time_next - time_created from jobs")
        assert row[0] == 1 and row[1] >= 4 * 10**9, f"due too soon: epoch, due - created {row}"
    finally:
        c.close()


def test_auto_renew_keeps_a_slow_handlers_message(served: Served):
    served.create_table("jobs", vt_ack_wait=0.6, vt_min_backoff=0.05, vt_poller_interval=0.2)
    enqueue(served, "jobs", [1])
    with served.client.subscribe("jobs", auto_renew=True) as sub:
        m = next(iter(sub))
        assert sub.leaser is not None and sub.leaser.every_s == pytest.approx(0.2)
        time.sleep(2.0)  # the slow handler: over three ack waits
        assert m.ack() == 1
        assert sub.leaser.renewed >= 5
        assert sub.leaser.leased == 0
    (row,) = served.sql("select epoch from jobs")
    assert row[0] == 1  # sent once


# -- a settlement belongs to its delivery ---------------------------------------------------
def test_a_late_release_or_renew_of_an_earlier_delivery_leaves_the_later_one_alone(
    served: Served,
):
    """A handler still holding the first delivery (its ack wait over, the message sent again)
    releases or renews it late: that must not release or renew the second delivery, which
    another handler may be working on. The client's release or renew by id alone still
    changes whichever delivery is current."""
    late_settlement(served, "")


def test_a_late_release_or_renew_in_a_subscription_leaves_its_later_delivery_alone(
    served: Served,
):
    """The same for a subscription (its state table)."""
    late_settlement(served, "billing")


def late_settlement(served: Served, group: str) -> None:
    served.create_table("jobs", vt_ack_wait=1, vt_min_backoff=0.05, vt_poller_interval=0.1)
    state = "jobs"
    if group:
        served.client.create_subscription("jobs", group, ack_wait_s=1)
        state = state_table_name("jobs", group)
    enqueue(served, "jobs", [1])
    c = Collector(served.client, "jobs", subscription=group)
    try:
        (first,) = c.take(1)
        (second,) = c.take(1, timeout_s=5)  # its ack wait ended: sent again
        assert (first.attempt, second.attempt) == (1, 2)
        before = served.sql(f"select epoch, time_next from {state}")
        assert first.renew(30) == 0
        assert first.release() == 0
        assert served.sql(f"select epoch, time_next from {state}") == before
        assert second.renew(30) == 1
        assert second.release() == 1  # its own delivery: due again at once
        (third,) = c.take(1, timeout_s=5)
        assert third.attempt == 3
        by_id = {"subscription": group}
        assert served.client.renew("jobs", [third.id], extend_s=30, **by_id) == 1  # any delivery
        assert served.client.release("jobs", [third.id], **by_id) == 1
        (fourth,) = c.take(1, timeout_s=5)
        assert fourth.attempt == 4 and fourth.ack() == 1
    finally:
        c.close()


def test_auto_renew_stops_quietly_once_its_client_is_closed(served: Served, caplog):
    """A client closed while a subscriber still holds messages (a worker's shutdown that
    closes the client first): auto-renew stops, rather than warn every round for ever that
    the client is closed; the messages are left to their ack wait."""
    served.create_table("jobs", vt_ack_wait=0.6, vt_min_backoff=0.05, vt_poller_interval=0.2)
    enqueue(served, "jobs", [1])
    client = Client(served.server.address)
    sub = client.subscribe("jobs", auto_renew=True)
    next(iter(sub))
    assert sub.leaser is not None
    caplog.set_level(logging.WARNING, logger="msgtable.client.leaser")
    client.close()
    wait_until(
        lambda: not sub.leaser._thread.is_alive(),  # type: ignore[union-attr]
        timeout_s=5,
        what="the leaser's thread to end after its client was closed",
    )
    said = [r.getMessage() for r in caplog.records if r.name == "msgtable.client.leaser"]
    assert said == []
    sub.close()


# -- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c: c.release("jobs", [1], delay_s=-1), "zero or more seconds"),
        (lambda c: c.release("jobs", [1], delay_s=float("nan")), "zero or more seconds"),
        (lambda c: c.release("jobs", [1], delay_s=86400), "over the limit"),
        (lambda c: c.renew("jobs", [1], extend_s=1e9), "over the limit"),
        (lambda c: c.reject("jobs", [1], reason="x" * 1001), "at most 1,000"),
        (lambda c: c.release("jobs", []), "no ids to release"),
        (lambda c: c.renew("jobs", list(range(10_001))), "at most 10000"),
        (lambda c: c.reject("jobs", ["one"]), "malformed id"),
    ],
)
def test_bad_settlement_input_is_invalid_and_changes_nothing(served: Served, call, error):
    served.create_table("jobs")
    enqueue(served, "jobs", [1])
    before = served.sql("select * from jobs")
    with pytest.raises(InvalidArgument, match=error):
        call(served.client)
    assert served.sql("select * from jobs") == before


def test_settling_ids_not_in_flight_counts_only_those_changed(served: Served):
    served.create_table("jobs", vt_ack_wait=30)
    enqueue(served, "jobs", [1, 2, 3])
    c = Collector(served.client, "jobs", max_in_flight=1)
    try:
        (m,) = c.take(1)
        others = [i for i in (1, 2, 3) if i != m.id]
        # never sent: a release or renew does not apply; unknown ids are not counted
        assert served.client.release("jobs", [*others, 99]) == 0
        assert served.client.renew("jobs", [*others, 99]) == 0
        assert served.client.renew("jobs", [m.id, *others, 99]) == 1
        assert served.client.reject("jobs", [99]) == 0
    finally:
        c.close()


# -- load errors -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("setup", "error"),
    [
        ("", "vt_dead_letter=jobs_dead: no message table jobs_dead"),
        (
            "create table jobs_dead(id bigint primary key) comment 'not a message table'",
            "no message table jobs_dead",
        ),
        ("missing", "jobs_dead lacks column message, time_dead, attempts, last_error"),
        ("self", "vt_dead_letter=jobs is the table itself"),
    ],
)
def test_a_bad_dead_letter_table_is_a_load_error_naming_the_field(served: Served, setup, error):
    if setup == "missing":
        served.sql(
            "create table jobs_dead(id bigint primary key, priority bigint, time_next bigint, "
            "epoch bigint, time_acked bigint) comment '" + comment() + "'"
        )
    elif setup and setup != "self":
        served.sql(setup)
    served.create_table("jobs", vt_dead_letter="jobs" if setup == "self" else "jobs_dead")
    with pytest.raises(TableLoadError, match=error):
        served.client.subscribe("jobs", retry=False)
    (t,) = [t for t in served.client.list_tables() if t.name == "jobs"]
    assert error in t.load_error


def test_the_schema_file_of_dead_letters_creates_tables_that_load(served: Served):
    text = (SCHEMA / "dead_letter.sql").read_text()
    lines = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
    for statement in lines.split(";"):
        if statement.strip():
            served.sql(statement)
    tables = {t.name: t for t in served.client.list_tables()}
    assert tables["refunds"].loaded and tables["refunds_dead"].loaded
    cfg = tables["refunds"].config
    assert cfg is not None and (cfg.max_attempts, cfg.dead_letter) == (5, "refunds_dead")


# -- redrive ---------------------------------------------------------------------------------
def test_a_redrive_stopped_half_way_and_rerun_moves_each_message_once(served: Served):
    make_pair(served)
    enqueue(served, "jobs", range(1, 13))
    assert served.client.reject("jobs", list(range(1, 13)), reason="bug 42") == 12
    assert ids_in(served, "jobs") == []
    first = served.client.redrive("jobs_dead", limit=5)
    assert (first.moved, first.last) == (5, 5)  # ... and the redrive stops here
    # the rerun: from the start, batch after batch, until nothing is left
    moved, after = 0, None
    while True:
        batch = served.client.redrive("jobs_dead", limit=4, after=after)
        if batch.last is None:
            break
        moved, after = moved + batch.moved, batch.last
    assert moved == 7
    assert ids_in(served, "jobs") == list(range(1, 13))
    assert ids_in(served, "jobs_dead") == []
    rows = served.sql("select distinct epoch, time_acked, last_error from jobs")
    assert [tuple(r) for r in rows] == [(0, None, "bug 42")]  # fresh, and its history kept


def test_a_redrive_skips_ids_the_target_has_again_and_leaves_them_dead(served: Served):
    make_pair(served)
    enqueue(served, "jobs", [1, 2])
    assert served.client.reject("jobs", [1, 2]) == 2
    enqueue(served, "jobs", [2])  # enqueued again under the same id
    batch = served.client.redrive("jobs", limit=10)  # the source names its dead letters
    assert (batch.moved, batch.skipped) == (1, (2,))
    assert ids_in(served, "jobs_dead") == [2]


# -- settlement by DML, as the README gives it, seen through the binlog ----------------------
@pytest.mark.parametrize("binlog", [True, False], ids=["binlog", "poll-only"])
def test_settling_by_dml_in_the_applications_transaction_is_honoured(db_dsn: str, binlog: bool):
    with serve(db_dsn, follow_binlog=binlog) as s:
        s.create_table("jobs", "last_error varchar(1000)", vt_ack_wait=2, vt_poller_interval=0.3)
        enqueue(s, "jobs", [1, 2])
        c = Collector(s.client, "jobs")
        try:
            got = {m.id: m for m in c.take(2)}
            assert {m.attempt for m in got.values()} == {1}
            with s.transaction() as tx:  # reject 1 in place, release 2 in 0.3 s
                tx.exec_driver_sql(
                    "update jobs set epoch = greatest(epoch, 1), "
                    f"time_next = {DEAD_TIME_NEXT}, last_error = 'bad' "
                    f"where id = 1 and time_acked is null and time_next <> {DEAD_TIME_NEXT}"
                )
                tx.exec_driver_sql(
                    "update jobs set epoch = greatest(epoch, 1), "
                    "time_next = unix_timestamp(now(6)) * 1000000000 + 300000000, "
                    "last_error = 'later' "
                    f"where id = 2 and epoch <= 1 and time_acked is null "
                    f"and time_next <> {DEAD_TIME_NEXT}"
                )
            (again,) = c.take(1, timeout_s=5)
            assert (again.id, again.attempt, again.values["last_error"]) == (2, 2, "later")
            assert again.ack() == 1
            c.nothing_for(2.5)  # 1 is dead: never again, even after its ack wait
        finally:
            c.close()
        rows = s.sql("select id, epoch, time_next, time_acked is null from jobs order by id")
        assert [tuple(r) for r in rows] == [(1, 1, DEAD_TIME_NEXT, 1), (2, 2, None, 0)]


def test_every_update_by_id_goes_by_the_primary_key(sql: Any):
    """On a table of many acked rows and few unacked ones the optimizer may take poller_idx for
    ``time_acked IS NULL`` over the id list, locking the index's entries before the rows: such
    an UPDATE deadlocked with one that locks the rows first (the fault suite saw an ack
    against a release, a renew against a send's locking read). Each goes by the primary
    key (msgtable.store.statements.BY_ID), locking its rows in id order."""
    sql.execute(current_layout_ddl("q", comment()))
    values = ", ".join(f"({i}, 'm', {'NULL' if i % 1000 == 0 else 1})" for i in range(1, 20_001))
    sql.execute(f"insert into q(id, message, time_acked) values {values}")
    sql.execute("analyze table q")
    s = TableStatements(load_table("q", comment(), CURRENT_COLUMNS, (("id",),)))
    # one unacked, 499 acked (a late ack; under MariaDB's 1,000 of an IN list it reads as a
    # table of values)
    ids = ",".join(str(i) for i in range(501, 1001))
    statements = {
        "claim": (s.claim.format(ids=ids), [1, 0, 1]),
        "claimable": (s.claimable.format(ids=ids), [0, 1]),
        "lock": (s.lock.format(ids=ids), [1]),
        "postpone": (s.postpone.format(ids=ids), [1, 0, 1]),
        "ack": (s.ack.format(ids=ids), [1]),
        "ack_first": (s.ack_first.format(ids=ids), [1, 0]),
        "release": (s.release.format(ids=ids, first="FALSE", bound="TRUE"), [1]),
        "renew": (s.renew.format(ids=ids, first="FALSE", bound="TRUE"), [1, 1, 1]),
    }
    cur = sql.connection.connection.cursor()  # the DB-API connection's (explain reads it)
    try:
        for what, (statement, params) in statements.items():
            plan = explain(cur, statement, params)  # the table format on either server
            assert [row["key"] for row in plan] == ["PRIMARY"], f"{what}: {plan}"
    finally:
        cur.close()
