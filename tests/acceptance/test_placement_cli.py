"""Tables placed on servers (msgtable.engine.placement), as a client without retries meets them: a
raw gRPC stub (no msgtable client, no retry) and `msgtable tail` against `msgtable serve`
subprocesses. A server never answers UNAVAILABLE for a table it lists and could send, never
redirects to itself or to a dead holder (DESIGN.md, principle 10; issue 39, item 2)."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import grpc
import pytest
from sqlalchemy.engine import make_url

from msgtable.core.tables import current_layout_ddl
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.proto.msgtable.v1 import messaging_pb2_grpc as pb_grpc
from tests.integration.helpers import comment
from tests.netfault import FaultProxy

from .helpers import Cli, wait_until

if TYPE_CHECKING:
    from tests.conftest import Sql

pytestmark = pytest.mark.timeout(120)

TAIL_LINE = re.compile(r"^id=(\d+) message=", re.MULTILINE)
QUICK = dict(vt_ack_wait=1, vt_min_backoff=0.5, vt_max_backoff=1, vt_poller_interval=0.1)
STREAM_TIMEOUT_S = 30.0
SLOW_DATABASE_S = 0.02  # each chunk to and from the database, behind the proxy


def tailed_ids(output: str) -> set[int]:
    return {int(i) for i in TAIL_LINE.findall(output)}


def first_rows(address: str, table: str, n: int, wait_for_ready: bool = False) -> list[int]:
    """Open a MessageStream of ``table`` with a raw stub (no retry) and return the ids of
    the first ``n`` rows it sends; fails with the status if the server refuses it."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.MessagingStub(channel)
        call = stub.MessageStream(
            pb.MessageStreamRequest(name=table),
            timeout=STREAM_TIMEOUT_S,
            wait_for_ready=wait_for_ready,
        )
        ids: list[int] = []
        try:
            first = next(call)
            assert first.fields, "the first response carries no fields"
            while len(ids) < n:
                ids += [row.values[0].int_value for row in next(call).rows]
        except grpc.RpcError as exc:
            pytest.fail(
                f"the stream of {table} at {address} failed: {exc.code().name}: {exc.details()}",
                pytrace=False,
            )
        finally:
            call.cancel()
        return ids


@pytest.fixture
def slow_dsn(db_dsn: str) -> Iterator[str]:
    """The test's database behind a proxy that delays every chunk (a database a few round
    trips away): the server's first steps take a moment, as they may anywhere."""
    url = make_url(db_dsn)
    with FaultProxy(url.host or "127.0.0.1", url.port or 3306) as proxy:
        proxy.latency_s = SLOW_DATABASE_S
        yield url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)


@pytest.mark.parametrize(
    ("stream", "said"),
    [("stderr", r"server: listening on "), ("stdout", r"^serving on ")],
    ids=["listening", "serving"],
)
def test_a_stream_opened_the_moment_serve_says_it_listens_gets_its_messages(
    cli: Cli, sql: Sql, slow_dsn: str, stream: str, said: str
):
    """A stream opened as soon as serve says it listens (its log line; the line it prints
    once it serves), before the server placed its table on itself: it used to answer
    UNAVAILABLE "no server holds its lease now; retry", or name its own address."""
    sql.execute(current_layout_ddl("orders", comment(vt_poller_interval=0.1)))
    sql.execute("insert into orders(id, message) values (1, 'one'), (2, 'two')")
    serve = cli.serve("--dsn", slow_dsn, wait=False)
    serve.wait_for_output(said, stream=stream)

    ids = first_rows(serve.address, "orders", 2)

    assert sorted(ids) == [1, 2], serve.describe()


def test_a_stream_opened_right_after_create_table_gets_its_messages(
    cli: Cli, sql: Sql, db_dsn: str
):
    serve = cli.serve("--dsn", db_dsn, "--discovery-interval", "600")
    with grpc.insecure_channel(serve.address) as channel:  # what the client saw before
        pb_grpc.MessagingStub(channel).ListTables(pb.ListTablesRequest(), timeout=10)
    sql.execute(current_layout_ddl("fresh", comment(vt_poller_interval=0.1)))
    sql.execute("insert into fresh(id, message) values (7, 'new')")

    assert first_rows(serve.address, "fresh", 1) == [7], serve.describe()


def test_a_stream_opened_right_after_list_tables_listed_a_new_table_gets_its_messages(
    cli: Cli, sql: Sql, db_dsn: str
):
    serve = cli.serve("--dsn", db_dsn, "--discovery-interval", "600")
    sql.execute(current_layout_ddl("fresh", comment(vt_poller_interval=0.1)))
    sql.execute("insert into fresh(id, message) values (7, 'new')")
    with grpc.insecure_channel(serve.address) as channel:
        listed = pb_grpc.MessagingStub(channel).ListTables(pb.ListTablesRequest(), timeout=10)
    assert "fresh" in {t.name for t in listed.tables}

    assert first_rows(serve.address, "fresh", 1) == [7], serve.describe()


def test_tail_at_the_server_that_does_not_send_a_table_waits_for_it_and_survives_its_sender(
    cli: Cli, sql: Sql, db_dsn: str
):
    """Two servers of one database; A sends the table. `tail --server B` goes where B
    sends it (one line saying so) and prints A's messages; A is SIGKILLed: the same tail
    gets the next messages from B within two lease periods (it used to exit at once, both
    times, with "the leader is at A")."""
    period_s = 3.0
    lease = ("--lease-period", str(period_s), "--discovery-interval", "0.5")
    sql.execute(current_layout_ddl("jobs", comment(**QUICK)))
    a = cli.serve("--dsn", db_dsn, *lease)
    sent_by_a = rf"^  jobs: {re.escape(a.address)}$"
    wait_until(
        lambda: re.search(sent_by_a, cli.run("tables", "--server", a.address).stdout, re.M),
        what=lambda: f"A to send jobs:\n{a.describe()}",
    )
    b = cli.serve("--dsn", db_dsn, *lease)
    wait_until(
        lambda: re.search(sent_by_a, cli.run("tables", "--server", b.address).stdout, re.M),
        what=lambda: f"B to name A as the sender of jobs:\n{b.describe()}",
    )

    tail = cli.start("tail", "jobs", "--server", b.address, "--ack")
    sql.execute("insert into jobs(id, message) values (1, 'one'), (2, 'two')")
    wait_until(
        lambda: tailed_ids(tail.stdout) == {1, 2} or not tail.running(),
        timeout_s=20,
        what=lambda: f"tail to print ids 1-2:\n{tail.describe()}",
    )
    assert tail.running() and tailed_ids(tail.stdout) == {1, 2}, tail.describe()
    said = tail.stderr.strip().splitlines()
    assert len(said) == 1 and a.address in said[0], tail.describe()
    assert "Traceback" not in tail.stderr, tail.describe()

    a.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    sql.execute("insert into jobs(id, message) values (3, 'three'), (4, 'four')")
    wait_until(
        lambda: {3, 4} <= tailed_ids(tail.stdout) or not tail.running(),
        timeout_s=6 * period_s,
        what=lambda: f"tail to print ids 3-4 after A's death:\n{tail.describe()}\n{b.describe()}",
    )
    took = time.monotonic() - killed
    assert tail.running() and {3, 4} <= tailed_ids(tail.stdout), tail.describe()
    assert took <= 2 * period_s, f"A's table reached tail {took:.1f}s after A died"
    assert "Traceback" not in tail.stderr, tail.describe()
