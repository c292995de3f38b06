"""A subscription's own limits (issue 45, item 4) on a real server: a subscription with a
rate of its own holds it while another subscription of the same table and the default group
run unlimited; an alter changes the limit live under a connected subscriber; bad values are
one-line errors over a raw gRPC stub (a client without retries), and nothing is written."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest

from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.proto.msgtable.v1 import messaging_pb2_grpc as pb_grpc

from ..flowcheck import Delivery, rate_overshoots
from .helpers import Served, serve
from .test_flow_control import TENANT, Workers, enqueue, first_attempts


@pytest.fixture
def served(db_dsn: str):
    with serve(db_dsn) as s:
        yield s


@contextmanager
def stub_of(s: Served) -> Iterator[pb_grpc.MessagingStub]:
    with grpc.insecure_channel(s.server.address) as channel:
        yield pb_grpc.MessagingStub(channel)


def span_s(ds: list[Delivery]) -> float:
    sent = sorted(d.sent_ns for d in ds)
    return (sent[-1] - sent[0]) / 1e9


def limits_of(s: Served) -> dict[str, str]:
    return {x.subscription: x.limits for x in s.client.list_subscriptions("jobs")}


def test_a_subscriptions_own_rate_holds_while_its_table_and_another_subscription_run_free(
    served: Served,
):
    served.create_table("jobs", TENANT, vt_poller_interval=0.5)
    served.client.create_subscription("jobs", "slow", limits={"rate": "10/s", "rate_burst": 2})
    served.client.create_subscription("jobs", "free")
    assert limits_of(served) == {"slow": "rate 10/s (burst 2)", "free": ""}
    n = 80
    enqueue(served.db, "jobs", [(i, "a") for i in range(1, n + 1)])
    groups = {
        "default": Workers(served.client, "jobs", 2),
        "free": Workers(served.client, "jobs", 2, subscription="free"),
        "slow": Workers(served.client, "jobs", 2, subscription="slow"),
    }
    try:
        for w in groups.values():
            w.wait_for(n, timeout_s=120)
    finally:
        for w in groups.values():
            w.close()
    slow = groups["slow"].log.deliveries
    assert rate_overshoots(slow, 10, 2) == [], "the subscription's own rate overshot"
    assert span_s(slow) >= (n - 2) / 10 * 0.9, f"{n} sent in {span_s(slow):.1f}s: not held"
    assert first_attempts(slow)  # held back: never counted as an attempt
    for name in ("default", "free"):
        ds = groups[name].log.deliveries
        # unlimited: far more in its window than 10/s would let go (a generous bound)
        assert n > 2 + 10 * span_s(ds), f"{name}: {n} in {span_s(ds):.1f}s, as if limited"
        assert rate_overshoots(ds, 10, 2), f"{name} was held to the other group's rate"
    (table,) = [t for t in served.client.list_tables() if t.name == "jobs" and not t.subscription]
    assert table.limits == ""


def test_an_alter_changes_a_subscriptions_limit_live_under_a_connected_subscriber(
    served: Served,
):
    served.create_table("jobs", TENANT, vt_poller_interval=0.5, vt_max_in_flight=50)
    served.client.create_subscription("jobs", "s", limits={"rate": "4/s", "rate_burst": 1})
    assert limits_of(served) == {"s": "rate 4/s (burst 1), max in flight 50"}
    n = 200
    enqueue(served.db, "jobs", [(i, "a") for i in range(1, n + 1)])
    w = Workers(served.client, "jobs", 2, subscription="s")
    try:
        w.wait_for(8, timeout_s=60)
        before = list(w.log.deliveries)
        # (taken as the alter begins: the new settings apply inside the call, and on a busy
        # machine the rest of the 200 went out before the call returned)
        altered_ns = served.now_ns()
        served.client.alter_subscription("jobs", "s", limits={"rate": "off"})
        assert limits_of(served) == {"s": "max in flight 50"}
        w.wait_for(n, timeout_s=120)  # the same subscribers: the stream was never ended
    finally:
        w.close()
    assert rate_overshoots(before, 4, 1) == [], "the rate before the alter overshot"
    after = [d for d in w.log.deliveries if d.sent_ns > altered_ns]
    assert len(after) > n / 2, f"only {len(after)} sent after the alter"
    assert len(after) > 1 + 4 * span_s(after) * 3, (
        f"{len(after)} in {span_s(after):.1f}s after the alter: still near 4/s"
    )
    # "" puts the table's back: the subscription has none of its own
    served.client.alter_subscription("jobs", "s", limits={"rate": ""})
    assert limits_of(served) == {"s": "max in flight 50"}
    served.client.alter_subscription("jobs", "s", limits={"max_in_flight": "3"})
    assert limits_of(served) == {"s": "max in flight 3"}


BAD = [
    (dict(rate="fast"), "rate='fast' is not a rate (N, N/s, N/m or N/h)"),
    (dict(rate="0/s"), "rate=0/s must be above 0"),
    (dict(max_in_flight="-3"), "max_in_flight=-3 must be between 1 and 10,000,000"),
    (dict(rate_burst="2"), "rate_burst needs rate (the subscription's or the table's)"),
    (dict(key_concurrency="2"), "key_concurrency needs the table's vt_limit_key"),
    (dict(max_in_flight="9" * 100), "limit 'max_in_flight' is over 64 characters long"),
]


@pytest.mark.parametrize(("limits", "why"), BAD, ids=[w.split()[0] for _, w in BAD])
def test_a_bad_limit_is_a_one_line_error_over_a_raw_stub_and_nothing_is_written(
    served: Served, limits: dict[str, str], why: str
):
    served.create_table("jobs", TENANT)
    served.client.create_subscription("jobs", "ok")
    with stub_of(served) as stub:
        for call, request in (
            (
                stub.CreateSubscription,
                pb.CreateSubscriptionRequest(
                    table="jobs", name="bad", settings=pb.SubscriptionSettings(**limits)
                ),
            ),
            (
                stub.AlterSubscription,
                pb.AlterSubscriptionRequest(
                    table="jobs", name="ok", settings=pb.SubscriptionSettings(**limits)
                ),
            ),
        ):
            with pytest.raises(grpc.RpcError) as caught:
                call(request, timeout=30)
            err = caught.value
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
            assert why in err.details() and "\n" not in err.details(), err.details()
            assert "subscription jobs/" in err.details(), err.details()
    assert limits_of(served) == {"ok": ""}, "a refused request changed a subscription"
    assert not served.sql("show tables like 'jobs__bad'"), "a refused create made a state table"


def test_a_definitions_table_from_before_own_limits_serves_and_takes_them_at_an_alter(
    served: Served,
):
    served.create_table("jobs", TENANT)
    served.client.create_subscription("jobs", "old")
    # as a server of an earlier version made it: no limits column
    served.sql("alter table msgtable_subscriptions drop column limits")
    served.engine.refresh()
    assert limits_of(served) == {"old": ""}
    (sub,) = served.client.list_subscriptions("jobs")
    assert not sub.load_error, sub.load_error
    served.client.alter_subscription("jobs", "old", limits={"max_in_flight": 7})
    assert limits_of(served) == {"old": "max in flight 7"}
    served.client.create_subscription("jobs", "new", limits={"rate": "2/s"})
    assert limits_of(served) == {"old": "max in flight 7", "new": "rate 2/s (burst 1)"}
