"""The SQS API with several servers on one database (msgtable.engine.placement): boto3 with
retries off, pointed at the server that does not send the table, sends, receives, changes
visibility and deletes as at the sender (the call goes to the sender's API); across a
hand-over a handle received through one server deletes at the other, once."""

from __future__ import annotations

import re
import signal
from typing import TYPE_CHECKING, Any

import pytest

from . import sqs_scenario as scenario
from .helpers import wait_until
from .test_sqs_boto3 import client, receive, receive_all

if TYPE_CHECKING:
    from tests.conftest import Sql

    from .helpers import Cli, Serve

pytestmark = pytest.mark.timeout(240)

PERIOD_S = 3.0
LEASE = ("--lease-period", str(PERIOD_S), "--discovery-interval", "0.5")


def sent_by(cli: Cli, at: Serve, sender: Serve, table: str) -> bool:
    listed = cli.run("tables", "--server", at.address).stdout
    return re.search(rf"^  {table}: {re.escape(sender.address)}$", listed, re.M) is not None


def two_servers(cli: Cli, sql: Sql, db_dsn: str) -> tuple[Serve, Serve, str, str]:
    """A sends jobs (it came first), B knows it: the servers and their APIs' URLs."""
    scenario.create_tables(sql)
    a, a_url = scenario.serve_sqs(cli, db_dsn, *LEASE)
    wait_until(lambda: sent_by(cli, a, a, "jobs"), what=lambda: f"A to send jobs:\n{a.describe()}")
    b, b_url = scenario.serve_sqs(cli, db_dsn, *LEASE)
    wait_until(
        lambda: sent_by(cli, b, a, "jobs"),
        what=lambda: f"B to name A as the sender of jobs:\n{b.describe()}",
    )
    return a, b, a_url, b_url


def acked(sql: Sql, ids: list[str]) -> int:
    return int(
        sql.scalar(
            "select count(*) from jobs where time_acked is not null and id in "
            f"({', '.join(str(int(i)) for i in ids)})"
        )
    )


def test_boto3_at_the_server_that_does_not_send_the_table_works_as_at_the_sender(
    cli: Cli, sql: Sql, db_dsn: str
):
    a, b, _, b_url = two_servers(cli, sql, db_dsn)
    sqs = client(b_url)
    url = sqs.get_queue_url(QueueName="jobs")["QueueUrl"]

    sent = sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": f"e{i}", "MessageBody": f"m{i}"} for i in range(4)]
    )
    assert len(sent["Successful"]) == 4, sent
    got = receive_all(sqs, url, 4, VisibilityTimeout=60)
    assert sorted(m["Body"] for m in got) == ["m0", "m1", "m2", "m3"], (a.describe(), b.describe())
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in got} == {"1"}

    # visibility: one released at once comes again (its second receive), one extended
    first, second, *rest = got
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0
    )
    changed = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[{"Id": "x", "ReceiptHandle": second["ReceiptHandle"], "VisibilityTimeout": 120}],
    )
    assert changed["Failed"] == [], changed
    again = receive_all(sqs, url, 1)
    assert [(m["MessageId"], m["Attributes"]["ApproximateReceiveCount"]) for m in again] == [
        (first["MessageId"], "2")
    ]

    # deletes: one, then a batch; the old handle of the redelivered message deletes nothing
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again[0]["ReceiptHandle"])
    deleted = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[{"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(rest)]
        + [{"Id": "s", "ReceiptHandle": second["ReceiptHandle"]}],
    )
    assert deleted["Failed"] == [], deleted
    ids = [m["MessageId"] for m in got]
    assert acked(sql, ids) == 4, (a.describe(), b.describe())
    assert receive(sqs, url, wait_s=1) == []


def test_a_handle_received_through_one_server_deletes_at_the_next_sender_once(
    cli: Cli, sql: Sql, db_dsn: str
):
    """A receive at B (A sends); A stops (B takes the table over): the handle deletes at B,
    and a handle of an earlier delivery of the same message deletes nothing."""
    a, b, _, b_url = two_servers(cli, sql, db_dsn)
    sqs = client(b_url)
    url = sqs.get_queue_url(QueueName="jobs")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="handed")
    (one,) = receive_all(sqs, url, 1, VisibilityTimeout=0)  # released: it comes again
    (two,) = receive_all(sqs, url, 1, VisibilityTimeout=120)
    assert one["MessageId"] == two["MessageId"]
    assert two["Attributes"]["ApproximateReceiveCount"] == "2"

    a.send_signal(signal.SIGTERM)
    assert a.wait(60) is not None, a.describe()
    wait_until(lambda: sent_by(cli, b, b, "jobs"), what=lambda: f"B to send jobs:\n{b.describe()}")

    at_b: Any = client(b_url)
    at_b.delete_message(QueueUrl=url, ReceiptHandle=one["ReceiptHandle"])  # stale: nothing
    assert acked(sql, [one["MessageId"]]) == 0
    at_b.delete_message(QueueUrl=url, ReceiptHandle=two["ReceiptHandle"])
    assert acked(sql, [two["MessageId"]]) == 1, b.describe()
    assert "Traceback" not in b.stderr, b.describe()
