"""Subscription filters against the real server: the compiled WHERE fragment selects exactly
the rows Filter.matches selects in Python, on both drivers, and hostile text changes nothing."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

from msgtable.core.filters import Filter, parse_filter
from msgtable.core.sql import quote
from msgtable.core.tables import Column
from msgtable.errors import InvalidArgument

from ..conftest import Sql
from ..waiting import wait_until
from .helpers import Collector, Served, serve

ODD = "odd%s`name"  # a column name with a DBAPI placeholder and a backtick in it
ODD_QUOTED = "`odd%s``name`"  # as a filter (and SQLAlchemy text()) names it
DDL = f"""CREATE TABLE t (
  id BIGINT NOT NULL PRIMARY KEY,
  region VARCHAR(32) NULL,
  kind VARCHAR(16) NOT NULL,
  amount INT NULL,
  price DECIMAL(10,2) NULL,
  ratio DOUBLE NULL,
  ts DATETIME NULL,
  day DATE NULL,
  at TIME NULL,
  blobby VARBINARY(32) NULL,
  {ODD_QUOTED} INT NULL
) DEFAULT CHARSET=utf8mb4"""
COLUMN_NAMES = (
    "id",
    "region",
    "kind",
    "amount",
    "price",
    "ratio",
    "ts",
    "day",
    "at",
    "blobby",
    ODD,
)

FILTERS = [
    "region = 'eu'",
    "region <> 'eu'",
    "region != 'EU'",
    "region IN ('eu', 'us')",
    "region NOT IN ('eu', 'us')",
    "region < 'm'",
    "region >= 'b'",
    "region BETWEEN 'a' AND 'f'",
    "region LIKE 'e%'",
    r"region LIKE 'e\_u'",
    "region LIKE 'e!%u' ESCAPE '!'",
    r"region LIKE '%\%'",
    "region NOT LIKE '%u%'",
    "region LIKE '_s'",
    "region IS NULL",
    "region IS NOT NULL",
    "region = '''; DROP TABLE t; --' OR kind = '`x` /* %s'",
    "kind LIKE 'order' AND NOT kind = 'ORDER'",
    "amount > 10",
    "amount <= -5",
    "-5 < amount",
    "amount BETWEEN -10 AND 10",
    "amount NOT BETWEEN -10 AND 10",
    "amount IN (1, 2, 3, TRUE)",
    "amount = '7' OR amount = 1e1",
    "price >= 2.5",
    "price < -1e1",
    "price BETWEEN 0 AND 1.5",
    "ratio = 0.1",
    "ratio = 0.3",
    "ratio > 1",
    "ts >= '2024-01-02'",
    "ts = '2024-01-03'",
    "ts < '2024-01-02 12:00:00'",
    "day = '2024-01-05'",
    "at < '-1:00:00'",
    "at > '24:00:00'",
    "blobby = 'abc'",
    "blobby LIKE 'a%'",
    "blobby > 'a'",
    f"{ODD_QUOTED} IS NULL",
    f"{ODD_QUOTED} > 50 OR {ODD_QUOTED} IS NULL",
    "NOT (region = 'eu' OR amount > 0)",
    "region = 'eu' AND amount > 0 OR kind = 'refund'",
    "NOT region = 'eu'",
    "region=eu|us,kind=order",
    "kind=refund",
    "amount=1|2|3",
    "region=a;DROP",
]
ATTACKS = [
    "'; DROP TABLE t; --",
    "id = 1; DROP TABLE t",
    "id = 1 OR 1=1 --",
    "id IN (SELECT id FROM t)",
    "sleep(1) = 0",
    "id = 1 /*! OR 1=1 */",
    "`id`` = 1; DELETE FROM t; -- ` = 1",
    "region = 'x' UNION SELECT 1",
    "region = 'x'\x00 OR 1=1",
    "id = @@version",
]


def rows(rng: random.Random) -> Iterator[tuple[Any, ...]]:
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.12 else value

    regions = ["eu", "EU", "us", "Us", "asia", "e_u", "e%u", "50%", "a_b", "eu-west", "o'neil"]
    regions.append("'; DROP TABLE t; --")  # data that looks like SQL is only ever compared
    for i in range(1, 201):
        yield (
            i,
            maybe(rng.choice(regions)),
            rng.choice(["order", "ORDER", "refund", "Order_1", "x%y"]),
            maybe(rng.randint(-30, 30)),
            maybe(Decimal(rng.randint(-2000, 2000)) / 100),
            maybe(rng.choice([0.1, 0.2, 0.30000000000000004, 0.3, 1.5, -2.0, 1e10])),
            maybe(dt.datetime(2024, 1, 1) + dt.timedelta(hours=rng.randint(0, 24 * 5))),
            maybe(dt.date(2024, 1, 1) + dt.timedelta(days=rng.randint(0, 9))),
            maybe(f"{rng.randint(-30, 30)}:{rng.randint(0, 59):02}:00"),
            maybe(rng.choice([b"abc", b"ABC", b"a%c", b"\x00\xff", b"", "é".encode()])),
            maybe(rng.randint(0, 100)),
        )


@pytest.fixture
def columns(sql: Sql) -> tuple[Column, ...]:
    """The table t, 200 varied rows, and its columns as information_schema describes them."""
    sql.execute(DDL)
    raw = sql.engine.raw_connection()
    try:
        cursor = raw.cursor()
        names = ", ".join(quote(name) for name in COLUMN_NAMES)
        cursor.executemany(
            f"INSERT INTO t ({names}) VALUES ({', '.join(['%s'] * len(COLUMN_NAMES))})",
            list(rows(random.Random(20240102))),
        )
        raw.commit()
    finally:
        raw.close()
    facts = sql.rows(
        "SELECT column_name, data_type, column_type FROM information_schema.columns"
        " WHERE table_schema = DATABASE() AND table_name = 't' ORDER BY ordinal_position"
    )
    return tuple(
        Column(name, data_type.lower(), column_type) for name, data_type, column_type in facts
    )


@pytest.fixture(params=["pymysql", "mysqldb"])
def cursor(
    request: pytest.FixtureRequest, db_dsn: str, columns: tuple[Column, ...]
) -> Iterator[Any]:
    """A DBAPI cursor of each driver (PyMySQL, mysqlclient): the fragments are DBAPI text."""
    url = sa.engine.make_url(db_dsn)
    engine = sa.create_engine(url.set(drivername=f"{url.get_backend_name()}+{request.param}"))
    raw = engine.raw_connection()
    try:
        yield raw.cursor()
    finally:
        raw.close()
        engine.dispose()


def selected(cursor: Any, statement: str, params: tuple[object, ...]) -> list[int]:
    cursor.execute(statement, params)  # params even when empty: the driver undoubles %%
    return sorted(row[0] for row in cursor.fetchall())


def table_rows(cursor: Any) -> list[dict[str, object]]:
    cursor.execute("SELECT * FROM t")
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def test_sql_and_python_select_the_same_rows_for_every_filter(cursor, columns):
    data = table_rows(cursor)
    assert len(data) == 200
    hits = {}
    for text in FILTERS:
        f: Filter = parse_filter(text, columns, "t")
        expected = sorted(row["id"] for row in data if f.matches(row))  # type: ignore[type-var]
        assert selected(cursor, f"SELECT id FROM t WHERE {f.sql}", f.params) == expected, text
        hits[text] = len(expected)
    # the filters are not vacuous: most select some rows and leave others
    assert sum(0 < n < 200 for n in hits.values()) >= len(FILTERS) - 4, hits


def test_every_fragment_runs_qualified_with_an_alias(cursor, columns):
    for text in FILTERS:
        f = parse_filter(text, columns, "t")
        plain = selected(cursor, f"SELECT id FROM t WHERE {f.sql}", f.params)
        fragment, params = f.where("m")
        assert "`m`." in fragment
        # joined to itself, an unqualified column would be ambiguous
        statement = f"SELECT m.id FROM t m JOIN t o ON o.id = m.id WHERE {fragment}"
        aliased = selected(cursor, statement, params)
        assert aliased == plain, text


def test_injection_attempts_are_refused_and_leave_the_table_untouched(sql: Sql, cursor, columns):
    def state() -> tuple[object, ...]:
        return sql.scalar("SELECT COUNT(*) FROM t"), sql.rows("CHECKSUM TABLE t")[0][1]

    before = state()
    for text in ATTACKS:
        with pytest.raises(InvalidArgument, match=r"^filter: at position \d+: "):
            parse_filter(text, columns, "t")
    for text in FILTERS:  # the hostile strings some of them hold are only ever parameters
        f = parse_filter(text, columns, "t")
        selected(cursor, f"SELECT id FROM t WHERE {f.sql}", f.params)
    assert state() == before
    tables = "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()"
    assert sql.scalar(tables) == 1


UNTOLD = dict(discovery_interval_s=3600, follow_binlog=False)  # a server not told of DDL
ORDERS = dict(vt_poller_interval=0.2, vt_purge_after=0)


def first_delivered(s: Served, subscription: str) -> list[int]:
    """The ids of the first batch the subscription delivers (acked)."""
    c = Collector(s.client, "orders", subscription=subscription)
    try:
        msgs = c.take(1, 15.0)
        c.subscription.ack(msgs)
        return [int(m.id) for m in msgs]
    finally:
        c.close()


def test_a_filter_on_a_column_added_since_the_last_discovery_is_accepted(db_dsn: str):
    """The table was ALTERed after the server read its definition (discovery an hour away,
    no binlog): CreateSubscription checks the filter naming the new column against the table
    as it is now, not refusing it as an unknown column."""
    with serve(db_dsn, **UNTOLD) as s:
        s.create_table("orders", "region varchar(16)", **ORDERS)
        s.engine.refresh()
        wait_until(lambda: s.engine.loaded("orders") is not None, 10, "orders loaded")
        s.sql("alter table orders add column tier varchar(8) not null default 'basic'")
        s.client.create_subscription("orders", "gold", filter="tier = 'gold'")
        s.sql("insert into orders(id, message, tier) values (1, 'a', 'basic'), (2, 'b', 'gold')")
        assert first_delivered(s, "gold") == [2]


def test_a_table_made_anew_under_the_same_name_gets_its_subscription(db_dsn: str):
    """A message table with a subscription dropped and made again under the same name, the
    server not told (discovery an hour away, no binlog): CreateSubscription works on the
    table as it is now (the old one had the fan-out's column, the new one has not)."""
    with serve(db_dsn, **UNTOLD) as s:
        s.create_table("orders", "region varchar(16)", **ORDERS)
        s.engine.refresh()
        s.client.create_subscription("orders", "eu", filter="region = 'eu'")
        s.client.drop_subscription("orders", "eu")
        s.sql("drop table orders")
        s.create_table("orders", "region varchar(16)", **ORDERS)
        s.client.create_subscription("orders", "eu", filter="region = 'eu'")
        s.sql("insert into orders(id, message, region) values (1, 'a', 'us'), (2, 'b', 'eu')")
        assert first_delivered(s, "eu") == [2]
