"""Subscriptions and push endpoints served on the in-memory store: the registry, the fan-out
and a subscription's manager run on InMemoryStore's subscription_store as they do on MySQL's
(the fake is held to SubscriptionSQL by tests/integration/test_subscription_store_contract.py),
so the features' unit tests need no database."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from msgtable.core.clock import FakeClock
from msgtable.core.endpoints import Endpoint
from msgtable.core.subscriptions import Subscription, state_table_name
from msgtable.core.tables import DEMO_COMMENT
from msgtable.engine.engine import MessageEngine
from msgtable.errors import InvalidArgument, TableNotFound
from msgtable.features.assembly import assemble
from msgtable.features.subscriptions.registry import Registry
from msgtable.testing import InMemoryStore
from tests.unit.engine.test_manager import drain

STATE = state_table_name("q", "big")
SECRET = "a secret of twenty bytes"


@pytest.fixture
def engine() -> Iterator[MessageEngine]:
    store = InMemoryStore()
    store.create_table("q", DEMO_COMMENT)
    e = assemble(
        store, clock=FakeClock(), rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    e.refresh()
    yield e
    e.close()


def fan_out(e: MessageEngine) -> int:
    """One fan-out step of table q (the loop's, which run_loops=False leaves to the test)."""
    registry = e._subscriptions
    assert isinstance(registry, Registry)
    return registry._fanouts["q"].fanout_once()


def test_a_subscription_is_created_fanned_out_served_and_dropped_in_memory(engine: MessageEngine):
    store = engine.store
    assert isinstance(store, InMemoryStore)
    store.insert("q", 1, message="before")  # before the first subscription: not for it
    assert engine.create_subscription(Subscription("q", "big", filter="id > 2")) == 0
    for i in (2, 3, 4):
        store.insert("q", i, message=f"m{i}")
    assert fan_out(engine) == 3
    m = engine.loaded(STATE)
    assert m is not None, "the subscription's state table is served once created"
    sub = engine.subscribe("q", subscription="big")
    m.poll_once()  # (the fan-out's hand-over may have polled them already)
    assert m.send_once() == 2
    assert drain(sub) == [(3, "m3"), (4, "m4")]
    (status,) = engine.list_subscriptions("q")
    assert (status.subscription, status.lag, status.filter) == ("big", 2, "id > 2")
    assert engine.ack("q", "", [3, 4], subscription="big") == 2
    (status,) = engine.list_subscriptions("q")
    assert status.lag == 0
    engine.drop_subscription("q", "big")
    assert engine.list_subscriptions("q") == []
    assert STATE not in store.rows


def test_a_subscription_made_twice_is_invalid_in_memory_as_on_mysql(engine: MessageEngine):
    engine.create_subscription(Subscription("q", "big"))
    with pytest.raises(InvalidArgument, match="exists already"):
        engine.create_subscription(Subscription("q", "big"))
    with pytest.raises(TableNotFound, match="q/ghost"):
        engine.drop_subscription("q", "ghost")


def test_push_endpoints_are_kept_in_memory_and_checked_before(engine: MessageEngine):
    with pytest.raises(InvalidArgument, match="push-allow"):
        engine.set_endpoint(Endpoint("q", "", "https://hooks.example/q", SECRET))
    with pytest.raises(TableNotFound, match="no push endpoint for q"):
        engine.drop_endpoint("q")
    store = engine.store.endpoint_store
    assert store is not None
    store.set_endpoint(Endpoint("q", "", "https://hooks.example/q", SECRET), 0)
    engine.drop_endpoint("q")
    assert store.endpoints() == []


def test_a_store_without_subscriptions_says_what_they_need():
    store = InMemoryStore()
    store.create_table("q", DEMO_COMMENT)
    store.subscription_store = None  # type: ignore[assignment]
    e = assemble(store, clock=FakeClock(), discovery_interval_s=3600, run_loops=False)
    try:
        e.refresh()
        with pytest.raises(InvalidArgument, match="subscriptions need a MySQL-family database"):
            e.create_subscription(Subscription("q", "big"))
        assert e.list_subscriptions() == []
    finally:
        e.close()


def test_while_committed_rows_are_left_unseen_the_fan_out_looks_again_soon(
    engine: MessageEngine,
):
    """After a fan-out, the loop waits the poller interval unless committed rows are left
    unseen (its pick skipped them as locked; here: rows no fan-out ran for): then 0.05 s,
    doubling up to the interval, and the interval again once none are left."""
    store = engine.store
    assert isinstance(store, InMemoryStore)
    engine.create_subscription(Subscription("q", "big"))
    registry = engine._subscriptions
    assert isinstance(registry, Registry)
    fanout = registry._fanouts["q"]
    m = engine.loaded("q")
    assert m is not None
    interval = m.config.poller_interval_s
    assert fanout._wait_s() == interval, "nothing left: the poller interval"
    store.insert("q", 1, message="m1")
    waits = [fanout._wait_s() for _ in range(12)]
    assert waits[:3] == [0.05, 0.1, 0.2]
    assert waits[-1] == interval and waits == sorted(waits), waits
    assert fan_out(engine) == 1
    assert fanout._wait_s() == interval, "none left: the poller interval again"
