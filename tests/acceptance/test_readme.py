"""The README's snippets run as pasted: its SQL on a real database, its Python client examples
against a real server, its auth file through the server's parser.

The one thing swapped is an address: the examples name 127.0.0.1:50051 (and the grants the
database `app`), and the test's server listens on a free port. A snippet that stops working,
or a README edit that breaks one, fails here.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pymysql
import pytest
from sqlalchemy.engine import make_url

from msgtable.cli.serve import create_demo_table
from msgtable.core.keyspace import load
from msgtable.core.tables import current_layout_ddl, load_table
from msgtable.server.auth import Authorizer
from msgtable.store.mysql import pymysql_args
from msgtable.store.mysqlstore import MySQLStore
from msgtable.testing import ServerHandle
from tests.integration.helpers import comment, serve
from tests.integration.test_gateway import keyspace_of

from .helpers import describe, wait_until

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
ADDRESS = "127.0.0.1:50051"


def snippets(language: str, section: str) -> list[str]:
    """The code blocks of ``language`` under the README's heading ``section`` (up to the
    next heading of its level or higher), unindented."""
    start = README.index(f"{section}\n")
    level = section.split(" ")[0]
    end = README.find(f"\n{level} ", start + len(section))
    text = README[start : end if end >= 0 else None]
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


def test_the_walkthrough_and_the_python_examples_run_as_pasted(db_dsn: str):
    walkthrough = snippets("sql", "## Five minutes with msgtable")
    enqueue, ack = walkthrough
    worker, batches = snippets("python", "### Python client")
    create_demo_table(db_dsn)  # what msgtable serve makes without a DSN
    with serve(db_dsn, follow_binlog=True) as s:
        run_sql(db_dsn, enqueue)
        assert [r[0] for r in s.sql("select id from my_message order by id")] == [1, 2, 3, 4]

        done = run_python(worker, s.server.address)
        assert done.returncode == 0, describe(done)
        handled = [line for line in done.stdout.splitlines() if line.startswith("handling")]
        assert handled == [
            "handling {'id': 1, 'message': 'hello world'}",
            "handling {'id': 2, 'message': 'two'}",
            "handling {'id': 3, 'message': 'three'}",
        ], describe(done)
        assert "my_message True" in done.stdout, describe(done)  # the table's line

        s.sql("update my_message set time_next = 0 where id = 4")  # due now, not in 10 s
        done = run_python(batches, s.server.address)
        assert done.returncode == 0, describe(done)
        assert done.stdout.splitlines() == ["handling 1 messages", "1 1"], describe(done)

        run_sql(db_dsn, ack)  # the DML ack acks what is left: none of the four comes again
        assert s.sql("select count(*) from my_message where time_acked is null")[0][0] == 0
        wait_until(  # the binlog shows the server this DML ack, which ACKED counts
            lambda: s.client.list_tables()[0].acked >= 4, what="the DML ack counted"
        )


def test_the_message_table_ddl_runs_as_pasted_and_loads(db_dsn: str):
    (ddl,) = snippets("sql", "## Message tables")
    run_sql(db_dsn, ddl)
    store = MySQLStore.from_dsn(db_dsn)
    try:
        (d,) = store.discover()
    finally:
        store.close()
    cfg = load_table(d.name, d.comment, d.columns, d.unique_indexes)
    assert [c.name for c in cfg.message_columns] == ["id", "message"]


def test_the_grants_run_as_pasted(mysql_server: ServerHandle):
    (grants,) = snippets("sql", "### Security")
    admin = mysql_server.dsn("mysql")
    run_sql(admin, "DROP USER IF EXISTS 'mq'@'%'")
    mysql_server.drop_database("app")
    mysql_server.create_database("app")  # the application's database the grants name
    try:
        run_sql(admin, grants)
        shown = pymysql.connect(**pymysql_args(make_url(admin)))
        with shown, shown.cursor() as cur:
            cur.execute("SHOW GRANTS FOR 'mq'@'%'")
            text = " ".join(row[0] for row in cur.fetchall())
        for grant in ("SELECT, UPDATE, DELETE ON `app`.*", "INSERT ON `app`.`msgtable_placement`"):
            assert grant in text, text
        # MariaDB 10.5+ shows REPLICATION CLIENT by its new name, BINLOG MONITOR
        assert re.search(r"REPLICATION SLAVE, (REPLICATION CLIENT|BINLOG MONITOR) ON \*\.\*", text)
    finally:
        run_sql(admin, "DROP USER IF EXISTS 'mq'@'%'")
        mysql_server.drop_database("app")


@pytest.mark.parametrize("section", ["### Security"])
def test_the_auth_file_example_is_one_the_server_takes(section: str):
    (toml,) = snippets("toml", section)
    authorizer = Authorizer.from_dict(tomllib.loads(toml))
    assert authorizer.allows("billing", "subscribe", "invoice_2026")
    assert not authorizer.allows("billing", "list", "invoice_2026")
    assert authorizer.allows("ops", "list", "anything")


def test_the_settlement_example_and_its_dml_run_as_pasted(db_dsn: str):
    (example,) = snippets("python", "## Settlement and dead letters")
    (dml,) = snippets("sql", "## Settlement and dead letters")
    create_demo_table(db_dsn)
    with serve(db_dsn) as s:
        s.sql("insert into my_message(id, message) values (1, 'later')")
        done = run_python(example, s.server.address)
        assert done.returncode == 0, describe(done)
        assert done.stdout.splitlines() == ["0 []"], describe(done)
        (row,) = s.sql(
            "select epoch, time_acked, time_next > unix_timestamp() * 1e9 from my_message"
        )
        assert tuple(row) == (1, None, 1)  # released: counted, due in a minute

    # the DML, on the tables of schema/dead_letter.sql, message 42 received at attempt 1
    with serve(db_dsn) as s:
        s.sql("drop table my_message")
        run_sql(db_dsn, "SOURCE schema/dead_letter.sql")
        s.sql("insert into my_message(id, message, epoch, time_next) values (42, 'm', 0, 0)")
        release, renew, *reject_moved, reject_in_place = statements(dml)
        run_sql(db_dsn, release)
        (row,) = s.sql(
            "select epoch, last_error, time_next > unix_timestamp() * 1e9 from my_message"
        )
        assert tuple(row) == (1, "upstream timeout", 1)
        run_sql(db_dsn, renew)
        run_sql(db_dsn, ";".join(reject_moved))
        assert s.sql("select count(*) from my_message")[0][0] == 0
        (dead,) = s.sql("select id, attempts, last_error, message, epoch from my_message_dead")
        assert tuple(dead) == (42, 1, "bad payload", "m", 0)
        s.sql("insert into my_message(id, message) values (42, 'again')")
        run_sql(db_dsn, reject_in_place)
        (row,) = s.sql("select epoch, time_next, last_error from my_message")
        assert tuple(row) == (1, 9223372036854775807, "bad payload")
        wait_until(
            lambda: [d.id for d in s.client.dead_letters("my_message_dead")[0]] == [42],
            what="the dead letter listed",
        )


def test_the_subscriptions_example_and_its_sql_run_as_pasted(db_dsn: str):
    (example,) = snippets("python", "## Subscriptions")
    (sql,) = snippets("sql", "## Subscriptions")
    create_demo_table(db_dsn)
    with serve(db_dsn, follow_binlog=True) as s:
        done = run_python(example, s.server.address)
        assert done.returncode == 0, describe(done)
        assert done.stdout.splitlines() == [
            "('id', 'message')",
            "audit active 0 True",
            "billing active 0 True",
        ], describe(done)

    # the SQL, on a fresh demo table: a subscription the server loads and serves
    run_sql(
        db_dsn,
        "drop table my_message; drop table my_message__billing; "
        "drop table my_message__audit; drop table msgtable_subscriptions",
    )
    create_demo_table(db_dsn)
    *create, ack, _drop_row, _drop_table = statements(sql)
    run_sql(db_dsn, ";".join(create))
    with serve(db_dsn, follow_binlog=True) as s:
        wait_until(
            lambda: (
                [t.subscription for t in s.client.list_subscriptions("my_message")] == ["reports"]
            ),
            what="the subscription created by SQL loaded",
        )
        s.sql("insert into my_message(id, message) values (7, 'seven'), (8, 'eight')")
        wait_until(
            lambda: s.sql("select count(*) from my_message__reports")[0][0] == 2,
            what="the two messages handed to reports",
        )
        run_sql(db_dsn, ack)
        sub = s.client.subscribe("my_message", subscription="reports", retry=False)
        try:
            (m,) = sub.next_batch()
            assert m.id == 8  # 7 was acked by the DML
        finally:
            sub.close()
        run_sql(db_dsn, ";".join([_drop_row, _drop_table]))
        assert s.sql("show tables like 'my_message__reports'") == []


def test_the_ordering_example_and_its_schema_file_run_as_pasted(db_dsn: str):
    (sql,) = snippets("sql", "## Ordering per key")
    (example,) = snippets("python", "## Ordering per key")
    ddl, *_inserts = statements(sql)
    schema = statements((ROOT / "schema" / "ordered.sql").read_text())
    assert schema == [ddl], "schema/ordered.sql is the README's DDL"
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
    ddl_sql, changes = snippets("sql", "## Table events")
    (example,) = snippets("python", "## Table events")
    schema = statements((ROOT / "schema" / "events.sql").read_text())
    assert schema == statements(ddl_sql), "schema/events.sql is the README's DDL"
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
            assert before in README
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

    (section,) = [README[README.index("## Metrics\n") :].split("\n## ", 1)[0]]
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
    assert not missing, f"served but not in the README: {sorted(missing)}"
    unserved = {name for name, _ in listed - served} - {"msgtable_capture_lag_seconds"}
    assert not unserved, f"in the README but not served: {sorted(unserved)}"


def test_the_asyncio_client_example_runs_as_pasted(db_dsn: str):
    (example,) = snippets("python", "### asyncio client")
    create_demo_table(db_dsn)
    with serve(db_dsn) as s:
        s.sql("insert into my_message(id, message) values (1, 'hello world')")
        done = run_python(example, s.server.address)
        assert done.returncode == 0, describe(done)
        assert done.stdout.splitlines() == [
            "handling {'id': 1, 'message': 'hello world'}",
            "['my_message']",
        ], describe(done)
        assert s.sql("select time_acked is not null from my_message")[0][0] == 1


def test_the_sqlalchemy_enqueue_example_runs_as_pasted(db_dsn: str):
    (example,) = snippets("python", "### Enqueue from SQLAlchemy")
    dsn = 'DSN = "mysql+pymysql://root@127.0.0.1:3306/app"'
    assert dsn in example
    create_demo_table(db_dsn)
    done = subprocess.run(
        [sys.executable, "-c", example.replace(dsn, f"DSN = {db_dsn!r}")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, describe(done)
    with serve(db_dsn) as s:
        rows = s.sql("select id, message, priority, time_next > 0 from my_message order by id")
        assert [tuple(r) for r in rows] == [
            (10, "paid", 0, 0),
            (11, "remind", 1, 1),
            (12, "a", 0, 0),
            (13, "b", 0, 0),
        ]


def test_the_keyspace_example_runs_as_pasted(mysql_server: ServerHandle, db_name: str, tmp_path):
    (file_example,) = snippets("toml", "### Keyspaces of shards")
    code, ordering = snippets("python", "### Keyspaces of shards")
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
