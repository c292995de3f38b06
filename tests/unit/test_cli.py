"""The msgtable command: arguments, output, and errors as one line (never a traceback)."""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import threading
from collections.abc import Iterator
from decimal import Decimal

import pytest

from msgtable import cli
from msgtable.cli import output
from msgtable.client import Field, TableInfo, TableSettings
from msgtable.codec import FieldType
from msgtable.devdb import INSTALL_HINT
from msgtable.errors import ServerBinaryNotFound, TableNotFound
from msgtable.limits import DEFAULT_ADDRESS
from msgtable.rows import Batch
from msgtable.server import MessagingServer

from .test_server import FakeEngine


class ServableEngine(FakeEngine):
    """A FakeEngine with the lifecycle `msgtable serve` drives."""

    def __init__(self) -> None:
        super().__init__()
        self.fatal = threading.Event()
        self.fatal_reason = ""
        self.opened = self.closed = False
        self.campaigned_as: str | None = None

    def open(self) -> None:
        self.opened = True

    def campaign(self, address: str) -> None:
        self.campaigned_as = address

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


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

    def open_engine(dsn, discovery_interval_s, follow_binlog, lease_period_s):
        seen.append((discovery_interval_s, follow_binlog))
        leases.append(lease_period_s)
        return engine

    monkeypatch.setattr(cli.serve, "open_engine", open_engine)
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
    assert engine.campaigned_as is not None and engine.campaigned_as.startswith("127.0.0.1:")
    cli.main([*argv, "--advertise", "mq1.example:7000"])
    assert engine.campaigned_as == "mq1.example:7000"


def test_the_advertised_address_names_this_host_on_a_wildcard_listen():
    assert cli.serve.advertised_address("127.0.0.1:0", "127.0.0.1:4567") == "127.0.0.1:4567"
    host = cli.serve.advertised_address("0.0.0.0:50051", "127.0.0.1:50051")
    assert host == f"{socket.gethostname()}:50051"


def test_tail_takes_a_name_and_its_options():
    args = cli.build_parser().parse_args(["tail", "my_message", "--ack", "--count", "5", "--json"])
    assert (args.name, args.ack, args.count, args.json) == ("my_message", True, 5, True)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["tail"],
        ["tail", "t", "--count", "0"],
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
        ]
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


def test_no_tables_says_so():
    assert output.format_tables([]) == "no message tables"


def test_tables_command_prints_what_the_server_reports(engine, server, capsys):
    from .test_server import failed_table, loaded_table

    engine.tables = [loaded_table(), failed_table()]
    assert cli.main(["tables", "--server", server.address]) == 0
    out = capsys.readouterr().out
    assert "my_message" in out and "missing comment field vt_ack_wait" in out


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
    assert engine.max_in_flight == 1
    feed_when_subscribed(engine, [(1, "a", None)])
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    assert cli.main(["tail", "t", "--server", server.address]) == 0  # Ctrl-C ends it
    assert engine.max_in_flight == 0  # no count: the server's default window


def test_tail_of_an_unknown_table_is_one_line_on_stderr(engine, server, capsys):
    engine.subscribe_error = TableNotFound("message table 'nope' not found")
    assert cli.main(["tail", "nope", "--server", server.address]) == 1
    assert_one_line_error(capsys.readouterr().err, "'nope' not found")


# -- serve --------------------------------------------------------------------------------
def test_serve_without_a_server_binary_prints_the_install_hint(monkeypatch, capsys):
    def no_binary():
        raise ServerBinaryNotFound(f"no mariadbd or mysqld binary found.\n{INSTALL_HINT}")

    monkeypatch.setattr(cli.serve, "start_local_server", no_binary)
    assert cli.main(["serve", "--listen", "127.0.0.1:0"]) == 1
    err = capsys.readouterr().err
    assert_one_line_error(err, "no mariadbd or mysqld", "apt-get install mariadb-server")


def test_serve_stops_gracefully_on_sigint_and_closes_the_engine(monkeypatch, capsys):
    engine = ServableEngine()
    monkeypatch.setattr(cli.serve, "open_engine", lambda *_, **__: engine)
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
    monkeypatch.setattr(cli.serve, "open_engine", lambda *_, **__: engine)
    assert (
        cli.main(["serve", "--dsn", "mysql+pymysql://u:p@db/app", "--listen", "127.0.0.1:0"]) == 1
    )
    assert engine.closed


def test_serve_on_a_port_in_use_is_one_line_on_stderr(monkeypatch, server, capsys):
    engine = ServableEngine()
    monkeypatch.setattr(cli.serve, "open_engine", lambda *_, **__: engine)
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
    for command in flags.COMMANDS:
        words = [command.name]
        for f in command.flags:
            if not f.name.startswith("-"):
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
    assert checked >= 12
