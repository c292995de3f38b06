"""The SQS API's address and calls where the server shows itself (issue 44, item 5): ListTables
carries them (sqs_listen, sqs_calls), `msgtable tables` prints them under the tables and the
dashboard's /api/state has them, after real calls through boto3 over a real socket."""

from __future__ import annotations

import json
import urllib.request
from typing import TYPE_CHECKING

import pytest

boto3 = pytest.importorskip("boto3")

from msgtable.client import Client  # noqa: E402

from . import sqs_scenario as scenario  # noqa: E402
from .helpers import describe, free_port  # noqa: E402
from .test_sqs_boto3 import client, code_of  # noqa: E402

if TYPE_CHECKING:
    from tests.conftest import Sql

    from .helpers import Cli

pytestmark = pytest.mark.timeout(120)


def test_tables_list_tables_and_the_dashboard_show_the_sqs_api_and_its_calls(
    cli: Cli, sql: Sql, db_dsn: str
):
    scenario.create_tables(sql)
    http = f"127.0.0.1:{free_port()}"
    serve, endpoint = scenario.serve_sqs(cli, db_dsn, "--http", http)
    listen = endpoint.removeprefix("http://")
    sqs = client(endpoint)
    url = sqs.get_queue_url(QueueName="jobs")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="one")
    sqs.send_message(QueueUrl=url, MessageBody="two")
    assert code_of(lambda: sqs.get_queue_url(QueueName="nowhere"))[0] == (
        "AWS.SimpleQueueService.NonExistentQueue"
    )
    calls = {"GetQueueUrl": 2, "SendMessage": 2}  # a failed call is a call too

    with Client(serve.address, wait_for_server=False) as c:
        status = c.status()
    assert (status.sqs_listen, status.sqs_calls) == (listen, calls)

    done = cli.run("tables", "--server", serve.address)
    assert done.returncode == 0, describe(done)
    assert f"sqs: http://{listen} (calls: GetQueueUrl 2, SendMessage 2)" in done.stdout, done.stdout

    with urllib.request.urlopen(f"http://{http}/api/state", timeout=10) as answer:
        state = json.loads(answer.read())
    assert state["server"]["sqs"] == {"listen": listen, "calls": calls}


def test_a_server_without_the_sqs_api_says_none(cli: Cli, sql: Sql, db_dsn: str):
    scenario.create_tables(sql)
    http = f"127.0.0.1:{free_port()}"
    serve = cli.serve("--dsn", db_dsn, "--http", http)
    serve.wait_for_output(rf"^dashboard on http://{http}/$")
    with Client(serve.address, wait_for_server=False) as c:
        status = c.status()
    assert (status.sqs_listen, status.sqs_calls) == ("", {})
    done = cli.run("tables", "--server", serve.address)
    assert done.returncode == 0, describe(done)
    assert "sqs:" not in done.stdout, done.stdout
    with urllib.request.urlopen(f"http://{http}/api/state", timeout=10) as answer:
        assert json.loads(answer.read())["server"]["sqs"] is None
