"""The contract of the schedule store and of vt_dedup: every case runs on the in-memory store
(msgtable.testing.schedules.InMemorySchedules over an InMemoryStore) and on MySQL
(msgtable.store.schedules.ScheduleSQL over a MySQLStore), so the fake cannot drift from the
real store. A case that passes on one and fails on the other is a drift: fix the fake (or the
real store), never the case.

What the ScheduleStore Protocol promises: schedules listed by name as created (their counters
start at none), a name once whatever its case (the name column's collation), drop once; a
tick is its message and the move of next_tick together, conditional on the next_tick read,
so two stores of one database racing for a tick enqueue it once; a tick whose message is a
duplicate moves on without a second one; the ticker's catch-up and skip of missed ticks come
out alike; an unreachable database fails each call as Unavailable. vt_dedup: the database
refuses a duplicate key (error 1062) and takes any number of NULL keys; expire_dedup clears
the keys of rows created before the cutoff (then the key may be used again), and the purge
keeps an acked row while it holds its key.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from msgtable.core.clock import FakeClock
from msgtable.core.schedules import MISSED_AFTER_S, Missed, Schedule, tick_id
from msgtable.core.tables import DEMO_COMMENT, Column, TableConfig, current_layout_ddl, load_table
from msgtable.errors import InvalidArgument, Unavailable
from msgtable.features.schedules.ticker import Ticker
from msgtable.store.mysql import DUPLICATE_KEY, error_code
from msgtable.store.mysqlstore import MySQLStore
from msgtable.store.protocol import Store
from msgtable.store.schedules import ScheduleSQL, ScheduleStore
from msgtable.testing import CURRENT_COLUMNS, InMemoryStore
from msgtable.testing.devdb import free_port
from msgtable.testing.schedules import InMemorySchedules

S = 10**9
NOW = 1_800_000_000 * S
COMMENT = DEMO_COMMENT + ",vt_dedup=dedup_key,vt_dedup_window=30"
EXTRA = {
    "dedup_key": "varchar(64)",
    "schedule_tick": "bigint",
    "schedule_name": "varchar(64)",
}
INDEXES = (("dedup_idx", ("dedup_key",)), ("dedup_created_idx", ("time_created", "dedup_key")))


class Database:
    """One database of the contract: the message table ``jobs`` (keyed by ``dedup_key``, with
    the schedule's columns) and its config as the engine loads it; ``schedules()`` a new
    schedule store on the database each call (as each server has its own); ``insert`` a row
    as another client's INSERT makes it (a duplicate key raises an error whose code is
    DUPLICATE_KEY); ``ids`` and ``row`` read the table back."""

    store: Store
    cfg: TableConfig

    def load(self) -> TableConfig:
        (d,) = [d for d in self.store.discover() if d.name == "jobs"]
        return load_table(d.name, d.comment, d.columns, d.unique_indexes, d.indexes)

    def schedules(self) -> ScheduleStore: ...
    def unreachable(self) -> ScheduleStore: ...
    def insert(self, id: Hashable, **values: Any) -> None: ...
    def ids(self) -> list[Hashable]: ...
    def row(self, id: Hashable) -> dict[str, Any] | None: ...


class MemoryDatabase(Database):
    def __init__(self) -> None:
        self.store = self.memory = InMemoryStore()
        more = tuple(Column(n, t.partition("(")[0], t) for n, t in EXTRA.items())
        self.memory.create_table(
            "jobs", COMMENT, CURRENT_COLUMNS + more, (("id",), ("dedup_key",)), INDEXES
        )
        self.cfg = self.load()

    def schedules(self) -> ScheduleStore:
        return InMemorySchedules(self.memory)

    def unreachable(self) -> ScheduleStore:
        down = InMemoryStore()
        down.down = True
        return InMemorySchedules(down)

    def insert(self, id: Hashable, **values: Any) -> None:
        self.memory.insert("jobs", id, **values)

    def ids(self) -> list[Hashable]:
        return sorted(self.memory.rows["jobs"], key=repr)

    def row(self, id: Hashable) -> dict[str, Any] | None:
        return self.memory.rows["jobs"].get(id)


class MySQLDatabase(Database):
    def __init__(self, sql: Any, dsn: str) -> None:
        self.sql, self.dsn = sql, dsn
        self.store = MySQLStore.from_dsn(dsn)
        self._stores: list[MySQLStore] = [self.store]
        columns = ",\n  ".join(f"{n} {t}" for n, t in EXTRA.items())
        indexes = ",\n  ".join(
            f"{'unique ' if name == 'dedup_idx' else ''}index {name}({', '.join(cols)})"
            for name, cols in INDEXES
        )
        ddl = current_layout_ddl("jobs", COMMENT).replace(
            "  primary key(id)", f"  {columns},\n  {indexes},\n  primary key(id)"
        )
        sql.execute(ddl)
        self.cfg = self.load()

    def schedules(self) -> ScheduleStore:
        store = MySQLStore.from_dsn(self.dsn)
        self._stores.append(store)
        return ScheduleSQL(store)

    def unreachable(self) -> ScheduleStore:
        store = MySQLStore.from_dsn(f"mysql://nobody@127.0.0.1:{free_port()}/nothing")
        self._stores.append(store)
        return ScheduleSQL(store)

    def insert(self, id: Hashable, **values: Any) -> None:
        values = {"id": id, **values}
        names = ", ".join(values)
        try:
            self.sql.execute(f"insert into jobs({names}) values (:{', :'.join(values)})", values)
        except sa.exc.IntegrityError as exc:
            raise exc.orig from None  # the driver's error, as a client sees it

    def ids(self) -> list[Hashable]:
        return sorted((r[0] for r in self.sql.execute("select id from jobs").fetchall()), key=repr)

    def row(self, id: Hashable) -> dict[str, Any] | None:
        got = self.sql.execute("select * from jobs where id = :id", {"id": id})
        row = got.mappings().first()
        return None if row is None else dict(row)

    def close(self) -> None:
        for s in self._stores:
            s.close()


@pytest.fixture(params=["memory", "mysql"])
def db(request: pytest.FixtureRequest) -> Iterator[Database]:
    """The same cases on the in-memory store and on MySQL (a fresh database per test)."""
    if request.param == "memory":
        yield MemoryDatabase()
        return
    d = MySQLDatabase(request.getfixturevalue("sql"), request.getfixturevalue("db_dsn"))
    try:
        yield d
    finally:
        d.close()


def beat(
    name: str = "beat", next_tick_ns: int = NOW, cron: str = "* * * * * *", **kw: Any
) -> Schedule:
    """A schedule of jobs (every second unless ``cron`` says), in Paris's time."""
    kw.setdefault("values", {"message": "tick", "priority": 3})
    return Schedule(name, "jobs", cron, "Europe/Paris", next_tick_ns=next_tick_ns, **kw)


def only(store: ScheduleStore, name: str = "beat") -> Schedule:
    (s,) = [s for s in store.schedules() if s.name == name]
    return s


def is_duplicate(call: Any) -> bool:
    try:
        call()
    except Exception as exc:
        assert error_code(exc) == DUPLICATE_KEY, f"not a duplicate key: {exc!r}"
        return True
    return False


# -- definitions -----------------------------------------------------------------------------
def test_a_created_schedule_is_listed_as_made_by_name_and_dropped_once(db: Database):
    store = db.schedules()
    assert store.schedules() == [] and store.drop("beat") is False  # no table yet: none
    made = beat(ticks=7, last_tick_ns=NOW - S, last_enqueued_ns=NOW - S, missed=Missed.ONCE)
    store.create(made, NOW)
    store.create(beat("alpha", values={}), NOW)
    listed = store.schedules()
    assert [s.name for s in listed] == ["alpha", "beat"]
    # what a schedule has done is the store's to count: a new one has done nothing
    fresh = Schedule(
        **{**made.__dict__, "ticks": 0, "last_tick_ns": None, "last_enqueued_ns": None}
    )
    assert listed[1] == fresh and db.schedules().schedules() == listed
    assert store.drop("beat") is True
    assert store.drop("beat") is False
    assert [s.name for s in store.schedules()] == ["alpha"]


def test_a_name_is_taken_once_whatever_its_case(db: Database):
    store = db.schedules()
    store.create(beat(), NOW)
    for name in ("beat", "BEAT", "Beat"):
        with pytest.raises(InvalidArgument, match=f"^schedule {name!r} exists$"):
            store.create(beat(name), NOW)
    assert [s.name for s in store.schedules()] == ["beat"]
    assert store.drop("BEAT") is True and store.schedules() == []


def test_a_schedule_made_by_hand_is_started_once(db: Database):
    store = db.schedules()
    store.create(beat(next_tick_ns=0), NOW)
    assert store.start("beat", NOW + 5 * S) is True
    assert store.start("beat", NOW + 9 * S) is False  # started already
    assert store.start("nothing", NOW) is False
    assert only(store).next_tick_ns == NOW + 5 * S


# -- ticks -----------------------------------------------------------------------------------
def test_a_tick_is_its_message_and_the_move_of_next_tick_together(db: Database):
    store = db.schedules()
    store.create(beat(), NOW)
    read = only(store)
    assert store.tick(read, db.cfg, NOW, NOW + S, NOW + 100) is True
    id_ = tick_id("beat", NOW, "integer")
    assert db.ids() == [id_]
    row = db.row(id_)
    assert row is not None
    got = {k: row[k] for k in ("message", "priority", "schedule_tick", "schedule_name", "epoch")}
    assert got == {
        "message": "tick",
        "priority": 3,
        "schedule_tick": NOW,
        "schedule_name": "beat",
        "epoch": 0,
    }
    after = only(store)
    assert (after.next_tick_ns, after.last_tick_ns, after.last_enqueued_ns, after.ticks) == (
        NOW + S,
        NOW,
        NOW + 100,
        1,
    )
    # the same tick again, from the schedule as read before: another server moved it first
    assert store.tick(read, db.cfg, NOW, NOW + S, NOW + 200) is False
    assert db.ids() == [id_] and only(store) == after


def test_a_tick_that_enqueues_nothing_moves_next_tick_alone(db: Database):
    store = db.schedules()
    store.create(beat(), NOW)
    assert store.tick(only(store), db.cfg, None, NOW + 60 * S, NOW) is True
    after = only(store)
    assert (after.next_tick_ns, after.last_tick_ns, after.last_enqueued_ns, after.ticks) == (
        NOW + 60 * S,
        None,
        None,
        0,
    )
    assert db.ids() == []


def test_a_tick_whose_message_is_a_duplicate_moves_on_without_a_second_one(db: Database):
    store = db.schedules()
    store.create(beat(values={"message": "tick", "dedup_key": "daily"}), NOW)
    db.insert(1, dedup_key="daily", message="by hand")
    assert store.tick(only(store), db.cfg, NOW, NOW + S, NOW + 10) is True
    assert db.ids() == [1]
    after = only(store)
    assert (after.next_tick_ns, after.last_tick_ns, after.ticks) == (NOW + S, NOW, 0)


def test_a_tick_of_a_dropped_schedule_does_nothing(db: Database):
    store = db.schedules()
    store.create(beat(), NOW)
    read = only(store)
    assert db.schedules().drop("beat") is True
    assert store.tick(read, db.cfg, NOW, NOW + S, NOW) is False
    assert db.ids() == []


def test_two_stores_of_one_database_racing_for_each_tick_enqueue_it_once(db: Database):
    rounds = 20
    first, second = db.schedules(), db.schedules()
    first.create(beat(), NOW)
    barrier = threading.Barrier(2, timeout=30)
    won: list[list[bool]] = [[], []]
    errors: list[BaseException] = []

    def race(store: ScheduleStore, mine: list[bool]) -> None:
        try:
            for _ in range(rounds):
                read = only(store)
                barrier.wait()  # both read the same next_tick
                t = read.next_tick_ns
                mine.append(store.tick(read, db.cfg, t, t + S, t))
                barrier.wait()  # both done before either reads again
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [
        threading.Thread(target=race, args=(s, w))
        for s, w in zip((first, second), won, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert all(a != b for a, b in zip(*won, strict=True)), won  # one winner each round
    assert len(db.ids()) == rounds
    assert {tick_id("beat", NOW + k * S, "integer") for k in range(rounds)} == set(db.ids())
    assert only(first).ticks == rounds


# -- what the ticker makes of a store: catch-up and skip of missed ticks ---------------------
def ticker(db: Database, store: ScheduleStore, clock: FakeClock) -> Ticker:
    return Ticker(store, {"jobs": db.cfg}.get, clock, lambda: True, lambda table: None)


def test_a_schedule_late_by_less_than_the_missed_limit_catches_up_each_tick_once(db: Database):
    store, clock = db.schedules(), FakeClock(NOW)
    store.create(beat(next_tick_ns=NOW - 90 * S), NOW)
    assert MISSED_AFTER_S > 90
    ticker(db, store, clock).tick_once()
    ticks = sorted(r["schedule_tick"] for r in (db.row(i) for i in db.ids()) if r)
    assert ticks == [NOW - k * S for k in range(90, -1, -1)]
    after = only(store)
    assert (after.next_tick_ns, after.ticks) == (NOW + S, 91)


@pytest.mark.parametrize("missed", [Missed.ONCE, Missed.SKIP])
def test_ticks_missed_while_no_server_ran_are_enqueued_once_or_skipped(
    db: Database, missed: Missed
):
    hourly = "0 * * * *"
    assert NOW % (3600 * S) == 0  # NOW is a tick of hourly, half an hour ago at the clock
    store, clock = db.schedules(), FakeClock(NOW + 1800 * S)
    store.create(beat(next_tick_ns=NOW - 5 * 3600 * S, cron=hourly, missed=missed), NOW)
    t = ticker(db, store, clock)
    t.tick_once()
    ticks = [r["schedule_tick"] for r in (db.row(i) for i in db.ids()) if r]
    if missed is Missed.ONCE:
        assert ticks == [NOW] and only(store).ticks == 1  # once, as the last tick due
    else:
        assert ticks == [] and only(store).ticks == 0
    assert only(store).next_tick_ns == NOW + 3600 * S and t.skipped == 1


# -- an unreachable database ------------------------------------------------------------------
def test_an_unreachable_database_fails_each_call_as_unavailable(db: Database):
    store = db.unreachable()
    calls = {
        "schedules": lambda: store.schedules(),
        "create": lambda: store.create(beat(), NOW),
        "drop": lambda: store.drop("beat"),
        "start": lambda: store.start("beat", NOW),
        "tick": lambda: store.tick(beat(), db.cfg, NOW, NOW + S, NOW),
    }
    raised = {}
    for name, call in calls.items():
        try:
            call()
            raised[name] = "nothing"
        except Unavailable:
            raised[name] = "Unavailable"
    assert raised == dict.fromkeys(calls, "Unavailable")


# -- vt_dedup --------------------------------------------------------------------------------
def test_the_dedup_settings_load_alike(db: Database):
    c = db.cfg
    assert (c.dedup, c.dedup_window_s, c.dedup_index) == ("dedup_key", 30.0, "dedup_idx")


def test_a_duplicate_key_is_refused_and_null_keys_never_collide(db: Database):
    db.insert(1, dedup_key="k", message="first")
    assert is_duplicate(lambda: db.insert(2, dedup_key="k", message="again"))
    db.insert(3, message="no key")
    db.insert(4, dedup_key=None, message="no key")
    db.insert(5, dedup_key="K2", message="other key")
    assert db.ids() == [1, 3, 4, 5]
    assert db.row(1)["message"] == "first"  # type: ignore[index]


def test_expire_dedup_frees_the_keys_created_before_the_cutoff_only(db: Database):
    for i, key in enumerate(("a", "b", "c"), start=1):
        db.insert(i, dedup_key=key, time_created=NOW - 100 * S)
    db.insert(4, dedup_key="new", time_created=NOW)
    db.insert(5, time_created=NOW - 100 * S)  # no key: nothing to clear
    cutoff = NOW - 30 * S
    assert db.store.expire_dedup(db.cfg, NOW - 200 * S, cutoff, 2) == 2  # a limit of 2
    assert db.store.expire_dedup(db.cfg, NOW - 200 * S, cutoff, 100) == 1
    assert db.store.expire_dedup(db.cfg, NOW - 200 * S, cutoff, 100) == 0
    assert db.store.expire_dedup(db.cfg, NOW - 50 * S, NOW + S, 100) == 1  # since: only new
    assert [db.row(i)["dedup_key"] for i in (1, 2, 3, 4)] == [None] * 4  # type: ignore[index]
    db.insert(6, dedup_key="a", time_created=NOW)  # the key may be used again
    assert is_duplicate(lambda: db.insert(7, dedup_key="a"))


def test_the_purge_keeps_an_acked_row_while_it_holds_its_key(db: Database):
    db.insert(1, dedup_key="k", time_created=NOW - 100 * S, time_acked=NOW - 100 * S)
    db.insert(2, time_created=NOW - 100 * S, time_acked=NOW - 100 * S)
    assert db.store.purge(db.cfg, NOW, 100) == 1  # row 2: no key
    assert db.ids() == [1]
    assert db.store.expire_dedup(db.cfg, 0, NOW - 30 * S, 100) == 1
    assert db.store.purge(db.cfg, NOW, 100) == 1
    assert db.ids() == []
