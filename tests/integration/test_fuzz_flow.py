"""Fuzzing flow control (issue 45; the rest of the fuzz suite is tests/integration/test_fuzz.py):
hostile limits in a table's comment load or fail with one line naming the field, so do a
subscription's own limits sent by a raw stub (nothing written for a refused one), and
hostile key values (quotes, NUL, a long text, non-BMP characters, NULL) under a key cap and
a fairness key are delivered, each once, within their cap, touching nothing else."""

from __future__ import annotations

import grpc
import pytest

from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.proto.msgtable.v1 import messaging_pb2_grpc as pb_grpc

from ..flowcheck import cap_violations
from ..waiting import wait_until
from .helpers import serve
from .test_flow_control import TENANT, Workers
from .test_fuzz import HOSTILE_VALUES, _comment_literal

LIMITS = [
    ("vt_rate", "0"),
    ("vt_rate", "-1/s"),
    ("vt_rate", "1e400"),
    ("vt_rate", "inf"),
    ("vt_rate", "10/fortnight"),
    ("vt_rate", "10//s"),
    ("vt_rate", "'; drop table canary; --"),
    ("vt_rate", "\uff11\uff10"),  # fullwidth digits: float() reads them (a rate of 10)
    ("vt_rate_burst", "5"),
    ("vt_max_in_flight", "99999999999999999999"),
    ("vt_max_in_flight", "0x10"),
    ("vt_key_concurrency", "-0"),
    ("vt_key_rate", "nan/s"),
    ("vt_limit_key", "tenant`"),
    ("vt_limit_key", "id"),
    ("vt_fair_key", "time_next"),
    ("vt_fair_key", "ça表"),
    ("vt_fair_key", "x" * 300),
]


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
def test_hostile_limits_load_or_fail_with_one_line_naming_the_field(db_dsn, ordered):
    with serve(db_dsn) as s:
        s.create_table("canary", vt_poller_interval=0.2)
        extra = "index order_idx(tenant, time_acked, id)" if ordered else ""
        for i, (field, value) in enumerate(LIMITS):
            fields = {field: "VALUE"}
            if ordered:
                fields["vt_order_key"] = "tenant"
            if field == "vt_rate_burst":
                fields["vt_rate"] = "5"
            columns = f"{TENANT}, {extra}" if extra else TENANT
            s.create_table(f"lim{i}", columns, **fields)
            s.sql(
                f"alter table lim{i} comment = "
                + "'"
                + _comment_literal(
                    s.sql(
                        "select table_comment from information_schema.tables "
                        f"where table_schema = database() and table_name = 'lim{i}'"
                    )[0][0].replace("VALUE", value)
                )
                + "'"
            )
        s.engine.refresh()
        by_name = {t.name: t for t in s.client.list_tables()}
        for i, (field, value) in enumerate(LIMITS):
            t = by_name[f"lim{i}"]
            if t.load_error:
                assert "\n" not in t.load_error and t.load_error.startswith(f"table lim{i}: ")
                assert field in t.load_error or "vt_order_key" in t.load_error, (value, t)
            else:
                assert t.limits, (field, value)  # loaded: its limits are shown
        assert not by_name["canary"].load_error
        assert [r[0] for r in s.sql("select count(*) from canary")] == [0]


def test_hostile_keys_are_delivered_once_each_within_their_cap(db_dsn):
    keys = [v for v in HOSTILE_VALUES if "\x00" not in v and len(v) < 64]
    keys += ["tenant\u202e", "", None, "K", "k"]
    with serve(db_dsn) as s:
        s.create_table("canary", vt_poller_interval=0.2)
        s.create_table(
            "jobs",
            TENANT,
            vt_limit_key="tenant",
            vt_key_concurrency=1,
            vt_fair_key="tenant",
            vt_poller_interval=0.2,
        )
        ids = []
        with s.db.connect() as conn:
            for i, key in enumerate(keys * 3, start=1):
                conn.exec_driver_sql(
                    "insert into jobs(id, tenant, message) values (%s, %s, %s)", (i, key, "m")
                )
                ids.append(i)
        w = Workers(s.client, "jobs", 3, hold_s=0.01)
        try:
            w.wait_for(len(ids), timeout_s=60)
        finally:
            w.close()
        ds = w.log.deliveries
        assert sorted(int(d.id) for d in ds) == ids  # each once
        assert cap_violations(ds, 1, 30, by_key=True) == []
        (t,) = [t for t in s.client.list_tables() if t.name == "jobs"]
        assert t.keys_at_cap == 0 and not t.load_error
        wait_until(lambda: [r[0] for r in s.sql("select count(*) from canary")] == [0])


# a subscription's own limits (proto SubscriptionSettings 20-25), each value sent raw
OWN_LIMITS = [
    ("rate", "0"),
    ("rate", "-1/s"),
    ("rate", "1e400"),
    ("rate", "inf/m"),
    ("rate", "10/fortnight"),
    ("rate", "'; drop table canary; --"),
    ("rate", "\uff11\uff10"),  # fullwidth digits: float() reads them (a rate of 10)
    ("rate", "\x00"),
    ("rate", "5/s" + " " * 70),  # stripped, as the comment's values are
    ("rate", "OFF"),
    ("rate_burst", "-0"),
    ("rate_burst", "1" * 5000),
    ("max_in_flight", "99999999999999999999"),
    ("max_in_flight", "0x10"),
    ("max_in_flight", "off"),
    ("key_rate", "nan/s"),
    ("key_rate", "5"),  # the table has no vt_limit_key
    ("key_burst", "3"),
    ("key_concurrency", "ça表"),
    ("key_concurrency", "off"),
]


def test_hostile_subscription_limits_are_refused_in_one_line_or_shown(db_dsn):
    with serve(db_dsn) as s:
        s.create_table("canary", vt_poller_interval=0.2)
        s.create_table("jobs", TENANT, vt_rate="100/s")
        with grpc.insecure_channel(s.server.address) as channel:
            stub = pb_grpc.MessagingStub(channel)
            made = []
            for i, (field, value) in enumerate(OWN_LIMITS):
                settings = pb.SubscriptionSettings(**{field: value})
                request = pb.CreateSubscriptionRequest(
                    table="jobs", name=f"s{i}", settings=settings
                )
                try:
                    stub.CreateSubscription(request, timeout=30)
                except grpc.RpcError as err:
                    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (value, err)
                    details = err.details() or ""
                    assert "\n" not in details and len(details) < 300, (value, details)
                    assert details.startswith(f"subscription jobs/s{i}: "), (value, details)
                    assert field in details, (value, details)
                else:
                    made.append(f"s{i}")
        by_name = {x.subscription: x for x in s.client.list_subscriptions("jobs")}
        assert sorted(by_name) == sorted(made), "a refused create left a subscription"
        shown = {OWN_LIMITS[int(n[1:])]: by_name[n].limits for n in made}
        assert shown == {
            ("rate", "\uff11\uff10"): "rate 10/s (burst 1)",
            ("rate", "5/s" + " " * 70): "rate 5/s (burst 1)",
            ("rate", "OFF"): "",
            ("max_in_flight", "off"): "rate 100/s (burst 10)",
            ("key_concurrency", "off"): "rate 100/s (burst 10)",
        }, shown
        states = {r[0] for r in s.sql("show tables like 'jobs\\_\\_%'")}
        assert states == {f"jobs__{n}" for n in made}, "a refused create left a state table"
        assert [r[0] for r in s.sql("select count(*) from canary")] == [0]
