"""The README's example runs as pasted and its links lead somewhere; and the examples the docs
pages hold that tests/acceptance/test_docs.py only runs are checked here for what they print
and leave behind: their SQL on a real database, their Python against a real server, their
files through the server's parsers.

The one thing swapped is an address: the examples name 127.0.0.1:50051 (and the grants the
tutorial's database `msgtable`), and the test's server listens on a free port. A snippet that
stops working, or an edit that breaks one, fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pymysql
from sqlalchemy.engine import make_url

from msgtable.cli.serve import create_demo_table
from msgtable.core.keyspace import load
from msgtable.core.tables import current_layout_ddl
from msgtable.server.auth import Authorizer
from msgtable.store.mysql import pymysql_args
from msgtable.testing import ServerHandle
from tests.integration.helpers import comment, serve
from tests.integration.test_gateway import keyspace_of

from .helpers import describe, wait_until

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
# a fence and its language: ```python, or ```{.python title="..."} as the docs write them
FENCE = re.compile(r"^( *)```\{?\.?(\w*)[^\n]*\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
README_MAX_LINES = 200
ADDRESS = "127.0.0.1:50051"


def snippets(language: str, section: str = "", page: str = "") -> list[str]:
    """The code blocks of ``language`` under the heading ``section`` (up to the next heading
    of its level or higher; "": all of them) of the README, or of the docs ``page``,
    unindented."""
    document = (DOCS / page).read_text() if page else README
    start = document.index(f"{section}\n") if section else 0
    level = section.split(" ")[0]
    end = document.find(f"\n{level} ", start + len(section)) if section else -1
    text = document[start : end if end >= 0 else None]
    out = []
    for indent, lang, code in FENCE.findall(text):
        if lang == language:
            out.append("".join(line[len(indent) :] + "\n" for line in code.splitlines()))
    return out


def statements(sql: str) -> list[str]:
    """A mysql-client script's statements (``;`` ends one; ``--`` lines are comments)."""
    lines = [line for line in sql.splitlines() if not line.strip().startswith("--")]
    code = re.sub(r"\s--\s.*$", "", "\n".join(lines), flags=re.MULTILINE)
    return [s.strip() for s in code.split(";") if s.strip()]


def run_sql(dsn: str, sql: str) -> None:
    """Run a script as the mysql client would, from a clone's directory (``SOURCE file``
    runs the file's statements)."""
    args = pymysql_args(make_url(dsn))
    conn = pymysql.connect(**args, database=make_url(dsn).database, autocommit=True)
    with conn, conn.cursor() as cur:
        for statement in statements(sql):
            if statement.upper().startswith("SOURCE "):
                for inner in statements((ROOT / statement.split(None, 1)[1]).read_text()):
                    cur.execute(inner)
            else:
                cur.execute(statement)


def run_python(code: str, address: str) -> subprocess.CompletedProcess[str]:
    assert ADDRESS in code, code
    return subprocess.run(
        [sys.executable, "-c", code.replace(ADDRESS, address)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_readme_is_short_and_says_the_two_set_up_commands():
    lines = README.splitlines()
    assert len(lines) <= README_MAX_LINES, f"the README has {len(lines)} lines"
    (setup,) = snippets("sh", "## Set-up on a fresh machine")
    assert [line.split()[:2] for line in setup.splitlines()] == [["make", "run"], ["make", "test"]]


def test_every_link_of_the_readme_leads_to_a_file_of_the_repository():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    assert links, "the README links its docs pages"
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert not missing, f"README links to nothing: {missing}"


def test_the_readme_example_runs_as_pasted(db_dsn: str):
    (example,) = snippets("python", "## From INSERT to ack")
    create_demo_table(db_dsn)  # what make run makes
    with serve(db_dsn) as s:
        env = dict(os.environ, MSGTABLE_DSN=db_dsn, MSGTABLE_SERVER=s.server.address)
        done = subprocess.run(
            [sys.executable, "-c", example], capture_output=True, text=True, env=env, timeout=60
        )
        assert done.returncode == 0, describe(done)
        assert done.stdout.splitlines() == ["{'id': 1001, 'message': 'hello from the README'}"], (
            describe(done)
        )
        assert s.sql("select time_acked is not null from my_message where id = 1001") == [(1,)]


def test_the_grants_run_as_pasted(mysql_server: ServerHandle):
    (grants,) = snippets("sql", "## The database user", page="how-to/mysql-mariadb.md")
    admin = mysql_server.dsn("mysql")
    run_sql(admin, "DROP USER IF EXISTS 'mq'@'%'")
    mysql_server.drop_database("msgtable")
    mysql_server.create_database("msgtable")  # the tutorial's database the grants name
    try:
        run_sql(admin, grants)
        shown = pymysql.connect(**pymysql_args(make_url(admin)))
        with shown, shown.cursor() as cur:
            cur.execute("SHOW GRANTS FOR 'mq'@'%'")
            text = " ".join(row[0] for row in cur.fetchall())
        for grant in (
            "SELECT, UPDATE, DELETE ON `msgtable`.*",
            "INSERT ON `msgtable`.`msgtable_placement`",
        ):
            assert grant in text, text
        # MariaDB 10.5+ shows REPLICATION CLIENT by its new name, BINLOG MONITOR
        assert re.search(r"REPLICATION SLAVE, (REPLICATION CLIENT|BINLOG MONITOR) ON \*\.\*", text)
    finally:
        run_sql(admin, "DROP USER IF EXISTS 'mq'@'%'")
        mysql_server.drop_database("msgtable")


def test_the_auth_file_example_is_one_the_server_takes():
    (toml,) = snippets("toml", page="how-to/security.md")
    authorizer = Authorizer.from_dict(tomllib.loads(toml))
    assert authorizer.allows("billing", "subscribe", "invoice_2026")
    assert not authorizer.allows("billing", "list", "invoice_2026")
    assert authorizer.allows("ops", "list", "anything")


def test_the_ordering_example_and_its_schema_file_run_as_pasted(db_dsn: str):
    (sql,) = snippets("sql", page="how-to/ordering.md")
    (example,) = snippets("python", page="how-to/ordering.md")
    ddl, *_inserts = statements(sql)
    schema = statements((ROOT / "schema" / "ordered.sql").read_text())
    assert [x.replace("if not exists ", "") for x in schema] == [ddl], (
        "schema/ordered.sql is the page's DDL"
    )
    run_sql(db_dsn, sql)
    with serve(db_dsn) as s:
        done = run_python(example, s.server.address)
        assert done.returncode == 0, describe(done)
        lines = done.stdout.splitlines()
        assert sorted(lines) == sorted(["o-1 created", "o-1 paid", "o-1 shipped", "o-2 created"]), (
            describe(done)
        )
        assert [x for x in lines if x.startswith("o-1")] == [
            "o-1 created",
            "o-1 paid",
            "o-1 shipped",
        ]
        (t,) = [t for t in s.client.list_tables() if t.name == "order_events"]
        assert t.config is not None and (t.config.order_key, t.config.order_by) == (
            "order_id",
            "id",
        )
        assert s.sql("select count(*) from order_events where time_acked is null")[0][0] == 0


def test_the_table_events_example_and_its_schema_file_run_as_pasted(db_dsn: str, flavour: str):
    ddl_sql, changes = snippets("sql", page="how-to/table-events.md")
    (example,) = snippets("python", page="how-to/table-events.md")
    schema = statements((ROOT / "schema" / "events.sql").read_text())
    assert [x.replace("if not exists ", "") for x in schema] == statements(ddl_sql), (
        "schema/events.sql is the page's DDL"
    )
    with serve(db_dsn) as s:
        run_sql(db_dsn, ddl_sql)
        s.engine.refresh()  # the server finds the capture table (as discovery would)
        assert s.engine.capture is not None
        wait_until(s.engine.capture.following.is_set, what="the capture follower")
        run_sql(db_dsn, changes)
        done = run_python(example, s.server.address)
        assert done.returncode == 0, describe(done)
        assert done.stdout.splitlines() == ["create orders_eu"], describe(done)
        wait_until(
            lambda: s.sql("select count(*) from table_events")[0][0] == 4,
            what="the four events of the example",
        )
        rows = s.sql(
            "select kind, pk, row_key, before_values, after_values from table_events "
            "where kind = 'update'"
        )
        before, after = (
            '{"id": 1, "item": "apple", "qty": 2}',
            '{"id": 1, "item": "apple", "qty": 3}',
        )
        if flavour == "mysql":  # README: MySQL's JSON columns come back keys shortest first
            before, after = (
                '{"id": 1, "qty": 2, "item": "apple"}',
                '{"id": 1, "qty": 3, "item": "apple"}',
            )
            assert before in (DOCS / "how-to" / "table-events.md").read_text()
        assert [tuple(r) for r in rows] == [
            ("update", '{"id": 1}', 'orders_eu:{"id": 1}', before, after)
        ]
        (t,) = [t for t in s.client.list_tables() if t.name == "table_events"]
        assert t.config is not None and t.config.capture == ("orders_*", "customers")
        assert t.config.order_key == "row_key"


def test_the_metrics_section_lists_every_family_the_server_serves(db_dsn: str):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from msgtable.observe.metrics import registry_for

    section = (DOCS / "reference" / "metrics.md").read_text()
    listed = set(re.findall(r"^\| `(msgtable_\w+)` \| (\w+)", section, re.MULTILINE))
    with serve(db_dsn, follow_binlog=True) as s:
        s.create_table("my_message")
        wait_until(lambda: s.engine.live_statuses(), what="the table loaded")
        assert s.engine.binlog is not None
        wait_until(s.engine.binlog.following.is_set, what="the binlog follower to start")
        text = generate_latest(registry_for(s.engine, streams=lambda: 0)).decode()
    served = {
        (f.name + "_total" if f.type == "counter" else f.name, f.type)
        for f in text_string_to_metric_families(text)
    }
    # push families are there, empty, without an endpoint; the capture lag only with one
    missing = served - listed
    assert not missing, f"served but not in docs/reference/metrics.md: {sorted(missing)}"
    # served only with what the page says they need, each tested where it is made: the
    # capture lag with a capture table, the schedules' with a schedule (tests/integration/
    # test_schedules.py), the SQS API's with --sqs-listen (tests/acceptance/test_sqs_boto3.py)
    conditional = {"msgtable_capture_lag_seconds", "msgtable_sqs_requests_total"}
    conditional |= {"msgtable_sqs_receives_waiting", "msgtable_schedule_ticks_total"}
    conditional |= {f"msgtable_schedule_{x}_seconds" for x in ("next_tick", "last_tick")}
    conditional |= {"msgtable_schedule_late_p99_seconds"}
    unserved = {name for name, _ in listed - served} - conditional
    assert not unserved, f"in docs/reference/metrics.md but not served: {sorted(unserved)}"


def test_the_keyspace_example_runs_as_pasted(mysql_server: ServerHandle, db_name: str, tmp_path):
    (file_example,) = snippets("toml", page="how-to/keyspaces.md")
    code, ordering = snippets("python", page="how-to/keyspaces.md")
    (tmp_path / "example.toml").write_text(file_example)
    example = load(tmp_path / "example.toml")  # the example file is one the loader takes
    assert [s.name for s in example.shards] == ["-80", "80-"]
    with keyspace_of(mysql_server, db_name, 2, tables=("my_message",)) as c:
        doc = tomllib.loads(file_example)  # the example's shape, the test's shards
        for entry, shard in zip(doc["shards"], c.keyspace.shards, strict=True):
            assert entry["key_range"] == shard.name
            entry["dsn"], entry["servers"] = shard.dsn, list(shard.servers)
        (tmp_path / "keyspace.toml").write_text(
            f'name = "{doc["name"]}"\n'
            + "".join(
                f'[[shards]]\nkey_range = "{e["key_range"]}"\ndsn = "{e["dsn"]}"\n'
                f"servers = {e['servers']!r}\n".replace("'", '"')
                for e in doc["shards"]
            )
        )
        run_in(tmp_path, code)
        acked = c.acked("my_message")
        assert sorted(i for ids in acked.values() for i in ids) == list(range(1, 11))
        for shard, ids in acked.items():  # each in the shard its id hashes to
            assert all(c.keyspace.shard_of(i).name == shard for i in ids)

        # the ordering example, with what it names set up before it (an ordered table)
        keyed = "k varchar(64), index order_idx (k, time_acked, id)"
        ddl = current_layout_ddl("order_events", comment(vt_order_key="k"))
        for shard in c.shards.values():
            shard.sql(ddl.replace("  primary key(id)", f"  {keyed},\n  primary key(id)"))
        before = (
            "from msgtable.core.keyspace import load\n"
            "from msgtable.enqueue.sharded import ShardedEnqueue\n"
            'keyspace = load("keyspace.toml")\n'
            "shards = ShardedEnqueue(keyspace)\n"
            'events = [("customer-3", "paid"), ("customer-4", "sent"), ("customer-3", "shipped")]\n'
        )
        run_in(tmp_path, before + ordering + "shards.close()\n")
        for key, texts in (("customer-3", ["paid", "shipped"]), ("customer-4", ["sent"])):
            home = c.shards[c.keyspace.shard_of_key(key).name]
            rows = home.sql("SELECT id, message FROM order_events WHERE k = :k ORDER BY id", k=key)
            assert [r[1] for r in rows] == texts  # the whole key in its shard, in order


def run_in(directory: Path, code: str) -> None:
    """Run Python ``code`` in ``directory`` (where its files are); it must exit 0."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=directory,
    )
    assert done.returncode == 0, describe(done)
