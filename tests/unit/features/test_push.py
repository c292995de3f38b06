"""Push endpoints without a network: the allow-list, the body and signature, the outcomes."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import email.utils
import json

import pytest

from msgtable.errors import InvalidArgument
from msgtable.features.push.allow import AllowList, parse_target
from msgtable.features.push.body import CONTENT_TYPE, BatchEncoder, headers, secret_bytes, sign
from msgtable.features.push.endpoints import Endpoint
from msgtable.features.push.outcome import MAX_RETRY_AFTER_S, Verdict, for_answer, retry_after_s

VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


# -- the allow-list ----------------------------------------------------------------------------
def allowed(allow: str, url: str) -> bool:
    return AllowList.parse(allow).url_problem(parse_target(url)) == ""


@pytest.mark.parametrize(
    ("allow", "url", "ok"),
    [
        ("", "http://127.0.0.1/", False),
        ("http://127.0.0.0/8", "http://127.0.0.1:8080/hook", True),
        ("http://127.0.0.0/8", "https://127.0.0.1/hook", False),  # the scheme counts
        ("https://127.0.0.0/8", "http://127.0.0.1/hook", False),
        ("http://127.0.0.0/8", "http://10.0.0.1/", False),
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080/x", True),
        ("http://127.0.0.1:8080", "http://127.0.0.1:8081/x", False),  # the port counts
        ("https://hooks.example.com", "https://hooks.example.com/in", True),
        ("https://hooks.example.com", "https://HOOKS.Example.com/in", True),
        ("https://hooks.example.com", "https://evil.example.com/in", False),
        ("https://*.example.com", "https://a.b.example.com/in", True),
        ("https://*.example.com", "https://example.com/in", False),  # not the domain itself
        ("https://*.example.com", "https://example.com.evil.net/", False),
        ("https://*.example.com", "https://evilexample.com/", False),
        ("http://[::1]", "http://[::1]:9000/hook", True),
        ("http://[::1/128]", "http://[::1]:9000/hook", True),
        ("http://[fd00::/8]", "http://[fd12::5]/hook", True),
        ("http://[::1]", "http://127.0.0.1/hook", False),
        ("http://10.0.0.0/8,https://*.example.com", "https://x.example.com/", True),
    ],
)
def test_allow_list_matches_scheme_host_wildcard_cidr_and_port(
    allow: str, url: str, ok: bool
) -> None:
    assert allowed(allow, url) is ok


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1@evil.example.com/", "user name"),
        ("http://user:pw@127.0.0.1/", "user name"),
        ("ftp://127.0.0.1/", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("http://127.0.0.1/a\r\nX-Injected: 1", "control character"),
        ("http://127.0.0.1/\x00", "control character"),
        ("http://exämple.com/", "not ASCII"),
        ("http:///nohost", "no host"),
        ("http://127.0.0.1:99999/", "malformed"),
        ("http://a..b/", "malformed"),
        ("http://127.0.0.1/#frag", "fragment"),
        ("http://" + "a" * 3000 + ".com/", "longer than"),
        ("", "required"),
    ],
)
def test_hostile_urls_are_refused_with_one_line(url: str, why: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_target(url)
    message = str(info.value)
    assert why in message and "\n" not in message


def test_userinfo_trick_never_reaches_the_allowed_host() -> None:
    """``http://127.0.0.1@evil`` names host evil: refused outright, whatever is allowed."""
    with pytest.raises(InvalidArgument):
        parse_target("http://127.0.0.1@169.254.169.254/latest/meta-data")


@pytest.mark.parametrize(
    "entry", ["127.0.0.1", "gopher://x", "http://", "http://a b", "http://1.2.3.4/40", "http://x:0"]
)
def test_a_bad_allow_entry_is_named(entry: str) -> None:
    with pytest.raises(InvalidArgument, match="--push-allow"):
        AllowList.parse(f"http://127.0.0.1,{entry}")


def test_a_name_allowed_by_cidr_connects_only_to_addresses_inside_it() -> None:
    """DNS rebinding: the name passes the URL check, its addresses are checked at connect."""
    allow = AllowList.parse("https://203.0.113.0/24")
    target = parse_target("https://hooks.partner.test/in")
    assert allow.url_problem(target) == ""
    assert allow.address_allowed(target, "203.0.113.7")
    assert not allow.address_allowed(target, "10.0.0.5")
    assert not allow.address_allowed(target, "127.0.0.1")


def test_a_name_allowed_by_name_may_resolve_anywhere_but_an_address_url_must_be_inside() -> None:
    allow = AllowList.parse("https://*.example.com")
    assert allow.address_allowed(parse_target("https://a.example.com/"), "10.1.2.3")
    assert not allow.address_allowed(parse_target("https://10.1.2.3/"), "10.1.2.3")


# -- the body and the signature ------------------------------------------------------------------
def test_signature_matches_the_standard_webhooks_test_vector() -> None:
    key = secret_bytes(VECTOR_SECRET)
    body = b'{"test": 2432232314}'
    expected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    assert sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == expected
    h = headers(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    assert h["webhook-signature"] == expected
    assert h["webhook-timestamp"] == "1614265330"
    assert h["content-type"] == CONTENT_TYPE


def test_a_raw_secret_is_its_utf8_bytes_and_bad_secrets_are_refused_without_quoting() -> None:
    assert secret_bytes("a-raw-secret-of-24-bytes") == b"a-raw-secret-of-24-bytes"
    for bad in ("", "short", "whsec_not base64!", "a" * 20 + "\n", "x" * 600):
        with pytest.raises(InvalidArgument) as info:
            secret_bytes(bad)
        if bad:
            assert bad.strip() not in str(info.value)


def test_an_endpoint_repr_never_shows_its_secret() -> None:
    ep = Endpoint("t", "", "http://127.0.0.1/", "s3cr3t-value-never-shown")
    assert "s3cr3t" not in repr(ep)


def test_each_message_is_one_cloudevent_with_its_columns_as_data() -> None:
    enc = BatchEncoder("db", "orders", "billing", ["id", "payload", "amount", "at", "key"], "key")
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    rows = [(7, b"\x00\xff", decimal.Decimal("1.50"), when, "k1"), (8, None, None, None, None)]
    events = json.loads(enc.body(rows, [1, 3], 1_700_000_000_000_000_000))
    first, second = events
    assert first["specversion"] == "1.0"
    assert first["id"] == "orders/7"
    assert first["source"] == "msgtable://db/orders/billing"
    assert first["type"] == "msgtable.message"
    assert first["time"] == "2023-11-14T22:13:20.000000Z"
    assert first["datacontenttype"] == "application/json"
    assert first["data"] == {
        "id": 7,
        "payload": base64.b64encode(b"\x00\xff").decode(),
        "amount": "1.50",
        "at": "2026-01-02T03:04:05+00:00",
        "key": "k1",
    }
    assert (first["attempt"], first["orderkey"]) == (1, "k1")
    assert second["attempt"] == 3 and "orderkey" not in second
    assert BatchEncoder("db", "t", "", ["id"]).source == "msgtable://db/t"


# -- outcomes ----------------------------------------------------------------------------------
NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        (200, Verdict.ACK),
        (202, Verdict.ACK),
        (204, Verdict.ACK),
        (408, Verdict.RELEASE),
        (429, Verdict.RELEASE),
        (500, Verdict.RELEASE),
        (503, Verdict.RELEASE),
        (301, Verdict.REJECT),
        (302, Verdict.REJECT),
        (307, Verdict.REJECT),
        (400, Verdict.REJECT),
        (401, Verdict.REJECT),
        (404, Verdict.REJECT),
        (410, Verdict.REJECT),
    ],
)
def test_status_to_outcome(status: int, verdict: Verdict) -> None:
    assert for_answer(status, b"", None, None, NOW).verdict is verdict


def test_a_4xx_reason_has_the_status_and_the_body_start() -> None:
    o = for_answer(422, b"field 'x' is\nmissing" + b"!" * 500, None, None, NOW)
    assert o.reason.startswith("HTTP 422: field 'x' is missing")
    assert len(o.reason) < 260


def test_a_redirect_is_not_followed_and_says_where_it_pointed() -> None:
    o = for_answer(302, b"", None, "http://10.0.0.1/admin", NOW)
    assert o.reason == "HTTP 302: redirect to http://10.0.0.1/admin not followed"


def test_retry_after_in_seconds_or_as_an_http_date_capped() -> None:
    assert retry_after_s("7", NOW) == 7.0
    date = email.utils.formatdate(NOW + 30, usegmt=True)
    assert retry_after_s(date, NOW) == pytest.approx(30.0)
    assert retry_after_s(email.utils.formatdate(NOW - 30, usegmt=True), NOW) == 0.0
    assert retry_after_s("999999", NOW) == MAX_RETRY_AFTER_S
    assert retry_after_s("soon", NOW) is None
    assert retry_after_s(None, NOW) is None
    assert for_answer(429, b"", "5", None, NOW).delay_s == 5.0
    assert for_answer(503, b"", None, None, NOW).delay_s is None


def test_a_tls_failure_whose_reason_is_text_is_described_not_raised() -> None:
    """ssl.SSLCertVerificationError has a str ``reason``: describing it once raised
    AttributeError and killed the pusher's worker thread."""
    import ssl

    import urllib3

    from msgtable.features.push.transport import failure_text

    cause = ssl.SSLCertVerificationError(1, "certificate verify failed: unable to get issuer")
    cause.reason = "CERTIFICATE_VERIFY_FAILED"
    error = urllib3.exceptions.SSLError(cause)
    error.__context__ = cause
    text, refused = failure_text(error)
    assert "certificate verify failed" in text and not refused


def test_the_webhook_id_is_stable_per_batch_attempt_and_safe_in_a_header() -> None:
    from msgtable.features.push.pusher import webhook_id

    a = webhook_id("jobs", "", "id\r\nX-Injected: 1", 1)
    assert a == webhook_id("jobs", "", "id\r\nX-Injected: 1", 1)
    assert a != webhook_id("jobs", "", "id\r\nX-Injected: 1", 2)
    assert a != webhook_id("jobs", "billing", "id\r\nX-Injected: 1", 1)
    assert a.startswith("msg_") and a[4:].isalnum() and a.isascii()


def test_the_docs_verify_snippet_accepts_a_pushed_request_and_refuses_a_tampered_one() -> None:
    import pathlib
    import time

    page = pathlib.Path(__file__).parents[3] / "docs" / "how-to" / "push.md"
    section = page.read_text()
    snippet = section[section.index("```python\n") + 10 :]
    snippet = snippet[: snippet.index("```")]
    scope: dict[str, object] = {}
    exec(snippet, scope)
    verify = scope["verify"]
    assert callable(verify)
    body = BatchEncoder("app", "my_message", "", ["id", "message"]).body(
        [(42, "hello")], [1], time.time_ns()
    )
    now = int(time.time())
    h = headers(secret_bytes(VECTOR_SECRET), "msg_1", now, body)
    assert verify(VECTOR_SECRET, h, body)
    assert not verify(VECTOR_SECRET, h, body.replace(b"hello", b"hellO"))
    assert not verify(
        VECTOR_SECRET, headers(secret_bytes(VECTOR_SECRET), "msg_1", now - 600, body), body
    )
    raw = "a-raw-secret-of-24-bytes"
    assert verify(raw, headers(secret_bytes(raw), "msg_2", now, body), body)


def test_serve_with_a_bad_push_allow_entry_stops_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from msgtable import cli

    argv = ["serve", "--dsn", "mysql+pymysql://u:p@127.0.0.1:1/app", "--listen", "127.0.0.1:0"]
    assert cli.main([*argv, "--push-allow", "http://10.0.0.0/8,ftp://x"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "msgtable: error: --push-allow: 'ftp://x' is not scheme://host[:port], "
        "scheme://*.domain or scheme://CIDR"
    ]
    assert cli.main([*argv, "--push-ca-file", "/nonexistent/ca.pem"]) == 1
    assert "--push-ca-file /nonexistent/ca.pem: no such file" in capsys.readouterr().err
