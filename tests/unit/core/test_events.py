"""Table events, the pure part: patterns and kinds, values as JSON, row keys, the tables a
DDL statement names, and a capture table's comment fields and columns."""

from __future__ import annotations

import datetime
import decimal
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msgtable.core.events import (
    KINDS,
    ROW_KEY_MAX,
    Capture,
    ddl_tables,
    excluded,
    json_value,
    parse_kinds,
    parse_patterns,
    pk_of,
    primary_key_columns,
    row_json,
    row_key,
)
from msgtable.core.tables import Column, load_table
from msgtable.errors import TableLoadError
from msgtable.testing import CURRENT_COLUMNS

EVENT_COLUMNS = (
    *CURRENT_COLUMNS[:-1],
    Column("source_table", "varchar", "varchar(64)"),
    Column("kind", "varchar", "varchar(16)"),
    Column("pk", "longtext", "longtext"),
    Column("row_key", "varchar", "varchar(255)"),
    Column("before_values", "longtext", "longtext"),
    Column("after_values", "longtext", "longtext"),
    Column("time_commit", "bigint", "bigint(20)"),
    Column("position", "varchar", "varchar(255)"),
)
BASE = (
    "vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=10,"
    "vt_cache_size=10000,vt_poller_interval=30"
)


def capture(patterns: str, kinds: str | None = None) -> Capture:
    p, wrong = parse_patterns(patterns)
    k, wrong_kinds = parse_kinds(kinds)
    assert not wrong and not wrong_kinds
    return Capture(p, k)


# -- patterns and kinds -------------------------------------------------------------------------
def test_patterns_match_whole_names_with_star_and_question_mark():
    c = capture("orders_*|customers|log_?")
    assert c.wants_table("orders_") and c.wants_table("orders_2026_eu")
    assert c.wants_table("customers") and c.wants_table("log_1")
    assert not c.wants_table("customers_old") and not c.wants_table("old_orders_1")
    assert not c.wants_table("log_12") and not c.wants_table("Orders_1")


def test_pattern_characters_other_than_the_wildcards_are_literal():
    c = Capture(("a.b", "x[1]", "p+q"), frozenset(KINDS))  # (a dot is refused when loaded)
    assert not c.wants_table("axb") and not c.wants_table("x1") and not c.wants_table("ppq")
    c = capture("x[1]|p+q|a(b)|^$")
    assert c.wants_table("^$")
    assert c.wants_table("x[1]") and c.wants_table("p+q") and c.wants_table("a(b)")


@pytest.mark.parametrize(
    "raw",
    ["", "  ", "a||b", "|", "x" * 65, "db.orders", "`orders`", "a/b", "a\\b", "a\nb"],
)
def test_a_bad_pattern_is_one_problem(raw: str):
    _, wrong = parse_patterns(raw)
    assert wrong and all("vt_capture" in w for w in wrong)


def test_kinds_default_to_all_and_are_checked():
    assert parse_kinds(None) == (frozenset(KINDS), [])
    assert parse_kinds("Create|drop") == (frozenset({"create", "drop"}), [])
    for raw in ("", "insert|upsert", "insert,delete", "|"):
        _, wrong = parse_kinds(raw)
        assert wrong and "vt_capture_kinds" in wrong[0]


def test_a_capture_wants_a_kind_of_a_table():
    c = capture("orders_*", "create")
    assert c.wants("orders_1", "create")
    assert not c.wants("orders_1", "insert") and not c.wants("customers", "create")


def test_msgtable_own_tables_are_never_captured():
    assert excluded("msgtable_capture") and excluded("msgtable_lease") and excluded("MSGTABLE_x")
    assert not excluded("orders")


# -- values -----------------------------------------------------------------------------------
def test_values_become_json_that_loses_nothing():
    values = {
        "i": 12345678901234567,
        "d": decimal.Decimal("12345678901234567890.123456789"),
        "f": 1.5,
        "dt": datetime.datetime(2026, 11, 23, 21, 48, 35, 123456),
        "date": datetime.date(2026, 2, 28),
        "t": datetime.timedelta(hours=-838, minutes=-59, seconds=-59),
        "t2": datetime.timedelta(hours=25, microseconds=5),
        "b": b"\x00\xff'\"",
        "s": "héllo 'quoted' \"and\" `back`",
        "n": None,
        "set": {"b", "a"},
        "j": {b"k": [1, None, {"x": decimal.Decimal("1.0")}]},
        "nan": float("nan"),
    }
    out = json.loads(row_json(values))
    assert out == {
        "i": 12345678901234567,
        "d": "12345678901234567890.123456789",
        "f": 1.5,
        "dt": "2026-11-23T21:48:35.123456",
        "date": "2026-02-28",
        "t": "-838:59:59",
        "t2": "25:00:00.000005",
        "b": "AP8nIg==",
        "s": "héllo 'quoted' \"and\" `back`",
        "n": None,
        "set": ["a", "b"],
        "j": {"k": [1, None, {"x": "1.0"}]},
        "nan": None,
    }
    assert json_value(memoryview(b"ab")) == "YWI="


def test_the_primary_key_and_row_key():
    assert primary_key_columns("id") == ("id",)
    assert primary_key_columns(("a", "b")) == ("a", "b")
    assert primary_key_columns("") == () and primary_key_columns(None) == ()
    row = {"a": 1, "b": "x", "c": 3}
    assert json.loads(pk_of(row, ("a", "b")) or "") == {"a": 1, "b": "x"}
    assert pk_of(row, ()) is None
    assert row_key("t", '{"a": 1}') == 't:{"a": 1}'
    assert row_key("t", None) == "t"
    long = row_key("t", json.dumps({"k": "x" * 300}))
    assert long.startswith("t:sha256:") and len(long) <= ROW_KEY_MAX
    assert long != row_key("t", json.dumps({"k": "y" * 300}))


# -- DDL ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        ("CREATE TABLE orders_1 (id int primary key)", [("create", (("db", "orders_1"),))]),
        ("create table if not exists `odd``name` (id int)", [("create", (("db", "odd`name"),))]),
        ("CREATE OR REPLACE TABLE other.t (id int)", [("create", (("other", "t"),))]),
        ("create table `s`.`t t` like x", [("create", (("s", "t t"),))]),
        ("/* lead */ -- c\nCREATE # hash\n TABLE t(id int)", [("create", (("db", "t"),))]),
        ("create temporary table t (id int)", []),
        ("alter table t add column x int", [("alter", (("db", "t"),))]),
        ("ALTER ONLINE IGNORE TABLE IF EXISTS d.t ENGINE=InnoDB", [("alter", (("d", "t"),))]),
        (
            "DROP TABLE IF EXISTS `a`, b, `c`.`d` /* generated by server */",
            [("drop", (("db", "a"),)), ("drop", (("db", "b"),)), ("drop", (("c", "d"),))],
        ),
        ("drop temporary table t", []),
        (
            "RENAME TABLE a TO b, c.d TO c.e",
            [("rename", (("db", "a"), ("db", "b"))), ("rename", (("c", "d"), ("c", "e")))],
        ),
        ("truncate table t", [("truncate", (("db", "t"),))]),
        ("TRUNCATE t", [("truncate", (("db", "t"),))]),
        ("create index i on t(x)", []),
        ("create view v as select 1", []),
        ("BEGIN", []),
        ("insert into t values (1)", []),
        ("", []),
        ("/*!40000 ALTER TABLE `t` DISABLE KEYS */", [("alter", (("db", "t"),))]),
        ("create table ünïcödé (id int)", [("create", (("db", "ünïcödé"),))]),
    ],
)
def test_ddl_table_names(statement: str, expected: list):
    assert ddl_tables(statement, "db") == expected


# -- a capture table's definition ----------------------------------------------------------------
def load(fields: str, columns=EVENT_COLUMNS):
    return load_table("events", BASE + fields, columns, (("id",),))


def test_a_capture_table_loads_its_patterns_and_kinds():
    cfg = load(",vt_capture=orders_*|customers,vt_capture_kinds=insert|create")
    assert cfg.capture == Capture(("orders_*", "customers"), frozenset({"insert", "create"}))
    assert load(",vt_capture=t").capture == Capture(("t",), frozenset(KINDS))
    assert load("").capture is None


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        (",vt_capture=", "vt_capture must name"),
        (",vt_capture=a||b", "empty pattern"),
        (",vt_capture=t,vt_capture_kinds=upsert", "vt_capture_kinds='upsert'"),
        (",vt_capture_kinds=insert", "vt_capture_kinds needs vt_capture"),
    ],
)
def test_a_bad_capture_field_is_a_load_error_naming_it(fields: str, problem: str):
    with pytest.raises(TableLoadError, match="table events: .*" + problem.replace("|", r"\|")):
        load(fields)


def test_a_missing_or_mistyped_event_column_is_named():
    columns = [c for c in EVENT_COLUMNS if c.name not in ("row_key", "position")]
    with pytest.raises(TableLoadError, match="missing event column row_key, position"):
        load(",vt_capture=t", columns)
    columns = [Column("kind", "int", "int(11)") if c.name == "kind" else c for c in EVENT_COLUMNS]
    with pytest.raises(TableLoadError, match="column kind cannot be int"):
        load(",vt_capture=t", columns)


@settings(max_examples=2000, deadline=None, database=None)
@given(st.text(max_size=100), st.one_of(st.none(), st.text(max_size=40)))
def test_any_capture_field_loads_or_is_one_load_error_naming_it(patterns: str, kinds):
    fields = ",vt_capture=" + patterns + ("" if kinds is None else ",vt_capture_kinds=" + kinds)
    try:
        cfg = load(fields)
    except TableLoadError as exc:
        assert str(exc).startswith("table events: ")
        return
    assert cfg.capture is not None
    for name in ("orders", "", patterns):
        cfg.capture.wants_table(name)  # never raises


@settings(max_examples=2000, deadline=None, database=None)
@given(st.text(max_size=200))
def test_any_statement_gives_table_names_or_nothing(statement: str):
    for kind, names in ddl_tables(statement, "db"):
        assert kind in KINDS and names and all(isinstance(t, str) for _, t in names)
    for prefix in ("create table ", "drop table ", "rename table a to ", "alter table "):
        ddl_tables(prefix + statement, "db")


def test_an_event_column_too_short_for_what_is_written_is_named():
    short = {"row_key": "varchar(100)", "position": "varchar(20)"}
    columns = [
        Column(c.name, c.data_type, short[c.name]) if c.name in short else c for c in EVENT_COLUMNS
    ]
    with pytest.raises(TableLoadError) as caught:
        load(",vt_capture=t", columns)
    assert "column row_key must hold 255 characters, not varchar(100)" in str(caught.value)
    assert "column position must hold 255 characters, not varchar(20)" in str(caught.value)
    long = [Column(c.name, "longtext", "longtext") if c.name in short else c for c in EVENT_COLUMNS]
    assert load(",vt_capture=t", long).capture is not None


def test_schema_events_sql_is_the_recommended_capture_table_ddl():
    from pathlib import Path

    from msgtable.core.events import capture_table_ddl

    text = (Path(__file__).parents[3] / "schema" / "events.sql").read_text()
    ddl = capture_table_ddl().strip().replace("create table", "create table if not exists", 1)
    assert ddl + ";" in text
