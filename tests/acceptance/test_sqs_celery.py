"""A Celery task run through msgtable's SQS API (issue 44): Celery's broker is kombu's SQS
transport (boto3 for the calls, pycurl for its asynchronous receive), pointed at `msgtable
serve --sqs-listen` with ``predefined_queues`` naming the queue's URL. A real worker (a
subprocess, the solo pool) runs the task the test sends; its message is acked in the table."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from msgtable.client import Client

from . import sqs_scenario as scenario
from .test_sqs_boto3 import client

if TYPE_CHECKING:
    from tests.conftest import Sql

    from .helpers import Cli

pytestmark = pytest.mark.timeout(180)
pytest.importorskip("celery")
pytest.importorskip("pycurl")

TASKS = """
import os
from pathlib import Path

from celery import Celery

endpoint = os.environ["SQS_ENDPOINT"]  # http://HOST:PORT
app = Celery("tasks", broker="sqs://any:anything-at-all@" + endpoint.removeprefix("http://"))
app.conf.update(
    broker_transport_options={
        "is_secure": False,
        "region": "eu-test-1",
        "wait_time_seconds": 1,
        **(
            {"predefined_queues": {"celery": {"url": os.environ["SQS_QUEUE_URL"]}}}
            if os.environ.get("SQS_QUEUE_URL")
            else {}  # kombu finds the queue (ListQueues), or creates it (CreateQueue)
        ),
    },
    broker_connection_retry_on_startup=True,
    task_default_queue="celery",
    worker_enable_remote_control=False,  # no fanout exchanges: SQS alone, no SNS
    worker_hijack_root_logger=False,
)


@app.task
def add(x, y):
    Path(os.environ["RESULTS"]).open("a").write(f"{x + y}\\n")
    return x + y
"""


@pytest.mark.parametrize("queue", ["predefined", "created"])
def test_a_celery_task_runs_through_the_sqs_api(
    cli: Cli, sql: Sql, db_dsn: str, tmp_path: Path, queue: str
):
    """``predefined``: the table made by DDL, its URL in predefined_queues; ``created``: no
    table, kombu creates the queue (CreateQueue, with serve --sqs-manage)."""
    if queue == "predefined":
        sql.execute(scenario.jobs_ddl("celery"))
        serve, endpoint = scenario.serve_sqs(cli, db_dsn)
        url = client(endpoint).get_queue_url(QueueName="celery")["QueueUrl"]
    else:
        serve, endpoint = scenario.serve_sqs(cli, db_dsn, "--sqs-manage")
        url = ""
    (tmp_path / "tasks.py").write_text(textwrap.dedent(TASKS))
    results = tmp_path / "results.txt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "SQS_ENDPOINT": endpoint,
        "SQS_QUEUE_URL": url,
        "RESULTS": str(results),
    }
    worker_log = tmp_path / "worker.log"
    with worker_log.open("w") as log:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tasks",
                "worker",
                "--pool=solo",
                "--without-mingle",
                "--without-gossip",
                "--without-heartbeat",
                "--loglevel=INFO",
            ],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        sent = subprocess.run(
            [sys.executable, "-c", "import tasks; print(tasks.add.delay(2, 3).id)"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert sent.returncode == 0, sent.stderr
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not results.exists():
            if worker.poll() is not None:
                break
            time.sleep(0.2)
        assert results.exists(), (
            "the Celery worker did not run the task within 60 s; its log:\n"
            + worker_log.read_text()[-4000:]
        )
        assert results.read_text() == "5\n"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sql.scalar(
            "select count(*) from celery where time_acked is null"
        ):
            time.sleep(0.2)
        assert sql.scalar("select count(*) from celery where time_acked is not null") == 1, (
            "the task's message was not acked (deleted) in the table"
        )
        with Client(serve.address, wait_for_server=False) as c:
            calls = c.status().sqs_calls
        print(f"\nthe SQS calls of a Celery task, worker and sender: {calls}")
        assert {"SendMessage", "ReceiveMessage", "DeleteMessage"} <= calls.keys(), calls
    finally:
        worker.terminate()
        worker.wait(30)
