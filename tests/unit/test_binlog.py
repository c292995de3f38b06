from __future__ import annotations

from msgtable.binlog import BinlogStatus, RowChange, gtid_state, row_changes

COLUMNS = ("id", "priority", "time_next", "epoch", "time_acked", "message")


def row(i, time_next=0, epoch=0, acked=None, priority=0, unnamed=False):
    values = dict(zip(COLUMNS, (i, priority, time_next, epoch, acked, "m"), strict=True))
    if unnamed:  # binlog_row_metadata=MINIMAL: the library numbers the columns
        return {f"UNKNOWN_COL{n}": v for n, v in enumerate(values.values())}
    return values


def test_an_ack_by_dml_is_gone_and_a_reschedule_is_moved():
    rows = [
        {"before_values": row(1), "after_values": row(1, time_next=None, acked=5)},
        {"before_values": row(2, time_next=9, epoch=1), "after_values": row(2, epoch=0)},
        {"before_values": row(3), "after_values": row(3)},  # nothing engine-visible changed
        {"before_values": row(4), "after_values": row(4, priority=3)},
    ]
    assert row_changes(rows, COLUMNS, update=True) == [
        RowChange(1, gone=True, moved=False),
        RowChange(2, gone=False, moved=True),
        RowChange(4, gone=False, moved=True),
    ]


def test_deleted_rows_are_gone_and_numbered_columns_are_named_by_position():
    rows = [{"values": row(7, unnamed=True)}]
    assert row_changes(rows, COLUMNS, update=False) == [RowChange(7, gone=True, moved=False)]


def test_rows_of_another_shape_than_the_table_ask_for_a_new_pass():
    rows = [{"values": {"UNKNOWN_COL0": 1, "UNKNOWN_COL1": 2}}]
    assert row_changes(rows, COLUMNS, update=False) is None


def test_the_binlog_must_be_on_and_row_based():
    assert BinlogStatus(True, "ROW", "b.1", 4, True).unusable_because() is None
    assert "log_bin" in str(BinlogStatus(False, "ROW", "", 0, True).unusable_because())
    assert "MIXED" in str(BinlogStatus(True, "MIXED", "b.1", 4, False).unusable_because())


def test_a_mariadb_gtid_position_is_read_per_domain():
    assert gtid_state("") == {}
    assert gtid_state("0-1-100") == {"0": "0-1-100"}
    assert gtid_state("0-1-100, 7-2-3") == {"0": "0-1-100", "7": "7-2-3"}
