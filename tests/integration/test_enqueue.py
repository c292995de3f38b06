"""Enqueue from SQLAlchemy (msgtable.enqueue) end to end: rows written in the application's
own transaction (a Connection or an ORM Session) on a real MariaDB, delivered by the real
server, or never when the transaction rolls back; delay, priority, order key, traceparent."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import orm

from msgtable.core.tables import current_layout_ddl
from msgtable.enqueue import enqueue, enqueue_many
from msgtable.errors import InvalidArgument, TableNotFound

from .helpers import NS, Collector, Served, comment, serve
from .test_ordering import KEYED


@pytest.fixture(params=["pymysql", "mysqldb"])
def served(request: pytest.FixtureRequest, db_dsn: str):
    """The application's engine on each MySQL driver (PyMySQL, mysqlclient)."""
    url = sa.engine.make_url(db_dsn)
    dsn = url.set(drivername=f"{url.get_backend_name()}+{request.param}")
    with serve(dsn.render_as_string(hide_password=False)) as s:
        assert s.db.dialect.driver == request.param
        yield s


class Boom(Exception):
    pass


def test_a_committed_transaction_is_delivered_and_a_rolled_back_one_enqueues_nothing(
    served: Served,
):
    served.create_table("jobs", vt_poller_interval=0.1)
    with served.transaction() as conn:
        assert enqueue(conn, "jobs", {"id": 1, "message": "kept"}) == 1
    with pytest.raises(Boom), served.transaction() as conn:
        enqueue(conn, "jobs", {"id": 2, "message": "rolled back"})
        raise Boom
    with orm.Session(served.db.execution_options(isolation_level="REPEATABLE READ")) as session:
        with session.begin():
            assert (
                enqueue_many(
                    session, "jobs", [{"id": 3, "message": "s"}, {"id": 4, "message": "t"}]
                )
                == 2
            )
        with pytest.raises(Boom), session.begin():
            enqueue(session, "jobs", {"id": 5, "message": "rolled back"})
            raise Boom
    c = Collector(served.client, "jobs")
    try:
        got = c.take(3)
        assert sorted((m.id, m.values["message"]) for m in got) == [(1, "kept"), (3, "s"), (4, "t")]
        assert served.client.ack("jobs", [m.id for m in got]) == 3
        c.nothing_for(0.5)
    finally:
        c.close()
    assert [r[0] for r in served.sql("select id from jobs order by id")] == [1, 3, 4]


def test_delay_sets_time_next_by_the_databases_clock_and_priority_orders(served: Served):
    served.create_table("jobs", vt_poller_interval=0.1)
    with served.transaction() as conn:
        (before,) = conn.exec_driver_sql("select unix_timestamp(now(6)) * 1000000000").one()
        enqueue(conn, "jobs", {"id": 1, "message": "later"}, delay_s=1.5)
        enqueue_many(conn, "jobs", [{"id": 2, "message": "low"}], priority=5)
        enqueue(conn, "jobs", {"id": 3, "message": "high"}, priority=-1)
    rows = {r[0]: (r[1], r[2]) for r in served.sql("select id, priority, time_next from jobs")}
    assert rows[1][0] == 0 and 1.5 * NS <= rows[1][1] - int(before) < 3 * NS
    assert rows[2] == (5, 0) and rows[3] == (-1, 0)
    c = Collector(served.client, "jobs")
    try:
        first = c.take(2)
        assert [m.id for m in first] == [3, 2]  # lower priority first; 1 not due yet
        (later,) = c.take(1, timeout_s=5)
        assert later.id == 1
        assert later.sent_ns >= rows[1][1]
    finally:
        c.close()


def test_order_key_and_traceparent_fill_their_columns(served: Served):
    served.create_table("jobs", f"{KEYED}, traceparent varchar(55)", vt_order_key="k")
    served.create_table("plain", vt_poller_interval=0.1)
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with served.transaction() as conn:
        enqueue(conn, "jobs", {"id": 1, "message": "a"}, order_key="cust-1", traceparent=tp)
        enqueue(conn, "jobs", {"id": 2, "message": "b"})
        enqueue(conn, "plain", {"id": 1, "message": "a"}, traceparent=tp)  # no column: left out
    rows = served.sql("select id, k, traceparent from jobs order by id")
    assert [tuple(r) for r in rows] == [(1, "cust-1", tp), (2, None, None)]
    assert served.sql("select count(*) from plain")[0][0] == 1


@pytest.mark.parametrize(
    ("table", "values", "kwargs", "error", "match"),
    [
        ("nope", {"id": 1}, {}, TableNotFound, "nope"),
        ("jobs`; drop table jobs; --", {"id": 1}, {}, TableNotFound, "drop table"),
        ("jobs", {"id": 1, "colour": "x"}, {}, InvalidArgument, "no column 'colour'"),
        ("jobs", {"id": 1, "epoch": 3}, {}, InvalidArgument, "engine's"),
        ("jobs", {"id": 1, "time_next": 0}, {}, InvalidArgument, "delay_s"),
        ("jobs", {"id": 1}, {"delay_s": -1}, InvalidArgument, "zero or more"),
        ("jobs", {"id": 1}, {"delay_s": float("nan")}, InvalidArgument, "zero or more"),
        ("jobs", {"id": 1}, {"priority": 1.5}, InvalidArgument, "integer"),
        ("jobs", {"id": 1}, {"order_key": "k"}, InvalidArgument, "no vt_order_key"),
        ("jobs", {"id": 1}, {"traceparent": "not-a-trace"}, InvalidArgument, "W3C"),
        # found by tests/integration/test_fuzz.py: a TypeError, the database's own errors,
        # and messages that echoed 1 MB of a name
        ("jobs", {"id": 1}, {"traceparent": 7}, InvalidArgument, "W3C"),
        ("jobs", {"id": 1}, {"delay_s": 1e300}, InvalidArgument, "at most"),
        ("jobs", {"id": 1}, {"delay_s": 1e10}, InvalidArgument, "at most"),
        ("jobs", {"id": 1}, {"priority": 2**70}, InvalidArgument, "bigint"),
        ("jobs", {"id": 1}, {"priority": -(2**63) - 1}, InvalidArgument, "bigint"),
        ("jobs", {"id": 1, "message": "x" * 1_000_000}, {}, InvalidArgument, "message"),
        ("jobs", {"id": 2**64}, {}, InvalidArgument, "id"),
        ("jobs", {"id": 1, "x" * 1_000_000: 1}, {}, InvalidArgument, "no column 'xxx"),
        ("x" * 1_000_000, {"id": 1}, {}, TableNotFound, "no message table 'xxx"),
    ],
)
def test_bad_input_is_one_clear_error_and_nothing_is_written(
    served: Served, table, values, kwargs, error, match
):
    served.create_table("jobs")
    with pytest.raises(error, match=match) as raised, served.transaction() as conn:
        enqueue(conn, table, values, **kwargs)
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 300, str(raised.value)[:400]
    assert served.sql("select count(*) from jobs")[0][0] == 0


@pytest.mark.parametrize("key", [object(), 1.5, None.__class__, [1], {"k": 1}, True])
def test_an_order_key_that_is_not_text_bytes_or_an_integer_is_refused(served: Served, key):
    """Found by the fuzz test: object() was enqueued with its repr as the key."""
    served.create_table("keyed", KEYED, vt_order_key="k")
    with pytest.raises(InvalidArgument, match="order_key"), served.transaction() as conn:
        enqueue(conn, "keyed", {"id": 1, "message": "m"}, order_key=key)
    assert served.sql("select count(*) from keyed")[0][0] == 0


def test_after_a_refused_value_the_transaction_goes_on(served: Served):
    """A value the database refuses fails only its statement: the application's
    transaction stays usable and commits what else it wrote."""
    served.create_table("jobs")
    with served.transaction() as conn:
        enqueue(conn, "jobs", {"id": 1, "message": "kept"})
        with pytest.raises(InvalidArgument, match="message"):
            enqueue(conn, "jobs", {"id": 2, "message": "x" * 1_000})
        enqueue(conn, "jobs", {"id": 3, "message": "kept"})
    assert served.sql("select id from jobs order by id") == [(1,), (3,)]


def test_rows_with_different_columns_are_refused(served: Served):
    served.create_table("jobs")
    with pytest.raises(InvalidArgument, match=r"rows\[1\]"), served.transaction() as conn:
        enqueue_many(conn, "jobs", [{"id": 1, "message": "a"}, {"id": 2}])


def test_a_column_added_to_the_table_is_seen_at_once(served: Served):
    served.create_table("jobs")
    with served.transaction() as conn:
        enqueue(conn, "jobs", {"id": 1, "message": "a"})  # the table's columns are kept
    served.sql("alter table jobs add column tenant varchar(10)")
    with served.transaction() as conn:
        enqueue(conn, "jobs", {"id": 2, "message": "b", "tenant": "t1"})
    assert served.sql("select tenant from jobs where id = 2")[0][0] == "t1"


def test_a_column_dropped_from_the_table_is_one_clear_error(served: Served):
    served.create_table("jobs", "tenant varchar(10)")
    with served.transaction() as conn:
        enqueue(conn, "jobs", {"id": 1, "message": "a", "tenant": "t1"})  # its columns kept
    served.sql("alter table jobs drop column tenant")
    with served.transaction() as conn:
        with pytest.raises(InvalidArgument, match="table jobs has no column 'tenant'"):
            enqueue(conn, "jobs", {"id": 2, "message": "b", "tenant": "t1"})
        enqueue(conn, "jobs", {"id": 3, "message": "c"})  # the transaction goes on
    assert [r[0] for r in served.sql("select id from jobs order by id")] == [1, 3]


# -- what an enqueue costs the application's transaction, and a connection's database ----------
def _app_engine(served: Served) -> tuple[sa.Engine, list[str]]:
    """The application's engine of one pooled connection, and the statements it runs."""
    app = sa.create_engine(served.db.url, pool_size=1, max_overflow=0)
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    sa.event.listen(app, "before_cursor_execute", seen)
    return app, statements


def test_an_enqueue_runs_its_insert_alone_once_its_connection_is_known(served: Served):
    """A transaction of one enqueue is BEGIN, the INSERT and COMMIT, as the application's own
    INSERT would be: the connection's database is read once, not before every INSERT."""
    served.create_table("jobs")
    app, statements = _app_engine(served)
    try:
        with app.begin() as conn:
            enqueue(conn, "jobs", {"id": 1, "message": "a"})  # the first reads the table
        for i in (2, 3):
            statements.clear()
            with app.begin() as conn:
                enqueue(conn, "jobs", {"id": i, "message": "b"})
            assert [s.split()[0] for s in statements] == ["INSERT"], statements
    finally:
        app.dispose()
    assert [r[0] for r in served.sql("select id from jobs order by id")] == [1, 2, 3]


@pytest.fixture
def other_databases(served: Served) -> Any:
    """Two more databases beside the test's (their names and engines), dropped afterwards."""
    names = [f"{served.db.url.database}_{n}" for n in ("other", "empty")]
    engines = []
    for name in names:
        served.sql(f"create database `{name}`")
        engines.append(
            sa.create_engine(served.db.url.set(database=name), isolation_level="AUTOCOMMIT")
        )
    try:
        yield list(zip(names, engines, strict=True))
    finally:
        for name, engine in zip(names, engines, strict=True):
            engine.dispose()
            served.sql(f"drop database if exists `{name}`")


def test_a_connection_switched_to_another_database_enqueues_there(
    served: Served, other_databases: Any
):
    """A connection the application switched with USE enqueues into that database's table,
    as its own INSERT would, whatever the table it enqueued into before had (a traceparent
    column, here), and one with no such table is refused naming that database."""
    (other, other_db), (empty, _) = other_databases
    served.create_table("jobs", "traceparent varchar(55)")
    ddl = current_layout_ddl("jobs", comment()).replace(
        "  primary key(id)", "  tenant varchar(10),\n  primary key(id)"
    )
    with other_db.connect() as c:
        c.exec_driver_sql(ddl)
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    app, _ = _app_engine(served)
    try:
        with app.begin() as conn:
            enqueue(conn, "jobs", {"id": 1, "message": "here"}, traceparent=trace)
        with app.begin() as conn:
            conn.exec_driver_sql(f"USE `{other}`")
            enqueue(conn, "jobs", {"id": 2, "message": "there"}, traceparent=trace)
            enqueue(conn, "jobs", {"id": 3, "message": "there too", "tenant": "t1"})
        with app.begin() as conn:
            conn.exec_driver_sql(f"USE `{empty}`")
            with pytest.raises(TableNotFound, match=f"in {empty}"):
                enqueue(conn, "jobs", {"id": 4, "message": "lost"})
    finally:
        app.dispose()
    assert [tuple(r) for r in served.sql("select id, traceparent from jobs")] == [(1, trace)]
    with other_db.connect() as c:
        rows = c.exec_driver_sql("select id, tenant from jobs order by id").all()
    assert [tuple(r) for r in rows] == [(2, None), (3, "t1")]
