"""The SQS API with several servers on one database (msgtable.engine.placement): boto3 with
retries off, pointed at the server that does not send the table, sends, receives, changes
visibility and deletes as at the sender (the call goes to the sender's API); across a
hand-over a handle received through one server deletes at the other, once; with --auth the
sender checks the caller's signature and rights on a forwarded call as on its own."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from . import sqs_scenario as scenario
from .helpers import wait_until
from .test_sqs_boto3 import client, code_of, receive, receive_all
from .test_sqs_node import run_script

if TYPE_CHECKING:
    from tests.conftest import Sql

    from .helpers import Cli, Serve

pytestmark = pytest.mark.timeout(240)

PERIOD_S = 3.0
LEASE = ("--lease-period", str(PERIOD_S), "--discovery-interval", "0.5")


TOKEN = "a-token-of-the-operator-0001"
READER_KEY = "AKIAMSGTABLEREADER01"
READER_SECRET = "a-secret-of-the-reader"
READER_ACCESS_KEY = f'"{READER_KEY}" = {{ secret = "{READER_SECRET}", principal = "reader" }}'
# worker may receive and delete; reader may send and list only; ops (gRPC) lists
AUTH_FILE = f"""
[tokens]
"{TOKEN}" = "ops"
{scenario.AUTH_FILE.replace("[access_keys]", "[access_keys]" + chr(10) + READER_ACCESS_KEY)}
[[allow]]
principal = "reader"
tables = ["*"]
actions = ["send", "list"]

[[allow]]
principal = "ops"
tables = ["*"]
actions = ["list"]
"""


def sent_by(cli: Cli, at: Serve, sender: Serve, table: str) -> bool:
    listed = cli.run("tables", "--server", at.address, "--token", TOKEN).stdout
    return re.search(rf"^  {table}: {re.escape(sender.address)}$", listed, re.M) is not None


def two_servers(cli: Cli, sql: Sql, db_dsn: str, *extra: str) -> tuple[Serve, Serve, str, str]:
    """A sends jobs (it came first), B knows it: the servers and their APIs' URLs."""
    scenario.create_tables(sql)
    a, a_url = scenario.serve_sqs(cli, db_dsn, *LEASE, *extra)
    wait_until(lambda: sent_by(cli, a, a, "jobs"), what=lambda: f"A to send jobs:\n{a.describe()}")
    b, b_url = scenario.serve_sqs(cli, db_dsn, *LEASE, *extra)
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


def test_with_auth_a_forwarded_call_is_the_callers_at_the_sender(
    cli: Cli, sql: Sql, db_dsn: str, tmp_path: Path
):
    """Both servers with --auth: boto3 at B (A sends jobs), signed with the worker's key,
    receives (SenderId: the worker, as the sender saw the caller) and deletes; the reader
    (send and list, no subscribe or ack) is refused with SQS's AccessDenied; a bad
    signature is refused; nothing is received or acked by a refused call."""
    auth = tmp_path / "auth.toml"
    auth.write_text(AUTH_FILE)
    a, b, _, b_url = two_servers(cli, sql, db_dsn, "--auth", str(auth))
    worker = client(b_url, scenario.ACCESS_KEY, scenario.SECRET)
    url = worker.get_queue_url(QueueName="jobs")["QueueUrl"]
    sent = worker.send_message_batch(
        QueueUrl=url, Entries=[{"Id": f"e{i}", "MessageBody": f"m{i}"} for i in range(3)]
    )
    assert len(sent["Successful"]) == 3, sent

    reader = client(b_url, READER_KEY, READER_SECRET)
    assert code_of(lambda: reader.receive_message(QueueUrl=url, WaitTimeSeconds=1))[:2] == (
        "AccessDenied",
        403,
    )
    forged = client(b_url, scenario.ACCESS_KEY, "not-the-secret-at-all")
    assert code_of(lambda: forged.receive_message(QueueUrl=url, WaitTimeSeconds=1))[:2] == (
        "SignatureDoesNotMatch",
        403,
    )

    got = receive_all(worker, url, 3, VisibilityTimeout=60)
    assert sorted(m["Body"] for m in got) == ["m0", "m1", "m2"], (a.describe(), b.describe())
    assert {m["Attributes"]["SenderId"] for m in got} == {"worker"}
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in got} == {"1"}, (
        "a refused call received"
    )

    first, *rest = got
    assert code_of(
        lambda: reader.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    )[:2] == ("AccessDenied", 403)
    assert code_of(
        lambda: forged.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    )[:2] == ("SignatureDoesNotMatch", 403)
    assert acked(sql, [first["MessageId"]]) == 0, "a refused delete acked"

    worker.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    deleted = worker.delete_message_batch(
        QueueUrl=url,
        Entries=[{"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(rest)],
    )
    assert deleted["Failed"] == [], deleted
    assert acked(sql, [m["MessageId"] for m in got]) == 3, (a.describe(), b.describe())
    # the allowed calls went to A (the refused ones stopped at B)
    at_a = cli.run("tables", "--server", a.address, "--token", TOKEN).stdout
    calls = re.search(r"^sqs: .*\(calls: (.*)\)$", at_a, re.M)
    assert calls is not None, at_a
    assert "DeleteMessage 1" in calls[1] and "DeleteMessageBatch 1" in calls[1], at_a
    assert "ReceiveMessage" in calls[1], at_a
    for s in (a, b):
        assert "Traceback" not in s.stderr, s.describe()


def test_with_auth_the_javascript_sdks_signature_holds_through_the_forwarding(
    cli: Cli, sql: Sql, db_dsn: str, tmp_path: Path
):
    """The JavaScript SDK signs more headers than boto3 (content-length, its amz-sdk-*):
    its signed receive and delete at B verify at A, and its refusals are SQS's."""
    auth = tmp_path / "auth.toml"
    auth.write_text(AUTH_FILE)
    a, _, _, b_url = two_servers(cli, sql, db_dsn, "--auth", str(auth))
    assert run_script(b_url, "auth").splitlines()[-1] == "OK"
    assert sql.scalar("select count(*) from jobs where time_acked is not null") == 1
    at_a = cli.run("tables", "--server", a.address, "--token", TOKEN).stdout
    assert re.search(r"^sqs: .*DeleteMessage 1", at_a, re.M), f"the delete did not reach A: {at_a}"
