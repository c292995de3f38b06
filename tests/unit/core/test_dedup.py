from __future__ import annotations

import threading

import pytest

from msgtable.core.clock import FakeClock
from msgtable.core.dedup import DEFAULT_DEDUP_WINDOW_S, is_duplicate_of
from msgtable.core.retry import Backoff
from msgtable.core.tables import Column, load_table
from msgtable.engine.purger import Purger
from msgtable.errors import TableLoadError
from msgtable.store.statements import TableStatements
from msgtable.testing import CURRENT_COLUMNS, InMemoryStore

GOOD = (
    "vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=10,"
    "vt_cache_size=10000,vt_poller_interval=30"
)
KEY = Column("dedup_key", "varchar", "varchar(64)")
COLUMNS = (*CURRENT_COLUMNS, KEY)
UNIQUE = (("id",), ("dedup_key",))
INDEXES = (
    ("PRIMARY", ("id",)),
    ("dedup_idx", ("dedup_key",)),
    ("dedup_created_idx", ("time_created", "dedup_key")),
)


def load(fields: str = ",vt_dedup=dedup_key", columns=COLUMNS, unique=UNIQUE, indexes=INDEXES):
    return load_table("jobs", GOOD + fields, columns, unique, indexes)


def test_a_dedup_table_loads_with_its_key_window_and_index():
    cfg = load(",vt_dedup=dedup_key,vt_dedup_window=60")
    assert (cfg.dedup, cfg.dedup_window_s, cfg.dedup_index) == ("dedup_key", 60.0, "dedup_idx")
    assert load().dedup_window_s == DEFAULT_DEDUP_WINDOW_S
    assert load("").dedup == ""


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        (",vt_dedup_window=60", "vt_dedup_window needs vt_dedup"),
        (",vt_dedup=", "vt_dedup must name a column"),
        (",vt_dedup=nope", "vt_dedup names unknown column 'nope'"),
        (",vt_dedup=time_next", "vt_dedup=time_next is an engine column"),
        (",vt_dedup=id", "vt_dedup=id is an engine column"),
        (",vt_dedup=dedup_key,vt_dedup_window=0", "vt_dedup_window=0 must be greater than zero"),
        (",vt_dedup=dedup_key,vt_dedup_window=nan", "vt_dedup_window=nan must be greater"),
        (",vt_dedup=dedup_key,vt_dedup_window=1e300", "at most 315360000 seconds"),
        (",vt_dedup=dedup_key,vt_dedup_window=soon", "vt_dedup_window='soon' is not a number"),
    ],
)
def test_a_bad_dedup_field_is_named(fields, said):
    with pytest.raises(TableLoadError, match="table jobs: .*" + said.replace("(", r"\(")):
        load(fields)


def test_the_missing_indexes_are_named_with_the_ddl_to_run():
    with pytest.raises(TableLoadError) as e:
        load(unique=(("id",),), indexes=(("PRIMARY", ("id",)),))
    assert str(e.value).endswith(
        "ALTER TABLE jobs ADD UNIQUE INDEX dedup_idx (dedup_key), "
        "ADD INDEX dedup_created_idx (time_created, dedup_key)"
    )
    assert "\n" not in str(e.value)
    with pytest.raises(TableLoadError, match=r"ALTER TABLE jobs ADD UNIQUE INDEX dedup_idx"):
        load(unique=(("id",),), indexes=INDEXES[:1] + INDEXES[2:])


def test_the_key_column_must_take_null_and_be_a_key_type():
    not_null = (*CURRENT_COLUMNS, Column("dedup_key", "varchar", "varchar(64)", nullable=False))
    with pytest.raises(TableLoadError, match=r"MODIFY dedup_key varchar\(64\) NULL"):
        load(columns=not_null)
    as_json = (*CURRENT_COLUMNS, Column("dedup_key", "json", "json"))
    with pytest.raises(TableLoadError, match="must be text, binary or an integer, not json"):
        load(columns=as_json)


def test_the_window_runs_from_time_created_which_the_table_must_have():
    without = tuple(c for c in COLUMNS if c.name != "time_created")
    with pytest.raises(TableLoadError, match="ADD COLUMN time_created bigint"):
        load(columns=without)


def test_the_purge_of_a_dedup_table_leaves_rows_that_hold_their_key():
    st = TableStatements(load())
    assert st.purge_pick.endswith("AND `dedup_key` IS NULL LIMIT %s")
    assert st.expire_dedup == (
        "/* msgtable */ UPDATE `jobs` SET `dedup_key` = NULL WHERE `time_created` >= %s "
        "AND `time_created` < %s AND `dedup_key` IS NOT NULL LIMIT %s"
    )
    plain = TableStatements(load(""))
    assert plain.expire_dedup == "" and "dedup" not in plain.purge


def test_a_duplicate_is_known_by_its_index_on_mariadb_and_mysql():
    assert is_duplicate_of("Duplicate entry 'k1' for key 'dedup_idx'", "jobs", "dedup_idx")
    assert is_duplicate_of("Duplicate entry 'k1' for key 'jobs.dedup_idx'", "jobs", "dedup_idx")
    assert not is_duplicate_of("Duplicate entry '7' for key 'PRIMARY'", "jobs", "dedup_idx")
    assert not is_duplicate_of("Duplicate entry 'x' for key 'other'", "jobs", "")


def _purger(store, cfg, clock):
    return Purger(store, lambda: cfg, clock, threading.Event(), lambda: False, Backoff(0.1, 1.0))


def test_the_purger_clears_keys_past_the_window_and_then_purges_their_acked_rows():
    cfg = load(",vt_dedup=dedup_key,vt_dedup_window=10")
    cfg = type(cfg)(**{**cfg.__dict__, "purge_after_s": 0.0})
    store = InMemoryStore()
    store.create_table("jobs", GOOD, COLUMNS, UNIQUE, INDEXES)
    clock = FakeClock(1_000 * 10**9)
    store.insert("jobs", 1, dedup_key="a", time_created=clock.now_ns(), time_acked=1)
    store.insert("jobs", 2, dedup_key="b", time_created=clock.now_ns())
    purger = _purger(store, cfg, clock)
    assert purger.purge_once() == 0  # acked, but its key is within the window
    assert store.rows["jobs"][1]["dedup_key"] == "a"
    clock.advance(10.5)
    assert purger.purge_once() == 1
    assert 1 not in store.rows["jobs"]
    assert store.rows["jobs"][2]["dedup_key"] is None  # unacked: stays, its key freed


def test_the_purger_looks_back_for_late_commits_and_sweeps_everything_hourly():
    cfg = load(",vt_dedup=dedup_key,vt_dedup_window=10")
    store = InMemoryStore()
    store.create_table("jobs", GOOD, COLUMNS, UNIQUE, INDEXES)
    clock = FakeClock(10_000 * 10**9)
    purger = _purger(store, cfg, clock)
    timer = [0.0]
    purger.timer = lambda: timer[0]
    purger.expire_dedup_once()
    clock.advance(100)
    purger.expire_dedup_once()  # the next pass looks back to 60 s before this one's cutoff
    store.insert("jobs", 1, dedup_key="late", time_created=clock.now_ns() - 50 * 10**9)
    store.insert("jobs", 2, dedup_key="later", time_created=clock.now_ns() - 90 * 10**9)
    assert purger.expire_dedup_once() == 1  # 50 s after its INSERT: within the look-back
    timer[0] = 3600.0
    assert purger.expire_dedup_once() == 1  # the full sweep
    assert all(r["dedup_key"] is None for r in store.rows["jobs"].values())
