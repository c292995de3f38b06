"""The msgtable command: arguments, output, and errors as one line (never a traceback)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import signal
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

import pytest

from msgtable import cli
from msgtable.cli import output
from msgtable.cli import serve as serve_command
from msgtable.client import Field, TableInfo, TableSettings
from msgtable.core.codec import FieldType
from msgtable.core.deadletters import DeadLetter
from msgtable.core.rows import Batch
from msgtable.core.status import TableStatus
from msgtable.core.subscriptions import Subscription
from msgtable.errors import InvalidArgument, ServerBinaryNotFound, TableNotFound
from msgtable.limits import DEFAULT_ADDRESS
from msgtable.server.servicer import MessagingServer
from msgtable.testing.devdb import INSTALL_HINT
from tests.unit.server.test_server import FakeEngine, FakeSubscriber, loaded_table


class ServableEngine(FakeEngine):
    """A FakeEngine with the lifecycle `msgtable serve` drives."""

    def __init__(self) -> None:
        super().__init__()
        self.fatal = threading.Event()
        self.fatal_reason = ""
        self.opened = self.closed = False
        self.campaigned_as: str | None = None
        self.services: dict[str, str] = {}

    def open(self) -> None:
        self.opened = True

    def campaign(self, address: str, services: Mapping[str, str] | None = None) -> None:
        self.campaigned_as = address
        self.services = dict(services or {})

    def close(self) -> None:
        self.closed = True


class SubscribingEngine(FakeEngine):
    """A FakeEngine that also keeps subscriptions (what the servicer asked, and the answers
    or error the test set up), and the subscription of every subscribe and ack in order."""

    def __init__(self) -> None:
        super().__init__()
        self.subscribed_as: list[str] = []  # the subscription of each subscribe ("": default)
        self.acked_as: list[str] = []
        self.created: list[tuple[Subscription, bool]] = []
        self.altered: list[tuple[str, str, dict[str, Any]]] = []
        self.dropped: list[tuple[str, str]] = []
        self.subscriptions: list[TableStatus] = []
        self.from_start_count = 0
        self.subscription_error: Exception | None = None

    def subscribe(
        self,
        name: str,
        keyspace: str = "",
        shard: str = "",
        key_range: tuple[bytes, bytes] = (b"", b""),
        max_in_flight: int = 0,
        subscription: str = "",
        filter: str = "",
        max_messages: int = 0,
    ) -> FakeSubscriber:
        self.subscribed_as.append(subscription)
        return super().subscribe(
            name, keyspace, shard, key_range, max_in_flight, subscription, filter, max_messages
        )

    def ack(self, name: str, keyspace: str, ids: Sequence[object], subscription: str = "") -> int:
        self.acked_as.append(subscription)
        return super().ack(name, keyspace, ids, subscription)

    def _check(self) -> None:
        if self.subscription_error is not None:
            raise self.subscription_error

    def create_subscription(self, sub: Subscription, from_start: bool = False) -> int:
        self._check()
        self.created.append((sub, from_start))
        return self.from_start_count if from_start else 0

    def alter_subscription(self, table: str, name: str, **changes: Any) -> Subscription:
        self._check()
        self.altered.append((table, name, changes))
        return Subscription(table, name)

    def drop_subscription(self, table: str, name: str) -> None:
        self._check()
        self.dropped.append((table, name))

    def list_subscriptions(self, table: str = "") -> list[TableStatus]:
        return [s for s in self.subscriptions if not table or s.name == table]


@pytest.fixture
def engine() -> SubscribingEngine:
    return SubscribingEngine()


@pytest.fixture
def server(engine: FakeEngine) -> Iterator[MessagingServer]:
    s = MessagingServer(engine, "127.0.0.1:0", max_workers=8, stream_poll_s=0.05)
    s.start()
    yield s
    s.stop(0)


@pytest.fixture(autouse=True)
def no_msgtable_env(monkeypatch):
    for name in (
        "MSGTABLE_DSN",
        "MSGTABLE_LISTEN",
        "MSGTABLE_SERVER",
        "MSGTABLE_LOG_LEVEL",
        "MSGTABLE_DISCOVERY_INTERVAL",
        "MSGTABLE_BINLOG",
    ):
        monkeypatch.delenv(name, raising=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def assert_one_line_error(err: str, *fragments: str) -> None:
    assert err.startswith("msgtable: error: ")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err


# -- arguments ----------------------------------------------------------------------------
def test_serve_defaults_to_no_dsn_and_the_loopback_address():
    args = cli.build_parser().parse_args(["serve"])
    assert (args.dsn, args.listen, args.log_level) == (None, DEFAULT_ADDRESS, "info")


def test_flags_fall_back_to_environment_variables(monkeypatch):
    monkeypatch.setenv("MSGTABLE_DSN", "mysql+pymysql://u:p@db/app")
    monkeypatch.setenv("MSGTABLE_LISTEN", "0.0.0.0:6000")
    monkeypatch.setenv("MSGTABLE_SERVER", "queue-host:6000")
    parser = cli.build_parser()
    serve = parser.parse_args(["serve"])
    assert (serve.dsn, serve.listen) == ("mysql+pymysql://u:p@db/app", "0.0.0.0:6000")
    assert parser.parse_args(["tables"]).server == "queue-host:6000"
    assert parser.parse_args(["tail", "t", "--server", "other:1"]).server == "other:1"


def test_the_discovery_interval_is_a_flag_with_an_environment_fallback(monkeypatch):
    parser = cli.build_parser()
    assert parser.parse_args(["serve"]).discovery_interval == 5.0
    assert parser.parse_args(["serve", "--discovery-interval", "0.5"]).discovery_interval == 0.5
    monkeypatch.setenv("MSGTABLE_DISCOVERY_INTERVAL", "2")
    assert cli.build_parser().parse_args(["serve"]).discovery_interval == 2.0


def test_serve_gives_the_engine_its_discovery_interval_and_binlog_choice(monkeypatch):
    engine = ServableEngine()
    seen = []
    leases: list[float | None] = []

    pushes: list[tuple[str, str | None]] = []

    def open_engine(
        dsn,
        discovery_interval_s,
        follow_binlog,
        lease_period_s,
        push_allow="",
        push_ca_file=None,
        shard=None,
        keyspace=None,
    ):
        assert (shard, keyspace) == (None, None)  # no --keyspace-file: unsharded
        seen.append((discovery_interval_s, follow_binlog))
        leases.append(lease_period_s)
        pushes.append((push_allow, push_ca_file))
        return engine

    monkeypatch.setattr(serve_command, "open_engine", open_engine)
    engine.fatal.set()  # stop at once
    argv = ["serve", "--dsn", "mysql+pymysql://u:p@db/app", "--listen", "127.0.0.1:0"]
    cli.main([*argv, "--discovery-interval", "0.25"])
    cli.main([*argv, "--no-binlog"])
    cli.main([*argv, "--binlog"])
    monkeypatch.setenv("MSGTABLE_BINLOG", "0")
    cli.main(argv)
    assert seen == [(0.25, True), (5.0, False), (5.0, True), (5.0, False)]
    assert leases == [5.0] * 4
    cli.main([*argv, "--lease-period", "2.5"])
    cli.main([*argv, "--no-lease"])
    assert leases[-2:] == [2.5, None]
    assert pushes[0] == ("", None)  # nothing allowed by default
    cli.main([*argv, "--push-allow", "https://*.example.com", "--push-ca-file", "ca.pem"])
    monkeypatch.setenv("MSGTABLE_PUSH_ALLOW", "http://10.0.0.0/8")
    cli.main(argv)
    assert pushes[-2:] == [("https://*.example.com", "ca.pem"), ("http://10.0.0.0/8", None)]
    assert engine.campaigned_as is not None and engine.campaigned_as.startswith("127.0.0.1:")
    cli.main([*argv, "--advertise", "mq1.example:7000"])
    assert engine.campaigned_as == "mq1.example:7000"


def test_the_advertised_address_names_this_host_on_a_wildcard_listen():
    assert serve_command.advertised_address("127.0.0.1:0", "127.0.0.1:4567") == "127.0.0.1:4567"
    host = serve_command.advertised_address("0.0.0.0:50051", "127.0.0.1:50051")
    assert host == f"{socket.gethostname()}:50051"


def test_tail_takes_a_name_and_its_options():
    args = cli.build_parser().parse_args(["tail", "my_message", "--ack", "--count", "5", "--json"])
    assert (args.name, args.ack, args.count, args.json) == ("my_message", True, 5, True)


def test_tail_reads_as_a_subscription_with_only_some_columns_when_asked():
    parser = cli.build_parser()
    args = parser.parse_args(
        ["tail", "orders", "--subscription", "billing", "--columns", "id,kind"]
    )
    assert (args.subscription, args.columns) == ("billing", ("id", "kind"))
    plain = parser.parse_args(["tail", "orders"])
    assert (plain.subscription, plain.columns) == ("", None)


def test_subscription_create_takes_a_table_a_name_and_its_settings():
    args = cli.build_parser().parse_args(
        [
            "subscription", "create", "orders", "billing", "--filter", "region = 'eu'",
            "--columns", "id,kind", "--ack-wait", "90s", "--max-attempts", "5",
            "--max-lag", "1000", "--expire-after", "7d", "--from-start",
        ]
    )  # fmt: skip
    assert (args.command, args.action, args.table, args.name) == (
        "subscription",
        "create",
        "orders",
        "billing",
    )
    assert (args.filter, args.columns, args.ack_wait, args.max_attempts) == (
        "region = 'eu'",
        ("id", "kind"),
        90.0,
        5,
    )
    assert (args.max_lag, args.expire_after, args.from_start) == (1000, 7 * 86400.0, True)


def test_subscription_settings_left_out_are_none_and_empty_or_zero_ones_are_kept():
    parser = cli.build_parser()
    left_out = parser.parse_args(["subscription", "alter", "orders", "billing"])
    given = [left_out.filter, left_out.columns, left_out.ack_wait, left_out.max_attempts]
    assert [*given, left_out.max_lag, left_out.expire_after] == [None] * 6
    cleared = parser.parse_args(
        ["subscription", "alter", "orders", "billing", "--filter", "", "--columns", "",
         "--ack-wait", "0", "--max-lag", "0", "--expire-after", "0", "--max-attempts", "0"]
    )  # fmt: skip
    assert (cleared.filter, cleared.columns, cleared.ack_wait) == ("", (), 0.0)
    assert (cleared.max_lag, cleared.expire_after, cleared.max_attempts) == (0, 0.0, 0)


def test_subscription_list_takes_an_optional_table():
    parser = cli.build_parser()
    every = parser.parse_args(["subscription", "list", "--json"])
    assert (every.table, every.json) == ("", True)
    assert parser.parse_args(["subscription", "list", "orders"]).table == "orders"
    dropped = parser.parse_args(["subscription", "drop", "orders", "billing"])
    assert (dropped.action, dropped.table, dropped.name) == ("drop", "orders", "billing")


def test_subscription_help_says_where_definitions_live_and_when_changes_apply(capsys):
    with pytest.raises(SystemExit):
        cli.main(["subscription", "alter", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "live in the database (table msgtable_subscriptions)" in text
    assert "at their next discovery (serve --discovery-interval" in text
    assert "A new filter applies to the messages handed over from then on" in text


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["tail"],
        ["tail", "t", "--count", "0"],
        ["subscription"],
        ["subscription", "create", "orders"],
        ["subscription", "rename", "orders", "billing"],
        ["subscription", "create", "orders", "b", "--max-attempts", "-1"],
        ["subscription", "create", "orders", "b", "--max-lag", "many"],
        ["subscription", "alter", "orders", "b", "--ack-wait", "soon"],
        ["subscription", "drop", "orders", "b", "--from-start"],
        ["serve", "--log-level", "loud"],
        ["serve", "--discovery-interval", "0"],
        ["serve", "--discovery-interval", "soon"],
        ["serve", "--discovery-interval", "inf"],
    ],
)
def test_bad_arguments_exit_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as caught:
        cli.main(argv)
    assert caught.value.code == 2
    assert "usage: msgtable" in capsys.readouterr().err


# -- tables -------------------------------------------------------------------------------
def test_tables_are_shown_with_their_settings_and_load_errors_in_full():
    columns = (Field("id", FieldType.INT, "bigint"),)
    settings = TableSettings(30, 86400, 10, 10000, 30, 30, 0, "current", columns, 1.0, 5, "dlq")
    text = output.format_tables(
        [
            TableInfo("my_message", "app", settings, "", 3, 2, 1, 9, 7, 4, 2, 6, 3, 100_000),
            TableInfo(
                "bad", "app", None, "table bad: missing comment field vt_ack_wait", 0, 0, 0, 0, 0
            ),
        ],
        wide=True,
    )
    header, good, bad, blank, moved, where, blank2, title, error = text.splitlines()
    assert header.split() == [
        "TABLE", "KEYSPACE", "STATUS", "BATCH", "CACHE", "ACK", "WAIT", "CACHED", "IN",
        "FLIGHT", "SUBSCRIBERS", "SENT", "ACKED", "RELEASED", "REJECTED", "RENEWED", "DIED",
        "DEAD", "MAX", "ATTEMPTS",
    ]  # fmt: skip
    assert (blank2, moved, where.split()) == (
        "",
        "dead letters go to:",
        ["my_message", "->", "dlq"],
    )
    assert good.split() == [
        "my_message",
        "app",
        "loaded",
        "10",
        "10000",
        "30s",
        "3",
        "2",
        "1",
        "9",
        "7",
        "4",
        "2",
        "6",
        "3",
        "100000+",
        "5",
    ]
    assert bad.split()[:6] == ["bad", "app", "error", "-", "-", "-"]
    assert (blank, title) == ("", "load errors:")
    assert error == "  bad: table bad: missing comment field vt_ack_wait"


def test_the_default_view_of_tables_fits_an_80_column_terminal():
    columns = (Field("id", FieldType.INT, "bigint"),)
    settings = TableSettings(30, 86400, 10, 10000, 30, 30, 0, "current", columns, 1.0, 5, "dlq")
    big = TableInfo(
        "customer_notifications", "app", settings, "", 10_000, 2_500, 12, 9_876_543_210,
        9_876_540_000, 4, 2, 6, 3, 100_000, sender="10.0.0.7:50051"
    )  # fmt: skip
    bad = TableInfo(
        "bad", "app", None, "table bad: missing comment field vt_ack_wait", 0, 0, 0, 0, 0
    )
    text = output.format_tables([big, bad])
    header, row, failed = text.splitlines()[:3]
    assert header.split() == [
        "TABLE",
        "STATUS",
        "SUBSCRIBERS",
        "IN",
        "FLIGHT",
        "SENT",
        "ACKED",
        "DEAD",
    ]
    assert row.split() == [
        "customer_notifications", "loaded", "12", "2500", "9.9G", "9.9G", "100k+"
    ]  # fmt: skip
    assert failed.split() == ["bad", "error", "0", "0", "0", "0", "-"]
    assert max(len(line) for line in text.splitlines()[:3]) <= 80
    assert (
        text.split("\n\n", 1)[1] == output.format_tables([big, bad], wide=True).split("\n\n", 1)[1]
    )  # the notes below are the same in both views
    # the keyspace, once the tables are in more than one (a gateway's shards)
    shards = [dataclasses.replace(big, shard=s, name="q") for s in ("-80", "80-")]
    lines = output.format_tables(shards).splitlines()
    assert [line.split()[:3] for line in lines[:3]] == [
        ["TABLE", "KEYSPACE", "STATUS"], ["q", "app/-80", "loaded"], ["q", "app/80-", "loaded"]
    ]  # fmt: skip
    assert max(len(line) for line in lines[:3]) <= 80


def test_tables_as_json_is_a_line_per_entry_with_every_field():
    columns = (Field("id", FieldType.INT, "bigint"),)
    settings = TableSettings(30, 86400, 10, 10000, 30, 30, 0, "current", columns, 1.0, 5, "dlq")
    info = TableInfo("orders", "app", settings, "", 3, 2, 1, 9, 7, 4, 2, 6, 3, 100_000, due=5)
    data = json.loads(output.table_json(info))
    assert set(data) == {f.name for f in dataclasses.fields(TableInfo)}
    assert (data["name"], data["sent"], data["dead"], data["due"]) == ("orders", 9, 100_000, 5)
    assert data["config"]["batch_size"] == 10 and data["config"]["dead_letter"] == "dlq"
    assert data["config"]["message_columns"] == [
        {"name": "id", "type": "int", "column_type": "bigint"}
    ]
    failed = json.loads(output.table_json(TableInfo("bad", "app", None, "why", 0, 0, 0, 0, 0)))
    assert (failed["config"], failed["load_error"]) == (None, "why")


def test_no_tables_says_so():
    assert output.format_tables([]) == "no message tables"


def test_tables_command_prints_what_the_server_reports(engine, server, capsys):
    from tests.unit.server.test_server import failed_table, loaded_table

    engine.tables = [loaded_table(), failed_table()]
    assert cli.main(["tables", "--server", server.address]) == 0
    out = capsys.readouterr().out
    assert "my_message" in out and "missing comment field vt_ack_wait" in out
    assert out.splitlines()[0].split()[:3] == ["TABLE", "STATUS", "SUBSCRIBERS"]
    assert cli.main(["tables", "--wide", "--server", server.address]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[:4] == [
        "TABLE", "KEYSPACE", "STATUS", "BATCH"
    ]  # fmt: skip
    assert cli.main(["tables", "--json", "--server", server.address]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(t["name"], t["load_error"] == "") for t in lines] == [
        ("my_message", True), (failed_table().name, False)
    ]  # fmt: skip


def test_an_unreachable_server_is_one_line_on_stderr(capsys):
    port = free_port()
    assert cli.main(["tables", "--server", f"127.0.0.1:{port}"]) == 1
    captured = capsys.readouterr()
    assert_one_line_error(captured.err, f"127.0.0.1:{port}")
    assert captured.out == ""


# -- tail ---------------------------------------------------------------------------------
def feed_when_subscribed(engine: FakeEngine, *batches: list[tuple[object, ...]]) -> None:
    def feed() -> None:
        sub = engine.next_subscriber()
        for batch in batches:
            sub.put(batch)

    threading.Thread(target=feed, daemon=True).start()


def test_tail_prints_each_message_and_acks_each_batch(engine, server, capsys):
    engine.ack_result = 2
    feed_when_subscribed(
        engine, [(1, "hello world", Decimal("9.99")), (2, None, None)], [(3, "x", None)]
    )
    assert (
        cli.main(["tail", "my_message", "--ack", "--count", "3", "--server", server.address]) == 0
    )
    assert capsys.readouterr().out.splitlines() == [
        'id=1 message="hello world" price=9.99',
        "id=2 message=NULL price=NULL",
        'id=3 message="x" price=NULL',
    ]
    assert [ids for _, _, ids in engine.acks] == [[1, 2], [3]]


def test_tail_stops_at_count_and_leaves_the_rest_unacked(engine, server, capsys):
    feed_when_subscribed(engine, [(1, "a", None), (2, "b", None), (3, "c", None)])
    assert cli.main(["tail", "t", "--ack", "--count", "2", "--server", server.address]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert [ids for _, _, ids in engine.acks] == [[1, 2]]


def test_tail_without_ack_acks_nothing(engine, server, capsys):
    feed_when_subscribed(engine, [(1, "a", None)])
    assert cli.main(["tail", "t", "--count", "1", "--server", server.address]) == 0
    assert engine.acks == []


def test_tail_json_writes_one_object_per_line(engine, server, capsys):
    engine.fields = (*engine.fields[:2], engine.fields[2].__class__("raw", "blob", "blob"))
    feed_when_subscribed(engine, [(1, "a", b"\x00\xff")])
    assert cli.main(["tail", "t", "--json", "--count", "1", "--server", server.address]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line) == {"id": 1, "message": "a", "raw": "0x00ff"}


def test_tail_marks_a_redelivery_and_shows_the_send_time_when_asked(engine, server, capsys):
    sent_ns = 1_700_000_000_123_000_000
    feed_when_subscribed(engine, Batch([(1, "a", None), (2, "b", None)], [0, 1], sent_ns))
    argv = ["tail", "t", "--count", "2", "--server", server.address]
    assert cli.main([*argv, "--time"]) == 0
    first, second = capsys.readouterr().out.splitlines()
    sent = datetime.datetime.fromtimestamp(sent_ns / 1e9).isoformat(" ", timespec="milliseconds")
    assert first == f'{sent} id=1 message="a" price=NULL'
    assert second == f'{sent} id=2 message="b" price=NULL (attempt 2)'
    feed_when_subscribed(engine, Batch([(2, "b", None)], [3], sent_ns))
    assert cli.main([*argv[:2], "--json", "--count", "1", "--server", server.address]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line) == {"id": 2, "message": "b", "price": None, "_attempt": 4}


def test_tail_with_a_count_asks_the_server_for_no_more(engine, server, capsys):
    feed_when_subscribed(engine, [(1, "a", None)])
    assert cli.main(["tail", "t", "--count", "1", "--server", server.address]) == 0
    assert (engine.max_in_flight, engine.max_messages) == (1, 1)
    feed_when_subscribed(engine, [(1, "a", None)])
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    assert cli.main(["tail", "t", "--server", server.address]) == 0  # Ctrl-C ends it
    assert (engine.max_in_flight, engine.max_messages) == (0, 0)  # no count: no limit


def test_tail_of_an_unknown_table_is_one_line_on_stderr(engine, server, capsys):
    engine.subscribe_error = TableNotFound("message table 'nope' not found")
    assert cli.main(["tail", "nope", "--server", server.address]) == 1
    assert_one_line_error(capsys.readouterr().err, "'nope' not found")


# -- serve --------------------------------------------------------------------------------
def test_serve_without_a_server_binary_prints_the_install_hint(monkeypatch, capsys):
    def no_binary():
        raise ServerBinaryNotFound(f"no mariadbd or mysqld binary found.\n{INSTALL_HINT}")

    monkeypatch.setattr(serve_command, "start_local_server", no_binary)
    assert cli.main(["serve", "--listen", "127.0.0.1:0"]) == 1
    err = capsys.readouterr().err
    assert_one_line_error(err, "no mariadbd or mysqld", "apt-get install mariadb-server")


def test_serve_stops_gracefully_on_sigint_and_closes_the_engine(monkeypatch, capsys):
    engine = ServableEngine()
    monkeypatch.setattr(serve_command, "open_engine", lambda *_, **__: engine)
    before = signal.getsignal(signal.SIGINT)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        code = cli.main(
            ["serve", "--dsn", "mysql+pymysql://u:secret@db/app", "--listen", "127.0.0.1:0"]
        )
    finally:
        timer.cancel()
    assert code == 0
    assert engine.opened and engine.closed
    out = capsys.readouterr().out
    assert "serving on 127.0.0.1:" in out and "secret" not in out
    assert signal.getsignal(signal.SIGINT) is before  # serve put back what it found


def test_serve_exits_non_zero_when_the_engine_dies(monkeypatch, capsys):
    engine = ServableEngine()
    engine.fatal_reason = "the poller of my_message died"
    engine.fatal.set()
    monkeypatch.setattr(serve_command, "open_engine", lambda *_, **__: engine)
    assert (
        cli.main(["serve", "--dsn", "mysql+pymysql://u:p@db/app", "--listen", "127.0.0.1:0"]) == 1
    )
    assert engine.closed


def test_serve_on_a_port_in_use_is_one_line_on_stderr(monkeypatch, server, capsys):
    engine = ServableEngine()
    monkeypatch.setattr(serve_command, "open_engine", lambda *_, **__: engine)
    assert (
        cli.main(["serve", "--dsn", "mysql+pymysql://u:p@db/app", "--listen", server.address]) == 1
    )
    assert_one_line_error(capsys.readouterr().err, f"cannot listen on {server.address}")
    assert engine.closed


def test_an_invalid_dsn_is_one_line_on_stderr(capsys):
    assert cli.main(["serve", "--dsn", "not a url", "--listen", "127.0.0.1:0"]) == 1
    assert_one_line_error(capsys.readouterr().err, "URL")


def test_an_unexpected_error_is_one_line_without_a_traceback(monkeypatch, capsys):
    def broken(args):
        raise RuntimeError("kaput")

    monkeypatch.setitem(cli.COMMANDS, "tables", broken)
    assert cli.main(["tables"]) == 1
    assert_one_line_error(capsys.readouterr().err, "RuntimeError: kaput")


def test_security_flags_fall_back_to_their_environment_variables(monkeypatch):
    parser = cli.build_parser()
    args = parser.parse_args(["serve", "--auth", "a.toml", "--tls-cert", "c.pem", "--tls-key", "k"])
    assert (args.auth, args.tls_cert, args.tls_key, args.tls_client_ca) == (
        "a.toml",
        "c.pem",
        "k",
        None,
    )
    monkeypatch.setenv("MSGTABLE_TOKEN", "from-the-environment")
    monkeypatch.setenv("MSGTABLE_TLS_CLIENT_CA", "ca.pem")
    parser = cli.build_parser()
    assert parser.parse_args(["tables"]).token == "from-the-environment"
    assert parser.parse_args(["serve"]).tls_client_ca == "ca.pem"
    assert parser.parse_args(["tail", "t", "--tls-ca", "x.pem"]).tls_ca == "x.pem"


def test_every_flag_declared_with_an_environment_variable_falls_back_to_it(monkeypatch):
    from msgtable.cli import flags

    checked = 0
    for path, command in (leaf for c in flags.COMMANDS for leaf in c.leaves()):
        words = list(path)
        for f in command.flags:
            if not f.name.startswith("-") and not f.optional:
                words.append("x")
            elif f.required:
                words += [f.name, "x"]
        for flag in command.flags:
            if flag.env is None:
                continue
            value = flag.choices[-1] if flag.choices else "7"
            monkeypatch.setenv(flag.env, "0" if flag.switch else value)
            args = cli.build_parser().parse_args(words)
            got = getattr(args, flag.name.lstrip("-").replace("-", "_"))
            assert got == (False if flag.switch else (flag.type or str)(value)), flag.name
            assert f"env {flag.env}" in flag.help_text
            monkeypatch.delenv(flag.env)
            checked += 1
    assert checked >= 24  # the subscription commands' client flags among them


# -- subscriptions ------------------------------------------------------------------------
NOW_NS = 1_700_000_000_000_000_000
COLUMNS = (Field("id", FieldType.INT, "bigint"),)
SETTINGS = TableSettings(30, 86400, 10, 10000, 30, 30, 0, "current", COLUMNS, 1.0, 5, "")


def sub_info(name: str, **fields: Any) -> TableInfo:
    values: dict[str, Any] = dict(state="active", lag=0, holding=True)
    values.update(fields)
    return TableInfo("orders", "app", SETTINGS, "", 0, 0, 1, 0, 0, subscription=name, **values)


def test_human_ages_take_the_largest_unit_that_reads_well():
    ages = [0.04, 3.2, 42, 59.96, 300, 5400, 86399, 3.3 * 86400, None]
    assert [output.age(a) for a in ages] == [
        "0s", "3.2s", "42s", "1m", "5m", "1.5h", "1d", "3.3d", "-"
    ]  # fmt: skip


def test_subscriptions_are_listed_with_lag_oldest_age_holding_and_filter():
    text = output.format_subscriptions(
        [
            sub_info("billing", filter="region = 'eu'", lag=12, oldest_ns=NOW_NS - 3_200_000_000),
            sub_info(
                "audit",
                state="expired",
                lag=1_000_000,
                oldest_ns=NOW_NS - 300 * 10**9,
                holding=False,
                not_holding="expired",
            ),
            sub_info("capped", lag=20, holding=False, not_holding="lag 20 over max_lag 10"),
        ],
        now_ns=NOW_NS,
    )
    header, billing, audit, capped = text.splitlines()
    assert header.split() == [
        "TABLE", "SUBSCRIPTION", "STATE", "SUBSCRIBERS", "LAG", "OLDEST", "HOLDING", "FILTER"
    ]  # fmt: skip
    assert billing.split() == [
        "orders", "billing", "active", "1", "12", "3.2s", "yes", "region", "=", "'eu'"
    ]  # fmt: skip
    assert audit.split() == [
        "orders", "audit", "expired", "1", "1000000+", "5m", "no:", "expired", "-"
    ]  # fmt: skip
    assert capped.split()[4:] == ["20", "-", "no:", "lag", "20", "over", "max_lag", "10", "-"]


def test_no_subscriptions_says_so_and_a_broken_one_shows_its_error_once():
    assert output.format_subscriptions([]) == "no subscriptions"
    assert output.format_subscriptions([], "orders") == "no subscriptions of orders"
    broken = dataclasses.replace(
        sub_info("x"), config=None, load_error="subscription orders/x: its state table is missing"
    )
    text = output.format_subscriptions([broken], "", NOW_NS)
    _, row, blank, title, error = text.split("\n")
    assert row.split() == ["orders", "x", "error", "-", "-", "-", "-", "-"]
    assert (blank, title, error) == ("", "load errors:", "  " + broken.load_error)


def test_a_subscription_as_json_has_its_numbers_and_settings():
    info = sub_info("billing", filter="kind=order", lag=3, oldest_ns=NOW_NS - 1_500_000_000)
    info = dataclasses.replace(
        info,
        due=2,
        scheduled=1,
        oldest_unacked_age_s=1.5,
        hold_s=4.5,
        hold_whole=True,
        limits="rate 5/s (burst 1)",
        state_rows="lazy",
        cursor_lag=2,
    )
    assert json.loads(output.subscription_json(info, NOW_NS)) == {
        "table": "orders",
        "keyspace": "app",
        "subscription": "billing",
        "state": "active",
        "subscribers": 1,
        "lag": 3,
        "oldest_ns": NOW_NS - 1_500_000_000,
        "oldest_age_s": 1.5,
        "holding": True,
        "not_holding": "",
        "filter": "kind=order",
        "columns": ["id"],
        "ack_wait_s": 30,
        "max_attempts": 5,
        "in_flight": 0,
        "sent": 0,
        "acked": 0,
        "dead": None,
        "due": 2,
        "scheduled": 1,
        "oldest_unacked_age_s": 1.5,
        "hold_s": 4.5,
        "hold_whole": True,
        "sender": "",
        "limits": "rate 5/s (burst 1)",
        "state_rows": "lazy",
        "cursor_lag": 2,
        "advice": "",
        "load_error": "",
    }


def test_tables_show_subscriptions_under_their_table_with_its_unseen_rows():
    table = TableInfo("orders", "app", SETTINGS, "", 0, 0, 0, 0, 0, unseen=4)
    plain = TableInfo("plain", "app", SETTINGS, "", 0, 0, 0, 0, 0)
    billing = sub_info("billing", filter="region = 'eu'", lag=2, oldest_ns=NOW_NS - 42 * 10**9)
    expired = sub_info("idle", state="expired", holding=False, not_holding="expired")
    text = output.format_tables([table, plain, billing, expired], NOW_NS)
    before, section = text.split("\n\nsubscriptions:\n")
    assert before == output.format_tables([table, plain])  # the tables' rows as they were
    assert [line.split()[0] for line in before.splitlines()] == ["TABLE", "orders", "plain"]
    header, orders, billing_row, idle_row = section.splitlines()
    assert header.split() == [
        "TABLE", "UNSEEN", "STATE", "SUBSCRIBERS", "LAG", "OLDEST", "HOLDING", "FILTER"
    ]  # fmt: skip
    assert orders.split() == ["orders", "4"]
    assert billing_row.startswith("    billing ")  # indented under its table
    assert billing_row.split() == [
        "billing", "active", "1", "2", "42s", "yes", "region", "=", "'eu'"
    ]  # fmt: skip
    assert idle_row.split() == ["idle", "expired", "1", "0", "-", "no:", "expired", "-"]


def test_tables_show_a_lazy_subscriptions_mode_and_cursor_lag():
    """A lazy subscription's row says it is lazy and, in its lag, how many of those are above
    its cursor, never sent; an eager one's row is as it was."""
    lazy = dataclasses.replace(sub_info("feed", lag=7), state_rows="lazy", cursor_lag=5)
    eager = dataclasses.replace(sub_info("billing", lag=2), state_rows="eager")
    section = output.format_tables([lazy, eager], NOW_NS).split("\n\nsubscriptions:\n")[1]
    _, _, lazy_row, eager_row = section.splitlines()
    assert lazy_row.split()[:7] == ["feed", "active", "(lazy)", "1", "7", "(cursor", "5)"]
    assert eager_row.split()[:4] == ["billing", "active", "1", "2"]
    listed = output.format_subscriptions([lazy], "", NOW_NS).splitlines()[1]
    assert listed.split()[:8] == ["orders", "feed", "active", "(lazy)", "1", "7", "(cursor", "5)"]


def test_tables_and_subscription_list_show_a_lazy_filters_advice_below():
    """A lazy subscription whose filter lacks an index: the server's advice, in a section of
    its own under the rows (and in each one's JSON); none for the others."""
    advice = "its filter reads every message above its cursor to find its matches: ALTER TABLE"
    lazy = dataclasses.replace(
        sub_info("feed", filter="region = 'eu'", lag=7), state_rows="lazy", advice=advice
    )
    eager = dataclasses.replace(sub_info("billing", lag=2), state_rows="eager")
    tables = output.format_tables([lazy, eager], NOW_NS)
    assert tables.endswith(f"\n\nadvice:\n  orders/feed: {advice}"), tables
    listed = output.format_subscriptions([lazy, eager], "", NOW_NS)
    assert listed.endswith(f"\n\nadvice:\n  orders/feed: {advice}"), listed
    assert "advice:" not in output.format_tables([eager], NOW_NS)
    assert json.loads(output.subscription_json(lazy, NOW_NS))["advice"] == advice


# the commands, over gRPC to the fake engine
def test_create_sends_the_settings_given_and_says_what_it_did(engine, server, capsys):
    argv = ["subscription", "create", "orders", "eu", "--server", server.address]
    assert cli.main([*argv, "--filter", "region = 'eu'", "--columns", "id,kind"]) == 0
    assert capsys.readouterr().out == (
        "created subscription orders/eu: messages matching \"region = 'eu'\" enqueued from now on\n"
    )
    engine.from_start_count = 1234
    flags = ["--ack-wait", "90s", "--max-attempts", "0", "--max-lag", "10", "--expire-after", "1h"]
    assert cli.main([*argv, *flags, "--from-start"]) == 0
    assert capsys.readouterr().out == (
        "created subscription orders/eu: 1,234 retained messages handed over, and every "
        "message enqueued from now on\n"
    )
    (first, start1), (second, start2) = engine.created
    assert (first.filter, first.columns, first.ack_wait_s, start1) == (
        "region = 'eu'",
        ("id", "kind"),
        None,
        False,
    )
    assert (second.ack_wait_s, second.max_attempts, second.max_lag) == (90.0, 0, 10)
    assert (second.expire_after_s, second.filter, start2) == (3600.0, "", True)


def test_create_takes_state_rows_lazy_and_says_so(engine, server, capsys):
    argv = ["subscription", "create", "orders", "lazy", "--server", server.address]
    assert cli.main([*argv, "--state-rows", "lazy"]) == 0
    assert capsys.readouterr().out == (
        "created subscription orders/lazy: every message enqueued from now on (state rows "
        "lazy: only for messages sent and not settled in order)\n"
    )
    assert cli.main([*argv[:-2], "--server", server.address]) == 0
    (lazy, _), (default, _) = engine.created
    assert (lazy.state_rows, default.state_rows) == ("lazy", "eager")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([*argv, "--state-rows", "sometimes"])


def test_alter_sends_only_the_settings_given_and_empty_or_zero_clears_one(engine, server, capsys):
    argv = ["subscription", "alter", "orders", "eu", "--server", server.address]
    assert cli.main([*argv, "--filter", "region = 'us'", "--max-lag", "100"]) == 0
    assert capsys.readouterr().out == (
        "altered subscription orders/eu: filter \"region = 'us'\" (for the messages handed over "
        "from now on), max lag 100\n"
    )
    cleared = ["--filter", "", "--columns", "", "--ack-wait", "0", "--max-lag", "0"]
    assert cli.main([*argv, *cleared, "--expire-after", "0", "--max-attempts", "0"]) == 0
    assert capsys.readouterr().out == (
        "altered subscription orders/eu: filter cleared (every message from now on), all "
        "columns, ack wait: the table's, max attempts: no limit, max lag: no limit, expire "
        "after: never\n"
    )
    (_, _, first), (_, _, second) = engine.altered
    assert first == {"filter": "region = 'us'", "max_lag": 100}
    assert second == {
        "filter": "",
        "columns": (),
        "ack_wait_s": None,
        "max_attempts": 0,
        "max_lag": None,
        "expire_after_s": None,
    }


def test_alter_with_nothing_to_change_is_one_line_and_asks_nothing(engine, server, capsys):
    assert cli.main(["subscription", "alter", "orders", "eu", "--server", server.address]) == 1
    assert_one_line_error(capsys.readouterr().err, "nothing to change", "--filter")
    assert engine.altered == []


def test_drop_and_list_say_what_the_server_did_and_has(engine, server, capsys):
    assert cli.main(["subscription", "drop", "orders", "eu", "--server", server.address]) == 0
    assert capsys.readouterr().out == (
        "dropped subscription orders/eu and its state table orders__eu\n"
    )
    assert engine.dropped == [("orders", "eu")]
    table = loaded_table("orders")
    engine.subscriptions = [
        dataclasses.replace(table, subscription="eu", state="active", lag=3, filter="x > 1"),
        dataclasses.replace(table, name="other", subscription="all", state="active", lag=0),
    ]
    assert cli.main(["subscription", "list", "orders", "--server", server.address]) == 0
    _, row = capsys.readouterr().out.splitlines()
    assert row.split() == ["orders", "eu", "active", "1", "3", "-", "yes", "x", ">", "1"]
    assert cli.main(["subscription", "list", "--json", "--server", server.address]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["table"], x["subscription"], x["lag"]) for x in lines] == [
        ("orders", "eu", 3),
        ("other", "all", 0),
    ]


def test_a_refused_filter_is_one_line_naming_the_position(engine, server, capsys):
    engine.subscription_error = InvalidArgument(
        "filter: at position 19: unknown column 'amont' (columns: id, region)"
    )
    argv = ["subscription", "create", "orders", "eu", "--filter", "region = 'eu' AND amont > 1"]
    assert cli.main([*argv, "--server", server.address]) == 1
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.out == ""
    assert_one_line_error(captured.err, "filter: at position 19: unknown column 'amont'")


def test_a_missing_subscription_is_one_line_on_stderr(engine, server, capsys):
    engine.subscription_error = TableNotFound("subscription orders/eu not found")
    assert cli.main(["subscription", "drop", "orders", "eu", "--server", server.address]) == 1
    assert_one_line_error(capsys.readouterr().err, "subscription orders/eu not found")


def test_tail_reads_and_acks_as_its_subscription(engine, server, capsys):
    feed_when_subscribed(engine, [(1, "a", None)])
    argv = ["tail", "orders", "--subscription", "eu", "--ack", "--count", "1"]
    assert cli.main([*argv, "--server", server.address]) == 0
    assert capsys.readouterr().out == 'id=1 message="a" price=NULL\n'
    assert (engine.subscribed_as, engine.acked_as) == (["eu"], ["eu"])


def test_tail_asks_for_only_the_columns_given(engine, server, capsys):
    feed_when_subscribed(engine, [(1, "a", Decimal("2.50"))])
    argv = ["tail", "orders", "--columns", "price", "--count", "1", "--server", server.address]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == "id=1 price=2.50\n"
    assert engine.subscribed_as == [""]


def test_metrics_listen_is_a_flag_with_an_environment_fallback_and_off_by_default(monkeypatch):
    assert cli.build_parser().parse_args(["serve"]).metrics_listen is None
    monkeypatch.setenv("MSGTABLE_METRICS_LISTEN", "127.0.0.1:9464")
    assert cli.build_parser().parse_args(["serve"]).metrics_listen == "127.0.0.1:9464"


def test_serve_with_a_bad_metrics_address_is_one_line_and_closes_the_engine(monkeypatch, capsys):
    engine = ServableEngine()
    monkeypatch.setattr(serve_command, "open_engine", lambda *a, **k: engine)
    argv = ["serve", "--dsn", "mysql+pymysql://u:p@db/app", "--listen", "127.0.0.1:0"]
    assert cli.main([*argv, "--metrics-listen", "localhost"]) == 1
    assert_one_line_error(capsys.readouterr().err, "--metrics-listen 'localhost'")
    assert not engine.opened and engine.closed


def test_counts_of_one_are_singular_in_what_msgtable_dead_prints():
    one = DeadLetter(7, 0, 5, "no ack after 5 attempts")
    assert output.format_dead([one], 1, "jobs").endswith("\n1 shown of 1 dead letter in jobs")
    assert output.format_dead([one], 2, "jobs").endswith("\n1 shown of 2 dead letters in jobs")


def test_the_sqs_line_names_the_api_or_at_a_gateway_the_shards_servers():
    assert output.format_sqs("127.0.0.1:9324", {}) == "sqs: http://127.0.0.1:9324 (calls: none yet)"
    assert output.format_sqs("", {"SendMessage": 3, "GetQueueUrl": 2}) == (
        "sqs: at the shards' servers (calls: GetQueueUrl 2, SendMessage 3)"
    )
