"""The SQS API's pure parts: SigV4 verified against botocore's own signer, the digests,
receipt handles, the record of deliveries, parameters and error shapes."""

from __future__ import annotations

import datetime
import hashlib
import json

import pytest

from msgtable.errors import InvalidArgument, TableNotFound, Unavailable
from msgtable.server.auth import AccessKey, Authorizer
from msgtable.server.sqs import handles, messages, signature
from msgtable.server.sqs.digest import md5_of_attributes, md5_of_body
from msgtable.server.sqs.handles import Deliveries, Handle
from msgtable.server.sqs.protocol import Params, SqsError, parse_body, sqs_error

botocore = pytest.importorskip("botocore")
from botocore.auth import SigV4Auth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402

KEYS = {"AKIDEXAMPLE": AccessKey("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "billing")}


def signed_at(request: signature.Request) -> datetime.datetime:
    """When botocore signed ``request`` (its x-amz-date): the server's "now" in these tests,
    however long the suite ran before them."""
    return datetime.datetime.strptime(request.headers["x-amz-date"], "%Y%m%dT%H%M%SZ").replace(
        tzinfo=datetime.UTC
    )


def signed(body: bytes, secret: str = KEYS["AKIDEXAMPLE"].secret) -> signature.Request:
    """A request as botocore signs it, as the server receives it."""
    req = AWSRequest(
        "POST",
        "http://127.0.0.1:9324/",
        data=body,
        headers={
            "Content-Type": "application/x-amz-json-1.0",
            "X-Amz-Target": "AmazonSQS.ListQueues",
        },
    )
    signer = SigV4Auth(Credentials("AKIDEXAMPLE", secret), "sqs", "eu-test-1")
    signer.add_auth(req)
    headers = {k.lower(): v for k, v in req.headers.items()}
    headers["host"] = "127.0.0.1:9324"
    return signature.Request("POST", "/", "", headers, body)


def test_a_request_botocore_signed_is_its_keys_principal():
    r = signed(b'{"QueueNamePrefix": "a"}')
    assert signature.verify(r, KEYS, signed_at(r)) == "billing"


def test_a_changed_body_or_a_wrong_secret_does_not_match():
    r = signed(b"{}")
    tampered = signature.Request(r.method, r.path, r.query, r.headers, b'{"x": 1}')
    for request in (tampered, signed(b"{}", secret="not-the-secret-at-all")):
        with pytest.raises(SqsError) as caught:
            signature.verify(request, KEYS, signed_at(r))
        assert (caught.value.code, caught.value.status) == ("SignatureDoesNotMatch", 403)


def test_an_old_request_an_unknown_key_and_no_signature_are_refused():
    with pytest.raises(SqsError, match="Signature expired") as caught:
        r = signed(b"{}")
        signature.verify(r, KEYS, signed_at(r) + datetime.timedelta(minutes=16))
    assert caught.value.code == "SignatureDoesNotMatch"
    with pytest.raises(SqsError) as caught:
        signature.verify(r, {}, signed_at(r))
    assert caught.value.code == "InvalidClientTokenId"
    r = signed(b"{}")
    bare = signature.Request(r.method, r.path, r.query, {"host": "h"}, r.body)
    with pytest.raises(SqsError) as caught:
        signature.verify(bare, KEYS, signed_at(r))
    assert (caught.value.code, caught.value.status) == ("MissingAuthenticationToken", 403)
    garbled = dict(r.headers, authorization="AWS4-HMAC-SHA256 nonsense")
    with pytest.raises(SqsError) as caught:
        signature.verify(signature.Request("POST", "/", "", garbled, b"{}"), KEYS, signed_at(r))
    assert caught.value.code == "IncompleteSignature"


def test_the_canonical_path_and_query_are_the_sdks():
    assert signature.canonical_path("") == "/"
    assert signature.canonical_path("/a/./b/../c%20d/") == "/a/c%2520d/"
    assert signature.canonical_query("b=2&a=x y&a=1") == "a=1&a=x%20y&b=2"


def test_the_digests_are_sqss():
    assert md5_of_body("héllo") == hashlib.md5("héllo".encode()).hexdigest()
    # one String attribute, by hand: length-prefixed name, type, 1, length-prefixed value
    by_hand = hashlib.md5(
        b"\x00\x00\x00\x01a" + b"\x00\x00\x00\x06String" + b"\x01" + b"\x00\x00\x00\x01x"
    ).hexdigest()
    assert md5_of_attributes({"a": {"DataType": "String", "StringValue": "x"}}) == by_hand
    both = {
        "b": {"DataType": "Binary", "BinaryValue": b"\x00"},
        "a": {"DataType": "String", "StringValue": "x"},
    }
    tail = b"\x00\x00\x00\x01b" + b"\x00\x00\x00\x06Binary" + b"\x02" + b"\x00\x00\x00\x01\x00"
    head = b"\x00\x00\x00\x01a\x00\x00\x00\x06String\x01\x00\x00\x00\x01x"
    assert md5_of_attributes(both) == hashlib.md5(head + tail).hexdigest()  # sorted by name


def test_a_handle_names_one_delivery_of_one_queue():
    tag = handles.tag_of("jobs")
    for rid in (7, -3, "uuid-text", b"\x00\xff"):
        h = Handle(tag, handles.new_nonce(), 2, rid)
        assert handles.decode(h.encode(), tag) == h
    h = Handle(tag, handles.new_nonce(), 1, 7)
    for bad, queue_tag in (
        (h.encode(), handles.tag_of("jobs_dead")),
        ("garbage", tag),
        ("", tag),
        ("x" * 2000, tag),
    ):
        with pytest.raises(SqsError) as caught:
            handles.decode(bad, queue_tag)
        assert caught.value.code == "ReceiptHandleIsInvalid"


def test_a_later_delivery_makes_the_earlier_handle_stale():
    d = Deliveries()
    tag = handles.tag_of("jobs")
    first = Handle(tag, handles.new_nonce(), 1, 7)
    now = 10**18
    assert d.handed(first, now + 30 * 10**9, 1000) == 1000
    assert d.state(first, now) == "current"
    assert d.state(first, now + 30 * 10**9) == "unknown"  # its visibility over: ask the table
    second = Handle(tag, handles.new_nonce(), 2, 7)
    assert d.handed(second, now + 60 * 10**9, 5000) == 1000  # the first receive is kept
    assert d.state(first, now) == "stale"
    assert d.state(second, now) == "current"
    assert d.state(Handle(tag, handles.new_nonce(), 1, 8), now) == "unknown"


def test_parameters_are_checked_as_sqs_checks_them():
    p = Params({"MaxNumberOfMessages": 11, "QueueUrl": 5, "Entries": [{"Id": "a"}] * 2})
    with pytest.raises(SqsError, match="Must be between 1 and 10"):
        p.integer("MaxNumberOfMessages", 1, 10)
    with pytest.raises(SqsError) as caught:
        p.text("QueueUrl")
    assert caught.value.code == "InvalidParameterValue"
    with pytest.raises(SqsError) as caught:
        p.text("ReceiptHandle", required=True)
    assert caught.value.code == "MissingParameter"
    with pytest.raises(SqsError) as caught:
        p.entries()
    assert caught.value.code == "BatchEntryIdsNotDistinct"
    for entries, code in (
        ([], "EmptyBatchRequest"),
        ([{"Id": str(i)} for i in range(11)], "TooManyEntriesInBatchRequest"),
        ([{"Id": "not ok!"}], "InvalidBatchEntryId"),
    ):
        with pytest.raises(SqsError) as caught:
            Params({"Entries": entries}).entries()
        assert caught.value.code == code
    for body in (b"[1]", b"{", b"\xff"):
        with pytest.raises(SqsError) as caught:
            parse_body(body)
        assert caught.value.code == "SerializationException"


def test_errors_have_sqss_shape_and_query_codes():
    e = sqs_error(TableNotFound("message table 'x' not found"))
    assert (e.code, e.status) == ("QueueDoesNotExist", 400)
    assert json.loads(e.body())["__type"] == "com.amazonaws.sqs#QueueDoesNotExist"
    assert e.headers() == [("x-amzn-query-error", "AWS.SimpleQueueService.NonExistentQueue;Sender")]
    assert sqs_error(InvalidArgument("bad")).code == "InvalidParameterValue"
    u = sqs_error(Unavailable("database unavailable"))
    assert (u.code, u.status, u.headers()[0][1]) == (
        "ServiceUnavailable",
        503,
        "ServiceUnavailable;Receiver",
    )


def test_message_attributes_are_checked():
    ok = messages.check_attributes(
        {
            "a": {"DataType": "Number.int", "StringValue": "1.5e3"},
            "b": {"DataType": "Binary", "BinaryValue": "AAE="},
        }
    )
    assert ok["b"]["BinaryValue"] == b"\x00\x01"
    for bad in (
        {"AWS.x": {"DataType": "String", "StringValue": "v"}},
        {"a": {"DataType": "Text", "StringValue": "v"}},
        {"a": {"DataType": "Number", "StringValue": "nan"}},
        {"a": {"DataType": "String", "StringValue": ""}},
        {"a": {"DataType": "Binary", "BinaryValue": "not base64!"}},
        {f"a{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)},
    ):
        with pytest.raises(SqsError):
            messages.check_attributes(bad)
    with pytest.raises(SqsError) as caught:
        messages.check_body("ok\x00")
    assert caught.value.code == "InvalidMessageContents"


def test_the_auth_file_maps_access_keys_to_principals():
    a = Authorizer.from_dict(
        {
            "access_keys": {"AKID1": {"secret": "s" * 16, "principal": "billing"}},
            "allow": [{"principal": "billing", "tables": ["orders"], "actions": ["send"]}],
        }
    )
    assert a.access_keys == {"AKID1": AccessKey("s" * 16, "billing")}
    assert a.allows("billing", "send", "orders")
    for bad in ({"AKID1": {"secret": "short", "principal": "p"}}, {"AKID1": "s" * 16}):
        with pytest.raises(InvalidArgument):
            Authorizer.from_dict({"access_keys": bad})


def test_ids_made_here_carry_their_time():
    import random

    rid = messages.time_ordered_id(random.Random(1))
    assert 0 < rid < 2**63
    sent = messages.sent_ms_of(rid)
    assert sent is not None and abs(sent - datetime.datetime.now().timestamp() * 1000) < 5000
    assert messages.sent_ms_of(7) is None
