"""The dashboard end to end (README: Dashboard): a real server on the real database, its
HTTP server on a real loopback socket; after known traffic the API's numbers are exact, a
redrive over HTTP brings a dead letter back, and auth works as over gRPC."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from msgtable.observe.dashboard import DashboardApi, DashboardServer, RateHistory
from msgtable.server.auth import Authorizer

from ..waiting import wait_until
from .helpers import Collector, Served, serve

OPS = "t0ken-of-the-ops-team"
JOBS_ONLY = "t0ken-of-the-jobs-team"
AUTH = {
    "tokens": {OPS: "ops", JOBS_ONLY: "jobs"},
    "allow": [
        {"principal": "ops", "tables": ["*"], "actions": ["list", "redrive"]},
        {"principal": "jobs", "tables": ["jobs"], "actions": ["list"]},
    ],
}


@pytest.fixture
def served(db_dsn: str):
    with serve(db_dsn) as s:
        yield s


def dashboard(served: Served, authorizer: Authorizer | None = None) -> DashboardServer:
    d = DashboardServer(DashboardApi(served.engine, RateHistory(0.2), authorizer), "127.0.0.1:0")
    d.open()
    return d


def call(
    d: DashboardServer, path: str, body: Any = None, token: str | None = None
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(d.url.rstrip("/") + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def entry(d: DashboardServer, name: str, token: str | None = None) -> dict[str, Any]:
    code, state = call(d, "/api/state", token=token)
    assert code == 200, state
    return next(t for t in state["tables"] if t["name"] == name and not t["subscription"])


def test_the_api_shows_exact_numbers_after_known_traffic_and_redrives(served: Served):
    served.create_table("jobs", vt_poller_interval=30, vt_ack_wait=30)
    served.sql("insert into jobs(id, message) values " + ",".join(f"({i}, 'm')" for i in range(6)))
    d = dashboard(served)
    c = None
    try:
        b = wait_until(
            lambda: (b := entry(d, "jobs")["backlog"])["due"] == 6 and b,
            timeout_s=15,
            what="the backlog of 6 due read (at most every 5 s)",
        )
        assert b["scheduled"] == 0 and b["by_age"][0] == [60.0, 6]
        assert b["by_age"][-1] == [None, 6] and 0 <= b["oldest_unacked_age_s"] < 60
        c = Collector(served.client, "jobs")
        got = {m.id: m for m in c.take(6)}
        assert served.client.ack("jobs", [0, 1, 2]) == 3
        assert got[3].reject("poison") == 1
        t = wait_until(
            lambda: (e := entry(d, "jobs"))["dead"] == 1 and e,
            what="the dead letter counted",
        )
        assert t["totals"] == {
            "sent": 6, "acked": 3, "released": 0, "rejected": 1, "dead_lettered": 1,
        }  # fmt: skip
        assert t["in_flight"] == 2 and t["subscribers"] == 1 and t["cached"] == 0
        assert t["backlog"]["in_flight"] == 2
        b = wait_until(
            lambda: (b := entry(d, "jobs")["backlog"])["scheduled"] == 2 and b,
            timeout_s=15,
            what="the backlog read again: 2 unacked in flight (scheduled), none due",
        )
        assert b["due"] == 0 and b["by_age"][-1] == [None, 2]
        # the history's deltas add up to the counters once sampled after the traffic
        rates = wait_until(
            lambda: (r := entry(d, "jobs")["rates"])["acked"] and sum(r["acked"]) == 3 and r,
            what="a sample after the acks",
        )
        assert sum(rates["sent"]) == 6 and sum(rates["dead_lettered"]) == 1
        code, state = call(d, "/api/state")
        assert state["server"]["database"] == {"up": True, "error": ""}
        assert state["server"]["leading"] is True
        assert state["server"]["lease_holder"] == "this server"

        code, dead = call(d, "/api/dead?table=jobs")
        assert code == 200 and dead["count"] == 1
        assert [x["id"] for x in dead["dead_letters"]] == [3]
        code, body = call(d, "/api/redrive", {"table": "jobs", "ids": [3]})
        assert (code, body) == (200, {"moved": 1, "skipped": []})
        (again,) = c.take(1, timeout_s=10)
        assert again.id == 3
        assert call(d, "/api/dead?table=jobs")[1]["count"] == 0
    finally:
        if c is not None:
            c.close()
        d.close()


def test_with_auth_a_call_needs_a_token_and_sees_only_what_it_may_list(served: Served):
    served.create_table("jobs")
    served.create_table("payroll")
    wait_until(
        lambda: {t.name for t in served.engine.list_tables()} >= {"jobs", "payroll"},
        what="both tables loaded",
    )
    d = dashboard(served, Authorizer.from_dict(AUTH))
    try:
        code, body = call(d, "/api/state")
        assert code == 401 and "token" in body["error"]
        assert call(d, "/api/state", token="a-token-nobody-has-here")[0] == 401
        code, state = call(d, "/api/state", token=JOBS_ONLY)
        assert code == 200 and [t["name"] for t in state["tables"]] == ["jobs"]
        code, state = call(d, "/api/state", token=OPS)
        assert [t["name"] for t in state["tables"]] == ["jobs", "payroll"]
        assert call(d, "/api/dead?table=payroll", token=JOBS_ONLY)[0] == 404
        assert call(d, "/api/redrive", {"table": "jobs"}, token=JOBS_ONLY)[0] == 403
        code, body = call(d, "/api/redrive", {"table": "jobs"}, token=OPS)
        assert (code, body) == (200, {"moved": 0, "skipped": []})
    finally:
        d.close()


def test_two_servers_name_the_same_lease_holder(db_dsn: str):
    with serve(db_dsn, lease_period_s=2.0) as first, serve(db_dsn, lease_period_s=2.0) as second:
        first.create_table("jobs")
        wait_until(lambda: first.engine.leading != second.engine.leading, what="one leader")
        leader, standby = (first, second) if first.engine.leading else (second, first)
        d_leader, d_standby = dashboard(leader), dashboard(standby)
        try:
            want = leader.server.address

            def holders() -> tuple[object, ...]:
                a, b = call(d_leader, "/api/state")[1], call(d_standby, "/api/state")[1]
                return (
                    a["server"]["leading"], a["server"]["lease_holder"],
                    b["server"]["leading"], b["server"]["lease_holder"],
                )  # fmt: skip

            wait_until(
                lambda: holders() == (True, want, False, want),
                what=lambda: f"both naming {want} (they say {holders()})",
            )
        finally:
            d_leader.close()
            d_standby.close()


def test_a_subscription_has_its_own_entry_rates_and_dead_letters(served: Served):
    served.create_table("orders", vt_poller_interval=0.2, vt_ack_wait=30)
    served.client.create_subscription("orders", "billing")
    served.sql("insert into orders(id, message) values (1, 'a'), (2, 'b'), (3, 'c')")
    d = dashboard(served)
    c = Collector(served.client, "orders", subscription="billing")
    try:
        got = {m.id: m for m in c.take(3)}
        assert got[1].ack() == 1
        assert got[2].reject("bad") == 1

        def billing() -> dict[str, Any]:
            state = call(d, "/api/state")[1]
            return next(t for t in state["tables"] if t["subscription"] == "billing")

        b = wait_until(
            lambda: (b := billing())["rates"] and sum(b["rates"]["dead_lettered"]) == 1 and b,
            what="the subscription's dead letter in its rates",
        )
        assert b["kind"] == "subscription" and b["name"] == "orders"
        assert b["totals"]["acked"] == 1 and b["in_flight"] == 1 and b["subscribers"] == 1
        code, dead = call(d, "/api/dead?table=orders&subscription=billing")
        assert code == 200 and [x["id"] for x in dead["dead_letters"]] == [2]
        code, body = call(d, "/api/redrive", {"table": "orders", "subscription": "billing"})
        assert (code, body) == (200, {"moved": 1, "skipped": []})
        (again,) = c.take(1, timeout_s=10)
        assert again.id == 2
    finally:
        c.close()
        d.close()


KEYED = (
    "dedup_key varchar(64), unique index dedup_idx(dedup_key), "
    "index dedup_created_idx(time_created, dedup_key), schedule_tick bigint"
)


def test_a_table_shows_its_dedup_and_its_schedules_last_and_next_tick(served: Served):
    served.create_table("jobs", KEYED, vt_dedup="dedup_key", vt_dedup_window=30)
    served.create_table("plain")
    wait_until(
        lambda: {t.name for t in served.engine.list_tables()} >= {"jobs", "plain"},
        what="both tables loaded",
    )
    served.engine.schedules.create_schedule(
        "beat", "jobs", "* * * * * *", {"message": "beat"}, timezone="Europe/Paris"
    )
    d = dashboard(served)
    try:
        jobs = wait_until(
            lambda: (j := entry(d, "jobs"))["schedules"] and j["schedules"][0]["ticks"] >= 2 and j,
            timeout_s=15,
            what="the schedule beat shown with two ticks enqueued",
        )
        assert jobs["dedup"] == {"column": "dedup_key", "window_s": 30.0}
        (beat,) = jobs["schedules"]
        assert (beat["name"], beat["cron"], beat["timezone"], beat["missed"]) == (
            "beat",
            "* * * * * *",
            "Europe/Paris",
            "skip",
        )
        assert beat["next_tick_s"] == beat["last_tick_s"] + 1.0, beat
        ticks = {r[0] for r in served.sql("select schedule_tick from jobs")}
        assert round(beat["last_tick_s"]) * 10**9 in ticks, (beat, ticks)
        plain = entry(d, "plain")
        assert (plain["dedup"], plain["schedules"]) == (None, [])
    finally:
        d.close()
