from __future__ import annotations

import pytest

from msgtable.core.tables import Column, Layout, current_layout_ddl, load_table, parse_comment
from msgtable.errors import TableLoadError
from msgtable.testing import CURRENT_COLUMNS

GOOD = (
    "vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=10,"
    "vt_cache_size=10000,vt_poller_interval=30"
)
V2018_COLUMNS = (
    Column("time_scheduled", "bigint", "bigint(20)"),
    Column("id", "bigint", "bigint(20)"),
    Column("time_next", "bigint", "bigint(20)"),
    Column("epoch", "bigint", "bigint(20)"),
    Column("time_created", "bigint", "bigint(20)"),
    Column("time_acked", "bigint", "bigint(20)"),
    Column("message", "varchar", "varchar(128)"),
)


def load(comment: str = GOOD, columns=CURRENT_COLUMNS, unique=(("id",),)):
    return load_table("my_message", comment, columns, unique)


def test_the_documented_comment_loads_with_its_values():
    cfg = load()
    assert (
        cfg.ack_wait_s,
        cfg.purge_after_s,
        cfg.batch_size,
        cfg.cache_size,
        cfg.poller_interval_s,
    ) == (30, 86400, 10, 10000, 30)
    assert cfg.min_backoff_s == 30 and cfg.max_backoff_s == 0
    assert cfg.layout is Layout.CURRENT
    assert [c.name for c in cfg.message_columns] == ["id", "message"]


def test_optional_backoff_fields_and_fractions_are_read():
    cfg = load(
        GOOD.replace("vt_ack_wait=30", "vt_ack_wait=0.5") + ",vt_min_backoff=2,vt_max_backoff=60"
    )
    assert (cfg.ack_wait_s, cfg.min_backoff_s, cfg.max_backoff_s) == (0.5, 2, 60)


def test_postpone_after_defaults_to_one_second_and_never_exceeds_the_ack_wait():
    assert load().postpone_after_s == 1.0 and load().postpone_after_ns == 10**9
    assert load(GOOD + ",vt_postpone_after=0").postpone_after_ns == 0
    assert load(GOOD + ",vt_postpone_after=2.5").postpone_after_ns == 2_500_000_000
    short = load(GOOD.replace("vt_ack_wait=30", "vt_ack_wait=0.2"))
    assert short.postpone_after_s == 1.0 and short.postpone_after_ns == 200_000_000


def test_spaces_around_fields_are_tolerated():
    assert load(GOOD.replace(",", " , ")).batch_size == 10


@pytest.mark.parametrize(
    "comment, field",
    [
        (GOOD.replace(",vt_ack_wait=30", ""), "vt_ack_wait"),
        (GOOD.replace("vt_batch_size=10", "vt_batch_size=ten"), "vt_batch_size"),
        (GOOD.replace("vt_batch_size=10", "vt_batch_size=0"), "vt_batch_size"),
        (GOOD.replace("vt_batch_size=10", "vt_batch_size=1.5"), "vt_batch_size"),
        (GOOD.replace("vt_cache_size=10000", "vt_cache_size=-1"), "vt_cache_size"),
        (GOOD.replace("vt_ack_wait=30", "vt_ack_wait=0"), "vt_ack_wait"),
        (GOOD.replace("vt_ack_wait=30", "vt_ack_wait=nan"), "vt_ack_wait"),
        (GOOD.replace("vt_poller_interval=30", "vt_poller_interval=-5"), "vt_poller_interval"),
        (GOOD.replace("vt_purge_after=86400", "vt_purge_after=-1"), "vt_purge_after"),
        (GOOD + ",vt_min_backoff=0", "vt_min_backoff"),
        (GOOD + ",vt_max_backoff=5,vt_min_backoff=10", "vt_max_backoff"),
        (GOOD + ",vt_postpone_after=-1", "vt_postpone_after"),
        (GOOD + ",vt_postpone_after=soon", "vt_postpone_after"),
        (GOOD + ",vt_colour=blue", "vt_colour"),
        (GOOD + ",vt_batch_size=20", "vt_batch_size"),
        (GOOD + ",whatever", "whatever"),
    ],
)
def test_a_bad_comment_names_the_table_and_the_field(comment, field):
    with pytest.raises(TableLoadError) as e:
        load(comment)
    assert "my_message" in str(e.value) and field in str(e.value)


def test_a_missing_required_column_is_named():
    cols = tuple(c for c in CURRENT_COLUMNS if c.name != "epoch")
    with pytest.raises(TableLoadError, match=r"my_message.*epoch"):
        load(columns=cols)


def test_an_engine_column_that_is_not_an_integer_is_refused():
    cols = tuple(
        Column("time_next", "varchar", "varchar(20)") if c.name == "time_next" else c
        for c in CURRENT_COLUMNS
    )
    with pytest.raises(TableLoadError, match="time_next"):
        load(columns=cols)


def test_id_must_be_unique_on_its_own():
    with pytest.raises(TableLoadError, match="id must be unique"):
        load(unique=(("time_scheduled", "id"),))


def test_the_2018_layout_loads_and_streams_id_and_message():
    cfg = load(columns=V2018_COLUMNS, unique=(("time_scheduled", "id"), ("id",)))
    assert cfg.layout is Layout.V2018
    assert [c.name for c in cfg.message_columns] == ["id", "message"]


def test_message_cols_selects_the_streamed_columns():
    cols = (*CURRENT_COLUMNS, Column("extra", "json", "json"))
    cfg = load(GOOD + ",vt_message_cols=id|extra", columns=cols)
    assert [c.name for c in cfg.message_columns] == ["id", "extra"]
    with pytest.raises(TableLoadError, match="vt_message_cols"):
        load(GOOD + ",vt_message_cols=message|id", columns=cols)
    with pytest.raises(TableLoadError, match="nope"):
        load(GOOD + ",vt_message_cols=id|nope", columns=cols)


def test_parse_comment_requires_the_marker():
    with pytest.raises(TableLoadError, match="vitess_message"):
        parse_comment("t", "vt_ack_wait=1")


def test_schema_current_sql_is_the_recommended_ddl():
    from pathlib import Path

    text = (Path(__file__).parents[3] / "schema" / "current.sql").read_text()
    ddl = current_layout_ddl().strip().replace("create table", "create table if not exists", 1)
    assert ddl + ";" in text


def test_every_problem_of_a_table_is_reported_at_once():
    comment = GOOD.replace("vt_ack_wait=30", "vt_ack_wait=soon").replace(
        "vt_batch_size=10", "vt_batch_size=0"
    )
    comment += ",vt_colour=blue,vt_message_cols=message"
    columns = tuple(c for c in CURRENT_COLUMNS if c.name != "epoch")
    with pytest.raises(TableLoadError) as raised:
        load(comment, columns, unique=())
    text = str(raised.value)
    assert text.startswith("table my_message: ")
    for problem in (
        "unknown comment field 'vt_colour'",
        "vt_ack_wait='soon' is not a number",
        "vt_batch_size=0 must be at least 1",
        "missing required column epoch",
        "column id must be unique on its own",
        "vt_message_cols must start with id",
    ):
        assert problem in text, text
    assert text.count("; ") == 5  # six problems, one message


def test_time_created_is_an_engine_column_of_the_current_layout_too():
    assert [c.name for c in load().message_columns] == ["id", "message"]
    assert "time_created" in [c.name for c in load().columns]
