"""The dashboard's JSON API and rate history without a database (README: Dashboard): the
in-memory engine, a fake clock, werkzeug's test client for the HTTP layer."""

from __future__ import annotations

import json
import random
import re
import socket

import pytest
from werkzeug.test import Client as HttpClient

from msgtable.core.clock import FakeClock
from msgtable.core.status import TableStatus
from msgtable.core.tables import DEMO_COMMENT
from msgtable.engine.engine import MessageEngine
from msgtable.errors import InvalidArgument
from msgtable.observe.dashboard import DashboardApi, DashboardServer, RateHistory, parse_listen
from msgtable.observe.dashboard.history import FIELDS
from msgtable.observe.dashboard.web import DashboardApp
from msgtable.server.auth import Authorizer
from msgtable.testing import InMemoryStore

COMMENT = DEMO_COMMENT.replace("vt_batch_size=10", "vt_batch_size=2")
OPS = "t0ken-of-the-ops-team"
JOBS_ONLY = "t0ken-of-the-jobs-team"
AUTH = {
    "tokens": {OPS: "ops", JOBS_ONLY: "jobs"},
    "allow": [
        {"principal": "ops", "tables": ["*"], "actions": ["list", "redrive"]},
        {"principal": "jobs", "tables": ["q"], "actions": ["list"]},
    ],
}


@pytest.fixture
def engine():
    store = InMemoryStore()
    store.create_table("q", COMMENT)
    store.create_table("secret", COMMENT)
    for i in range(5):
        store.insert("q", i, message=str(i))
    e = MessageEngine(
        store, clock=FakeClock(), rng=random.Random(1), discovery_interval_s=3600, run_loops=False
    )
    e.refresh()
    yield e
    e.close()


class Now:
    def __init__(self) -> None:
        self.s = 1_000_000.0

    def __call__(self) -> float:
        return self.s


def http(engine, authorizer=None, slots=720):
    now = Now()
    api = DashboardApi(engine, RateHistory(5.0, slots), authorizer, clock=now)
    return HttpClient(DashboardApp(api)), api, now


def get(client, path, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answer = client.get(path, headers=headers)
    return answer.status_code, json.loads(answer.get_data(as_text=True))


def post(client, path, body, token=None, content_type="application/json"):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answer = client.post(path, data=json.dumps(body), headers=headers, content_type=content_type)
    return answer.status_code, json.loads(answer.get_data(as_text=True))


def traffic(engine) -> list[int]:
    """Sends 4 of q's 5 messages, acks 2, rejects 1 (it dies: dead in place)."""
    m = engine._manager("q", "")
    sub = m.subscribe()
    m.poll_once()
    m.send_once()
    m.send_once()
    got = []
    while batch := sub.next_batch(0):
        got.extend(r[0] for r in batch)
    assert len(got) == 4
    engine.ack("q", "", got[:2])
    engine.reject("q", "", [got[2]], "poison")
    return got


def test_state_shows_every_table_with_its_counts_and_the_server(engine):
    client, _, _ = http(engine)
    traffic(engine)
    code, state = get(client, "/api/state")
    assert code == 200
    assert state["keyspace"] == engine.keyspace
    assert state["server"] == {
        "leading": True,
        "lease_holder": "this server",
        "database": {"up": True, "error": ""},
        "binlog": None,
        "sqs": None,
    }
    by_name = {t["name"]: t for t in state["tables"]}
    assert sorted(by_name) == ["q", "secret"]
    q = by_name["q"]
    assert q["totals"] == {"sent": 4, "acked": 2, "released": 0, "rejected": 1, "dead_lettered": 1}
    assert q["in_flight"] == 1 and q["dead"] == 1 and q["subscribers"] == 1
    assert q["sender"] == "this server" and q["sending"]  # it shares its database with none
    assert q["backlog"]["in_flight"] == 1
    assert set(q["rates"]) == set(FIELDS)


def test_state_reads_the_database_on_the_refresher_not_in_the_request(engine):
    """After the first answer, /api/state runs no statement: what the database says (dead
    letters, lag, the backlog, discovery) is the last refresh's, the counters are live."""
    client, api, now = http(engine)
    calls = []
    list_tables = engine.list_tables
    engine.list_tables = lambda: calls.append("list_tables") or list_tables()
    code, first = get(client, "/api/state")
    assert code == 200 and calls == ["list_tables"]  # no snapshot yet: the first reads
    assert first["read_at_s"] == now.s
    traffic(engine)  # sends 4, acks 2, rejects 1 (dead)
    now.s += 1
    engine.store.down = True  # a statement now would fail
    _, state = get(client, "/api/state")
    engine.store.down = False
    assert calls == ["list_tables"]
    q = next(t for t in state["tables"] if t["name"] == "q")
    assert q["totals"] == {"sent": 4, "acked": 2, "released": 0, "rejected": 1, "dead_lettered": 1}
    assert q["in_flight"] == 1 and q["subscribers"] == 1  # live
    assert q["dead"] == 0  # the database's count: as the last refresh read it
    assert state["read_at_s"] == now.s - 1
    api.refresh()  # the refresher's next round
    _, state = get(client, "/api/state")
    q = next(t for t in state["tables"] if t["name"] == "q")
    assert q["dead"] == 1 and state["read_at_s"] == now.s
    assert calls == ["list_tables"] * 2


def test_rates_sum_to_the_counters_once_sampled(engine):
    client, api, now = http(engine)
    api.sample()  # before any traffic: all zero
    traffic(engine)
    now.s += 5
    api.sample()
    _, state = get(client, "/api/state")
    assert state["history"]["times"] == [1_000_000.0, 1_000_005.0]
    q = next(t for t in state["tables"] if t["name"] == "q")
    assert q["rates"]["sent"] == [0.0, 4.0]
    assert q["rates"]["acked"] == [0.0, 2.0]
    assert q["rates"]["dead_lettered"] == [0.0, 1.0]


@pytest.fixture
def config(engine):
    return engine._manager("q", "").config


def status(config, name: str, **counts: int) -> TableStatus:
    return TableStatus(name=name, keyspace="ks", config=config, load_error=None, **counts)


def test_history_is_bounded_to_its_slots_and_drops_vanished_tables(config):
    h = RateHistory(5.0, slots=3)
    for i in range(1, 6):  # five samples into three slots
        h.sample(float(i), [status(config, "a", sent=10 * i), status(config, "b", acked=i)])
    assert h.times() == [3.0, 4.0, 5.0]
    assert h.series("a")["sent"] == [10.0, 10.0, 10.0]
    h.sample(6.0, [status(config, "a", sent=3)])  # a reopened (its counter restarted), b gone
    assert h.series("a")["sent"] == [10.0, 10.0, 3.0]
    assert h.keys() == [("a", "")]
    assert h.series("b")["acked"] == [0.0, 0.0, 0.0]  # unknown: zeros, not an error
    # the memory held is fixed: one array of `slots` doubles per field and key
    a = h._series[("a", "")]
    assert [len(d) for d in a.deltas] == [3] * len(FIELDS)


def test_a_key_seen_late_has_zeros_before_its_first_sample(config):
    h = RateHistory(5.0, slots=4)
    h.sample(1.0, [status(config, "a", sent=1)])
    h.sample(2.0, [status(config, "a", sent=1), status(config, "b", sent=7)])
    assert h.series("b")["sent"] == [0.0, 7.0]
    assert h.series("a")["sent"] == [1.0, 0.0]


def test_without_a_token_every_api_call_is_401_and_a_wrong_token_too(engine):
    client, _, _ = http(engine, Authorizer.from_dict(AUTH))
    for path in ("/api/state", "/api/dead?table=q"):
        code, body = get(client, path)
        assert code == 401 and "token" in body["error"]
        code, body = get(client, path, token="not-a-known-token-at-all")
        assert code == 401 and body == {"error": "unknown token"}
    code, _ = post(client, "/api/redrive", {"table": "q"})
    assert code == 401
    assert client.get("/").status_code == 200  # the page itself asks for the token


def test_a_table_the_token_may_not_list_is_absent_and_answers_like_a_missing_one(engine):
    client, _, _ = http(engine, Authorizer.from_dict(AUTH))
    traffic(engine)
    code, state = get(client, "/api/state", token=JOBS_ONLY)
    assert code == 200 and [t["name"] for t in state["tables"]] == ["q"]
    code, state = get(client, "/api/state", token=OPS)
    assert [t["name"] for t in state["tables"]] == ["q", "secret"]
    hidden = get(client, "/api/dead?table=secret", token=JOBS_ONLY)
    missing = get(client, "/api/dead?table=nosuch", token=JOBS_ONLY)
    assert hidden[0] == missing[0] == 404
    code, body = post(client, "/api/redrive", {"table": "q"}, token=JOBS_ONLY)
    assert code == 403 and body == {"error": "jobs may not redrive 'q'"}


def test_dead_letters_are_listed_and_redriven_over_the_api(engine):
    client, _, _ = http(engine, Authorizer.from_dict(AUTH))
    got = traffic(engine)
    code, dead = get(client, "/api/dead?table=q", token=OPS)
    assert code == 200 and dead["count"] == 1
    (d,) = dead["dead_letters"]
    assert d["id"] == got[2] and d["attempts"] == 1
    code, body = post(client, "/api/redrive", {"table": "q", "ids": [got[2]]}, token=OPS)
    assert (code, body) == (200, {"moved": 1, "skipped": []})
    assert get(client, "/api/dead?table=q", token=OPS)[1]["count"] == 0


def test_a_redrive_must_be_json_so_a_cross_site_form_cannot_send_one(engine):
    client, _, _ = http(engine)
    code, body = post(client, "/api/redrive", {"table": "q"}, content_type="text/plain")
    assert code == 415 and "JSON" in body["error"]
    assert client.get("/api/redrive").status_code == 405
    code, body = post(client, "/api/redrive", {"table": "q", "ids": [{"x": 1}]})
    assert code == 400 and body == {"error": "ids must be a list of message ids"}


def test_the_page_and_its_files_come_from_this_server_only(engine):
    client, _, _ = http(engine)
    page = client.get("/")
    assert page.status_code == 200 and page.mimetype == "text/html"
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    html = page.get_data(as_text=True)
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert refs and all(r.startswith("/static/") for r in refs), refs
    for ref in refs:
        answer = client.get(ref)
        assert answer.status_code == 200, ref
    js = client.get("/static/dashboard.js").get_data(as_text=True)
    assert "http://" not in js and "https://" not in js
    assert client.get("/static/uPlot.LICENSE").status_code == 404  # only the page's files
    assert client.get("/static/nothing.js").status_code == 404


def test_bad_http_addresses_are_one_clear_line(engine):
    with pytest.raises(InvalidArgument, match=r"--http 'nohost': expected HOST:PORT"):
        parse_listen("nohost")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        api = DashboardApi(engine, RateHistory())
        server = DashboardServer(api, f"127.0.0.1:{port}")
        with pytest.raises(InvalidArgument) as caught:
            server.open()
        assert str(caught.value) == (
            f"--http 127.0.0.1:{port}: cannot listen there (Address already in use)"
        )
        server.close()  # closing what never opened is fine
    finally:
        taken.close()


def test_open_and_close_are_idempotent_and_close_frees_the_port(engine):
    server = DashboardServer(DashboardApi(engine, RateHistory()), "127.0.0.1:0")
    server.open()
    server.open()
    address = server.address
    assert re.fullmatch(r"127\.0\.0\.1:\d+", address) and not address.endswith(":0")
    server.close()
    server.close()
    host, port = address.split(":")
    with socket.socket() as s:
        s.bind((host, int(port)))  # free again


def test_a_poll_after_a_time_gets_only_the_samples_since_then(config):
    h = RateHistory(5.0, slots=4)
    for i in range(1, 7):  # six samples into four slots: 3, 4, 5, 6 held
        h.sample(float(i), [status(config, "a", sent=i * i)])
    times, series = h.view(4.0)
    assert times == [5.0, 6.0]
    assert series[("a", "")]["sent"] == [9.0, 11.0]
    assert h.view(6.0) == ([], {("a", ""): {f: [] for f in FIELDS}})
    times, series = h.view(None)
    assert times == [3.0, 4.0, 5.0, 6.0] and series[("a", "")]["sent"] == [5.0, 7.0, 9.0, 11.0]
    h.sample(7.0, [status(config, "a", sent=36), status(config, "b", sent=2)])
    times, series = h.view(5.5)
    assert times == [6.0, 7.0]
    assert series[("b", "")]["sent"] == [0.0, 2.0]  # b was first seen at 7


def test_the_state_api_gives_the_samples_after_the_time_asked(engine):
    client, api, now = http(engine)
    api.sample()
    now.s += 5
    traffic(engine)
    api.sample()
    _, state = get(client, f"/api/state?after={1_000_000.0}")
    assert state["history"]["times"] == [1_000_005.0]
    q = next(t for t in state["tables"] if t["name"] == "q")
    assert q["rates"]["sent"] == [4.0]
    code, body = get(client, "/api/state?after=soon")
    assert code == 400 and body == {"error": "after must be a time in seconds, not 'soon'"}


def test_the_backlog_is_the_databases_by_age_with_no_infinity_in_the_json(engine):
    client, _, _ = http(engine)
    traffic(engine)  # of 5: 2 acked, 1 dead, 1 in flight, 1 never sent
    code, state = get(client, "/api/state")
    assert code == 200
    q = next(t for t in state["tables"] if t["name"] == "q")
    b = q["backlog"]
    # the database's view: the one in flight has no postpone written yet (no loops run
    # here), so both unacked ones are due there; the manager counts 1 in flight
    assert (b["due"], b["scheduled"], b["in_flight"]) == (2, 0, 1)
    bounds = [u for u, _ in b["by_age"]]
    assert bounds == [60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0, None]
    assert b["by_age"][-1] == [None, 2]  # every unacked message


def test_with_the_database_away_the_state_says_so_and_dead_letters_are_503(engine):
    from msgtable.errors import DatabaseUnavailable

    client, _, _ = http(engine)
    engine.store.down = True
    # what the server's loops do when a statement fails: the outage is told
    engine.store.outage.down(DatabaseUnavailable("database unavailable: (2003) test outage"))
    code, body = get(client, "/api/dead?table=q")
    assert code == 503 and "database unavailable" in body["error"]
    code, state = get(client, "/api/state")  # at once, the tables as last seen
    assert code == 200, state
    assert state["server"]["database"]["up"] is False
    assert "test outage" in state["server"]["database"]["error"]
    assert [t["name"] for t in state["tables"]] == ["q", "secret"]


def test_an_open_dashboard_answers_only_to_addresses_and_localhost_not_a_rebound_name(engine):
    """Without --auth, a page on another site whose name was rebound to this server's
    address (DNS rebinding) must not read the state or redrive: the Host it sends is that
    site's name, so an open dashboard answers only to IP addresses and localhost."""
    client, _, _ = http(engine)
    for host in ("127.0.0.1:8080", "[::1]:8080", "10.1.2.3", "localhost:8080", "LocalHost"):
        answer = client.get("/api/state", headers={"Host": host})
        assert answer.status_code == 200, host
    for host in ("evil.example:8080", "queue-host", "127.0.0.1.evil.example"):
        for path in ("/", "/api/state", "/static/dashboard.js"):
            answer = client.get(path, headers={"Host": host})
            assert answer.status_code == 403, (host, path)
            assert "--auth" in answer.get_data(as_text=True), (host, path)
        answer = client.post(
            "/api/redrive",
            data=json.dumps({"table": "q"}),
            headers={"Host": host},
            content_type="application/json",
        )
        assert answer.status_code == 403, host


def test_with_auth_the_dashboard_answers_to_any_name(engine):
    """With --auth a rebound page has no token (the tab's sessionStorage is per origin): a
    name is fine, and the token rules decide."""
    client, _, _ = http(engine, Authorizer.from_dict(AUTH))
    answer = client.get("/api/state", headers={"Host": "queue-host:8080"})
    assert answer.status_code == 401
    answer = client.get(
        "/api/state", headers={"Host": "queue-host:8080", "Authorization": f"Bearer {OPS}"}
    )
    assert answer.status_code == 200


def test_a_host_header_that_is_no_host_name_is_400_not_a_500(engine):
    """Hosts werkzeug cannot bind (an empty or over-long IDNA label: ".", "a..b") answer
    400, with --auth on (the host is not checked before) as without (the fuzz test found
    the 500 with a Host of ".")."""
    for authorizer in (Authorizer.from_dict(AUTH), None):
        client, _, _ = http(engine, authorizer)
        for host in (".", "a..b", "x" * 64 + ".example"):
            response = client.get("/api/state", headers={"Host": host})
            assert 400 <= response.status_code < 500, (host, response.status_code)
