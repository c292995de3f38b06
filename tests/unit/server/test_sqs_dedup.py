"""The SQS API's MessageDeduplicationId on a vt_dedup table (msgtable.core.dedup): it goes into
the table's key column, whose unique index refuses a duplicate within the window."""

from __future__ import annotations

from msgtable.core.tables import Column, load_table
from msgtable.server.sqs.messages import DEDUP_COLUMN, Outgoing, dedup_column, shape_of
from msgtable.testing import CURRENT_COLUMNS

COMMENT = (
    "vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=10,"
    "vt_cache_size=10000,vt_poller_interval=30"
)


def test_the_deduplication_id_goes_into_the_tables_vt_dedup_column():
    columns = (*CURRENT_COLUMNS, Column("idem", "varchar", "varchar(128)"))
    indexes = (("PRIMARY", ("id",)), ("idem_idx", ("idem",)), ("c", ("time_created", "idem")))
    cfg = load_table("jobs", COMMENT + ",vt_dedup=idem", columns, (("id",), ("idem",)), indexes)
    assert dedup_column(cfg) == "idem"
    shape = shape_of(cfg)
    assert shape.has_dedup
    row = shape.row(Outgoing("hello", {}, 0, None, "d-1"), 7)
    assert row == {"id": 7, "message": "hello", "idem": "d-1"}
    assert shape.dedup_id([7, "hello", "d-1"]) == "d-1"


def test_without_vt_dedup_it_is_the_message_deduplication_id_column_as_before():
    cfg = load_table("jobs", COMMENT, CURRENT_COLUMNS, (("id",),))
    assert dedup_column(cfg) == DEDUP_COLUMN
    assert not shape_of(cfg).has_dedup
