"""What a newcomer meets first (issue 39): each mistake is one clear message naming its cause
and its fix, where there was a wrong or a missing one. The commands run as subprocesses
(the `cli` fixture) against `msgtable serve` on the test's own database."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from sqlalchemy.engine import make_url

from msgtable.core.tables import current_layout_ddl
from tests.integration.helpers import comment

from .helpers import Cli, assert_one_line_error, describe, free_port, wait_until

if TYPE_CHECKING:
    from tests.conftest import Sql

pytestmark = pytest.mark.timeout(90)


# -- a wrong database password ---------------------------------------------------------------
def test_a_wrong_password_is_named_as_the_cause_and_the_binlog_follows_once_it_is_right(
    cli: Cli, sql: Sql, db_dsn: str
):
    """Issue 39: a wrong password made the binlog follower say the user needed REPLICATION
    grants, and give up for good. The server says the database refused the DSN's user and
    password (naming the user and the database's address, never the password); once the
    account takes that password, the binlog is followed."""
    url = make_url(db_dsn)
    user, right, wrong = f"pw_{url.database}"[-32:], "the-right-password", "a-wrong-password"
    sql.execute(f"drop user if exists '{user}'@'%'")
    sql.execute(f"create user '{user}'@'%' identified by '{right}'")
    try:
        sql.execute(f"grant all privileges on `{url.database}`.* to '{user}'@'%'")
        sql.execute(f"grant replication slave, replication client on *.* to '{user}'@'%'")
        metrics = f"127.0.0.1:{free_port()}"
        dsn = url.set(username=user, password=wrong).render_as_string(hide_password=False)
        serve = cli.serve("--dsn", dsn, "--metrics-listen", metrics, "--log-level", "debug")
        # the binlog follower has tried (and failed) once: what it made of it
        serve.wait_for_output(r"binlog: (following failed|not following)", stream="stderr")
        assert "REPLICATION" not in serve.stderr, serve.describe()
        assert "binlog: not following" not in serve.stderr, serve.describe()
        where = f"waiting for the database at {url.host}:{url.port}"
        said = [line for line in serve.stderr.splitlines() if where in line]
        assert len(said) == 1, serve.describe()
        for fragment in ("(1045) Access denied", f"user '{user}'", "user or password"):
            assert fragment in said[0], f"{fragment!r} not in {said[0]!r}"
        assert wrong not in serve.stderr + serve.stdout, serve.describe()

        sql.execute(f"alter user '{user}'@'%' identified by '{wrong}'")  # now it is right

        wait_until(
            lambda: _binlog_following(metrics),
            timeout_s=30,
            what=lambda: (
                f"msgtable_binlog_following 1 once the password is right:\n{serve.describe()}"
            ),
        )
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout_s=15) == 0, serve.describe()
    finally:
        sql.execute(f"drop user if exists '{user}'@'%'")


def _binlog_following(metrics: str) -> bool:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return re.search(r"^msgtable_binlog_following(\{[^}]*\})? 1(\.0)?$", text, re.M) is not None


# -- a keyspace file with an unknown key -----------------------------------------------------
def test_an_unknown_key_of_a_shard_names_the_shard_by_its_key_range(cli: Cli, tmp_path: Path):
    """As every other keyspace error does (a shard's name is its key range), not "shard 2"."""
    file = tmp_path / "keyspace.toml"
    file.write_text(
        'name = "app"\n'
        '[[shards]]\nkey_range = "-80"\ndsn = "mysql://u:p@db1/app"\n'
        '[[shards]]\nkey_range = "80-"\ndsn = "mysql://u:p@db2/app"\nweight = 2\n',
        encoding="utf-8",
    )
    for argv in (("serve", "--shard", "80-"), ("gateway",)):
        done = cli.run(*argv, "--keyspace-file", str(file))
        line = assert_one_line_error(done, f"{file}: shard 80-: unknown key 'weight'")
        assert "shard 2" not in line, line


# -- msgtable report without Spark -----------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]


def without_pyspark(cli: Cli, tmp_path: Path, *first: Path) -> dict[str, str]:
    """An environment in which `import pyspark` fails as it does where it is not installed
    (a module of that name that raises the same ImportError comes first on the path), with
    ``first`` before it on the path, and the working directory not on it."""
    shadow = tmp_path / "no-pyspark"
    (shadow / "pyspark").mkdir(parents=True)
    (shadow / "pyspark" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'pyspark'\", name='pyspark')\n"
    )
    path = os.pathsep.join(str(p) for p in (*first, shadow))
    return cli.env(PYTHONPATH=path, PYTHONSAFEPATH="1")


def test_report_without_spark_in_a_clone_says_make_spark(cli: Cli, tmp_path: Path):
    done = cli.run(
        "report", "orders", "--dsn", "mysql://u:p@db/app", env=without_pyspark(cli, tmp_path)
    )
    line = assert_one_line_error(done, "make spark", str(REPO))
    assert "pip install" not in line, line


def test_report_without_spark_where_msgtable_is_installed_says_pip_install(
    cli: Cli, tmp_path: Path
):
    site = tmp_path / "site-packages"  # msgtable as a wheel installs it: no clone around it
    shutil.copytree(
        REPO / "msgtable", site / "msgtable", ignore=shutil.ignore_patterns("__pycache__")
    )
    env = without_pyspark(cli, tmp_path, site)
    done = cli.run("report", "orders", "--dsn", "mysql://u:p@db/app", env=env)
    line = assert_one_line_error(done, "pip install 'msgtable[spark]'")
    assert "make spark" not in line, line


# -- a port in use ---------------------------------------------------------------------------
def test_serve_on_a_port_in_use_says_only_its_own_line(cli: Cli, db_dsn: str):
    """gRPC's C-core wrote its own line first (E1128 ... add_port.cc:83] Failed to add port)."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        done = cli.run("serve", "--dsn", db_dsn, "--listen", address)
    assert "add_port" not in done.stderr, describe(done)
    assert_one_line_error(done, f"cannot listen on {address}", "in use", "--listen")


# -- a push endpoint the server will not call ------------------------------------------------
def test_endpoint_set_outside_push_allow_is_refused_and_says_so(
    cli: Cli, sql: Sql, db_dsn: str, tmp_path: Path
):
    """It printed `jobs is pushed to URL` and exited 0, and the server never called it. The
    server refuses it (INVALID_ARGUMENT, so a client in any language learns it), nothing is
    stored, and the command says why in one line."""
    sql.execute(current_layout_ddl("jobs", comment()))
    secret = tmp_path / "push.secret"
    secret.write_text("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n")
    for allow in (("--push-allow", "http://127.0.0.0/8"), ()):
        serve = cli.serve("--dsn", db_dsn, *allow)
        server = ("--server", serve.address)
        url = "http://10.1.2.3:8080/in"
        done = cli.run("endpoint", "set", "jobs", url, "--secret-file", str(secret), *server)
        line = assert_one_line_error(done, "will not call", url, "--push-allow")
        assert "pushed to" not in done.stdout + line, describe(done)
        listed = cli.run("endpoint", "list", *server)
        assert listed.stdout.strip() == "no push endpoints", describe(listed)
        serve.stop()


# -- no server at the address ----------------------------------------------------------------
# Beyond starting the command (timed on one that fails before it connects: the machine may
# be busy), failing may take this long: tables took 8.6 s of retries, tail 0.5 s in all.
FAST_FAIL_S = 5.0


@pytest.mark.parametrize(
    "command",
    [
        ("tables",),
        ("tail", "jobs", "--count", "1"),
        ("subscription", "list", "jobs"),
        ("endpoint", "list"),
        ("dead", "jobs"),
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_a_command_without_a_server_fails_fast_naming_server_and_its_variable(
    cli: Cli, command: tuple[str, ...]
):
    address = f"127.0.0.1:{free_port()}"
    for how, env in (
        (("--server", address), cli.env()),
        ((), cli.env(MSGTABLE_SERVER=address)),
    ):
        began = time.monotonic()
        assert_one_line_error(cli.run("subscription", "alter", "jobs", "s"), "nothing to change")
        started_s = time.monotonic() - began
        began = time.monotonic()
        done = cli.run(*command, *how, env=env)
        took_s = time.monotonic() - began
        assert_one_line_error(done, address, "--server", "MSGTABLE_SERVER")
        assert took_s < started_s + FAST_FAIL_S, (
            f"took {took_s:.1f}s to fail (a command that does not connect: {started_s:.1f}s):\n"
            f"{describe(done)}"
        )
