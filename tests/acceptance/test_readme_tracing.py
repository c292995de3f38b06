"""The tracing example (docs/how-to/observe.md, Tracing) runs as pasted: its DDL on a real
database, its producer and consumer example against a real server, printing each span and its
parent."""

from __future__ import annotations

from msgtable.cli.serve import create_demo_table
from tests.integration.helpers import serve

from .helpers import describe
from .test_readme import run_python, run_sql, snippets

DSN = 'DSN = "mysql+pymysql://msgtable:msgtable@127.0.0.1:3306/msgtable"'


def test_the_tracing_example_runs_as_pasted(db_dsn: str):
    (ddl,) = snippets("sql", "## Tracing", page="how-to/observe.md")
    (example,) = snippets("python", "## Tracing", page="how-to/observe.md")
    assert DSN in example
    create_demo_table(db_dsn)
    run_sql(db_dsn, ddl)
    with serve(db_dsn) as s:
        done = run_python(example.replace(DSN, f"DSN = {db_dsn!r}"), s.server.address)
        assert done.returncode == 0, describe(done)
        lines = done.stdout.splitlines()
        assert sorted(line for line in lines if line.startswith("handling")) == [
            "handling paid",
            "handling shipped",
        ], describe(done)
        spans = sorted(line for line in lines if "<-" in line)
        assert spans == [
            "checkout <- None",
            "handle <- process my_message",
            "handle <- process my_message",
            "process my_message <- checkout",
            "process my_message <- send my_message",
            "send my_message <- checkout",
        ], describe(done)
        rows = s.sql("select id, traceparent is not null, time_acked is not null from my_message")
        assert sorted(tuple(r) for r in rows) == [(20, 1, 1), (21, 1, 1)]
