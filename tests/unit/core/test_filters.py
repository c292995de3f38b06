from __future__ import annotations

import datetime as dt
import re
import time
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgtable.core.filters import MAX_DEPTH, MAX_FILTER_CHARS, MAX_IN_ITEMS, Filter, parse_filter
from msgtable.core.tables import Column
from msgtable.errors import InvalidArgument

COLUMNS = (
    Column("id", "bigint", "bigint(20)"),
    Column("region", "varchar", "varchar(16)"),
    Column("kind", "varchar", "varchar(16)"),
    Column("amount", "int", "int(11)"),
    Column("price", "decimal", "decimal(10,2)"),
    Column("ratio", "double", "double"),
    Column("ts", "datetime", "datetime"),
    Column("day", "date", "date"),
    Column("at", "time", "time"),
    Column("blobby", "varbinary", "varbinary(32)"),
    Column("doc", "json", "json"),
    Column("odd%s`name", "int", "int(11)"),
)
ROW = {
    "id": 7,
    "region": "EU",
    "kind": "order",
    "amount": 10,
    "price": Decimal("2.50"),
    "ratio": 0.1,
    "ts": dt.datetime(2024, 1, 2, 10, 0),
    "day": dt.date(2024, 1, 2),
    "at": dt.timedelta(hours=-1),
    "blobby": b"Abc%_",
    "doc": '{"a": 1}',
    "odd%s`name": None,
}
# what a compiled fragment may contain besides quoted names: nothing from the user's text
QUOTED_NAME = re.compile(r"(?:`(?:[^`]|``)*`\.)?`(?:[^`]|``)*`")
SQL_VOCABULARY = re.compile(
    r"(?:[ (),]|%s|=|<>|<=|>=|<|>|\b(?:IN|NOT|BETWEEN|AND|OR|LIKE|ESCAPE|IS|NULL)\b)*"
)


def parse(text: str) -> Filter:
    return parse_filter(text, COLUMNS, "orders")


def error(text: str) -> str:
    with pytest.raises(InvalidArgument) as caught:
        parse(text)
    return str(caught.value)


def selects(text: str, row: dict[str, object] | None = None) -> bool:
    return parse(text).matches({**ROW, **(row or {})})


# -- operators -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "sql_op", "expected"),
    [
        ("=", "=", [False, True, False]),
        ("<>", "<>", [True, False, True]),
        ("!=", "<>", [True, False, True]),
        ("<", "<", [True, False, False]),
        ("<=", "<=", [True, True, False]),
        (">", ">", [False, False, True]),
        (">=", ">=", [False, True, True]),
    ],
)
def test_each_comparison_becomes_one_parameter_and_matches_as_sql_would(op, sql_op, expected):
    f = parse(f"amount {op} 10")
    assert (f.sql, f.params, f.columns) == (f"(`amount` {sql_op} %s)", (10,), {"amount"})
    assert [f.matches({"amount": a}) for a in (9, 10, 11)] == expected


def test_a_literal_on_the_left_turns_the_comparison_around():
    assert parse("10 < amount").sql == "(`amount` > %s)"
    assert parse("10 >= amount").sql == "(`amount` <= %s)"
    assert parse("'eu' = region").sql == "(`region` = %s)"


def test_in_and_not_in_take_a_list_of_literals():
    f = parse("region IN ('eu', 'us')")
    assert (f.sql, f.params) == ("(`region` IN (%s,%s))", ("eu", "us"))
    assert f.matches({"region": "US"}) and not f.matches({"region": "asia"})
    g = parse("region not in ('eu')")
    assert g.sql == "(`region` NOT IN (%s))" and g.matches({"region": "us"})


def test_between_includes_both_ends_and_not_between_excludes_them():
    f = parse("amount BETWEEN 1 AND 10")
    assert (f.sql, f.params) == ("(`amount` BETWEEN %s AND %s)", (1, 10))
    assert [f.matches({"amount": a}) for a in (0, 1, 10, 11)] == [False, True, True, False]
    g = parse("amount NOT BETWEEN 1 AND 10")
    assert [g.matches({"amount": a}) for a in (0, 1, 10, 11)] == [True, False, False, True]


def test_like_has_percent_and_underscore_and_backslash_as_its_default_escape():
    f = parse("kind LIKE 'o_d%'")
    assert (f.sql, f.params) == ("(`kind` LIKE %s ESCAPE %s)", ("o_d%", "\\"))
    assert f.matches({"kind": "ORDER"}) and f.matches({"kind": "old"})
    assert not f.matches({"kind": "od"}) and not f.matches({"kind": "xorder"})
    assert parse(r"kind LIKE '50\%'").matches({"kind": "50%"})
    assert not parse(r"kind LIKE '50\%'").matches({"kind": "500"})
    assert parse("kind NOT LIKE '%der'").matches({"kind": "ordex"})


def test_like_escape_names_its_own_escape_character():
    f = parse("kind LIKE 'a!_b%' ESCAPE '!'")
    assert f.params == ("a!_b%", "!")
    assert f.matches({"kind": "a_bc"}) and not f.matches({"kind": "axbc"})
    assert "ESCAPE takes one character" in error("kind LIKE 'a' ESCAPE 'xy'")


def test_like_on_binary_is_byte_for_byte_and_case_sensitive():
    f = parse("blobby LIKE 'Ab%'")
    assert f.params == (b"Ab%", "\\")
    assert f.matches({"blobby": b"Abc"}) and not f.matches({"blobby": b"abc"})


def test_like_with_many_percents_stays_linear():
    f = parse("kind LIKE '" + "%a" * 30 + "%b'")
    started = time.perf_counter()
    assert not f.matches({"kind": "a" * 5000})
    assert time.perf_counter() - started < 1


def test_is_null_and_is_not_null_work_on_every_column_even_json():
    assert parse("doc IS NULL").sql == "(`doc` IS NULL)"
    assert parse("doc is not null").matches(ROW)
    assert parse("odd%s`name IS NULL".replace("odd%s`name", "`odd%s``name`")).matches(ROW)


def test_keywords_are_case_insensitive():
    assert parse("amount between 1 And 10 oR NoT region iS nUlL").sql == (
        "((`amount` BETWEEN %s AND %s) OR (NOT (`region` IS NULL)))"
    )


def test_a_backticked_name_is_quoted_again_with_percent_doubled_for_dbapi():
    f = parse("`odd%s``name` = 1")
    assert (f.sql, f.params, f.columns) == ("(`odd%%s``name` = %s)", (1,), {"odd%s`name"})


def test_column_names_are_case_insensitive_as_in_mysql():
    assert parse("REGION = 'eu'").sql == "(`region` = %s)"


def test_text_compares_case_insensitively_and_binary_does_not():
    assert selects("region = 'eu'") and selects("region IN ('x', 'Eu')")
    assert selects("region BETWEEN 'a' AND 'f'") and selects("region < 'F'")
    assert selects("blobby = 'Abc%_'") and not selects("blobby = 'abc%_'")


# -- logic -----------------------------------------------------------------------------------


def test_null_is_unknown_and_unknown_is_not_matched():
    null = {"amount": None}
    assert not selects("amount = 1", null) and not selects("amount <> 1", null)
    assert not selects("NOT amount = 1", null) and not selects("amount NOT IN (1)", null)
    assert selects("amount = 1 OR id = 7", null)  # unknown OR true is true
    assert not selects("amount = 1 AND id = 7", null)
    assert selects("NOT (amount = 1 AND id = 8)", null)  # NOT (unknown AND false)
    assert not selects("NOT (amount = 1 AND id = 7)", null)  # NOT unknown
    assert selects("amount IS NULL", null)


def test_a_column_missing_from_the_row_reads_as_null():
    assert not parse("amount = 10").matches({}) and parse("amount IS NULL").matches({})


def test_not_binds_tighter_than_and_and_and_tighter_than_or():
    f = parse("NOT id = 1 AND kind = 'a' OR region = 'b'")
    assert f.sql == "(((NOT (`id` = %s)) AND (`kind` = %s)) OR (`region` = %s))"
    assert f.params == (1, "a", "b")


def test_parentheses_group_as_written():
    f = parse("NOT (id = 1 AND (kind = 'a' OR region = 'b'))")
    assert f.sql == "(NOT ((`id` = %s) AND ((`kind` = %s) OR (`region` = %s))))"


def test_chains_of_and_or_are_flat():
    f = parse(" AND ".join(["id = 1"] * 200))
    assert f.sql.count("AND") == 199 and f.sql.startswith("((`id`")


def test_where_qualifies_every_column_with_the_alias():
    f = parse("region IN ('eu', 'us') AND `odd%s``name` = 3")
    assert f.where() == (f.sql, f.params)
    assert f.where("m") == (
        "((`m`.`region` IN (%s,%s)) AND (`m`.`odd%%s``name` = %s))",
        ("eu", "us", 3),
    )
    assert parse("region=eu,kind=x").where("t%") == (
        "((`t%%`.`region` = %s) AND (`t%%`.`kind` = %s))",
        ("eu", "x"),
    )


# -- the ODPS matcher ------------------------------------------------------------------------


def test_the_matcher_means_in_for_alternatives_and_and_between_keys():
    f = parse("region=eu|us,kind=order")
    assert f.sql == "((`region` IN (%s,%s)) AND (`kind` = %s))"
    assert f.params == ("eu", "us", "order")
    assert f.matches({"region": "US", "kind": "Order"})
    assert not f.matches({"region": "asia", "kind": "order"})


def test_the_matcher_allows_whitespace_around_its_tokens():
    assert parse(" region = eu | us , kind=order ").params == ("eu", "us", "order")


def test_matcher_values_take_the_type_of_their_column():
    f = parse("amount=1|2e1,price=2.5,ratio=0.1,day=2024-01-02,blobby=x")
    assert f.params == (1, 20, Decimal("2.5"), 0.1, dt.date(2024, 1, 2), b"x")
    assert parse("amount=true").params == (1,)
    assert "'x' is not a number for column amount (int)" in error("amount=1|x")


def test_matcher_values_may_hold_what_the_selector_would_refuse():
    f = parse("region=a;DROP,kind=--x")
    assert f.params == ("a;DROP", "--x") and "DROP" not in f.sql


def test_one_equality_without_quotes_is_the_matcher():
    assert parse("region=kind").params == ("kind",)  # not column against column
    assert parse("region = 5").params == ("5",)  # not a number for a text column
    assert "'NULL' is not a number for column id" in error("id = NULL")


# -- types -----------------------------------------------------------------------------------


def test_numbers_take_the_type_of_their_column():
    assert parse("price = 2.5").params == (Decimal("2.5"),)
    assert parse("ratio = 0.1").params == (0.1,) and selects("ratio = 0.1")
    assert parse("amount = 1e3").params == (1000,) and parse("amount = 2.0").params == (2,)
    assert parse("amount = '12'").params == (12,)  # a string that reads as a number
    assert parse("id = -2").params == (-2,)


def test_true_and_false_are_one_and_zero_on_integer_columns_only():
    assert parse("amount = TRUE OR amount = false").params == (1, 0)
    assert "TRUE is only for integer columns, not column price (decimal)" in error(
        "price = TRUE AND id = 1"
    )


def test_dates_and_times_are_checked_and_compared_as_such():
    assert parse("ts >= '2024-01-02'").params == (dt.datetime(2024, 1, 2),)
    assert selects("ts > '2024-01-02'") and selects("ts = '2024-01-02T10:00:00'")
    assert selects("day = '2024-01-02'") and not selects("day < '2024-01-02'")
    assert parse("at < '-0:30:00'").params == ("-0:30:00.000000",) and selects("at < '-0:30:00'")
    assert "is not a date (YYYY-MM-DD) for column day (date)" in error("day = '2024-13-01'")
    assert "is not a datetime" in error("ts = 'yesterday'")
    assert "is not a time" in error("at = '10:61:00'")


def test_binary_values_are_bound_as_utf8_bytes():
    assert parse("blobby = 'é'").params == ("é".encode(),)


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kind = 'x' OR regoin = 'eu'", "at position 15: unknown column 'regoin' in table orders"),
        ("amount = 'abc'", "at position 10: 'abc' is not a number for column amount (int)"),
        ("amount = 1.5 OR id = 1", "at position 10: 1.5 is not an integer for column amount (int)"),
        ("amount = 1e30 OR id = 1", "at position 10: 1e30 is out of range for column amount (int)"),
        ("price = 1e999999999999 OR id = 1", "at position 9: 1e999999999999 is out of range"),
        (
            "ratio = 1e400 OR id = 1",
            "at position 9: 1e400 is out of range for column ratio (double)",
        ),
        ("region = 5 AND id = 1", "at position 10: 5 is not a string for column region"),
        ("doc = 'x' AND id = 1", "at position 1: column doc (json) cannot be filtered"),
        ("amount LIKE 'x'", "at position 13: LIKE needs a text or binary column"),
        ("region = kind AND id = 1", "at position 10: compares column region (varchar) with"),
        ("1 = 1", "at position 1: compares two literals: one side must be a column"),
        ("id = 1 AND", "at position 11: unexpected end of filter"),
        ("id = 1)", "at position 7: unexpected ')'"),
        ("(id = 1", "at position 8: unexpected end of filter"),
        (
            "id = NULL OR id = 1",
            "at position 6: unexpected 'NULL': NULL is only allowed in IS [NOT] NULL",
        ),
        ("id = 1 -- x", "at position 8: comments are not allowed"),
        ("id = 1 /* x */", "at position 8: comments are not allowed"),
        ("id = 1 # x", "at position 8: comments are not allowed"),
        ("id = 1; DROP TABLE x", "at position 7: unexpected character ';'"),
        ('region = "eu"', "at position 10: strings are single-quoted"),
        ("region = 'eu", "at position 10: unterminated string"),
        ("`region = 1", "at position 1: unterminated or empty quoted column name"),
        ("sleep(1) = 1", "at position 6: unexpected '(': function calls are not allowed"),
        ("id IN (SELECT id FROM t)", "at position 8: unexpected 'SELECT': subqueries are not"),
        ("(SELECT 1) = 1", "at position 9: unexpected '1': subqueries are not allowed"),
        ("id = 1 + 1", "at position 8: unexpected character '+'"),
        ("region=eu|'us'", "at position 10: '|' only separates the values of key=a|b"),
        ("kind LIKE 'a' ESCAPE ''", "at position 22: ESCAPE takes one character"),
        ("   ", "at position 1: the filter is empty"),
        ("  id = 1 AND", "at position 13: unexpected end of filter"),  # counts from the text given
    ],
)
def test_each_error_names_its_position_and_reason_on_one_line(text, expected):
    message = error(text)
    assert message.startswith("filter: " + expected) and message.isprintable()


@pytest.mark.parametrize(
    ("text", "points_at", "reason"),
    [
        ("region=eu|us,", ",", "a ',' with nothing after it (expected name=value, or remove it)"),
        ("region=eu,", ",", "a ',' with nothing after it"),
        ("region=eu|us, ", ",", "a ',' with nothing after it"),
        ("region=eu|us,,", ",", "unexpected ',' (expected name=value)"),
        ("region=eu|us,kind", "k", "unexpected 'kind' (expected name=value)"),
        ("region=eu|", "|", "a '|' with nothing after it (expected a value, or remove it)"),
    ],
)
def test_a_key_value_filter_broken_after_its_clauses_points_at_the_fault(text, points_at, reason):
    message = error(text)
    position = int(message.split("at position ", 1)[1].split(":", 1)[0])
    caret = " " * (position - 1) + "^"  # what a caret under the filter would show
    assert text[caret.index("^")] == points_at, f"{text}\n{caret}\n{message}"
    assert reason in message


def test_an_unknown_column_lists_the_columns_there_are():
    assert error("regoin = 'eu' OR id = 1").endswith(
        "(columns: id, region, kind, amount, price, ratio, ts, day, at, blobby, doc, odd%s`name)"
    )


def test_the_limits_are_errors_with_positions():
    assert error("id = 1 OR " + "x" * MAX_FILTER_CHARS).startswith(
        f"filter: at position {MAX_FILTER_CHARS + 1}: longer than {MAX_FILTER_CHARS} characters"
    )
    items = ",".join(["1"] * (MAX_IN_ITEMS + 1))
    assert f"more than {MAX_IN_ITEMS} items in IN" in error(f"id IN ({items})")
    assert f"more than {MAX_IN_ITEMS} values" in error("id=" + "|".join(["1"] * 1001))
    assert len(parse(f"id IN ({items[2:]})").params) == MAX_IN_ITEMS


def test_nesting_deeper_than_the_limit_is_refused_at_the_first_level_too_deep():
    ok = "(" * MAX_DEPTH + "id = 1" + ")" * MAX_DEPTH
    assert parse(ok).sql == "(`id` = %s)"
    too_deep = "(" * (MAX_DEPTH + 1) + "id = 1" + ")" * (MAX_DEPTH + 1)
    assert error(too_deep) == f"filter: at position {MAX_DEPTH + 1}: nested deeper than 32"
    assert "nested deeper than 32" in error("NOT " * (MAX_DEPTH + 1) + "id = 1")
    assert "nested deeper than 32" in error("(" * 1990 + "id=1" + ")" * 1990)
    assert "nested deeper than 32" in error("NOT " * 990 + "id = 1")


@pytest.mark.parametrize(
    "text",
    [
        "'; DROP TABLE x; --",
        "id = 1; DROP TABLE x; --",
        "id = 1 OR 1=1",
        "1=1 OR",
        "id = 1 OR '1'='1'",
        "region = '' OR ''=''",
        "region = 'a' '",
        "region = 'x\\' OR 1=1 -- '",
        "(SELECT 1)",
        "id IN (SELECT id FROM mysql.user)",
        "sleep(1)",
        "id = sleep(1)",
        "BENCHMARK(1000000, MD5('a')) = 1",
        "id = 1 UNION SELECT 1",
        "`a``b` = 1",
        "`region` = 1`",
        "```",
        "`region`` = 'x'",
        "region = 'x'\x00",
        "region\x00 = 'x'",
        "régión = 'x'",
        "region = 'x' ‮OR id = 1",
        "id = 0x41",
        "id = @@version",
        "id = ?",
        "id = %s",
        "id = :p",
        "region = N'x'",
        "region = _utf8'x'",
        "region = 'x' COLLATE utf8mb4_bin",
        "id = 1 /*! OR 1=1 */",
        "id = 1 --",
        "id = 1 #",
        'region = "x"',
        "id = 1 AND (",
        "id = 1 AND id",
        "NOT",
        "id",
        "=",
    ],
)
def test_injection_attempts_are_refused_cleanly(text):
    message = error(text)
    assert message.startswith("filter: at position ") and message.isprintable()


def test_hostile_text_inside_a_string_stays_a_parameter():
    f = parse("region = '''; DROP TABLE x; --' OR kind = '`x` /* %s'")
    assert f.params == ("'; DROP TABLE x; --", "`x` /* %s")
    assert f.sql == "((`region` = %s) OR (`kind` = %s))"


def test_unicode_strings_are_parameters():
    assert parse("region = 'été ⚡'").params == ("été ⚡",)


def test_the_text_is_kept_stripped():
    assert parse("  id = 1\n").text == "id = 1"


# -- fuzz ------------------------------------------------------------------------------------

FRAGMENTS = [
    *(c.name for c in COLUMNS[:-1]),
    "`odd%s``name`", "`a``b`", "`", "REGION", "nope",
    "=", "<>", "!=", "<", "<=", ">", ">=", "AND", "or", "NOT", "In", "BETWEEN", "LIKE",
    "ESCAPE", "IS", "NULL", "TRUE", "false", "(", ")", ",", "|", "'", '"',
    "'eu'", "'it''s'", "'%'", "'_x'", "'\\'", "'2024-01-02'", "'10:00:00'", "'é'",
    "1", "-2", "1.5", "1e3", "1e999", ".5", "eu", "us|eu",
    ";", "--", "/*", "*/", "#", "SELECT", "sleep", "%s", "%", "\x00", "\u202e", "\n",
]  # fmt: skip
strings = st.text(max_size=8).map(lambda s: "'" + s.replace("'", "''") + "'")
integers = st.integers(-(2**63), 2**64 - 1).map(str)
TYPED = {
    ("id", "amount", "`odd%s``name`"): st.one_of(integers, st.sampled_from(["TRUE", "false"])),
    ("price",): st.decimals(-(10**8), 10**8, places=2).map(str),
    ("ratio",): st.floats(allow_nan=False, allow_infinity=False).map(repr),
    ("region", "kind", "blobby", "REGION"): strings,
    ("ts",): st.datetimes().map(lambda t: f"'{t.isoformat(' ')}'"),
    ("day",): st.dates().map(lambda d: f"'{d}'"),
    ("at",): st.times().map(lambda t: f"'{t}'"),
    ("doc", "nope"): st.one_of(integers, strings),  # errors
}
COMPARISONS = st.sampled_from(["=", "<>", "!=", "<", "<=", ">", ">="])
nots = st.sampled_from(["", "NOT "])


def typed_predicates(names: tuple[str, ...], literals: st.SearchStrategy[str]):
    name = st.sampled_from(names)
    return st.one_of(
        st.builds("{} {} {}".format, name, COMPARISONS, literals),
        st.builds("{} {} {}".format, literals, COMPARISONS, name),
        st.builds(
            "{} {}IN ({})".format,
            name,
            nots,
            st.lists(literals, min_size=1, max_size=3).map(", ".join),
        ),
        st.builds("{} {}BETWEEN {} AND {}".format, name, nots, literals, literals),
        st.builds("{} {}LIKE {}".format, name, nots, strings),
        st.builds("{} IS {}NULL".format, name, nots),
    )


predicates = st.one_of(*(typed_predicates(names, lits) for names, lits in TYPED.items()))
selectors = st.recursive(
    predicates,
    lambda inner: st.one_of(
        st.builds("{} AND {}".format, inner, inner),
        st.builds("{} OR {}".format, inner, inner),
        st.builds("NOT {}".format, inner),
        st.builds("({})".format, inner),
    ),
    max_leaves=4,
)
filter_texts = st.one_of(
    selectors,
    selectors,  # twice: a third of the examples are mostly valid filters
    st.text(max_size=40),
    st.lists(st.sampled_from(FRAGMENTS), max_size=10).map(" ".join),
    st.lists(st.sampled_from(FRAGMENTS), max_size=10).map("".join),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3)), max_size=8).map(" ".join),
    st.lists(
        st.tuples(
            st.sampled_from([c.name for c in COLUMNS[:-1]] + ["x", "`id`"]),
            st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=3).map("|".join),
        ),
        min_size=1,
        max_size=3,
    ).map(lambda pairs: ",".join(f"{k}={v}" for k, v in pairs)),
)


@settings(
    max_examples=10_000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(filter_texts)
def test_any_text_is_a_parameterised_filter_or_a_one_line_invalid_argument(text):
    try:
        f = parse(text)
    except InvalidArgument as e:
        message = str(e)
        assert re.match(r"filter: at position [0-9]+: ", message) and message.isprintable()
        return
    for sql, params in (f.where(), f.where("m")):
        skeleton = QUOTED_NAME.sub("", sql)
        assert SQL_VOCABULARY.fullmatch(skeleton), sql
        assert skeleton.count("%s") == len(params) == len(f.params)
        sql % tuple("?" * len(params))  # the DBAPI's own formatting: every % is doubled
    assert sql.count("`m`.") == len(QUOTED_NAME.findall(f.sql))
    assert isinstance(f.matches(ROW), bool) and isinstance(f.matches({}), bool)


@pytest.mark.parametrize(
    ("text", "columns"),
    [
        ("region = 'eu'", ("region",)),
        ("region IN ('eu', 'us') AND kind = 'order' AND amount > 3", ("region", "kind")),
        ("region=eu|us,kind=order", ("region", "kind")),  # the matcher: an IN and an =
        ("amount > 3 AND (region = 'eu' AND kind = 'x')", ("region", "kind")),
        ("region = 'eu' OR kind = 'order'", ()),  # either: no one column finds every match
        ("NOT region = 'eu'", ()),
        ("region NOT IN ('eu') AND region <> 'us' AND kind != 'x'", ()),
        ("region = 'eu' AND region IN ('eu', 'us')", ("region",)),
        ("amount BETWEEN 1 AND 3 AND region LIKE 'e%'", ()),
    ],
)
def test_the_equality_columns_are_those_every_match_has_equal_to_a_few_values(text, columns):
    assert parse_filter(text, COLUMNS).equality_columns == columns
