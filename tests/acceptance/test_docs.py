"""The documentation site's snippets run as pasted, in the order the site gives them, on one
throwaway database: the tutorial's.

The pages are read in the order of mkdocs.yml's navigation, and every fence of each is run as
a reader would paste it (docs/development.md, "Writing these pages", says the same to writers):

- ``sql``: statement by statement on the tutorial's database, as the mysql client would
  (``SOURCE file`` from the clone's directory);
- ``python``: a script, in a working directory of its own;
- ``sh``: each command, with bash, in that directory (where ``.venv`` and ``schema`` are the
  clone's): ``make run ARGS=...`` as the ``msgtable serve`` it runs; a server (``make run``,
  ``msgtable serve``) or a ``msgtable tail`` without ``--count`` in the background until the
  end of its page, except the tutorial's first server, which serves every page;
- ``toml`` with a title (``title="auth.toml"``): that file, written in the working directory;
- a fence with the class ``.norun`` (``{.python .norun title="why"}``) is not run, and must say
  why in its title; other fences (text, http, yaml, mermaid) are shown, not run.

The one thing swapped is the port of an address: the pages name the tutorial's server
127.0.0.1:50051 and its database 127.0.0.1:3306, and this test maps each address a page names
to the port it really has (the database's is the one the first ``make run`` printed); a command
that names no server calls the tutorial's, through MSGTABLE_SERVER. After a page, a few checks
read the database: what the page did is there.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pymysql
import pytest
from sqlalchemy.engine import make_url

from msgtable.client import Client
from msgtable.core.keyspace import load
from msgtable.store.mysql import pymysql_args
from msgtable.testing.devdb import free_port

from .helpers import wait_until

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^( *)```([^\n`]*)\n(.*?)^\1```[ \t]*$", re.MULTILINE | re.DOTALL)
ADDRESS = re.compile(r"127\.0\.0\.1:(\d+)")
DATABASE_PORT = "3306"  # the pages' port of the tutorial's database
SERVER_PORT = "50051"  # and of its server
RUN_TIMEOUT_S = 120.0
START_TIMEOUT_S = 120.0  # a server, a throwaway database's start included
STOP_TIMEOUT_S = 30.0
MAX_NOT_RUN = 8  # fences that cannot run here (a cluster, shards): few, and each says why


@dataclass(frozen=True)
class Snippet:
    page: str
    number: int  # its place on the page, from 1
    language: str
    classes: tuple[str, ...]
    title: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page}, snippet {self.number} ({self.language})"


def pages() -> list[str]:
    """The pages of mkdocs.yml's navigation, in its order."""
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    return re.findall(r"^\s+- (?:[^\n]*: )?([\w/.-]+\.md)\s*$", nav, re.MULTILINE)


def snippets(page: str) -> list[Snippet]:
    text = (DOCS / page).read_text()
    out = []
    for number, (indent, info, code) in enumerate(FENCE.findall(text), 1):
        info = info.strip()
        if info.startswith("{"):
            classes = tuple(re.findall(r"\.([\w-]+)", info))
            language = classes[0] if classes else ""
        else:
            classes = ()
            language = info.split(" ")[0]
        title = re.search(r'title="([^"]*)"', info)
        body = "".join(line[len(indent) :] + "\n" for line in code.splitlines())
        out.append(Snippet(page, number, language, classes, title.group(1) if title else "", body))
    return out


def statements(sql: str) -> list[str]:
    """A mysql-client script's statements (``;`` ends one; ``--`` starts a comment)."""
    lines = [line for line in sql.splitlines() if not line.strip().startswith("--")]
    code = re.sub(r"\s--\s.*$", "", "\n".join(lines), flags=re.MULTILINE)
    return [s.strip() for s in code.split(";") if s.strip()]


def commands(sh: str) -> list[str]:
    """A shell snippet's commands: one a line, a trailing backslash joining the next."""
    joined = re.sub(r"\\\n\s*", " ", sh)
    return [c.strip() for c in joined.splitlines() if c.strip() and not c.strip().startswith("#")]


@dataclass
class Background:
    """A command left running, as in a terminal of its own."""

    command: str
    process: subprocess.Popen[bytes]
    log: Path
    for_good: bool = False

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # Ctrl-C
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Reader:
    """Someone following the pages: a working directory, the ports they have, what runs."""

    workdir: Path
    ports: dict[str, str] = field(default_factory=dict)
    running: list[Background] = field(default_factory=list)
    dsn: str = ""
    outputs: dict[tuple[str, int], str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT)  # this checkout's msgtable, whatever .venv was made from
        env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        for name in ("MSGTABLE_LISTEN", "MSGTABLE_DSN", "MSGTABLE_TOKEN"):
            env.pop(name, None)
        env["MSGTABLE_SERVER"] = self.address()  # the default address, 50051, swapped
        return env

    def address(self, port: str = SERVER_PORT) -> str:
        return "127.0.0.1:" + self.ports.setdefault(port, str(free_port()))

    def localise(self, code: str) -> str:
        def swap(m: re.Match[str]) -> str:
            if m.group(1) == DATABASE_PORT:
                assert self.dsn, "a page names the database before the tutorial started it"
                return f"127.0.0.1:{make_url(self.dsn).port}"
            return self.address(m.group(1))

        return ADDRESS.sub(swap, code)

    # -- the languages
    def run(self, snippet: Snippet) -> None:
        code = self.localise(snippet.code)
        if snippet.language == "sql":
            self.run_sql(code)
        elif snippet.language == "python":
            self.outputs[(snippet.page, snippet.number)] = self.run_process(
                [sys.executable, "-c", code], snippet.where
            )
        elif snippet.language == "sh":
            for command in commands(code):
                self.run_command(command, snippet)
        elif snippet.language == "toml" and snippet.title:
            tomllib.loads(code)
            (self.workdir / snippet.title).write_text(code)

    def run_sql(self, sql: str) -> None:
        url = make_url(self.dsn)
        conn = pymysql.connect(**pymysql_args(url), database=url.database, autocommit=True)
        with conn, conn.cursor() as cur:
            for statement in statements(sql):
                if statement.upper().startswith("SOURCE "):
                    for inner in statements((ROOT / statement.split(None, 1)[1]).read_text()):
                        cur.execute(inner)
                else:
                    cur.execute(statement)

    def run_process(self, argv: list[str], where: str) -> str:
        done = subprocess.run(
            argv,
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, (
            f"{where}: exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        )
        return done.stdout

    def run_command(self, command: str, snippet: Snippet) -> None:
        make_run = re.fullmatch(r'make run(?: ARGS="([^"]*)")?', command)
        if make_run:  # what make run runs, once installed
            args = make_run.group(1) or ""
            if "--listen" not in args:
                args += f" --listen {self.address()}"
            command = f".venv/bin/msgtable serve {args}"
        words = command.split()
        program = words[0].rsplit("/", 1)[-1] if words else ""
        if program == "msgtable" and words[1] in ("serve", "gateway"):
            self.start(command, snippet, serving=True)
        elif program == "msgtable" and words[1] == "tail" and "--count" not in words:
            self.start(command, snippet, serving=False)
        else:
            out = self.run_process(["bash", "-c", command], f"{snippet.where}: {command}")
            self.outputs[(snippet.page, snippet.number)] = out

    def start(self, command: str, snippet: Snippet, serving: bool) -> None:
        log = self.workdir / f"background-{len(self.running)}.log"
        out: IO[bytes] = log.open("wb")
        process = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=self.workdir,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        job = Background(command, process, log, for_good=not self.dsn)
        self.running.append(job)
        if not serving:
            return
        wait_until(
            lambda: "serving on" in job.output() or process.poll() is not None,
            timeout_s=START_TIMEOUT_S,
            what=f"{snippet.where}: {command} to serve",
        )
        assert process.poll() is None, f"{snippet.where}: {command} ended:\n{job.output()}"
        found = re.search(r"serving on \S+ \(database (mysql://\S+)\)", job.output())
        if found and not self.dsn:
            self.dsn = found.group(1)

    def end_of_page(self) -> None:
        for job in [j for j in self.running if not j.for_good]:
            job.stop()
            self.running.remove(job)

    def stop_all(self) -> None:
        for job in reversed(self.running):
            job.stop()
        self.running.clear()

    # -- what the checks read
    def sql(self, statement: str) -> list[tuple[Any, ...]]:
        url = make_url(self.dsn)
        conn = pymysql.connect(**pymysql_args(url), database=url.database, autocommit=True)
        with conn, conn.cursor() as cur:
            cur.execute(statement)
            return list(cur.fetchall())

    def client(self) -> Client:
        return Client(self.address())


@pytest.fixture
def reader(tmp_path: Path) -> Iterator[Reader]:
    workdir = tmp_path / "reader"
    workdir.mkdir()
    for name in (".venv", "schema"):  # a clone's directory, as the pages assume
        (workdir / name).symlink_to(ROOT / name)
    r = Reader(workdir)
    try:
        yield r
    finally:
        r.stop_all()


def acked(r: Reader, table: str) -> set[Any]:
    return {row[0] for row in r.sql(f"select id from {table} where time_acked is not null")}


# -- before a snippet: what the page's prose says a reader waits for ---------------------------
def capture_table_found(r: Reader) -> None:
    """'Once the server has found the table (msgtable tables lists it under "table events")'."""
    with r.client() as client:
        wait_until(
            lambda: any(
                t.name == "table_events" and t.capture_position and not t.capture_problem
                for t in client.list_tables()
            ),
            timeout_s=60,
            what="the server to follow the binlog for table_events",
        )


BEFORE: dict[tuple[str, str], Callable[[Reader], None]] = {
    ("how-to/table-events.md", "create table orders_eu"): capture_table_found,
}


# -- after a page: what it did is in the database ----------------------------------------------
def first_hour(r: Reader) -> None:
    assert acked(r, "my_message") >= {1, 2, 3, 4}
    text = page_text("tutorial/first-hour.md")
    sample = re.search(r"```text\n(msgtable: no DSN given.*?)```", text, re.S)
    assert sample, "the tutorial shows make run's output"
    printed = next(j for j in r.running if j.for_good).output()
    for line in sample.group(1).splitlines():
        if "receive:" in line:  # names this machine's path and the test's port
            continue
        shape = re.escape(re.sub(r"\d+", "0", line)).replace("0", r"\d+")
        assert re.search(shape, printed), f"make run no longer prints {line!r}:\n{printed}"


def python_app(r: Reader) -> None:
    assert {10, 12, 13, 15, 16, 17} <= acked(r, "my_message")
    assert r.sql("select count(*) from my_message where id = 14") == [(0,)]  # rolled back
    assert r.sql("select order_id from shipment") == [(15,)]
    assert any("shipped 15 acked 1" in out for out in r.outputs.values()), r.outputs


def settlement(r: Reader) -> None:
    assert r.sql("select epoch, last_error from payments where id = 1") == [(1, "not yet")]
    assert r.sql("select count(*) from payments_dead where id = 42") == [(0,)]  # redriven
    assert r.sql("select epoch from payments where id = 42") == [(0,)]


def subscriptions(r: Reader) -> None:
    with r.client() as client:
        subs = client.list_subscriptions("notifications")
    names = sorted(s.subscription for s in subs)
    assert names == ["audit", "billing", "shipping"]
    (shipping,) = [s for s in subs if s.subscription == "shipping"]
    assert shipping.limits == "rate 100/s (burst 10), max in flight 50"  # its own limits
    assert r.sql("select count(*) from notifications__shipping where time_acked is not null") == [
        (1,)
    ]


def flow_control(r: Reader) -> None:
    with r.client() as client:
        limits = {s.subscription: s.limits for s in client.list_subscriptions("api_calls")}
    assert limits == {"crm": "rate 10/s (burst 3), customer: at most 2 in flight", "report": ""}


def ordering(r: Reader) -> None:
    assert r.sql("select count(*) from order_events where time_acked is null") == [(0,)]


def table_events(r: Reader) -> None:
    kinds = [row[0] for row in r.sql("select kind from table_events order by id")]
    assert kinds == ["create", "insert", "update", "delete"]


def keyspaces(r: Reader) -> None:
    assert [s.name for s in load(r.workdir / "keyspace.toml").shards] == ["-80", "80-"]


AFTER: dict[str, Callable[[Reader], None]] = {
    "tutorial/first-hour.md": first_hour,
    "tutorial/python-app.md": python_app,
    "how-to/settlement.md": settlement,
    "how-to/subscriptions.md": subscriptions,
    "how-to/flow-control.md": flow_control,
    "how-to/ordering.md": ordering,
    "how-to/table-events.md": table_events,
    "how-to/keyspaces.md": keyspaces,
}


def page_text(page: str) -> str:
    return (DOCS / page).read_text()


def test_the_navigation_names_every_page_once():
    listed = pages()
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(listed) == on_disk
    assert len(set(listed)) == len(listed)


def test_the_snippets_not_run_are_few_and_say_why():
    not_run = [s for page in pages() for s in snippets(page) if "norun" in s.classes]
    assert len(not_run) <= MAX_NOT_RUN, [s.where for s in not_run]
    assert all(s.title for s in not_run), [s.where for s in not_run if not s.title]


def test_every_snippet_runs_as_pasted_in_the_order_of_the_pages(reader: Reader):
    ran = 0
    for page in pages():
        for snippet in snippets(page):
            if "norun" in snippet.classes:
                continue
            for (where, marker), wait in BEFORE.items():
                if where == page and marker in snippet.code:
                    wait(reader)
            reader.run(snippet)
            ran += 1
        reader.end_of_page()
        if page in AFTER:
            AFTER[page](reader)
    assert ran > 40, f"only {ran} snippets ran"
