"""Push to HTTP endpoints end to end (README: Push to HTTP endpoints): a real MariaDB, the
server's pushers, and a real HTTP receiver on loopback (tests/push_receiver.py) that checks
every signature with its own HMAC code."""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from msgtable.errors import InvalidArgument, TableLoadError, TableNotFound
from msgtable.features.push.allow import AllowList

from ..push_receiver import Receiver
from ..waiting import wait_until
from .helpers import Served, serve

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
RAW_SECRET = "a-raw-secret-never-to-be-seen-anywhere"
DEAD_COLUMNS = "last_error varchar(1000), time_dead bigint"
FAST = dict(vt_ack_wait=5, vt_min_backoff=0.1, vt_max_backoff=0.3, vt_poller_interval=0.2)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(SECRET).start()
    yield r
    r.stop()


@pytest.fixture
def served(db_dsn: str) -> Iterator[Served]:
    with serve(db_dsn, follow_binlog=True, push_allow=AllowList.parse("http://127.0.0.0/8")) as s:
        yield s


def enqueue(s: Served, table: str, ids: range | list[int]) -> None:
    values = ",".join(f"({i}, 'm{i}')" for i in ids)
    s.sql(f"insert into {table}(id, message) values {values}")


def push_of(s: Served, table: str, subscription: str = "") -> Any:
    (t,) = [t for t in s.client.list_tables() if (t.name, t.subscription) == (table, subscription)]
    return t.push


def unacked(s: Served, table: str) -> list[int]:
    return [r[0] for r in s.sql(f"select id from {table} where time_acked is null order by id")]


def test_default_group_and_a_subscription_are_pushed_signed_and_acked(
    served: Served, receiver: Receiver
) -> None:
    served.create_table("orders", **FAST)
    served.client.create_subscription("orders", "billing")
    served.client.set_endpoint("orders", receiver.url("/all"), SECRET)
    served.client.set_endpoint("orders", receiver.url("/billing"), SECRET, subscription="billing")
    enqueue(served, "orders", range(1, 51))
    wait_until(
        lambda: (
            sorted(receiver.ids("/all")) == list(range(1, 51))
            and sorted(receiver.ids("/billing")) == list(range(1, 51))
        ),
        what=lambda: f"50 events on each path, got {len(receiver.received())}",
    )
    assert receiver.bad_signatures == [] and receiver.bad_bodies == []
    assert receiver.content_types == {"application/cloudevents-batch+json"}
    wait_until(lambda: unacked(served, "orders") == [], what="every default-group row acked")
    wait_until(lambda: unacked(served, "orders__billing") == [], what="every subscription ack")
    first = next(r.event for r in receiver.received() if r.path == "/billing")
    assert first["source"].endswith("/orders/billing")
    assert first["id"] == f"orders/{first['data']['id']}"
    assert first["data"]["message"] == f"m{first['data']['id']}"
    assert first["attempt"] == 1
    p = push_of(served, "orders")
    assert p.url == receiver.url("/all") and p.state == "pushing"
    wait_until(lambda: push_of(served, "orders").pushed == 50, what="pushed counted")
    assert push_of(served, "orders", "billing").pushed == 50
    assert receiver.connections <= 2 * 4  # keep-alive: at most one per batch in flight


def test_500s_release_with_the_backoff_then_everything_arrives(
    served: Served, receiver: Receiver
) -> None:
    served.create_table("jobs", DEAD_COLUMNS, **FAST)
    receiver.answer(500, body=b"broken for now")
    served.client.set_endpoint("jobs", receiver.url(), SECRET, timeout_s=2)
    enqueue(served, "jobs", range(1, 21))
    wait_until(lambda: receiver.requests >= 6, what="several failed attempts")
    state = push_of(served, "jobs").state
    assert state == "failing: HTTP 500: broken for now"
    errors = served.sql("select distinct last_error from jobs where epoch > 0")
    assert [r[0] for r in errors] == ["HTTP 500: broken for now"]
    receiver.answer_ok()
    wait_until(
        lambda: sorted(set(receiver.ids())) == list(range(1, 21)),
        what=lambda: f"all 20 after the 500s, got {sorted(set(receiver.ids()))}",
    )
    wait_until(lambda: unacked(served, "jobs") == [], what="all acked")
    assert max(r.event["attempt"] for r in receiver.received()) > 1
    wait_until(lambda: push_of(served, "jobs").state == "pushing", what="pushing again")


def test_an_endpoint_down_for_a_while_gets_everything_when_it_comes_back(
    served: Served, receiver: Receiver
) -> None:
    served.create_table("jobs", **FAST)
    served.client.set_endpoint("jobs", receiver.url(), SECRET, timeout_s=2)
    enqueue(served, "jobs", [1])
    wait_until(lambda: receiver.ids() == [1], what="the first message")
    receiver.go_away()
    enqueue(served, "jobs", range(2, 31))
    wait_until(
        lambda: push_of(served, "jobs").state.startswith("failing: "),
        what="the pusher failing while the receiver is away",
    )
    assert "refused" in push_of(served, "jobs").state.lower()
    receiver.come_back()
    wait_until(
        lambda: sorted(set(receiver.ids())) == list(range(1, 31)),
        timeout_s=20,
        what=lambda: f"all 30 after the outage, got {sorted(set(receiver.ids()))}",
    )
    wait_until(lambda: unacked(served, "jobs") == [], what="all acked")


def test_a_4xx_is_a_dead_letter_with_the_status_and_body_start(
    served: Served, receiver: Receiver
) -> None:
    served.create_table("jobs", DEAD_COLUMNS, **FAST)
    receiver.answer(422, body=b"schema mismatch: field amount")
    served.client.set_endpoint("jobs", receiver.url(), SECRET)
    enqueue(served, "jobs", [1, 2, 3])
    wait_until(lambda: served.client.dead_letters("jobs")[1] == 3, what="three dead letters")
    rows, _ = served.client.dead_letters("jobs")
    assert {r.last_error for r in rows} == {"HTTP 422: schema mismatch: field amount"}
    assert receiver.ids() == []


def test_a_redirect_is_not_followed_and_the_reason_says_so(
    served: Served, receiver: Receiver
) -> None:
    served.create_table("jobs", DEAD_COLUMNS, **FAST)
    receiver.answer(302, location=receiver.url("/elsewhere"))
    served.client.set_endpoint("jobs", receiver.url(), SECRET)
    enqueue(served, "jobs", [1])
    wait_until(lambda: served.client.dead_letters("jobs")[1] == 1, what="a dead letter")
    (row,), _ = served.client.dead_letters("jobs")
    assert row.last_error == f"HTTP 302: redirect to {receiver.url('/elsewhere')} not followed"
    assert receiver.ids("/elsewhere") == []
    assert receiver.requests == 1


def test_429_honours_retry_after(served: Served, receiver: Receiver) -> None:
    served.create_table("jobs", DEAD_COLUMNS, **FAST)
    receiver.answer(429, retry_after="2")
    served.client.set_endpoint("jobs", receiver.url(), SECRET)
    enqueue(served, "jobs", [1])
    wait_until(lambda: receiver.requests == 1, what="the first attempt")
    answered = time.monotonic()
    receiver.answer_ok()
    wait_until(lambda: receiver.ids() == [1], what="the message after Retry-After")
    # the backoff alone (vt_max_backoff=0.3) would have sent it again well before 2 s
    assert time.monotonic() - answered >= 1.5


def test_a_hanging_endpoint_times_out_while_another_table_keeps_its_rate(
    served: Served, receiver: Receiver
) -> None:
    served.create_table("slow", **FAST)
    served.create_table("fast", **FAST)
    receiver.hang("/slow")
    served.client.set_endpoint("slow", receiver.url("/slow"), SECRET, timeout_s=1, max_in_flight=1)
    served.client.set_endpoint("fast", receiver.url("/fast"), SECRET)
    enqueue(served, "slow", range(1, 101))
    wait_until(lambda: push_of(served, "slow").in_flight == 1, what="a POST hanging")
    started = time.monotonic()
    for n in range(10):
        enqueue(served, "fast", range(n * 100 + 1, n * 100 + 101))
    wait_until(
        lambda: len(set(receiver.ids("/fast"))) == 1000,
        what=lambda: f"1000 on /fast, got {len(set(receiver.ids('/fast')))}",
    )
    assert time.monotonic() - started < 5
    wait_until(
        lambda: "timed out" in push_of(served, "slow").state,
        what=lambda: f"the time-out in the state, got {push_of(served, 'slow').state}",
    )
    receiver.unhang()
    wait_until(
        lambda: sorted(set(receiver.ids("/slow"))) == list(range(1, 101)),
        timeout_s=20,
        what="every slow message once it answers",
    )


def test_an_ordered_tables_keys_arrive_in_order_through_500s(
    served: Served, receiver: Receiver
) -> None:
    served.create_table(
        "jobs", "k varchar(64), index order_idx(k, time_acked, id)", vt_order_key="k", **FAST
    )
    served.client.set_endpoint("jobs", receiver.url(), SECRET)
    receiver.answer(500)
    rows = [(i, f"key{i % 4}") for i in range(1, 81)]
    served.sql(
        "insert into jobs(id, k, message) values "
        + ",".join(f"({i}, '{k}', 'm{i}')" for i, k in rows)
    )
    wait_until(lambda: receiver.requests >= 4, what="the first attempts failing")
    receiver.answer_ok()
    wait_until(
        lambda: sorted(set(receiver.ids())) == [i for i, _ in rows],
        timeout_s=20,
        what=lambda: f"all 80, got {len(set(receiver.ids()))}",
    )
    by_key: dict[str, list[int]] = {}
    for r in receiver.received():
        by_key.setdefault(r.event["orderkey"], []).append(int(r.event["data"]["id"]))
    for key, ids in by_key.items():
        firsts = list(dict.fromkeys(ids))
        assert firsts == sorted(firsts), f"{key} out of order: {ids}"


def test_the_allow_list_refuses_and_the_messages_wait(db_dsn: str, receiver: Receiver) -> None:
    with serve(db_dsn, push_allow=AllowList.parse("http://127.0.0.0/8")) as s:
        s.create_table("jobs", **FAST)
        s.client.set_endpoint("jobs", receiver.url(), SECRET)  # stored: this server allows it
    with serve(db_dsn, push_allow=AllowList.parse("https://*.example.com")) as s:
        # a server refuses to store what it would not call (issue 39: it stored it, said
        # nothing); one stored through a server that allowed it waits here
        with pytest.raises(InvalidArgument, match=r"the server will not call http://127\.0\.0\.1:"):
            s.client.set_endpoint("jobs", receiver.url("/other"), SECRET)
        enqueue(s, "jobs", range(1, 6))
        wait_until(lambda: push_of(s, "jobs") is not None, what="the endpoint's status")
        state = push_of(s, "jobs").state
        assert state.startswith("not allowed: http://127.0.0.1:") and "--push-allow" in state
        time.sleep(0.5)  # a push would have happened by now; none may
        assert receiver.requests == 0
        assert unacked(s, "jobs") == [1, 2, 3, 4, 5]
    with serve(db_dsn) as s:  # no --push-allow: nothing at all
        wait_until(lambda: push_of(s, "jobs") is not None, what="the endpoint's status")
        assert push_of(s, "jobs").state == (
            "not allowed: no endpoint is allowed: the server has no --push-allow"
        )


def test_malformed_definitions_are_refused_and_secrets_never_show(
    served: Served, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    served.create_table("jobs", **FAST)
    with pytest.raises(InvalidArgument, match="user name"):
        served.client.set_endpoint("jobs", "http://127.0.0.1@evil.test/", RAW_SECRET)
    with pytest.raises(InvalidArgument, match="secret must be 16 to 512 bytes") as info:
        served.client.set_endpoint("jobs", receiver.url(), "short")
    assert "short" not in str(info.value).split("bytes")[-1]
    with pytest.raises(TableNotFound):
        served.client.set_endpoint("nope", receiver.url(), RAW_SECRET)
    served.create_table("grouped", vt_default_group="off", **FAST)
    with pytest.raises(TableLoadError, match="no default group"):
        served.client.set_endpoint("grouped", receiver.url(), RAW_SECRET)
    with pytest.raises(TableNotFound):
        served.client.drop_endpoint("jobs")
    served.client.set_endpoint("jobs", receiver.url(), RAW_SECRET)
    enqueue(served, "jobs", [1])
    wait_until(lambda: receiver.bad_signatures, what="a request signed with another secret")
    listed = repr(served.client.list_tables()) + repr(served.client.list_subscriptions())
    assert receiver.url() in listed
    assert RAW_SECRET not in listed and RAW_SECRET not in caplog.text
    served.client.drop_endpoint("jobs")
    wait_until(lambda: push_of(served, "jobs") is None, what="the endpoint gone")


def test_a_name_resolving_outside_the_allowed_network_gets_no_connection(
    db_dsn: str, receiver: Receiver
) -> None:
    """The URL check passes (a name under a CIDR entry); the address check at connect does
    not: localhost is 127.0.0.1, outside 127.0.0.2/32 (as a name rebound to an internal
    address would be)."""
    with serve(db_dsn, push_allow=AllowList.parse("http://127.0.0.2/32")) as s:
        s.create_table("jobs", **FAST)
        s.client.set_endpoint("jobs", receiver.url(host="localhost"), SECRET, timeout_s=2)
        enqueue(s, "jobs", [1, 2])
        wait_until(
            lambda: "resolves to" in push_of(s, "jobs").state,
            what=lambda: f"the address refused, state {push_of(s, 'jobs').state!r}",
        )
        assert push_of(s, "jobs").state.startswith("failing: not allowed: localhost resolves to")
        assert receiver.requests == 0
        assert unacked(s, "jobs") == [1, 2]


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and a certificate of the receiver's for localhost and 127.0.0.1."""
    d = tmp_path_factory.mktemp("push-pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "2", "-subj", "/CN=push-test-ca", cwd=d)  # fmt: skip
    (d / "san.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "hook.key", "-out", "hook.csr",
            "-subj", "/CN=localhost", cwd=d)  # fmt: skip
    openssl("x509", "-req", "-in", "hook.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "hook.pem", "-days", "2", "-extfile", "san.cnf",
            cwd=d)  # fmt: skip
    return d


def test_https_verifies_the_certificate_against_the_ca_file(db_dsn: str, pki: Path) -> None:
    receiver = Receiver(SECRET).start(tls=(str(pki / "hook.pem"), str(pki / "hook.key")))
    allow = AllowList.parse("https://127.0.0.0/8")
    try:
        with serve(db_dsn, push_allow=allow) as s:  # the system's CAs: not this one
            s.create_table("jobs", **FAST)
            s.client.set_endpoint("jobs", receiver.url(host="localhost"), SECRET, timeout_s=2)
            enqueue(s, "jobs", [1, 2, 3])
            wait_until(
                lambda: "certificate" in push_of(s, "jobs").state.lower(),
                what=lambda: f"a certificate failure, state {push_of(s, 'jobs').state!r}",
            )
            assert receiver.ids() == []
        with serve(db_dsn, push_allow=allow, push_ca_file=str(pki / "ca.pem")) as s:
            wait_until(
                lambda: sorted(receiver.ids()) == [1, 2, 3],
                what=lambda: f"the three over HTTPS, state {push_of(s, 'jobs').state!r}",
            )
            assert receiver.bad_signatures == []
    finally:
        receiver.stop()


def test_an_endpoint_failing_past_max_attempts_makes_dead_letters(
    served: Served, receiver: Receiver
) -> None:
    served.create_table("jobs", DEAD_COLUMNS, vt_max_attempts=3, **FAST)
    receiver.answer(503, body=b"down for maintenance")
    served.client.set_endpoint("jobs", receiver.url(), SECRET)
    enqueue(served, "jobs", [1, 2])
    wait_until(lambda: served.client.dead_letters("jobs")[1] == 2, what="two dead letters")
    rows, _ = served.client.dead_letters("jobs")
    assert {(r.attempts, r.last_error) for r in rows} == {(3, "HTTP 503: down for maintenance")}
    assert receiver.requests == 3  # one batch of both, three times


def test_a_server_shutting_down_lets_its_posts_finish_and_settles_them(
    db_dsn: str, receiver: Receiver
) -> None:
    receiver.slow(1.5)
    with serve(db_dsn, push_allow=AllowList.parse("http://127.0.0.0/8")) as s:
        s.create_table("jobs", **FAST)
        s.client.set_endpoint("jobs", receiver.url(), SECRET)
        enqueue(s, "jobs", [1, 2, 3])
        wait_until(lambda: push_of(s, "jobs").in_flight == 1, what="a POST in progress")
        assert receiver.ids() == []
    # closed: the POST was answered 2xx meanwhile, and the batch acked before the close ended
    assert sorted(receiver.ids()) == [1, 2, 3]
    with serve(db_dsn) as s:
        assert unacked(s, "jobs") == []
