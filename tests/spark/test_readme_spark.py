"""The Spark page's example (docs/how-to/spark.md) runs as pasted (its database URL and server
address swapped for the test's): a batch read, a bulk enqueue both ways, and a stream defined on
a live server. The docs' own test cannot run it (no Spark there): this one does."""

from __future__ import annotations

import contextlib
import io

from msgtable.cli.serve import create_demo_table

from ..acceptance.test_readme import snippets
from ..integration.helpers import serve

DSN = "mysql://msgtable:msgtable@127.0.0.1:3306/msgtable"
ADDRESS = "127.0.0.1:50051"


def test_the_spark_example_runs_as_pasted(spark, db_dsn):
    (code,) = snippets("python", page="how-to/spark.md")
    assert DSN in code and ADDRESS in code, code
    create_demo_table(db_dsn)
    with serve(db_dsn) as s:
        s.sql("insert into my_message(id, message) values (1, 'one'), (2, 'two')")
        s.engine.refresh()
        printed = io.StringIO()
        names: dict[str, object] = {}
        with contextlib.redirect_stdout(printed):
            exec(code.replace(DSN, db_dsn).replace(ADDRESS, s.server.address), names)
        assert printed.getvalue() == "2 rows, 2 due\n"
        assert [r[0] for r in s.sql("select id from my_message order by id")] == [
            1,
            2,
            100,
            101,
            200,
            201,
        ]
        assert names["stream"].isStreaming  # type: ignore[attr-defined]
