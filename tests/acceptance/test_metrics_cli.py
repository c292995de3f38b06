"""`msgtable serve --metrics-listen` as a user runs it: the env var, a scrape over HTTP after
`msgtable tail --ack`, and a bad address."""

from __future__ import annotations

import urllib.request
from typing import TYPE_CHECKING

import pytest
from grpc_health.v1 import health_pb2
from prometheus_client.parser import text_string_to_metric_families

from msgtable.core.tables import current_layout_ddl
from tests.integration.helpers import comment

from .helpers import Cli, assert_one_line_error, describe, free_port

if TYPE_CHECKING:
    from tests.conftest import Sql

pytestmark = pytest.mark.timeout(90)


def samples(address: str) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    out: dict[tuple[str, str], float] = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:  # summed over via (msgtable_messages_acked_total)
            key = (s.name, s.labels.get("table", ""))
            out[key] = out.get(key, 0) + s.value if "via" in s.labels else s.value
    return out


def test_serve_with_msgtable_metrics_listen_counts_what_tail_acked(cli: Cli, sql: Sql, db_dsn: str):
    sql.execute(current_layout_ddl("orders", comment()))
    sql.execute("insert into orders(id, message) values (1, 'one'), (2, 'two'), (3, 'three')")
    address = f"127.0.0.1:{free_port()}"
    serve = cli.serve("--dsn", db_dsn, env=cli.env(MSGTABLE_METRICS_LISTEN=address))
    assert serve.wait_answering() == health_pb2.HealthCheckResponse.SERVING
    serve.wait_for_output(rf"^metrics on http://{address}/metrics$")
    done = cli.run("tail", "orders", "--server", serve.address, "--ack", "--count", "3")
    assert done.returncode == 0, describe(done)
    got = samples(address)
    assert got[("msgtable_messages_sent_total", "orders")] == 3
    assert got[("msgtable_messages_acked_total", "orders")] == 3
    assert got[("msgtable_message_ack_latency_seconds_count", "orders")] == 3


def test_serve_with_a_bad_metrics_address_is_one_line(cli: Cli, db_dsn: str):
    done = cli.run("serve", "--dsn", db_dsn, "--metrics-listen", "nowhere")
    assert done.returncode == 1, describe(done)
    assert_one_line_error(done, "--metrics-listen 'nowhere'", "HOST:PORT")
