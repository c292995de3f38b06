"""Flow control at the sender (msgtable.engine.flow): rates, caps, fair share, driven step by
step on the in-memory store with a fake clock."""

from __future__ import annotations

import dataclasses
import random

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from msgtable.cli.output import format_tables
from msgtable.core.clock import FakeClock
from msgtable.core.codec import table_info_from_proto, table_status_to_proto
from msgtable.core.flow import rate_violations
from msgtable.core.tables import Column
from msgtable.engine.due import DueRows
from msgtable.engine.engine import MessageEngine
from msgtable.engine.flow import KeyedDue
from msgtable.engine.manager import MessageManager
from msgtable.engine.subscriber import Subscriber
from msgtable.observe.metrics import registry_for
from msgtable.testing import CURRENT_COLUMNS, InMemoryStore

BASE = (
    "vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=2,"
    "vt_cache_size=100,vt_poller_interval=30"
)
COLUMNS = (*CURRENT_COLUMNS, Column("tenant", "varchar", "varchar(64)"))


@pytest.fixture
def clock():
    return FakeClock()


def table(clock: FakeClock, limits: str, rows: list[tuple[int, str]], **extra: int):
    """An engine driven by hand, the manager of its table q (``limits`` added to its
    comment, ``extra`` fields replaced) and the store."""
    store = InMemoryStore()
    comment = BASE
    for k, v in extra.items():
        comment = _set(comment, f"vt_{k}", v)
    store.create_table("q", f"{comment},{limits}" if limits else comment, columns=COLUMNS)
    for rid, tenant in rows:
        store.insert("q", rid, message=f"m{rid}", tenant=tenant)
    engine = MessageEngine(
        store, clock=clock, rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    engine.refresh()
    return engine, engine._manager("q", ""), store


def _set(comment: str, key: str, value: int) -> str:
    fields = [f for f in comment.split(",") if not f.startswith(f"{key}=")]
    return ",".join([*fields, f"{key}={value}"])


def drain(sub: Subscriber) -> list:
    out = []
    while batch := sub.next_batch(0):
        out.extend(batch)
    return out


def ack(m: MessageManager, sub: Subscriber) -> None:
    ids = [v[0] for v in drain(sub)]
    if ids:
        m.ack(ids)


def send_all(m: MessageManager) -> int:
    n = 0
    while taken := m.send_once():
        n += taken
    return n


def test_a_table_without_limits_has_no_limiter_and_its_plain_cache(clock):
    engine, m, _ = table(clock, "", [(1, "a")])
    assert m._limiter is None and type(m.cache.due) is DueRows
    assert m.cache.inflight.on_land is None
    engine.close()


def test_a_rate_starts_empty_and_lets_its_burst_then_its_rate_go(clock):
    engine, m, store = table(clock, "vt_rate=10/s,vt_rate_burst=2", [(i, "a") for i in range(20)])
    sub = m.subscribe()
    m.poll_once()
    assert send_all(m) == 0  # a new sender's bucket is empty
    clock.advance(0.1)
    assert send_all(m) == 1
    clock.advance(5)
    assert send_all(m) == 2  # never more than the burst at once
    assert len(drain(sub)) == 3
    m.postpone_once(everything=True)  # the sent ones count their attempt
    # held back: not an attempt, still queued in its place
    held = [r for r in store.rows["q"].values() if r["epoch"] == 0]
    assert len(held) == 17 and m.cache.due.queued == 17
    assert m._limiter.throttled["rate"] >= 2
    assert m._idle_wait_s() == pytest.approx(0.1, abs=0.01)  # the next token
    engine.close()


def test_a_rate_holds_across_the_subscribers_in_every_interval(clock):
    engine, m, _ = table(
        clock, "vt_rate=20/s,vt_rate_burst=3", [(i, "a") for i in range(200)], cache_size=1000
    )
    subs = [m.subscribe() for _ in range(3)]
    m.poll_once()
    sent_ns: list[int] = []
    for _ in range(300):  # 3 s in steps of 10 ms
        clock.advance(0.01)
        n = send_all(m)
        sent_ns += [clock.now_ns()] * n
        for s in subs:  # acked at once: the windows never limit
            ack(m, s)
    assert 55 <= len(sent_ns) <= 3 + 20 * 3
    assert rate_violations(sent_ns, 20.0, 3) == []
    engine.close()


def test_max_in_flight_caps_the_group_and_frees_on_acks_and_ack_waits(clock):
    engine, m, _ = table(clock, "vt_max_in_flight=3", [(i, "a") for i in range(10)])
    a, b = m.subscribe(), m.subscribe()
    m.poll_once()
    assert send_all(m) == 3
    got = drain(a) + drain(b)
    assert len(got) == 3 and m._limiter.throttled["in_flight"] >= 1
    m.ack([got[0][0]])
    assert m._send_wake.is_set()  # the group left its cap: the sender looks again
    assert send_all(m) == 1
    clock.advance(31)  # their ack waits are over: no longer in flight
    assert send_all(m) == 3
    engine.close()


def test_a_key_cap_holds_its_key_back_and_lets_the_others_go(clock):
    rows = [(1, "a"), (2, "a"), (3, "a"), (4, "b"), (5, "a"), (6, "c")]
    engine, m, store = table(clock, "vt_limit_key=tenant,vt_key_concurrency=1", rows)
    sub = m.subscribe()
    m.poll_once()
    assert send_all(m) == 3
    assert [v[0] for v in drain(sub)] == [1, 4, 6]  # best first, one of each key
    assert m._limiter.keys_at_cap == 3 and m._limiter.throttled["key_cap"] >= 1
    assert store.rows["q"][2]["epoch"] == 0  # held back: not an attempt
    m.ack([1])
    assert send_all(m) == 1
    assert [v[0] for v in drain(sub)] == [2]  # its place kept: the key's next
    m.ack([2, 4, 6])
    send_all(m)
    assert [v[0] for v in drain(sub)] == [3]
    engine.close()


def test_a_key_cap_above_one_caps_without_order(clock):
    rows = [(i, "a") for i in range(1, 6)]
    engine, m, _ = table(clock, "vt_limit_key=tenant,vt_key_concurrency=2", rows)
    sub = m.subscribe()
    m.poll_once()
    assert send_all(m) == 2
    drain(sub)
    clock.advance(31)  # ack waits over: the key is free again
    assert send_all(m) == 2
    engine.close()


def test_a_row_the_check_drops_spends_no_token_and_gives_its_key_back(clock):
    rows = [(1, "a"), (2, "a")]
    engine, m, store = table(
        clock, "vt_limit_key=tenant,vt_key_concurrency=1,vt_rate=1000,vt_rate_burst=5", rows
    )
    sub = m.subscribe()
    m.poll_once()
    clock.advance(1)
    store.rows["q"][1]["time_acked"] = clock.now_ns()  # acked by DML since the poll
    assert m.send_once() == 1  # taken, dropped by the check
    assert drain(sub) == [] and m._limiter.keys_at_cap == 0
    assert m._limiter._group.available(clock.now_ns()) == 5
    m.poll_once()
    send_all(m)
    assert [v[0] for v in drain(sub)] == [2]
    engine.close()


def test_a_key_rate_holds_one_key_and_not_the_others(clock):
    rows = [(i, "a") for i in range(1, 6)] + [(10, "b"), (11, "b")]
    engine, m, _ = table(clock, "vt_limit_key=tenant,vt_key_rate=1/s", rows)
    sub = m.subscribe()
    m.poll_once()
    clock.advance(1)
    send_all(m)
    assert [v[0] for v in drain(sub)] == [1, 10]
    clock.advance(0.5)
    assert send_all(m) == 0 and m._limiter.throttled["key_rate"] >= 1
    clock.advance(0.5)
    send_all(m)
    assert [v[0] for v in drain(sub)] == [2, 11]
    engine.close()


def test_fair_share_serves_the_keys_in_turn_and_the_noisy_one_gets_the_rest(clock):
    rows = [(i, "noisy") for i in range(1, 21)] + [(100, "q1"), (200, "q2")]
    engine, m, _ = table(clock, "vt_fair_key=tenant", rows)
    assert isinstance(m.cache.due, KeyedDue)
    sub = m.subscribe(max_in_flight=4)
    m.poll_once()
    send_all(m)
    first = [v[0] for v in drain(sub)]
    assert set(first) >= {100, 200} and len(first) == 4  # the quiet keys do not wait
    m.ack(first)
    for _ in range(10):
        send_all(m)
        ack(m, sub)
    assert m.cache.due.queued == 0  # work-conserving: the noisy key took what was left
    engine.close()


def test_fair_share_keeps_priority_within_a_key(clock):
    engine, m, store = table(clock, "vt_fair_key=tenant", [])
    for rid, prio in ((1, 5), (2, 1), (3, 3)):
        store.insert("q", rid, message="m", tenant="a", priority=prio)
    sub = m.subscribe()
    m.poll_once()
    send_all(m)
    assert [v[0] for v in drain(sub)] == [2, 3, 1]
    engine.close()


def test_fair_share_leaves_a_noisy_keys_backlog_in_the_table_so_the_others_find_room(clock):
    rows = [(i, "noisy") for i in range(1, 41)] + [(100, "quiet")]
    engine, m, _ = table(clock, "vt_fair_key=tenant", rows, cache_size=8)
    sub = m.subscribe(max_in_flight=2)
    m.poll_once()
    for _ in range(10):  # the pass goes on past the noisy rows it leaves in the table
        m.poll_once(restart=False)
    send_all(m)
    assert 100 in [v[0] for v in drain(sub)]
    engine.close()


def test_a_filtered_stream_of_a_keyed_table_finds_its_rows(clock):
    rows = [(1, "a"), (2, "b"), (3, "a"), (4, "b")]
    engine, m, _ = table(clock, "vt_limit_key=tenant,vt_key_concurrency=5", rows)
    only_b = m.subscribe(accepts=lambda values: values[2] == "b")
    m.poll_once()
    send_all(m)
    assert [v[0] for v in drain(only_b)] == [2, 4]
    rest = m.subscribe()
    send_all(m)
    assert [v[0] for v in drain(rest)] == [1, 3]
    engine.close()


def test_new_settings_keep_what_is_in_flight_under_the_cap(clock):
    rows = [(1, "a"), (2, "a"), (3, "a")]
    engine, m, store = table(clock, "vt_limit_key=tenant,vt_key_concurrency=1", rows)
    sub = m.subscribe()
    m.poll_once()
    send_all(m)
    assert [v[0] for v in drain(sub)] == [1]
    d = store.definitions["q"]
    store.definitions["q"] = dataclasses.replace(
        d, comment=d.comment.replace("concurrency=1", "concurrency=2")
    )
    engine.refresh()
    assert m.config.flow.key_concurrency == 2 and m._limiter.keys_at_cap == 0
    send_all(m)
    assert [v[0] for v in drain(sub)] == [2]  # one in flight already, one more
    engine.close()


def test_a_takeover_restarts_the_rates_empty(clock):
    engine, m, _ = table(clock, "vt_rate=10/s,vt_rate_burst=5", [(i, "a") for i in range(20)])
    m.subscribe()
    m.poll_once()
    clock.advance(10)
    m.hold(0.0)  # a takeover with nothing to wait for: the window starts again, empty
    assert send_all(m) == 0
    clock.advance(0.3)
    assert send_all(m) == 3
    engine.close()


def test_what_a_limit_held_back_shows_in_list_tables_msgtable_tables_and_the_metrics(clock):
    rows = [(1, "a"), (2, "a"), (3, "b")]
    engine, m, _ = table(clock, "vt_limit_key=tenant,vt_key_concurrency=1,vt_rate=100/s", rows)
    m.subscribe()
    m.poll_once()
    clock.advance(1)
    send_all(m)
    (status,) = [s for s in engine.list_tables() if s.name == "q"]
    assert status.limits == "rate 100/s (burst 10), tenant: at most 1 in flight"
    assert dict(status.throttled)["key_cap"] >= 1 and status.keys_at_cap == 2
    info = table_info_from_proto(table_status_to_proto(status))  # the wire, both ways
    assert (info.limits, info.keys_at_cap) == (status.limits, 2)
    assert info.throttled == dict(status.throttled)
    text = format_tables([info])
    assert "flow control (held back: the sends a limit held messages back in):" in text
    assert "  q: rate 100/s (burst 10), tenant: at most 1 in flight; held back: key_cap" in text
    assert "2 keys at their cap now" in text
    families = {
        f.name: f
        for f in text_string_to_metric_families(generate_latest(registry_for(engine)).decode())
    }
    held = {
        s.labels["reason"]: s.value
        for s in families["msgtable_sends_throttled"].samples
        if s.name.endswith("_total")
    }
    assert held["key_cap"] >= 1 and held["rate"] == 0
    (capped,) = families["msgtable_keys_at_cap"].samples
    assert capped.value == 2
    engine.close()


def test_a_table_without_limits_shows_none_and_has_no_flow_samples(clock):
    engine, _, _ = table(clock, "", [(1, "a")])
    (status,) = [s for s in engine.list_tables() if s.name == "q"]
    assert (status.limits, status.throttled, status.keys_at_cap) == ("", (), 0)
    assert "flow control" not in format_tables(
        [table_info_from_proto(table_status_to_proto(status))]
    )
    families = {
        f.name: f
        for f in text_string_to_metric_families(generate_latest(registry_for(engine)).decode())
    }
    assert families["msgtable_sends_throttled"].samples == []
    engine.close()


def test_rows_a_fair_pass_left_in_the_table_are_read_once_the_cache_has_room(clock):
    rows = [(i, "noisy") for i in range(1, 21)]
    engine, m, _ = table(clock, "vt_fair_key=tenant", rows, cache_size=8)
    sub = m.subscribe(max_in_flight=100)
    while m.poll_once(restart=False) or (m.cache.due.pending and m.cache.due.room()):
        if m._cursor is None:
            break
    assert m.cache.due.queued < 20 and m.cache.due.pending  # some left behind, and known
    got: list = []
    for _ in range(20):
        send_all(m)
        got += drain(sub)
        if m.cache.due.wants_refill():
            m.poll_once(restart=False)
    assert sorted(v[0] for v in got) == list(range(1, 21))  # none stranded in the table
    engine.close()


def test_a_send_with_nothing_due_counts_nothing_held_and_the_sender_sleeps(clock):
    engine, m, _ = table(clock, "vt_rate=10/s,vt_rate_burst=1", [(1, "a"), (2, "a")])
    sub = m.subscribe()
    m.poll_once()
    clock.advance(0.1)
    assert send_all(m) == 1  # the second held back by the rate
    held = m._limiter.throttled["rate"]
    m.unsubscribe(sub)  # the cache is dropped: nothing due
    clock.advance(1)
    m.postpone_once()  # the sent one's (its postpone is due: the sender would write it)
    for _ in range(5):
        assert m.send_once() == 0
    assert m._limiter.throttled["rate"] == held  # no send began: none held back
    assert m._idle_wait_s() > 0  # and no past wake-up time to spin on
    engine.close()


def test_a_next_token_already_due_when_the_sender_sleeps_wakes_it_at_once(clock):
    """The send's check may outlast the wait for one token: the sender must not sleep on
    to its next poll then (a rate of 1,000/s went at ~100/s that way)."""
    engine, m, _ = table(clock, "vt_rate=10/s,vt_rate_burst=1", [(1, "a"), (2, "a")])
    m.subscribe()
    m.poll_once()
    clock.advance(0.1)
    assert send_all(m) == 1  # the second held back by the rate: its token in 0.1 s
    clock.advance(0.2)  # the check and the hand-over took longer than that
    assert m._idle_wait_s() == 0
    assert send_all(m) == 1
    engine.close()
