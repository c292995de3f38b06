"""`msgtable serve --http` as a user runs it: the env var, the page and its data over HTTP
after `msgtable tail --ack`, a bad address and a port in use (one line each), and the
README's auth example."""

from __future__ import annotations

import json
import socket
import tomllib
import urllib.request
from typing import TYPE_CHECKING

import pytest
from grpc_health.v1 import health_pb2

from msgtable.core.tables import current_layout_ddl
from msgtable.server.auth import Authorizer
from tests.integration.helpers import comment

from .helpers import Cli, assert_one_line_error, describe, free_port
from .test_readme import snippets

if TYPE_CHECKING:
    from tests.conftest import Sql

pytestmark = pytest.mark.timeout(90)


def test_serve_with_msgtable_http_shows_what_tail_acked(cli: Cli, sql: Sql, db_dsn: str):
    sql.execute(current_layout_ddl("orders", comment()))
    sql.execute("insert into orders(id, message) values (1, 'one'), (2, 'two'), (3, 'three')")
    address = f"127.0.0.1:{free_port()}"
    serve = cli.serve("--dsn", db_dsn, env=cli.env(MSGTABLE_HTTP=address))
    assert serve.wait_answering() == health_pb2.HealthCheckResponse.SERVING
    serve.wait_for_output(rf"^dashboard on http://{address}/$")
    done = cli.run("tail", "orders", "--server", serve.address, "--ack", "--count", "3")
    assert done.returncode == 0, describe(done)
    with urllib.request.urlopen(f"http://{address}/", timeout=10) as answer:
        assert answer.status == 200 and b"/static/dashboard.js" in answer.read()
    with urllib.request.urlopen(f"http://{address}/api/state", timeout=10) as answer:
        state = json.loads(answer.read())
    (orders,) = [t for t in state["tables"] if t["name"] == "orders"]
    assert orders["totals"]["sent"] == 3 and orders["totals"]["acked"] == 3


def test_serve_with_a_bad_http_address_is_one_line(cli: Cli, db_dsn: str):
    done = cli.run("serve", "--dsn", db_dsn, "--http", "nowhere")
    assert done.returncode == 1, describe(done)
    assert_one_line_error(done, "--http 'nowhere'", "HOST:PORT")


def test_serve_with_the_http_port_in_use_is_one_line_and_stops(cli: Cli, db_dsn: str):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli.run("serve", "--dsn", db_dsn, "--http", f"127.0.0.1:{port}")
    assert done.returncode == 1, describe(done)
    assert_one_line_error(done, f"--http 127.0.0.1:{port}", "Address already in use")


def test_the_docs_dashboard_auth_file_lets_viewers_list_only():
    (toml,) = snippets("toml", "## Dashboard", page="how-to/observe.md")
    auth = Authorizer.from_dict(tomllib.loads(toml))
    principal = auth.authenticate([("authorization", "Bearer k3y-of-the-dashboard-viewers")], ())
    assert principal == "viewers"
    assert auth.allows(principal, "list", "orders")
    assert auth.allows(principal, "list", "orders/billing")
    assert not auth.allows(principal, "redrive", "orders")
