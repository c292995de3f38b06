"""Hostile requests to the SQS API (issue 44, item 5; hypothesis): JSON bodies of every shape
and size, wrong and missing headers, methods and targets, hostile queue URLs, receipt handles
and batch entries, forged and garbled signatures. Each gets a clean answer in SQS's shape
(4xx; never a 5xx), the server keeps serving, and with --auth nothing a forged request asked
for is written."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgtable.server.auth import Authorizer
from msgtable.server.sqs.app import SqsServer

from .helpers import Served, serve

EXAMPLES = 600
ACTIONS = (
    "GetQueueUrl",
    "ListQueues",
    "GetQueueAttributes",
    "SendMessage",
    "SendMessageBatch",
    "ReceiveMessage",
    "DeleteMessage",
    "DeleteMessageBatch",
    "ChangeMessageVisibility",
    "ChangeMessageVisibilityBatch",
    "CreateQueue",
    "PurgeQueue",
    "DeleteQueue",
)
HOSTILE_TEXT = st.one_of(
    st.text(max_size=60),
    st.sampled_from(
        [
            "",
            "'; drop table jobs; --",
            "`jobs`",
            "jobs\x00",
            "../../etc",
            "\uff4a\uff4f\uff42\uff53",
            "a" * 70_000,
        ]
    ),
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | HOSTILE_TEXT,
    lambda inner: st.lists(inner, max_size=12) | st.dictionaries(HOSTILE_TEXT, inner, max_size=6),
    max_leaves=30,
)


@pytest.fixture(scope="module")
def api(request: pytest.FixtureRequest) -> Iterator[tuple[Served, SqsServer, SqsServer]]:
    """One engine, and two APIs on it: open (no auth) and signed (an auth file)."""
    mysql_server = request.getfixturevalue("mysql_server")
    name = "t_fuzz_sqs"
    mysql_server.drop_database(name)
    mysql_server.create_database(name)
    dsn = mysql_server.dsn(name)
    with serve(dsn) as s:
        s.sql(
            "create table jobs(id bigint not null, priority bigint not null default 0, "
            "time_next bigint default 0, epoch bigint not null default 0, time_acked bigint, "
            "time_created bigint, message mediumtext, primary key(id), "
            "index poller_idx(time_acked, priority, time_next)) comment "
            "'vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=10,"
            "vt_cache_size=100,vt_poller_interval=1'"
        )
        s.engine.refresh()
        auth = Authorizer.from_dict(
            {
                "access_keys": {"AKIAFUZZ": {"secret": "s" * 20, "principal": "p"}},
                "allow": [{"principal": "p", "tables": ["*"], "actions": ["send"]}],
            }
        )
        open_api = SqsServer(s.engine, dsn, "127.0.0.1:0")
        signed_api = SqsServer(s.engine, dsn, "127.0.0.1:0", authorizer=auth)
        open_api.open()
        signed_api.open()
        try:
            yield s, open_api, signed_api
        finally:
            signed_api.close()
            open_api.close()
    mysql_server.drop_database(name)


def post(api: SqsServer, body: bytes, headers: dict[str, str], method: str = "POST") -> Any:
    conn = http.client.HTTPConnection(api.host, api.web._bound, timeout=30)
    try:
        conn.request(method, "/", body=body, headers=headers)
        answer = conn.getresponse()
        return answer.status, answer.read(), dict(answer.getheaders())
    finally:
        conn.close()


def _header(text: str) -> str:
    """Hostile text as a header value can carry it (one line of latin-1, at most 4 KB)."""
    latin = text.encode("latin-1", "replace").decode("latin-1")
    return "".join(c if c >= " " or c == "\t" else "?" for c in latin).strip()[:4000]


def check_clean(status: int, body: bytes, headers: dict[str, str]) -> None:
    assert status < 500, (status, body[:300])
    if status >= 400:
        doc = json.loads(body)
        assert doc["__type"].startswith("com.amazonaws.sqs#"), doc
        assert isinstance(doc["message"], str) and len(doc["message"]) < 2_000
        assert ";" in headers["x-amzn-query-error"]


def url_of(api: SqsServer, s: Served) -> str:
    return f"http://{api.address}/{s.engine.keyspace}/jobs"


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    action=st.sampled_from(ACTIONS) | HOSTILE_TEXT,
    params=st.dictionaries(
        st.sampled_from(
            [
                "QueueUrl",
                "QueueName",
                "MessageBody",
                "MessageAttributes",
                "Entries",
                "ReceiptHandle",
                "VisibilityTimeout",
                "MaxNumberOfMessages",
                "WaitTimeSeconds",
                "DelaySeconds",
                "MessageGroupId",
                "AttributeNames",
                "MessageAttributeNames",
            ]
        )
        | HOSTILE_TEXT,
        JSON_VALUES,
        max_size=6,
    ),
    real_url=st.booleans(),
    wait=st.booleans(),
)
def test_hostile_json_gets_a_clean_answer(api, action, params, real_url, wait):
    s, open_api, _ = api
    if real_url:
        params["QueueUrl"] = url_of(open_api, s)
    if "WaitTimeSeconds" in params or wait:
        params["WaitTimeSeconds"] = 0  # no example waits
    status, body, headers = post(
        open_api,
        json.dumps(params).encode(),
        {
            "X-Amz-Target": _header(f"AmazonSQS.{action}"),
            "Content-Type": "application/x-amz-json-1.0",
        },
    )
    check_clean(status, body, headers)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    body=st.binary(max_size=3000)
    | st.sampled_from([b"", b"[]", b"null", b"{" * 5000, b"\xff\xfe"]),
    target=st.none() | HOSTILE_TEXT,
    method=st.sampled_from(["POST", "GET", "PUT", "DELETE"]),
)
def test_hostile_bodies_headers_and_methods_get_a_clean_4xx(api, body, target, method):
    _, open_api, _ = api
    headers = {"Content-Type": "application/x-amz-json-1.0"}
    if target is not None:
        headers["X-Amz-Target"] = _header(target)
    status, answer, got = post(open_api, body, headers, method)
    check_clean(status, answer, got)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    authorization=st.one_of(
        HOSTILE_TEXT,
        st.builds(
            lambda key, date, signed, sig: (
                f"AWS4-HMAC-SHA256 Credential={key}/{date}/r/sqs/aws4_request, "
                f"SignedHeaders={signed}, Signature={sig}"
            ),
            st.sampled_from(["AKIAFUZZ", "AKIAOTHER", ""]) | HOSTILE_TEXT,
            st.sampled_from(["20250101", "99999999", ""]) | HOSTILE_TEXT,
            st.sampled_from(["host;x-amz-date", "host", "x-amz-date", ""]) | HOSTILE_TEXT,
            st.text("0123456789abcdef", min_size=64, max_size=64) | HOSTILE_TEXT,
        ),
    ),
    amz_date=st.none() | st.sampled_from(["20250101T000000Z", "garbage", ""]) | HOSTILE_TEXT,
)
def test_forged_signatures_change_nothing(api, authorization, amz_date):
    s, _, signed_api = api
    before = s.sql("select count(*) from jobs")[0][0]
    headers = {
        "X-Amz-Target": "AmazonSQS.SendMessage",
        "Content-Type": "application/x-amz-json-1.0",
        "Authorization": _header(authorization),
    }
    if amz_date is not None:
        headers["X-Amz-Date"] = _header(amz_date)
    body = json.dumps({"QueueUrl": url_of(signed_api, s), "MessageBody": "forged"}).encode()
    status, answer, got = post(signed_api, body, headers)
    assert 400 <= status < 500, (status, answer[:300])
    check_clean(status, answer, got)
    assert s.sql("select count(*) from jobs")[0][0] == before


@pytest.fixture(scope="module")
def manage_api(api: tuple[Served, SqsServer, SqsServer]) -> Iterator[tuple[Served, SqsServer]]:
    """An API with --sqs-manage on the same engine: CreateQueue writes DDL."""
    s = api[0]
    managing = SqsServer(
        s.engine, s.db.url.render_as_string(hide_password=False), "127.0.0.1:0", manage=True
    )
    managing.open()
    try:
        yield s, managing
    finally:
        managing.close()


def tables_of(s: Served) -> set[str]:
    rows = s.sql("select table_name from information_schema.tables where table_schema = database()")
    return {str(r[0]) for r in rows}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    name=HOSTILE_TEXT | st.from_regex(r"[A-Za-z0-9_]{1,12}(\.fifo)?", fullmatch=True),
    attributes=st.dictionaries(
        st.sampled_from(
            [
                "VisibilityTimeout",
                "MessageRetentionPeriod",
                "RedrivePolicy",
                "FifoQueue",
                "DelaySeconds",
                "ContentBasedDeduplication",
            ]
        )
        | HOSTILE_TEXT,
        JSON_VALUES,
        max_size=4,
    ),
)
def test_hostile_create_queue_with_manage_creates_only_the_table_it_names(
    manage_api, name, attributes
):
    s, managing = manage_api
    before = tables_of(s)
    status, body, headers = post(
        managing,
        json.dumps({"QueueName": name, "Attributes": attributes}).encode(),
        {"X-Amz-Target": "AmazonSQS.CreateQueue", "Content-Type": "application/x-amz-json-1.0"},
    )
    check_clean(status, body, headers)
    made = tables_of(s) - before
    try:
        if status == 200:
            assert made <= {name.removesuffix(".fifo")}, (name, made)
            assert json.loads(body)["QueueUrl"].rsplit("/", 1)[1] in (name, name + ".fifo")
        else:
            assert not made, (name, attributes, made, body[:300])
        assert "jobs" in tables_of(s)
    finally:
        for table in made:  # names the check above let through: letters, digits, _
            s.sql(f"drop table `{table}`")
