"""The SQS API as boto3 (the AWS SDK for Python) uses it, against `msgtable serve
--sqs-listen` on a real database: the scenario of issue 44 (the JavaScript SDK runs the same
in test_sqs_node.py)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

boto3 = pytest.importorskip("boto3")
from botocore.config import Config  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from . import sqs_scenario as scenario  # noqa: E402
from .helpers import free_port  # noqa: E402

if TYPE_CHECKING:
    from tests.conftest import Sql

    from .helpers import Cli

pytestmark = pytest.mark.timeout(240)


def client(endpoint: str, key: str = "any", secret: str = "anything-at-all") -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=scenario.REGION,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1}, read_timeout=60),
    )


def code_of(call: Callable[[], Any]) -> tuple[str, int, str]:
    """The error a call answers: its SQS code (the query code boto3 shows), HTTP status,
    and the exception's class name."""
    with pytest.raises(ClientError) as caught:
        call()
    e = caught.value
    return (
        e.response["Error"]["Code"],
        e.response["ResponseMetadata"]["HTTPStatusCode"],
        type(e).__name__,
    )


def receive(sqs: Any, url: str, wait_s: int = 5, **kwargs: Any) -> list[dict[str, Any]]:
    got = sqs.receive_message(
        QueueUrl=url,
        MaxNumberOfMessages=kwargs.pop("most", 10),
        WaitTimeSeconds=wait_s,
        MessageSystemAttributeNames=["All"],
        MessageAttributeNames=["All"],
        **kwargs,
    )
    messages: list[dict[str, Any]] = got.get("Messages", [])
    for m in messages:  # what the SDKs check (the JavaScript SDK refuses a wrong one)
        assert m["MD5OfBody"] == hashlib.md5(m["Body"].encode()).hexdigest()
    return messages


def receive_all(sqs: Any, url: str, n: int, **kwargs: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while len(out) < n and time.monotonic() < deadline:
        out += receive(sqs, url, **kwargs)
    return out


def test_boto3_sends_receives_and_settles_as_sqs_answers(cli: Cli, sql: Sql, db_dsn: str):
    scenario.create_tables(sql)
    _, endpoint = scenario.serve_sqs(cli, db_dsn)
    sqs = client(endpoint)

    # queues: a table's default group; an ordered table is a FIFO queue
    url = sqs.get_queue_url(QueueName="jobs")["QueueUrl"]
    assert url.endswith("/jobs") and url.startswith(endpoint)
    listed = sqs.list_queues()["QueueUrls"]
    assert [u.rsplit("/", 1)[1] for u in listed] == ["events.fifo", "jobs", "jobs_dead"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "30"
    assert attrs["ApproximateNumberOfMessages"] == "0"
    keyspace = url.split("/")[3]
    assert json.loads(attrs["RedrivePolicy"]) == {
        "deadLetterTargetArn": f"arn:aws:sqs:msgtable:{keyspace}:jobs_dead",
        "maxReceiveCount": 3,
    }

    # send: the body to message, customer to its column, other attributes to the JSON column
    attributes = {
        "customer": {"DataType": "String", "StringValue": "acme"},
        "trace": {"DataType": "String.id", "StringValue": "t-1"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
        "n": {"DataType": "Number", "StringValue": "42"},
    }
    sent = sqs.send_message(QueueUrl=url, MessageBody="héllo", MessageAttributes=attributes)
    assert sent["MD5OfMessageBody"] == hashlib.md5("héllo".encode()).hexdigest()
    assert sent["MD5OfMessageAttributes"] == scenario.md5_of_attributes(attributes)
    assert (
        sql.scalar("select customer from jobs where id = :id", {"id": int(sent["MessageId"])})
        == "acme"
    )
    batch = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[{"Id": f"e{i}", "MessageBody": f"batch {i}"} for i in range(3)]
        + [{"Id": "late", "MessageBody": "later", "DelaySeconds": 900}],
    )
    assert sorted(e["Id"] for e in batch["Successful"]) == ["e0", "e1", "e2", "late"]
    assert batch["Failed"] == []

    # receive: everything due, in one long poll, with system and message attributes
    got = receive_all(sqs, url, 4)
    by_body = {m["Body"]: m for m in got}
    assert sorted(by_body) == ["batch 0", "batch 1", "batch 2", "héllo"]
    first = by_body["héllo"]
    assert first["MessageAttributes"] == attributes
    assert first["MD5OfMessageAttributes"] == scenario.md5_of_attributes(attributes)
    assert first["Attributes"]["ApproximateReceiveCount"] == "1"
    assert abs(int(first["Attributes"]["SentTimestamp"]) - time.time() * 1000) < 120_000
    assert receive(sqs, url, wait_s=1) == []  # the rest is in flight, "later" delayed

    # delete (the ack), by batch and one by one
    done = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": f"d{i}", "ReceiptHandle": by_body[f"batch {i}"]["ReceiptHandle"]}
            for i in range(2)
        ]
        + [{"Id": "bad", "ReceiptHandle": "bm90IGEgaGFuZGxl"}],
    )
    assert [e["Id"] for e in done["Successful"]] == ["d0", "d1"]
    assert [(e["Id"], e["Code"], e["SenderFault"]) for e in done["Failed"]] == [
        ("bad", "ReceiptHandleIsInvalid", True)
    ]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=by_body["batch 2"]["ReceiptHandle"])
    assert sql.scalar("select count(*) from jobs where time_acked is not null") == 3

    # visibility: 0 releases at once, and the redelivery counts its receive
    old = first["ReceiptHandle"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=old, VisibilityTimeout=0)
    (again,) = receive_all(sqs, url, 1)
    assert again["Body"] == "héllo"
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"
    assert (
        again["Attributes"]["ApproximateFirstReceiveTimestamp"]
        == (first["Attributes"]["ApproximateFirstReceiveTimestamp"])
    )
    # a stale handle (of the first delivery) neither extends nor deletes the second
    assert code_of(
        lambda: sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=old, VisibilityTimeout=60)
    )[:2] == ("AWS.SimpleQueueService.MessageNotInflight", 400)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=old)
    assert sql.scalar("select time_acked from jobs where message = 'héllo'") is None
    # a receive's VisibilityTimeout: in flight that long, then back
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=again["ReceiptHandle"], VisibilityTimeout=2
    )
    assert receive(sqs, url, wait_s=1) == []
    (third,) = receive_all(sqs, url, 1, VisibilityTimeout=60)
    assert third["Attributes"]["ApproximateReceiveCount"] == "3"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=third["ReceiptHandle"])
    assert sql.scalar("select time_acked from jobs where message = 'héllo'") is not None

    # long polling answers as soon as a plain SQL INSERT commits
    answer: list[Any] = []
    poll = threading.Thread(
        target=lambda: answer.append((receive(sqs, url, wait_s=20), time.monotonic()))
    )
    poll.start()
    time.sleep(1.0)
    sql.execute("insert into jobs(id, message, customer) values (7, 'by sql', 'sqlco')")
    committed = time.monotonic()
    poll.join(30)
    (inserted,), returned = answer[0]
    assert returned - committed < 5.0
    assert inserted["Body"] == "by sql" and inserted["MessageId"] == "7"
    assert inserted["MessageAttributes"] == {
        "customer": {"DataType": "String", "StringValue": "sqlco"}
    }
    sqs.delete_message(QueueUrl=url, ReceiptHandle=inserted["ReceiptHandle"])

    # dead letters after vt_max_attempts (3) receives without a delete
    sqs.send_message(QueueUrl=url, MessageBody="poison")
    for attempt in (1, 2, 3):
        (m,) = receive_all(sqs, url, 1, VisibilityTimeout=0)
        assert (m["Body"], m["Attributes"]["ApproximateReceiveCount"]) == ("poison", str(attempt))
    dead_url = sqs.get_queue_url(QueueName="jobs_dead")["QueueUrl"]
    (dead,) = receive_all(sqs, dead_url, 1)
    assert dead["Body"] == "poison"
    assert dead["MessageAttributes"]["attempts"] == {"DataType": "Number", "StringValue": "3"}

    # FIFO: an ordered table, MessageGroupId its order key; order kept per group
    fifo = sqs.get_queue_url(QueueName="events.fifo")["QueueUrl"]
    assert sqs.get_queue_attributes(QueueUrl=fifo, AttributeNames=["FifoQueue"])["Attributes"] == {
        "FifoQueue": "true"
    }
    for i in range(4):
        for group in ("a", "b"):
            sqs.send_message(
                QueueUrl=fifo,
                MessageBody=f"{group}{i}",
                MessageGroupId=group,
                MessageDeduplicationId=f"{group}-{i}",
            )
    dup = sqs.send_message(
        QueueUrl=fifo, MessageBody="a0 again", MessageGroupId="a", MessageDeduplicationId="a-0"
    )
    assert dup["MessageId"]
    seen: dict[str, list[str]] = {"a": [], "b": []}
    deadline = time.monotonic() + 30
    while sum(map(len, seen.values())) < 8 and time.monotonic() < deadline:
        for m in receive(sqs, fifo, wait_s=2):
            seen[m["Attributes"]["MessageGroupId"]].append(m["Body"])
            sqs.delete_message(QueueUrl=fifo, ReceiptHandle=m["ReceiptHandle"])
    assert seen == {"a": ["a0", "a1", "a2", "a3"], "b": ["b0", "b1", "b2", "b3"]}
    assert code_of(lambda: sqs.send_message(QueueUrl=fifo, MessageBody="x"))[:2] == (
        "MissingParameter",
        400,
    )

    # bad input, answered as SQS answers it
    nowhere = url.rsplit("/", 1)[0] + "/nowhere"
    assert code_of(lambda: sqs.send_message(QueueUrl=nowhere, MessageBody="x")) == (
        "AWS.SimpleQueueService.NonExistentQueue",
        400,
        "QueueDoesNotExist",
    )
    assert code_of(lambda: sqs.get_queue_url(QueueName="nowhere"))[2] == "QueueDoesNotExist"
    assert code_of(lambda: sqs.delete_message(QueueUrl=url, ReceiptHandle="garbage")) == (
        "ReceiptHandleIsInvalid",
        400,
        "ReceiptHandleIsInvalid",
    )
    # a handle of another queue is not one of this queue's
    assert code_of(lambda: sqs.delete_message(QueueUrl=dead_url, ReceiptHandle=old))[0] == (
        "ReceiptHandleIsInvalid"
    )
    eleven = [{"Id": f"m{i}", "MessageBody": "x"} for i in range(11)]
    assert code_of(lambda: sqs.send_message_batch(QueueUrl=url, Entries=eleven)) == (
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        400,
        "TooManyEntriesInBatchRequest",
    )
    assert code_of(lambda: sqs.send_message(QueueUrl=url, MessageBody="x" * 262_145))[:2] == (
        "InvalidParameterValue",
        400,
    )
    assert code_of(lambda: sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11))[:2] == (
        "InvalidParameterValue",
        400,
    )
    big = [{"Id": f"m{i}", "MessageBody": "x" * 100_000} for i in range(3)]
    assert code_of(lambda: sqs.send_message_batch(QueueUrl=url, Entries=big))[0] == (
        "AWS.SimpleQueueService.BatchRequestTooLong"
    )
    mixed = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[{"Id": "ok", "MessageBody": "fine"}, {"Id": "bad", "MessageBody": "\x00"}],
    )
    assert [e["Id"] for e in mixed["Successful"]] == ["ok"]
    assert [(e["Id"], e["Code"]) for e in mixed["Failed"]] == [("bad", "InvalidMessageContents")]


def test_a_visibility_timeout_shorter_than_what_is_left_brings_the_message_back_sooner(
    cli: Cli, sql: Sql, db_dsn: str
):
    """SQS's ChangeMessageVisibility counts its timeout from the call, shorter or longer than
    what was left; so does a receive's VisibilityTimeout. Both before and after the server
    wrote the send's postpone (vt_postpone_after, 1 s): a postponed message kept its 30 s."""
    scenario.create_tables(sql)
    _, endpoint = scenario.serve_sqs(cli, db_dsn)
    sqs = client(endpoint)
    url = sqs.get_queue_url(QueueName="jobs")["QueueUrl"]
    for n, body in enumerate(["not postponed yet", "postponed"]):
        sqs.send_message(QueueUrl=url, MessageBody=body)
        (m,) = receive_all(sqs, url, 1)
        assert m["Body"] == body
        if n:  # wait for the postpone (epoch 1, due after the 30 s ack wait)
            deadline = time.monotonic() + 20
            while sql.scalar("select epoch from jobs where message = :b", {"b": body}) != 1:
                assert time.monotonic() < deadline, "the send's postpone was never written"
                time.sleep(0.1)
        sqs.change_message_visibility(
            QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=1
        )
        (again,) = receive(sqs, url, wait_s=10, VisibilityTimeout=1) or [None]
        assert again is not None, f"{body!r}: not back within 10 s of a 1 s visibility"
        assert again["Body"] == body and again["Attributes"]["ApproximateReceiveCount"] == "2"
        (third,) = receive(sqs, url, wait_s=10) or [None]  # the receive's own 1 s is over
        assert third is not None, f"{body!r}: not back within 10 s of a receive's 1 s"
        assert third["Attributes"]["ApproximateReceiveCount"] == "3"
        sqs.delete_message(QueueUrl=url, ReceiptHandle=third["ReceiptHandle"])


def test_boto3_signatures_are_checked_against_the_auth_files_access_keys(
    cli: Cli, sql: Sql, db_dsn: str, tmp_path: Path
):
    scenario.create_tables(sql)
    auth = tmp_path / "auth.toml"
    auth.write_text(scenario.AUTH_FILE)
    metrics = f"127.0.0.1:{free_port()}"
    _, endpoint = scenario.serve_sqs(cli, db_dsn, "--auth", str(auth), "--metrics-listen", metrics)
    worker = client(endpoint, scenario.ACCESS_KEY, scenario.SECRET)
    url = worker.get_queue_url(QueueName="jobs")["QueueUrl"]
    worker.send_message(QueueUrl=url, MessageBody="signed")
    (m,) = receive_all(worker, url, 1)
    assert m["Attributes"]["SenderId"] == "worker"
    worker.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])

    forged = client(endpoint, scenario.ACCESS_KEY, "not-the-secret-at-all")
    assert code_of(lambda: forged.send_message(QueueUrl=url, MessageBody="x"))[:2] == (
        "SignatureDoesNotMatch",
        403,
    )
    stranger = client(endpoint, "AKIAUNKNOWNKEY000000", scenario.SECRET)
    assert code_of(lambda: stranger.list_queues())[:2] == ("InvalidClientTokenId", 403)
    nobody = client(endpoint, scenario.NOBODY_KEY, scenario.NOBODY_SECRET)
    assert code_of(lambda: nobody.send_message(QueueUrl=url, MessageBody="x"))[:2] == (
        "AccessDenied",
        403,
    )
    assert nobody.list_queues().get("QueueUrls") is None
    assert sql.scalar("select count(*) from jobs") == 1  # nothing but the signed one

    # /metrics counts the API's requests by action and outcome
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    counted = {
        (x.labels["action"], x.labels["outcome"]): x.value
        for f in text_string_to_metric_families(text)
        if f.name == "msgtable_sqs_requests"
        for x in f.samples
    }
    assert counted[("SendMessage", "ok")] == 1
    assert counted[("SendMessage", "SignatureDoesNotMatch")] == 1
    assert counted[("SendMessage", "AccessDenied")] == 1
    assert counted[("ListQueues", "InvalidClientTokenId")] == 1
    assert "msgtable_sqs_receives_waiting" in text
