"""CreateQueue, DeleteQueue and PurgeQueue through boto3 (issue 44): refused, naming the
flag, without `msgtable serve --sqs-manage`; with it, a queue created is a message table in
the database (its COMMENT from the attributes), works as any, dead-letters into a created
queue, purges (once a minute, as SQS) and drops; with --auth only for the manage right."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

boto3 = pytest.importorskip("boto3")
from botocore.exceptions import ClientError  # noqa: E402

from . import sqs_scenario as scenario  # noqa: E402
from .test_sqs_boto3 import client, code_of, receive_all  # noqa: E402

if TYPE_CHECKING:
    from tests.conftest import Sql

    from .helpers import Cli

pytestmark = pytest.mark.timeout(180)


def message_of(call: Any) -> tuple[str, str]:
    with pytest.raises(ClientError) as caught:
        call()
    return caught.value.response["Error"]["Code"], caught.value.response["Error"]["Message"]


def comment_of(sql: Sql, table: str) -> dict[str, str]:
    text = sql.scalar(
        "select table_comment from information_schema.tables "
        "where table_schema = database() and table_name = :t",
        {"t": table},
    )
    assert text is not None, f"no table {table}"
    return dict(f.split("=", 1) for f in str(text).split(",")[1:])


def test_without_the_flag_create_delete_and_purge_name_the_flag(cli: Cli, sql: Sql, db_dsn: str):
    scenario.create_tables(sql)
    _, endpoint = scenario.serve_sqs(cli, db_dsn)
    sqs = client(endpoint)
    url = sqs.get_queue_url(QueueName="jobs")["QueueUrl"]
    assert sqs.create_queue(QueueName="jobs")["QueueUrl"] == url  # an existing table's queue
    for call in (
        lambda: sqs.create_queue(QueueName="brand_new"),
        lambda: sqs.delete_queue(QueueUrl=url),
        lambda: sqs.purge_queue(QueueUrl=url),
    ):
        code, message = message_of(call)
        assert code == "AWS.SimpleQueueService.UnsupportedOperation", (code, message)
        assert "--sqs-manage" in message and "\n" not in message, message
    assert (
        sql.scalar(
            "select count(*) from information_schema.tables where table_schema = database() "
            "and table_name = 'brand_new'"
        )
        == 0
    )


def test_with_the_flag_queues_are_created_used_purged_and_deleted(cli: Cli, sql: Sql, db_dsn: str):
    _, endpoint = scenario.serve_sqs(cli, db_dsn, "--sqs-manage")
    sqs = client(endpoint)
    dlq = sqs.create_queue(QueueName="orders_dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "2"})
    attributes = {
        "VisibilityTimeout": "5",
        "MessageRetentionPeriod": "3600",
        "RedrivePolicy": policy,
    }
    url = sqs.create_queue(QueueName="orders", Attributes=attributes)["QueueUrl"]
    assert url.endswith("/orders")
    fields = comment_of(sql, "orders")
    assert (fields["vt_ack_wait"], fields["vt_purge_after"]) == ("5", "3600")
    assert (fields["vt_max_attempts"], fields["vt_dead_letter"]) == ("2", "orders_dlq")
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert got["VisibilityTimeout"] == "5"
    assert json.loads(got["RedrivePolicy"]) == {
        "deadLetterTargetArn": dlq_arn,
        "maxReceiveCount": 2,
    }
    # the same again is the same queue; other attributes are another queue of that name
    assert sqs.create_queue(QueueName="orders", Attributes=attributes)["QueueUrl"] == url
    assert (
        code_of(
            lambda: sqs.create_queue(QueueName="orders", Attributes={"VisibilityTimeout": "9"})
        )[0]
        == "QueueAlreadyExists"
    )
    assert code_of(lambda: sqs.create_queue(QueueName="orders.fifo"))[0] == "QueueAlreadyExists"

    # it is a queue like any: send, receive, delete; dead letters go to the created DLQ
    sqs.send_message(
        QueueUrl=url,
        MessageBody="kept",
        MessageAttributes={"k": {"DataType": "String", "StringValue": "v"}},
    )
    (m,) = receive_all(sqs, url, 1)
    assert m["Body"] == "kept" and m["MessageAttributes"]["k"]["StringValue"] == "v"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    sqs.send_message(QueueUrl=url, MessageBody="doomed")
    for attempt in ("1", "2"):  # released at once (visibility 0): each receive an attempt
        (m,) = receive_all(sqs, url, 1, VisibilityTimeout=0)
        assert m["Attributes"]["ApproximateReceiveCount"] == attempt
    (dead,) = receive_all(sqs, dlq, 1)
    assert dead["Body"] == "doomed"
    assert sql.scalar("select attempts from orders_dlq") == 2

    # a FIFO queue is an ordered table: the group id in its column
    fifo = sqs.create_queue(QueueName="steps.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    assert comment_of(sql, "steps")["vt_order_key"] == "message_group_id"
    sqs.send_message(QueueUrl=fifo, MessageBody="a", MessageGroupId="g1")
    sqs.send_message(QueueUrl=fifo, MessageBody="a", MessageGroupId="g1")  # content-based
    assert sql.scalar("select count(*) from steps where message_group_id = 'g1'") == 1
    # deduplication ids are exact (SQS's are case-sensitive): ids differing in case are two
    for dedup in ("Order-7", "order-7", "ORDER-7"):
        sqs.send_message(
            QueueUrl=fifo, MessageBody=dedup, MessageGroupId="g2", MessageDeduplicationId=dedup
        )
    assert sql.scalar("select count(*) from steps where message_group_id = 'g2'") == 3

    # a purge deletes what is not acked; another within 60 s is PurgeQueueInProgress
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(5)]
    )
    sqs.purge_queue(QueueUrl=url)
    assert sql.scalar("select count(*) from orders where time_acked is null") == 0
    assert code_of(lambda: sqs.purge_queue(QueueUrl=url))[0] == (
        "AWS.SimpleQueueService.PurgeQueueInProgress"
    )

    # a queue another's RedrivePolicy names is not dropped; the others are
    code, message = message_of(lambda: sqs.delete_queue(QueueUrl=dlq))
    assert code == "AWS.SimpleQueueService.UnsupportedOperation" and "orders" in message
    sqs.delete_queue(QueueUrl=url)
    sqs.delete_queue(QueueUrl=dlq)
    assert code_of(lambda: sqs.get_queue_url(QueueName="orders"))[0] == (
        "AWS.SimpleQueueService.NonExistentQueue"
    )
    assert (
        sql.scalar(
            "select count(*) from information_schema.tables where table_schema = database() "
            "and table_name in ('orders', 'orders_dlq')"
        )
        == 0
    )
    assert [u.rsplit("/", 1)[1] for u in sqs.list_queues()["QueueUrls"]] == ["steps.fifo"]

    # bad names and attributes are SQS's errors, and nothing is created
    assert code_of(lambda: sqs.create_queue(QueueName="has-hyphen"))[0] == ("InvalidParameterValue")
    assert (
        code_of(lambda: sqs.create_queue(QueueName="x", Attributes={"KmsMasterKeyId": "k"}))[0]
        == "InvalidAttributeName"
    )
    assert (
        code_of(lambda: sqs.create_queue(QueueName="x", Attributes={"DelaySeconds": "5"}))[0]
        == "InvalidAttributeValue"
    )


def test_with_auth_creating_needs_the_manage_right(cli: Cli, sql: Sql, db_dsn: str, tmp_path: Path):
    auth = tmp_path / "auth.toml"
    auth.write_text(
        scenario.AUTH_FILE
        + '\n[[allow]]\nprincipal = "nobody"\ntables = ["made_*"]\nactions = ["manage"]\n'
    )
    _, endpoint = scenario.serve_sqs(cli, db_dsn, "--sqs-manage", "--auth", str(auth))
    worker = client(endpoint, scenario.ACCESS_KEY, scenario.SECRET)
    assert code_of(lambda: worker.create_queue(QueueName="made_here"))[:2] == (
        "AccessDenied",
        403,
    )
    manager = client(endpoint, scenario.NOBODY_KEY, scenario.NOBODY_SECRET)
    assert manager.create_queue(QueueName="made_here")["QueueUrl"].endswith("/made_here")
    assert comment_of(sql, "made_here")["vt_ack_wait"] == "30"


def test_concurrent_creates_of_one_queue_each_answer_its_url(cli: Cli, sql: Sql, db_dsn: str):
    """SQS's CreateQueue is idempotent: workers starting together (Celery's, each creating
    its queue) all get the queue, not a QueueAlreadyExists from the one that lost the race."""
    _, endpoint = scenario.serve_sqs(cli, db_dsn, "--sqs-manage")
    clients = [client(endpoint) for _ in range(6)]
    start = threading.Barrier(len(clients))
    answers: list[object] = []

    def create(sqs: Any) -> None:
        start.wait(30)
        try:
            answers.append(sqs.create_queue(QueueName=f"raced_{n}")["QueueUrl"])
        except ClientError as exc:
            answers.append(exc.response["Error"]["Code"])

    for n in range(3):
        answers.clear()
        threads = [threading.Thread(target=create, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(set(answers)) == 1 and str(answers[0]).endswith(f"/raced_{n}"), answers
