"""The schema files users copy (schema/*.sql) run one after another on the database `make run`
serves, in the order the docs give them, and again: each has tables of its own (or the demo's
own DDL), and each statement is CREATE TABLE IF NOT EXISTS, so no file fails on a table an
earlier example made (a newcomer met ERROR 1050 from schema/dead_letter.sql)."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from msgtable.cli.serve import create_demo_table

from .helpers import serve

SCHEMA = Path(__file__).parents[2] / "schema"
# the order the docs name them in: the tutorial's table, then the how-to guides
ORDER = (
    "current.sql",
    "v2018.sql",
    "dead_letter.sql",
    "ordered.sql",
    "events.sql",
    "dedup.sql",
    "msgtable_placement.sql",
    "msgtable_schedules.sql",
)


def statements(path: Path) -> list[str]:
    text = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("--"))
    return [s.strip() for s in text.split(";") if s.strip()]


def test_every_schema_file_is_in_the_order_and_runs_after_the_others_and_again(db_dsn: str):
    assert sorted(ORDER) == sorted(p.name for p in SCHEMA.glob("*.sql")), "a new file: order it"
    create_demo_table(db_dsn)  # what make run's throwaway database begins with
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    try:
        for _ in range(2):
            for name in ORDER:
                with db.connect() as conn:
                    for statement in statements(SCHEMA / name):
                        conn.exec_driver_sql(statement)
    finally:
        db.dispose()
    with serve(db_dsn) as s:
        tables = {t.name: t for t in s.client.list_tables()}
    for name in ("my_message", "old_message", "refunds", "refunds_dead", "order_events"):
        assert tables[name].loaded, (name, tables[name].load_error)
    for name in ("table_events", "order_jobs"):
        assert tables[name].loaded, (name, tables[name].load_error)
