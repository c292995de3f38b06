"""The SQS API as the AWS SDK for JavaScript v3 (@aws-sdk/client-sqs, from the npm registry)
uses it: tests/node/sqs.js runs the scenario of test_sqs_boto3.py through node against
`msgtable serve --sqs-listen` on a real database (`make node-deps` installs tests/node)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from . import sqs_scenario as scenario

if TYPE_CHECKING:
    from tests.conftest import Sql

    from .helpers import Cli

pytestmark = pytest.mark.timeout(240)
NODE_TESTS = Path(__file__).parents[1] / "node"
SCRIPT_TIMEOUT_S = 200


def run_script(endpoint: str, mode: str, on_longpoll: object = None) -> str:
    sdk = NODE_TESTS / "node_modules" / "@aws-sdk" / "client-sqs"
    assert sdk.is_dir(), f"{sdk} is missing: `make node-deps` installs tests/node"
    node = subprocess.Popen(
        ["node", str(NODE_TESTS / "sqs.js"), endpoint, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    timer = threading.Timer(SCRIPT_TIMEOUT_S, node.kill)
    timer.start()
    lines = []
    try:
        assert node.stdout is not None and node.stdin is not None
        for line in node.stdout:
            lines.append(line)
            if line.strip() == "LONGPOLL" and callable(on_longpoll):
                on_longpoll()
                node.stdin.write("INSERTED\n")
                node.stdin.close()
        node.wait()
    finally:
        timer.cancel()
    assert node.stderr is not None
    err = node.stderr.read()
    assert node.returncode == 0, f"sqs.js {mode} failed:\n{''.join(lines)}{err[-4000:]}"
    return "".join(lines)


def test_the_javascript_sdk_sends_receives_and_settles_as_sqs_answers(
    cli: Cli, sql: Sql, db_dsn: str
):
    scenario.create_tables(sql)
    _, endpoint = scenario.serve_sqs(cli, db_dsn)

    def insert() -> None:
        time.sleep(1.0)
        sql.execute("insert into jobs(id, message, customer) values (7, 'by sql', 'sqlco')")

    out = run_script(endpoint, "open", insert)
    assert out.splitlines()[-1] == "OK"
    assert sql.scalar("select count(*) from jobs_dead") == 1


def test_the_javascript_sdks_signatures_are_checked(
    cli: Cli, sql: Sql, db_dsn: str, tmp_path: Path
):
    scenario.create_tables(sql)
    auth = tmp_path / "auth.toml"
    auth.write_text(scenario.AUTH_FILE)
    _, endpoint = scenario.serve_sqs(cli, db_dsn, "--auth", str(auth))
    assert run_script(endpoint, "auth").splitlines()[-1] == "OK"
    assert sql.scalar("select count(*) from jobs") == 1


def test_the_javascript_sdk_creates_purges_and_deletes_queues_with_sqs_manage(
    cli: Cli, sql: Sql, db_dsn: str
):
    _, endpoint = scenario.serve_sqs(cli, db_dsn, "--sqs-manage")
    assert run_script(endpoint, "manage").splitlines()[-1] == "OK"
    assert not sql.scalar(
        "select count(*) from information_schema.tables where table_schema = database() "
        "and table_name = 'made_by_js'"
    )
