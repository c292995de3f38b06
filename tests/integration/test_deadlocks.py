"""Deadlocks the fault suite's database logged (issue 42, item 5), each reproduced on a real
MySQL-family server by holding one transaction's locks in the order the other's statement
meets them: the statement must take its locks so that no cycle can form (in id order, or
only the rows it changes)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from msgtable.core.rows import CachedRow
from msgtable.core.tables import Column, current_layout_ddl, load_table
from msgtable.engine.lease import connector
from msgtable.engine.placement import PLACEMENT_TABLE, Placement
from msgtable.store.bulk import BulkStatements
from msgtable.store.deadletters import DeadStatements
from msgtable.store.mysqlstore import MySQLStore
from msgtable.store.subscriptions import FanoutStatements, add_fanout_ddl
from msgtable.testing import CURRENT_COLUMNS

from ..waiting import wait_until
from .helpers import comment

WAIT_S = 10.0


def run_sql(conn: sa.Connection, sql: str, params: list[Any]) -> Any:
    """A store's statement (``%s`` parameters) on a connection; returns its cursor."""
    return conn.exec_driver_sql(sql, tuple(params))


def deadlocks(db: sa.Engine) -> int:
    """How many deadlocks the server has detected so far (its InnoDB counter)."""
    with db.connect() as conn:
        got = conn.execute(
            sa.text(
                "SELECT `count` FROM information_schema.INNODB_METRICS "
                "WHERE name = 'lock_deadlocks'"
            )
        ).scalar()
    return int(got or 0)


def running(db: sa.Engine, like: str) -> int:
    """Statements running now (waiting for a lock, in these tests) whose text is ``like``
    (the process list: MariaDB reads a row it finds by primary key while it plans the
    statement, which INNODB_TRX does not always show as a lock wait)."""
    with db.connect() as conn:
        got = conn.execute(
            sa.text(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                "WHERE command = 'Query' AND info LIKE :like"
            ),
            {"like": like},
        ).scalar()
    return int(got or 0)


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``call`` on a thread; the list gets its result or the exception it raised."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_the_sends_locking_read_locks_its_rows_in_id_order_whatever_their_epochs(
    db_dsn: str,
):
    """The send's check read one epoch's rows, then the next epoch's: rows 1 and 3 (epoch 0)
    before row 2 (epoch 1). A renew (an UPDATE by id, in id order) that held row 2 and then
    wanted row 3 deadlocked with it. One read of every row, in id order, cannot."""
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    store = MySQLStore.from_dsn(db_dsn)
    try:
        with db.connect() as conn:
            conn.execute(sa.text(current_layout_ddl("q", comment())))
            conn.execute(
                sa.text("insert into q(id, message, epoch) values (1,'a',0),(2,'b',1),(3,'c',0)")
            )
        cfg = load_table("q", comment(), CURRENT_COLUMNS, (("id",),))
        batch = [
            CachedRow(0, 0, 0, (1, "a")),
            CachedRow(0, 0, 1, (2, "b")),
            CachedRow(0, 0, 0, (3, "c")),
        ]
        before = deadlocks(db)
        renew = sa.create_engine(db_dsn).connect()
        try:
            tx = renew.begin()
            renew.execute(sa.text("update q set message = concat(message, 2) where id = 2"))
            delivered: list[list[Any]] = []
            t, sent = in_thread(
                lambda: store.send(cfg, batch, time.time_ns(), lambda rows: delivered.append(rows))
            )
            wait_until(
                lambda: running(db, "%LOCK IN SHARE MODE") or not t.is_alive(),
                what="the send waiting for row 2's lock",
            )
            assert t.is_alive(), f"the send did not wait for row 2's lock: {sent}"
            renew.execute(sa.text("update q set message = concat(message, 3) where id = 3"))
            tx.commit()
        finally:
            renew.close()
        t.join(WAIT_S)
        assert not t.is_alive(), "the send never ended"
        assert not isinstance(sent[0], Exception), f"the send failed: {sent[0]!r}"
        assert [r.id for r in sent[0]] == [1, 2, 3], f"the send: {sent}"
        assert deadlocks(db) == before, "the send and the renew deadlocked"
    finally:
        store.close()
        db.dispose()


def test_a_renewal_of_the_placement_locks_only_its_own_rows(db_dsn: str):
    """A server's renewal updated its leases with ``kind <> 'server'``: a range of the
    primary key that locked every other server's lease row too, in key order, while another
    server gave its tables back at SIGTERM in its own order: they deadlocked. The renewal
    locks its own rows alone (by primary key)."""
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    store = MySQLStore.from_dsn(db_dsn)
    gained = threading.Event()
    a = Placement(
        connector(store.url, store.database),
        "a:1",
        0.6,
        units=lambda: {"t1"},
        on_gain=lambda _unit, _takeover: gained.set(),
        on_loss=lambda _unit, _sender: True,
    )
    try:
        a.prepare()
        a.start()
        assert gained.wait(WAIT_S), "server a never took its table"
        with db.connect() as conn:  # server b's live leases of t0 and t2
            conn.execute(
                sa.text(
                    f"insert into {PLACEMENT_TABLE} (kind, name, holder, address, expires) "
                    "values ('table', 't0', 'b', 'b:1', utc_timestamp(6) + interval 1 hour), "
                    "('table', 't2', 'b', 'b:1', utc_timestamp(6) + interval 1 hour)"
                )
            )
        before = deadlocks(db)
        give_back = (
            f"update {PLACEMENT_TABLE} set expires = utc_timestamp(6), released = 1 "
            "where kind = 'table' and name = :n and holder = 'b'"
        )
        b = sa.create_engine(db_dsn).connect()  # b at SIGTERM: t2 given back, then t0
        try:
            tx = b.begin()
            b.execute(sa.text(give_back), {"n": "t2"})
            stepped, _ = in_thread(lambda: a.await_step(WAIT_S, wake=True))
            # a's renewal either waits for t2 (the range) or is done (its own row alone)
            wait_until(
                lambda: running(db, "UPDATE msgtable_placement%") or not stepped.is_alive(),
                what="server a's renewal",
            )
            b.execute(sa.text(give_back), {"n": "t0"})
            tx.commit()
        finally:
            b.close()
        stepped.join(WAIT_S)
        assert deadlocks(db) == before, "the renewal and the give-back deadlocked"
        assert a.held() == ["t1"]
    finally:
        a.close()
        store.close()
        db.dispose()


def test_the_purge_and_the_fanout_lock_only_the_rows_they_change(db_dsn: str):
    """The chaos run's deadlock: the purge's DELETE of acked, handed-over rows by id and
    the fan-out's UPDATE of time_fanout by id were each planned as a scan of the whole
    table (EXPLAIN: type ALL and index, rows 400, for 200 and 150 ids of 400), so the
    DELETE waited for the unseen rows the fan-out's pick had locked while the UPDATE waited
    for the rows the DELETE had deleted. Each takes its own rows alone (by primary key), and
    the two sets never meet: the purge takes only rows handed over, the fan-out only rows
    not handed over yet."""
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    store = MySQLStore.from_dsn(db_dsn)
    text = comment(vt_default_group=False)
    try:
        with db.connect() as conn:
            conn.execute(sa.text(current_layout_ddl("q", text)))
            conn.execute(sa.text(add_fanout_ddl("q")))
            old = time.time_ns() - 10**12  # acked and handed over long ago: purgeable
            done = ",".join(f"({i}, 'm{i}', {old}, {old})" for i in range(1, 201))
            conn.execute(
                sa.text(f"insert into q(id, message, time_acked, time_fanout) values {done}")
            )
            fresh = ",".join(f"({i}, 'm{i}')" for i in range(201, 401))
            conn.execute(sa.text(f"insert into q(id, message) values {fresh}"))
            conn.execute(sa.text("analyze table q"))
        cfg = dataclasses.replace(load_table("q", text, CURRENT_COLUMNS, (("id",),)), fanout=True)
        fan = FanoutStatements(cfg)
        before = deadlocks(db)
        fanout = sa.create_engine(db_dsn).connect()
        try:
            tx = fanout.begin()
            picked = run_sql(fanout, *fan.pick([], 150)).fetchall()  # rows 201-350
            assert [r[0] for r in picked] == list(range(201, 351)), "the pick"
            t, purged = in_thread(lambda: store.purge(cfg, time.time_ns(), 1_000))
            # the purge either waits for a picked row (a scan) or is done (its rows alone)
            wait_until(
                lambda: running(db, "/* msgtable */ DELETE%") or not t.is_alive(),
                what="the purge's DELETE",
            )
            marked: list[Any] = []
            try:
                ids = [r[0] for r in picked]  # numbered 201-350 of the sequence
                marked.append(run_sql(fanout, *fan.mark_sql(ids, 350, time.time_ns() + 10**12)))
                tx.commit()
            except Exception as exc:
                marked.append(exc)
        finally:
            fanout.close()
        t.join(WAIT_S)
        assert not t.is_alive(), "the purge never ended"
        assert deadlocks(db) == before, f"the purge and the fan-out deadlocked: {purged} {marked}"
        assert purged == [200], f"the purge: {purged}"
        assert marked[0].rowcount == 150, f"the fan-out's mark: {marked}"
    finally:
        store.close()
        db.dispose()


def test_statements_by_id_wait_for_no_row_they_do_not_name(db_dsn: str):
    """The archive's DELETE of acked rows and a dead letter's removal from its table name
    100 ids of a 400-row table: planned as a scan of the whole table they locked every row
    (a transaction holding row 2, named by neither, made them wait). By primary key they
    take their own rows alone (tests/unit/store/test_by_id.py: every such statement)."""
    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    text = comment(vt_dead_letter="q_dead")
    old = time.time_ns() - 10**12
    named = list(range(100, 400, 3))
    try:
        with db.connect() as conn:
            conn.execute(sa.text(current_layout_ddl("q", text)))
            rows = ",".join(f"({i}, 'm{i}', {old})" for i in range(1, 401))
            conn.execute(sa.text(f"insert into q(id, message, time_acked) values {rows}"))
            conn.execute(sa.text("analyze table q"))
        cfg = load_table("q", text, CURRENT_COLUMNS, (("id",),))
        dead_columns = (("time_dead", "bigint"), ("attempts", "bigint"), ("last_error", "text"))
        dead = load_table(
            "q_dead",
            comment(),
            CURRENT_COLUMNS + tuple(Column(c, t, t) for c, t in dead_columns),
            (("id",),),
        )
        statements = {
            "the archive's delete": BulkStatements(cfg).delete_acked(len(named)),
            "a dead letter's removal": DeadStatements(cfg, dead).remove.format(
                ids=", ".join(["%s"] * len(named))
            ),
        }
        holder = sa.create_engine(db_dsn).connect()
        try:
            tx = holder.begin()
            holder.exec_driver_sql("SELECT id FROM q WHERE id = 2 FOR UPDATE").fetchall()
            for what, sql in statements.items():
                with sa.create_engine(db_dsn).connect() as conn:
                    conn.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 2")
                    try:
                        conn.exec_driver_sql(sql, tuple(named))
                    except sa.exc.OperationalError as exc:
                        raise AssertionError(f"{what} waited for row 2: {exc}") from None
                    finally:
                        conn.rollback()
            tx.rollback()
        finally:
            holder.close()
    finally:
        db.dispose()


def test_every_statement_by_id_reads_its_rows_by_the_primary_key(db_dsn: str):
    """EXPLAIN of each locking statement by id (tests/unit/store/test_by_id.py lists them)
    naming 100 ids of a 400-row table: a range of the primary key, never a scan of the
    table (ALL) or of a whole index (index). MariaDB 10.11 ignores FORCE INDEX where the
    statement names no column but the key."""
    from ..unit.store.test_by_id import by_id_statements

    db = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    ids = ", ".join(str(i) for i in range(100, 400, 3))
    dead_columns = "time_dead BIGINT, attempts BIGINT, last_error TEXT"
    try:
        with db.connect() as conn:
            conn.execute(sa.text(current_layout_ddl("q", comment())))
            conn.execute(sa.text("create table q_dead like q"))
            conn.execute(sa.text(f"alter table q_dead add column ({dead_columns})"))
            conn.execute(sa.text(current_layout_ddl("q__s", comment())))
            for table in ("q", "q_dead", "q__s"):
                rows = ",".join(f"({i}, 'm{i}')" for i in range(1, 401))
                conn.execute(sa.text(f"insert into {table}(id, message) values {rows}"))
                conn.execute(sa.text(f"analyze table {table}"))
            version = conn.exec_driver_sql("select version()").scalar_one().lower()
            mysql = "mariadb" not in version
            plans = {}
            for name, template in by_id_statements().items():
                sql = template.replace("{ids}", ids).replace("{first}", "0")
                sql = sql.replace("%s", "1")
                explain = "EXPLAIN FORMAT=TRADITIONAL " if mysql else "EXPLAIN "
                result = conn.exec_driver_sql(explain + sql.replace("%", "%%"))
                keys = list(result.keys())
                plans[name] = [
                    (row[keys.index("table")], row[keys.index("type")], row[keys.index("key")])
                    for row in result
                    if row[keys.index("table")] in ("q", "q_dead", "q__s")
                    and row[keys.index("select_type")] != "INSERT"  # (MySQL: the target's row)
                ]
        scans = {n: p for n, p in plans.items() if any(t in ("ALL", "index") for _, t, _ in p)}
        assert not scans, f"statements by id that scan a whole table or index: {scans}"
        off_key = {n: p for n, p in plans.items() if any(k != "PRIMARY" for _, _, k in p)}
        assert not off_key, f"statements by id off the primary key: {off_key}"
    finally:
        db.dispose()
