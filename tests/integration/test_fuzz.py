"""10,000 hostile requests against a real server (hypothesis): names with quotes, backticks,
semicolons, unicode, empty and 1 MB strings, ids of the wrong type, huge id lists, valueless
ids, streams cancelled at once; releases, rejects and renews with negative, huge, infinite and
NaN delays and hostile or 1 MB reasons; dead-letter listings and redrives with hostile names,
targets, limits and cursors; subscriptions created, altered, dropped, listed and streamed with
hostile names, filters (quotes, comments, subqueries, function calls, unknown columns, random
text) and projections; the same on an ordered table (vt_order_key) whose keys are hostile
text; push endpoints set and dropped with hostile URLs (userinfo tricks, CRLF header
injection, NUL, unicode hosts, 1 MB) and secrets. Each must get a clean status (never
INTERNAL or UNKNOWN), the server must keep serving, and no table may change that was not
named legitimately. Issue 19's parts too: hostile dashboard requests (paths, query
strings, JSON bodies of every shape, wrong content types, huge bodies, forged tokens, Host
headers) get a clean 4xx; /metrics scraped under hostile calls stays valid Prometheus text
whose labels name only real tables; msgtable.enqueue with hostile arguments raises one
clear error and writes nothing."""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import logging
import math
import os
import subprocess
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgtable.errors import InvalidArgument
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.proto.msgtable.v1 import messaging_pb2_grpc as pb_grpc
from msgtable.store.sequences import CURSOR_TABLE, SEQUENCE_TABLE

from ..waiting import wait_until
from .helpers import Collector, serve

EXAMPLES = 10_000
CLEAN = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.CANCELLED,  # the test cancelled the stream
}
NASTY = [
    "",
    "'",
    '"',
    "`",
    "``",
    "canary`; drop table canary; --",
    "canary' or '1'='1",
    "canary; delete from canary",
    "canary%s",
    "canary\x00",
    "{ids}",
    "../canary",
    "ça😀表",
    "\u202ecanary",
    "x" * 1_000_000,
    "CANARY",
    "canary ",
]
names = st.one_of(st.sampled_from(NASTY), st.text(max_size=80)).filter(lambda n: n != "canary")
values = st.one_of(
    st.builds(pb.Value),  # no kind set
    st.builds(lambda t: pb.Value(text_value=t), st.text(max_size=40)),
    # text Python's str.isdigit() takes but int() does not: once an INTERNAL error
    st.builds(
        lambda t: pb.Value(text_value=t),
        st.sampled_from(["\u00b2", "\u0663", "1_000", "--1", "+-3", " 7 ", "1e3", "0x10"]),
    ),
    st.builds(lambda b: pb.Value(bytes_value=b), st.binary(max_size=40)),
    st.builds(lambda f: pb.Value(double_value=f), st.floats(allow_nan=True)),
    st.builds(lambda i: pb.Value(int_value=i), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda i: pb.Value(uint_value=i), st.integers(0, 2**64 - 1)),
    st.just(pb.Value(null_value=0)),
)


def _not_a_canary_id(v: pb.Value) -> bool:
    """Not a value the server could read as id 1 or 2 (the canary's rows must stay)."""
    kind = v.WhichOneof("kind")
    if kind in ("int_value", "uint_value"):
        return False
    raw = getattr(v, kind) if kind else None
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if isinstance(raw, str):
        return raw.strip().lstrip("+-0") not in ("1", "2", "1.0", "2.0", "")
    if isinstance(raw, float):
        return raw not in (1.0, 2.0)
    return True


HUGE = [pb.Value(int_value=10_000_000 + i) for i in range(10_001)]  # over the 10,000 limit
delays = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, -1.0, 43_200.0, 43_200.1, 1e308, 5e-324]),
)
reasons = st.one_of(st.sampled_from(NASTY), st.text(max_size=1_200))
limits = st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 10_000, 10_001]))
verbs = st.sampled_from(["release", "reject", "renew"])
attempts = st.lists(st.one_of(st.just(0), st.integers(0, 2**32 - 1)), max_size=6)
kinds = st.sampled_from(
    ["stream"] * 4
    + ["ack"] * 4
    + ["ack_canary"] * 3
    + ["huge_ack"]
    + ["settle"] * 3
    + ["settle_canary"] * 3
    + ["settle_keyed"] * 2
    + ["settle_bound"] * 2
    + ["dead"] * 2
    + ["redrive"] * 2
    + ["create_sub"] * 3
    + ["stream_sub"] * 2
    + ["manage_sub"] * 2
    + ["endpoint"] * 3
)
HOSTILE_FILTERS = [
    "message = 'kept' OR 1=1",
    "message = 'x'; drop table canary; --",
    "message = 'x' -- comment",
    "message = 'x' /* c */",
    "(select 1) = 1",
    "sleep(1) = 0",
    "id IN (select id from canary)",
    "nosuch = 1",
    "message = message",
    "id = 'one'",
    "`id`` = 1",
    "id=1|2,message=kept",
    "id = 1",
    "message LIKE '%' ESCAPE ''",
    "NOT NOT NOT id > 0",
    "(" * 200 + "id = 1" + ")" * 200,
]
filters = st.one_of(st.sampled_from(HOSTILE_FILTERS + NASTY), st.text(max_size=120))
columns = st.lists(
    st.one_of(st.sampled_from(["id", "message", "epoch", "nosuch"]), names), max_size=3
)
HOSTILE_URLS = [
    "http://127.0.0.1@evil.test/",
    "http://user:pw@127.0.0.1/",
    "http://127.0.0.1/a\r\nX-Injected: 1",
    "http://127.0.0.1/\x00",
    "http://ex\u00e4mple.com/",
    "http://\u0661\u0662\u0667.0.0.1/",
    "http://[::1/",
    "http://127.0.0.1:99999/",
    "javascript:alert(1)",
    "file:///etc/passwd",
    "gopher://127.0.0.1:6379/_FLUSHALL",
    "http://" + "a" * 1_000_000,
    "http://127.0.0.1:1/valid",  # well formed: refused (this server allows no endpoint)
    "https://hooks.example.com/in?x=1",
]
urls = st.one_of(st.sampled_from(HOSTILE_URLS + NASTY), st.text(max_size=200))
secrets = st.one_of(
    st.sampled_from(
        [
            *NASTY,
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_not base64!",
            "a-raw-secret-of-enough-bytes\r\nX: 1",
            "s" * 513,
            "a-raw-secret-of-enough-bytes",
        ]
    ),
    st.text(max_size=100),
)
# Each kind's strategy built once: a strategy made anew for every example (a flatmap
# building the dict) cost hypothesis most of the test's time in checking it again.
REQUESTS_BY_KIND = {
    "stream": st.tuples(
        st.just("stream"), names, names, st.sampled_from(["", "0", "-", "-80", "'"])
    ),
    "ack": st.tuples(st.just("ack"), names, st.lists(values, max_size=5)),
    "ack_canary": st.tuples(
        st.just("ack_canary"), st.lists(values.filter(_not_a_canary_id), max_size=5)
    ),
    "huge_ack": st.just(("huge_ack",)),
    "settle": st.tuples(
        st.just("settle"), verbs, names, st.lists(values, max_size=5), delays, reasons
    ),
    "settle_canary": st.tuples(
        st.just("settle"),
        verbs,
        st.just("canary"),
        st.lists(values.filter(_not_a_canary_id), max_size=5),
        delays,
        reasons,
    ),
    "settle_keyed": st.tuples(
        st.just("settle"),
        verbs,
        st.just("keyed"),
        st.lists(values.filter(_not_a_canary_id), max_size=5),
        delays,
        reasons,
    ),
    # the canary's own (never sent) ids and others, each with any delivery named, or
    # attempts that are not one per id: nothing of the canary may change
    "settle_bound": st.tuples(
        st.just("settle"),
        st.sampled_from(["release", "renew"]),
        st.just("canary"),
        st.lists(
            st.one_of(st.sampled_from([1, 2]), st.integers(3, 2**40)).map(
                lambda i: pb.Value(int_value=i)
            ),
            min_size=1,
            max_size=5,
        ),
        delays,
        reasons,
        attempts,
    ),
    "dead": st.tuples(
        st.just("dead"), st.one_of(names, st.just("canary")), limits, st.none() | values
    ),
    "create_sub": st.tuples(
        st.just("create_sub"),
        filters,
        columns,
        # how its state rows are kept (msgtable.features.subscriptions.lazy): set or not
        st.one_of(st.none(), st.sampled_from(["lazy", "eager", "LAZY", " lazy "]), names),
    ),
    "stream_sub": st.tuples(
        st.just("stream_sub"), st.one_of(names, st.just("")), filters | st.just(""), columns
    ),
    "manage_sub": st.tuples(
        st.just("manage_sub"), st.sampled_from(["alter", "drop", "list"]), names, names
    ),
    "endpoint": st.tuples(
        st.just("endpoint"),
        st.one_of(names, st.just("canary")),
        st.one_of(st.just(""), names),
        urls,
        secrets,
        st.integers(-(2**63), 2**63 - 1) | st.sampled_from([0, 1, 64, 65]),
        st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, 300.0, 301.0]),
    ),
    "redrive": st.tuples(
        st.just("redrive"),
        st.one_of(names, st.just("canary")),
        st.one_of(names, st.just("canary"), st.just("")),
        st.lists(values.filter(_not_a_canary_id), max_size=3),
        limits,
        st.none() | values,
        st.one_of(st.just(""), names),  # a subscription (none exists on the canary)
    ),
}
requests = kinds.flatmap(REQUESTS_BY_KIND.__getitem__)


def test_hostile_requests_get_clean_statuses_and_touch_nothing(db_dsn):
    with serve(db_dsn) as s:
        s.create_table("canary", vt_poller_interval=0.2)
        keyed = "k varchar(64), index order_idx (k, time_acked, id)"
        # an ordered table (empty: subscription streams check filters, send nothing) and an
        # ordered canary whose key is hostile text
        s.create_table("fuzzed", keyed, vt_poller_interval=0.2, vt_order_key="k")
        s.create_table("keyed", keyed, vt_poller_interval=0.2, vt_order_key="k")
        s.sql("insert into canary(id, message) values (1, 'kept'), (2, 'kept')")
        s.sql(
            "insert into keyed(id, message, k) values "
            "(1, 'kept', 'k`; drop table keyed; --'), (2, 'kept', 'k`; drop table keyed; --')"
        )
        s.engine.refresh()
        before = s.sql("select id, epoch, time_next, time_acked, message from canary order by id")
        keyed_before = s.sql("select id, epoch, time_next, time_acked, k from keyed order by id")
        tables_before = s.sql("show tables")
        seen: dict[str, int] = {}
        with grpc.insecure_channel(
            s.server.address, options=[("grpc.max_send_message_length", 8 * 1024 * 1024)]
        ) as channel:
            stub = pb_grpc.MessagingStub(channel)

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(requests)
            def hostile(request):
                code = send(stub, request)
                seen[code.name] = seen.get(code.name, 0) + 1
                assert code in CLEAN or code is grpc.StatusCode.OK, (request[0], code)

            hostile()
        assert sum(seen.values()) >= EXAMPLES
        # still serving, and nothing was touched (a subscription created by a valid request
        # was dropped at once; the canary's first one added its time_fanout column)
        registries = ("msgtable_subscriptions", "msgtable_endpoints", SEQUENCE_TABLE, CURSOR_TABLE)
        assert [t for t in s.sql("show tables") if t[0] not in registries] == [
            t for t in tables_before if t[0] not in registries
        ]
        assert s.client.list_tables() and all(t.push is None for t in s.client.list_tables())
        after = s.sql("select id, epoch, time_next, time_acked, message from canary order by id")
        assert after == before
        c = Collector(s.client, "canary")
        assert sorted(m.id for m in c.take(2)) == [1, 2]
        c.close()
        keyed_after = s.sql("select id, epoch, time_next, time_acked, k from keyed order by id")
        assert keyed_after == keyed_before
        c = Collector(s.client, "keyed", max_in_flight=1)
        (first,) = c.take(1)
        c.nothing_for(0.3)  # one key: 2 waits for 1
        first.ack()
        (second,) = c.take(1)
        c.close()
        assert (first.id, second.id) == (1, 2)


def send(stub: pb_grpc.MessagingStub, request: tuple) -> grpc.StatusCode:
    kind = request[0]
    try:
        if kind == "stream":
            _, name, keyspace, shard = request
            call = stub.MessageStream(
                pb.MessageStreamRequest(name=name, keyspace=keyspace, shard=shard), timeout=10
            )
            try:
                next(call)
            finally:
                call.cancel()
            return grpc.StatusCode.OK
        if kind == "ack":
            _, name, ids = request
            stub.MessageAck(pb.MessageAckRequest(name=name, ids=ids), timeout=10)
        elif kind == "ack_canary":  # ids of the wrong type for a bigint id, or none
            _, ids = request
            stub.MessageAck(pb.MessageAckRequest(name="canary", ids=ids), timeout=10)
        elif kind == "settle":
            _, verb, name, ids, delay, reason, *named = request
            tries = named[0] if named else []
            if verb == "release":
                stub.MessageRelease(
                    pb.MessageReleaseRequest(
                        name=name, ids=ids, delay_s=delay, reason=reason, attempts=tries
                    ),
                    timeout=10,
                )
            elif verb == "renew":
                stub.MessageRenew(
                    pb.MessageRenewRequest(
                        name=name, ids=ids, extend_s=delay, reason=reason, attempts=tries
                    ),
                    timeout=10,
                )
            else:
                stub.MessageReject(
                    pb.MessageRejectRequest(name=name, ids=ids, reason=reason), timeout=10
                )
        elif kind == "dead":
            _, name, limit, after = request
            req = pb.ListDeadLettersRequest(name=name, limit=limit)
            if after is not None:
                req.after.CopyFrom(after)
            stub.ListDeadLetters(req, timeout=10)
        elif kind == "redrive":
            # on the canary (which has no dead messages) and with ids that are not its own
            _, name, to, ids, limit, after, sub = request
            req = pb.RedriveRequest(name=name, to=to, ids=ids, limit=limit, subscription=sub)
            if after is not None:
                req.after.CopyFrom(after)
            stub.Redrive(req, timeout=10)
        elif kind == "create_sub":  # a hostile filter, projection or state_rows on the canary
            _, text, cols, rows = request
            settings = pb.SubscriptionSettings(filter=text, columns=cols)
            if rows is not None:
                settings.state_rows = rows
            stub.CreateSubscription(
                pb.CreateSubscriptionRequest(table="canary", name="fz", settings=settings),
                timeout=30,
            )
            # listed with its advice (a lazy filter's index: one line, or nothing)
            listed = stub.ListSubscriptions(
                pb.ListSubscriptionsRequest(table="canary"), timeout=30
            ).subscriptions
            for t in listed:
                assert not t.load_error, t.load_error
                assert "\n" not in t.advice, t.advice
                assert t.advice == "" or t.advice.startswith("its filter reads every"), t.advice
            stub.DropSubscription(pb.DropSubscriptionRequest(table="canary", name="fz"), timeout=30)
        elif kind == "stream_sub":
            _, sub, text, cols = request
            call = stub.MessageStream(
                # an empty table: the filter and columns are checked, nothing is sent
                pb.MessageStreamRequest(name="fuzzed", subscription=sub, filter=text, columns=cols),
                timeout=10,
            )
            try:
                next(call)
            finally:
                call.cancel()
        elif kind == "manage_sub":
            _, what, table, name = request
            if what == "alter":
                # (a name for state_rows too: alter refuses any, cleanly)
                settings = pb.SubscriptionSettings(filter=name)
                if len(name) % 2:
                    settings.state_rows = name
                stub.AlterSubscription(
                    pb.AlterSubscriptionRequest(table=table, name=name, settings=settings),
                    timeout=10,
                )
            elif what == "drop":
                stub.DropSubscription(
                    pb.DropSubscriptionRequest(table=table, name=name), timeout=10
                )
            else:
                stub.ListSubscriptions(pb.ListSubscriptionsRequest(table=table), timeout=10)
        elif kind == "endpoint":
            _, table, sub, url, secret, n, timeout_s = request
            stub.SetEndpoint(
                pb.SetEndpointRequest(
                    table=table,
                    subscription=sub,
                    url=url,
                    secret=secret,
                    max_in_flight=n,
                    timeout_s=timeout_s,
                ),
                timeout=30,
            )
            stub.DropEndpoint(pb.DropEndpointRequest(table=table, subscription=sub), timeout=30)
        else:
            stub.MessageAck(pb.MessageAckRequest(name="canary", ids=HUGE), timeout=10)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()


# -- table events (msgtable.features.capture.follower)
# -------------------------------------------------------------
HOSTILE_TABLES = [
    "orders_'quote",
    'orders_"dq',
    "orders_`tick`",
    "orders_; drop table canary; --",
    "orders_ça表ü",  # (identifiers and comments are utf8mb3: no emoji in them)
    "orders_%s{}",
    "orders_\\back",
    "orders_" + "x" * 57,  # 64 characters, MySQL's longest
]
HOSTILE_VALUES = [
    "'",
    '"',
    "`; drop table canary; --",
    "\\",
    "ça😀表\u202e",
    "\x00nul",
    "%s %(x)s {}",
    "y" * 70_000,
]


def _comment_literal(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "''")


def test_hostile_capture_patterns_load_or_fail_with_one_line_naming_the_field(db_dsn):
    from tests.integration.test_capture import event_table_ddl

    patterns = [
        "",
        "|",
        "a||b",
        "`x`",
        "db.orders",
        "../x",
        "x\ny",
        "x" * 65,
        "orders_*|*",
        "ça表*",
        "[abc]|(x)|x+",
        "'; drop table canary; --",
    ]
    with serve(db_dsn) as s:
        s.create_table("canary", vt_poller_interval=0.2)
        for i, pattern in enumerate(patterns):
            ddl = event_table_ddl(f"ev{i}", vt_capture="PATTERN").replace(
                "vt_capture=PATTERN", "vt_capture=" + _comment_literal(pattern)
            )
            s.sql(ddl)
        s.engine.refresh()
        by_name = {t.name: t for t in s.client.list_tables()}
        for i, pattern in enumerate(patterns):
            t = by_name[f"ev{i}"]
            if t.load_error:
                assert "\n" not in t.load_error and "vt_capture" in t.load_error, (pattern, t)
                assert t.load_error.startswith(f"table ev{i}: ")
            else:
                assert t.config is not None and "|".join(t.config.capture) == pattern.strip()
        assert not by_name["canary"].load_error
        assert [r[0] for r in s.sql("select count(*) from canary")] == [0]


def test_hostile_source_tables_columns_and_values_are_captured_exactly(db_dsn):
    import json

    from tests.integration.test_capture import event_table_ddl

    with serve(db_dsn) as s:
        s.sql(event_table_ddl(vt_capture="orders_*"))
        s.engine.refresh()
        wait_until(s.engine.capture.following.is_set, what="the capture follower")
        column = "c`'\"; ça表"
        quoted = "`" + column.replace("`", "``") + "`"
        want = []
        for table in HOSTILE_TABLES:
            qt = "`" + table.replace("`", "``") + "`"
            s.sql(f"create table {qt}(id int primary key, {quoted} longtext, b longblob)")
            for i, value in enumerate(HOSTILE_VALUES):
                s.sql(
                    f"insert into {qt} values (:id, :v, :b)",
                    id=i,
                    v=value,
                    b=value.encode("utf-8") * 10,
                )
                want.append((table, i, value))
            s.sql(f"insert into {qt} (id, b) values (99, :b)", b=os.urandom(4_000_000))
            want.append((table, 99, None))
        got: list[tuple] = []

        def arrived() -> bool:
            got[:] = s.sql(
                "select source_table, pk, after_values from table_events "
                "where kind = 'insert' order by id"
            )
            return len(got) >= len(want)

        wait_until(arrived, 60, what=lambda: f"{len(want)} events, got {len(got)}")
        assert len(got) == len(want)
        for (source, pk, after), (table, i, value) in zip(got, want, strict=True):
            after = json.loads(after)
            assert source == table and json.loads(pk) == {"id": i}
            assert after["id"] == i and after[column] == value
            if value is not None:
                assert base64.b64decode(after["b"]) == value.encode("utf-8") * 10
            else:
                assert len(base64.b64decode(after["b"])) == 4_000_000
        creates = s.sql("select source_table from table_events where kind = 'create' order by id")
        assert [r[0] for r in creates] == HOSTILE_TABLES


# -- the dashboard, the metrics and msgtable.enqueue (issue 19) ---------------------------------
DASH_TOKEN = "t0ken-fuzz-0ps-s3cret"
DASH_AUTH = {
    "tokens": {DASH_TOKEN: "ops"},
    "allow": [{"principal": "ops", "tables": ["canary"], "actions": ["list"]}],
}
DASH_EXAMPLES = 1_500
HOSTILE_NUMBERS = [
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e309",
    "-1",
    "0",
    "9" * 400,
    "1_000",
    "0x10",
    "",
    " 1",
    "1.5",
    "\u0663",
    "%00",
    "'; drop table canary; --",
]
paths = st.sampled_from(
    [
        "/api/state",
        "/api/dead",
        "/api/redrive",
        "/",
        "/static/app.js",
        "/static/..%2f..%2fetc%2fpasswd",
        "/static/.hidden",
        "/static/x.py",
        "//api/state",
        "/api/../api/state",
        "/api/state/",
        "/api/%00",
        "/metrics",
        "/" + "a" * 8_000,
    ]
)
query_values = st.one_of(st.sampled_from(HOSTILE_NUMBERS + NASTY[:-3]), st.text(max_size=40))
queries = st.dictionaries(
    st.sampled_from(["after", "limit", "table", "subscription", "x", ""]),
    query_values,
    max_size=4,
)
json_bodies = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
) | st.fixed_dictionaries(
    {"table": st.one_of(names, st.just("canary"), st.integers(), st.none())},
    optional={
        "subscription": st.one_of(names, st.just(""), st.lists(st.integers(), max_size=2)),
        "ids": st.one_of(
            st.lists(st.integers(10_000_000, 2**70) | st.text(max_size=10), max_size=5),
            st.just([]),
            st.just(list(range(10_000_000, 10_002_000))),
            st.just("1,2"),
            st.just([True, None]),
            st.just([1.0, 2.0]),
        ),
    },
)
bodies = st.one_of(
    st.none(),
    st.builds(lambda b: json.dumps(b, allow_nan=True).encode(), json_bodies),
    st.binary(max_size=200),
    st.sampled_from([b"{", b"\xff\xfe", b"null", b"[]", b'{"table": "canary"' + b" " * 5_000]),
    st.just(b"HUGE"),  # stands for HUGE_BODY (a short repr in a failing example)
)
HUGE_BODY = b"{" + b'"a":1,' * 400_000 + b'"table":"canary"}'  # about 2.4 MB
content_types = st.sampled_from(
    [None, "application/json", "text/plain", "application/json; charset=latin-1", "multipart/x"]
)
header_text = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=60
)
authorizations = st.one_of(
    st.none(),
    st.just(f"Bearer {DASH_TOKEN}"),
    st.sampled_from(
        [
            "Bearer",
            "Bearer ",
            f"bearer {DASH_TOKEN}",
            f"Bearer {DASH_TOKEN} extra",
            f"Bearer {DASH_TOKEN[:-1]}",
            f"Basic {base64.b64encode(b'ops:' + DASH_TOKEN.encode()).decode()}",
            "Bearer " + "A" * 8_000,
            "Bearer '; drop table canary; --",
        ]
    ),
    header_text,
)
hosts = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "localhost",
            "127.0.0.1",
            "evil.test",
            "127.0.0.1.evil.test",
            "localhost.evil.test",
            "[::1]",
            "[::1",
            "::1",
            "",
            "127.0.0.1:99999",
            "0x7f.1",
        ]
    ),
    header_text,
)
dashboard_requests = st.tuples(
    st.sampled_from(["open", "auth"]),
    st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS"]),
    paths,
    queries,
    bodies,
    content_types,
    authorizations,
    hosts,
)


def _http(
    address: str,
    method: str,
    target: str,
    body: bytes | None,
    headers: dict[str, str],
    host: str | None,
) -> tuple[int, bytes]:
    import http.client

    host_name, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host_name, int(port), timeout=30)
    try:
        conn.putrequest(method, target, skip_host=host is not None, skip_accept_encoding=True)
        if host is not None:
            conn.putheader("Host", host)
        for k, v in headers.items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(HUGE_BODY if body == b"HUGE" else body)))
        if body == b"HUGE":
            body = HUGE_BODY
        # it may answer (and close) before reading the whole body: the answer says why
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.endheaders(body)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def test_hostile_dashboard_requests_get_a_clean_4xx_and_touch_nothing(db_dsn):
    import urllib.parse

    from msgtable.observe.dashboard import DashboardApi, DashboardServer, RateHistory
    from msgtable.server.auth import Authorizer

    with serve(db_dsn) as s:
        s.create_table("canary", vt_poller_interval=0.2)
        s.sql("insert into canary(id, message) values (1, 'kept'), (2, 'kept')")
        s.engine.refresh()
        before = s.sql("select id, epoch, time_next, time_acked, message from canary order by id")
        tables_before = s.sql("show tables")
        servers = {
            "open": DashboardServer(DashboardApi(s.engine, RateHistory(0.2)), "127.0.0.1:0"),
            "auth": DashboardServer(
                DashboardApi(s.engine, RateHistory(0.2), Authorizer.from_dict(DASH_AUTH)),
                "127.0.0.1:0",
            ),
        }
        for d in servers.values():
            d.open()
        seen: dict[int, int] = {}
        try:

            @settings(
                max_examples=DASH_EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(dashboard_requests)
            def hostile(request):
                which, method, path, query, body, ctype, auth, host = request
                target = path
                if query:
                    target += "?" + urllib.parse.urlencode(query)
                headers = {}
                if ctype is not None:
                    headers["Content-Type"] = ctype
                if auth is not None:
                    headers["Authorization"] = auth
                try:
                    code, text = _http(servers[which].address, method, target, body, headers, host)
                except ValueError:  # http.client itself refuses to send it (not a server's fault)
                    return
                seen[code] = seen.get(code, 0) + 1
                assert code < 500, (request[:4], code, text[:300])
                assert b"Traceback" not in text and DASH_TOKEN.encode() not in text, text[:300]
                if code != 200:
                    assert 400 <= code < 500, (request[:4], code)
                    if text.startswith(b"{"):  # the API's own answers say why
                        assert "error" in json.loads(text), text[:300]

            hostile()
            # still serving, both
            code, text = _http(servers["open"].address, "GET", "/api/state", None, {}, None)
            assert code == 200 and "canary" in {t["name"] for t in json.loads(text)["tables"]}
            code, _ = _http(
                servers["auth"].address,
                "GET",
                "/api/state",
                None,
                {"Authorization": f"Bearer {DASH_TOKEN}"},
                None,
            )
            assert code == 200
        finally:
            for d in servers.values():
                d.close()
        assert sum(seen.values()) >= DASH_EXAMPLES // 2, seen
        assert seen.get(200) and seen.get(400) and seen.get(401) and seen.get(403), seen
        assert s.sql("show tables") == tables_before
        after = s.sql("select id, epoch, time_next, time_acked, message from canary order by id")
        assert after == before
        c = Collector(s.client, "canary")
        assert sorted(m.id for m in c.take(2)) == [1, 2]
        c.close()


METRICS_EXAMPLES = 400
WEIRD_TABLE = 'we"ird\\na\nme{x="y"}'  # a real table: its label must come out escaped, exactly


def test_metrics_stay_valid_prometheus_text_under_hostile_calls(db_dsn):
    from prometheus_client.parser import text_string_to_metric_families

    from msgtable.core.sql import quote
    from msgtable.observe.metrics import MetricsServer

    with serve(db_dsn) as s:
        s.create_table("canary", vt_poller_interval=0.2)
        keyed = "k varchar(64), index order_idx (k, time_acked, id)"
        s.create_table("fuzzed", keyed, vt_poller_interval=0.2, vt_order_key="k")
        s.create_table("keyed", keyed, vt_poller_interval=0.2, vt_order_key="k")
        s.create_table(quote(WEIRD_TABLE), vt_poller_interval=0.2)
        s.sql("insert into canary(id, message) values (1, 'kept'), (2, 'kept')")
        s.sql(f"insert into {quote(WEIRD_TABLE)}(id, message) values (1, 'kept')")
        s.engine.refresh()
        real = {str(r[0]) for r in s.sql("show tables")}
        assert WEIRD_TABLE in real
        wait_until(
            lambda: WEIRD_TABLE in {t.name for t in s.engine.list_tables()},
            what="the weirdly named table loaded",
        )
        m = MetricsServer(s.engine, "127.0.0.1:0", s.server.servicer.streams)
        m.open()
        labelled: set[str] = set()
        try:
            with grpc.insecure_channel(
                s.server.address, options=[("grpc.max_send_message_length", 8 * 1024 * 1024)]
            ) as channel:
                stub = pb_grpc.MessagingStub(channel)

                @settings(
                    max_examples=METRICS_EXAMPLES,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                )
                @given(requests)
                def hostile(request):
                    code = send(stub, request)
                    assert code in CLEAN or code is grpc.StatusCode.OK, (request[0], code)
                    code, text = _http(m.address, "GET", "/metrics", None, {}, None)
                    assert code == 200, text[:300]
                    families = list(text_string_to_metric_families(text.decode()))
                    assert any(f.name == "msgtable_database_up" for f in families)
                    subscriptions = {"", "fz"}
                    if s.sql("show tables like 'msgtable_subscriptions'"):
                        registry = s.sql("select name from msgtable_subscriptions")
                        subscriptions |= {str(r[0]) for r in registry}
                    for f in families:
                        for sample in f.samples:
                            table = sample.labels.get("table")
                            if table is not None:
                                labelled.add(table)
                                assert table in real, (sample.name, table)
                            sub = sample.labels.get("subscription")
                            assert sub is None or sub in subscriptions, (sample.name, sub)

                hostile()
        finally:
            m.close()
        # the weird name came out of the text exactly as it is in the database
        assert {"canary", "keyed", WEIRD_TABLE} <= labelled
        assert s.sql("select id, message from canary order by id") == [(1, "kept"), (2, "kept")]


BIG = "<1 MB>"  # stands for 1 MB of text (a short repr in a failing example)


def _big(value: object) -> object:
    return "x" * 1_000_000 if value == BIG else value


@functools.cache  # built once a kind (see REQUESTS_BY_KIND)
def _enqueue_case(kind: str) -> st.SearchStrategy[tuple]:
    big = BIG
    hostile_numbers = st.one_of(  # none of them a delay (0 to MAX_ENQUEUE_DELAY_S seconds)
        st.floats(allow_nan=True, allow_infinity=True).filter(
            lambda f: not 0 <= f <= 100 * 365 * 86400
        ),
        st.sampled_from([-1, -1e-9, 1e300, 2**70, -(2**70), 1e10, "1", None, b"1"]),
    )
    return {
        "table": st.tuples(st.just("table"), st.one_of(names, st.just("msgtable_subscriptions"))),
        "traceparent": st.tuples(
            st.just("traceparent"),
            st.one_of(
                st.text(max_size=60),
                st.sampled_from(
                    [
                        "00-" + "0" * 32 + "-" + "0" * 16 + "-01\n",
                        "00-" + "A" * 32 + "-" + "b" * 16 + "-01",
                        "00-" + "a" * 32 + "-" + "b" * 16 + "-01-extra",
                        "00-\u0663" + "a" * 31 + "-" + "b" * 16 + "-01",
                        big,
                    ]
                ),
                st.integers(),
                st.binary(max_size=55),
            ),
        ),
        "priority": st.tuples(
            st.just("priority"),
            st.one_of(
                st.sampled_from([2**63, -(2**63) - 1, 2**70, True, 1.5, "1", None, math.nan]),
                st.integers(min_value=2**63),
                st.integers(max_value=-(2**63) - 1),
            ),
        ),
        "delay": st.tuples(st.just("delay"), hostile_numbers),
        "columns": st.tuples(
            st.just("columns"),
            st.dictionaries(
                st.one_of(
                    names,
                    st.sampled_from(
                        ["epoch", "time_next", "priority", "time_acked", "ID", "id ", "`id`"]
                    ),
                ),
                st.just(1),
                min_size=1,
                max_size=3,
            ),
        ),
        "order_key": st.tuples(
            st.just("order_key"),
            st.sampled_from(["jobs", "keyed"]),
            st.one_of(st.just(big), st.just("k" * 65), st.builds(object), st.just(b"\xff" * 70)),
        ),
        "big": st.tuples(st.just("big"), st.just(big)),
        "rows": st.tuples(
            st.just("rows"),
            st.lists(
                st.dictionaries(st.sampled_from(["id", "message"]), st.just(7)), min_size=2
            ).filter(lambda rows: any(list(r) != list(rows[0]) for r in rows)),
        ),
    }[kind]


enqueue_requests = st.sampled_from(
    ["table", "traceparent", "priority", "delay", "columns", "order_key", "big", "rows"]
).flatmap(_enqueue_case)
ENQUEUE_EXAMPLES = 600


def test_hostile_enqueues_raise_one_clear_error_and_write_nothing(db_dsn):
    import sqlalchemy as sa

    from msgtable.enqueue import enqueue, enqueue_many
    from msgtable.errors import MsgtableError

    with serve(db_dsn) as s:
        s.create_table("jobs", "traceparent varchar(55)", vt_poller_interval=0.2)
        keyed = "k varchar(64), index order_idx (k, time_acked, id)"
        s.create_table("keyed", keyed, vt_poller_interval=0.2, vt_order_key="k")
        s.sql("insert into jobs(id, message) values (1, 'kept')")
        counts: dict[str, int] = {}
        ids = iter(range(100, 1_000_000))

        @settings(
            max_examples=ENQUEUE_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(enqueue_requests)
        def hostile(request):
            kind = request[0]
            table, rows, kwargs = "jobs", [{"id": next(ids), "message": "m"}], {}
            request = tuple(_big(v) for v in request)
            if kind == "table":
                table = request[1]
            elif kind == "traceparent":
                kwargs["traceparent"] = request[1]
            elif kind == "priority":
                kwargs["priority"] = request[1]
            elif kind == "delay":
                kwargs["delay_s"] = request[1]
            elif kind == "columns":
                rows = [request[1]]
            elif kind == "order_key":
                table, kwargs["order_key"] = request[1], request[2]
            elif kind == "big":
                rows[0]["message"] = request[1]
            else:
                rows = request[1]
            with s.db.connect() as conn:
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
                tx = conn.begin()
                before = conn.exec_driver_sql("select count(*) from jobs").scalar()
                try:
                    enqueue_many(conn, table, rows, **kwargs)
                except MsgtableError as exc:
                    message = str(exc)
                    assert "\n" not in message and len(message) < 400, message[:500]
                    counts[type(exc).__name__] = counts.get(type(exc).__name__, 0) + 1
                else:
                    raise AssertionError(f"{kind} enqueued: {str(request)[:200]}")
                # the transaction stays usable, and the failed call wrote nothing
                assert conn.exec_driver_sql("select count(*) from jobs").scalar() == before
                tx.rollback()

        hostile()
        assert counts.get("InvalidArgument") and counts.get("TableNotFound"), counts
        # the helpers still work on the same tables
        with s.db.connect() as conn, conn.begin():
            assert enqueue(conn, "jobs", {"id": 2, "message": "ok"}, delay_s=0.5, priority=1)
            assert enqueue(conn, "keyed", {"id": 1, "message": "ok"}, order_key="k1") == 1
        assert [r[0] for r in s.sql("select id from jobs order by id")] == [1, 2]
        _ = sa


# -- user text echoed back: a bounded status on a real channel -------------------------------
MAX_DETAILS = 1_200  # what a status's message may carry at most (msgtable.server.servicer)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, data: bytes) -> bytes:
    """A length-delimited protobuf field: how any string field goes on the wire."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def raw_status(channel: grpc.Channel, method: str, payload: bytes) -> tuple[str, str]:
    """The status of ``method`` called with ``payload`` as its serialized request (bytes as
    they are: a client that is not protobuf's), as (code name, details)."""
    path = f"/msgtable.v1.Messaging/{method}"
    try:
        if method == "MessageStream":
            call = channel.unary_stream(path)(payload, timeout=10)
            try:
                next(call)
            finally:
                call.cancel()
        else:
            channel.unary_unary(path)(payload, timeout=10)
    except grpc.RpcError as exc:
        return exc.code().name, exc.details() or ""
    return "OK", ""


# (method, the serialized request's fields other than the name field 1)
ID_ONE = _field(3, b"\x10\x02")  # ids: [Value(int_value=1)] (a sint64, field 2)
NAMED_METHODS = [
    ("MessageStream", b""),
    ("MessageAck", ID_ONE),
    ("MessageRelease", ID_ONE),
    ("ListDeadLetters", b""),
]


def test_oversized_and_undecodable_text_gets_a_bounded_invalid_argument(db_dsn, caplog):
    """A name of 70,000 characters, or one that is not UTF-8, sent as raw bytes: each method
    answers INVALID_ARGUMENT with a short message, at once, before any lookup; the server
    logs no error (no traceback) and keeps serving. The project's own client gets the same
    for a 16 KB name (not a RESOURCE_EXHAUSTED of its own, from a reply that outgrew its
    metadata limit)."""
    with serve(db_dsn) as s, grpc.insecure_channel(s.server.address) as channel:
        s.create_table("canary")
        caplog.set_level(logging.WARNING)
        for method, rest in NAMED_METHODS:
            for name, code_wanted, why in (
                (b"t" * 70_000, "INVALID_ARGUMENT", "at most 64 characters"),
                (b"t\xff\xfe", "INVALID_ARGUMENT", "not valid UTF-8"),
                (b"no_such_table", "NOT_FOUND", "no_such_table"),  # the request is well formed
            ):
                code, details = raw_status(channel, method, _field(1, name) + rest)
                assert (code, why in details) == (code_wanted, True), (method, details)
                assert len(details) <= MAX_DETAILS, (method, len(details))
        with pytest.raises(InvalidArgument, match="at most 64 characters"):
            s.client.ack("t" * 16_000, [1])
        with pytest.raises(InvalidArgument) as bad:
            s.client.create_subscription("canary", "s", filter="message = '" + "x" * 70_000)
        assert len(str(bad.value)) <= MAX_DETAILS
        errors = [r.getMessage()[:200] for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == []
        assert s.client.list_tables()[0].name == "canary"  # still serving


NODE_TESTS = Path(__file__).parents[1] / "node"


def test_hostile_text_from_nodes_grpc_js_gets_a_bounded_status(db_dsn):
    """The same from a second client stack, Node's grpc-js (tests/node/hostile.js sends raw
    bytes): names of 70,000 and 16,000 characters and one that is not UTF-8 are
    INVALID_ARGUMENT, an unknown table NOT_FOUND, each with a short message, on every
    method tried (none hangs to its deadline, as a 64 KB name once did)."""
    grpc_js = NODE_TESTS / "node_modules" / "@grpc" / "grpc-js"
    assert grpc_js.is_dir(), f"{grpc_js} is missing: `make node-deps` installs tests/node"
    with serve(db_dsn) as s:
        s.create_table("canary")
        try:  # each call has a 10 s deadline: 16 calls that all hang end in 160 s
            ran = subprocess.run(
                ["node", str(NODE_TESTS / "hostile.js"), s.server.address],
                capture_output=True,
                text=True,
                timeout=240,
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"hostile.js did not end in 240 s; the calls it finished: {exc.stdout!r}")
        assert ran.returncode == 0, ran.stderr[-2_000:]
        calls = [json.loads(line) for line in ran.stdout.splitlines()]
        assert len(calls) == 16, ran.stdout
        for c in calls:
            wanted = "NOT_FOUND" if c["case"] == "unknown table" else "INVALID_ARGUMENT"
            assert (c["status"], c["details_length"] <= MAX_DETAILS) == (wanted, True), c
        assert s.client.list_tables()[0].name == "canary"  # still serving
