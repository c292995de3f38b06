from __future__ import annotations

import io
import time
import types

import pymysql
import pytest

from msgtable.core.rows import RowChange
from msgtable.core.sql import STATEMENT_MARK
from msgtable.engine.binlog import (
    PARSE_MAX_BYTES,
    BinlogFollower,
    gtid_state,
    install_fast_path,
    library_keys,
    row_changes,
)
from msgtable.store.mysql import BinlogStatus

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


def test_an_ack_by_dml_counts_as_acked_only_when_another_client_wrote_it():
    rows = [{"before_values": row(1), "after_values": row(1, time_next=None, acked=5)}]
    assert row_changes(rows, COLUMNS, update=True, theirs=True) == [
        RowChange(1, gone=True, moved=False, acked=True)
    ]
    assert row_changes(rows, COLUMNS, update=True)[0].acked is False


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


def test_a_binlog_without_statement_texts_names_the_variable_that_turns_them_on():
    assert BinlogStatus(True, "ROW", "b.1", 4, True).unannotated_because() is None
    mysql = BinlogStatus(True, "ROW", "b.1", 4, False, annotated=False).unannotated_because()
    assert "SET PERSIST binlog_rows_query_log_events = ON" in str(mysql)
    mariadb = BinlogStatus(True, "ROW", "b.1", 4, True, annotated=False).unannotated_because()
    assert "SET GLOBAL binlog_annotate_row_events = ON" in str(mariadb)


def test_a_mariadb_gtid_position_is_read_per_domain():
    assert gtid_state("") == {}
    assert gtid_state("0-1-100") == {"0": "0-1-100"}
    assert gtid_state("0-1-100, 7-2-3") == {"0": "0-1-100", "7": "7-2-3"}


# -- the fast path: events handled from their raw bytes ------------------------------------
class Sink:
    def __init__(self, tables=("jobs",)):
        self.tables = {t: COLUMNS for t in tables}
        self.inserts: list[str] = []
        self.rows: list[int] = []

    def binlog_tables(self):
        return self.tables

    def binlog_insert(self, table, rows=0, keys=None):
        self.inserts.append(table)
        self.rows.append(rows)
        self.keys = keys  # the last INSERT's poll keys, read when asked

    def binlog_changes(self, table, changes):  # pragma: no cover - the library's path
        raise AssertionError("parsed by the library, not here")

    def binlog_resync(self):  # pragma: no cover
        raise AssertionError("no resync expected")


def packet(kind: int, body: bytes, size: int | None = None, server_id: int = 1) -> bytes:
    """A binlog packet as the stream delivers it: OK byte, 19-byte event header, event."""
    size = 19 + len(body) if size is None else size
    header = (
        (1700000000).to_bytes(4, "little")
        + bytes([kind])
        + server_id.to_bytes(4, "little")
        + size.to_bytes(4, "little")
        + (1234).to_bytes(4, "little")  # next position
        + (0).to_bytes(2, "little")
    )
    return b"\x00" + header + body


def table_map(table_id: int, schema: str, table: str) -> bytes:
    body = table_id.to_bytes(6, "little") + b"\x00\x00"
    body += bytes([len(schema)]) + schema.encode() + b"\x00"
    body += bytes([len(table)]) + table.encode() + b"\x00" + b"\x01\x08\x00\x00"
    return packet(0x13, body)


def rows(kind: int, table_id: int, end: bool = True, size: int | None = None) -> bytes:
    body = table_id.to_bytes(6, "little") + (1 if end else 0).to_bytes(2, "little") + b"\x02\x00"
    return packet(kind, body + b"\x01\xff\x00" * 4, size=size)


WRITE, UPDATE, DELETE = 0x1E, 0x1F, 0x20


def follower(sink):
    return BinlogFollower({}, "app", sink, status=lambda: None)


def test_another_clients_insert_is_a_hint_without_the_library():
    sink = Sink()
    f = follower(sink)
    assert f.fast(packet(0xA0, b"INSERT INTO jobs VALUES (1)"))  # MariaDB annotation
    assert f._ours is False
    assert not f.fast(table_map(7, "app", "jobs"))  # the library maps it too
    assert f.fast(rows(WRITE, 7))
    assert sink.inserts == ["jobs"] and f.events == 1 and f._ours is None


def test_msgtable_s_own_statements_are_skipped_unparsed():
    sink = Sink()
    f = follower(sink)
    f.fast(table_map(7, "app", "jobs"))
    assert f.fast(packet(0xA0, STATEMENT_MARK.encode() + b"UPDATE `jobs` SET time_acked = 1"))
    assert f.fast(table_map(7, "app", "jobs"))  # ours: the library need not map it
    assert f.fast(rows(UPDATE, 7, end=False))
    assert f._ours is True  # until the statement's last event
    assert f.fast(rows(UPDATE, 7, end=True))
    assert f._ours is None and sink.inserts == []


def test_another_clients_update_or_delete_goes_to_the_library():
    f = follower(Sink())
    f.fast(table_map(7, "app", "jobs"))
    f.fast(packet(0xA0, b"UPDATE jobs SET time_acked = 5 WHERE id = 1"))
    assert not f.fast(rows(UPDATE, 7))
    assert not f.fast(rows(DELETE, 7))
    assert f.events == 0  # counted where the library hands the event over


def test_without_annotations_a_large_update_is_taken_for_msgtable_s_merged_acks():
    f = follower(Sink())
    f.fast(table_map(7, "app", "jobs"))
    assert not f.fast(rows(UPDATE, 7, size=PARSE_MAX_BYTES))
    assert f.fast(rows(UPDATE, 7, size=PARSE_MAX_BYTES + 1))


def test_rows_of_other_schemas_and_unmapped_tables():
    sink = Sink()
    f = follower(sink)
    assert f.fast(table_map(9, "elsewhere", "jobs"))  # another schema: skipped here
    assert f.fast(rows(WRITE, 9))
    assert sink.inserts == [] and f.events == 0
    assert not f.fast(rows(WRITE, 10))  # no table map seen here: the library's


def test_gtids_read_to_their_commit_are_where_a_stream_resumes():
    f = follower(Sink())
    f._gtids = gtid_state("0-1-5")
    gtid = (6).to_bytes(8, "little") + (0).to_bytes(4, "little") + b"\x00"
    assert f.fast(packet(0xA2, gtid, server_id=3))
    assert f._gtids == {"0": "0-1-5"} and f._reading == "0-3-6"
    assert f.fast(packet(0x10, (99).to_bytes(8, "little")))  # Xid: committed
    assert f._gtids == {"0": "0-3-6"} and f._reading is None


def test_the_fast_path_hooks_into_the_pinned_library():
    assert install_fast_path()
    assert install_fast_path()  # once


def test_counting_rows_counts_another_clients_insert_from_its_bytes_and_skips_ours():
    sink = Sink()
    f = follower(sink)
    f.count_rows = True
    assert f.fast(packet(0xA0, b"INSERT INTO jobs VALUES (1), (2)"))
    assert not f.fast(table_map(7, "app", "jobs"))  # one bigint column, its shape kept
    two = (7).to_bytes(6, "little") + b"\x01\x00" + b"\x02\x00" + b"\x01\x01"
    two += (b"\x00" + (1).to_bytes(8, "little")) + (b"\x00" + (2).to_bytes(8, "little"))
    assert f.fast(packet(WRITE, two))
    assert sink.inserts == ["jobs"] and sink.rows == [2] and f.counted_fast == 1
    assert f.fast(packet(0xA0, b"INSERT INTO jobs VALUES (3)"))
    assert not f.fast(rows(WRITE, 7))  # rows it cannot step over exactly: the library counts
    assert sink.rows == [2] and f.events == 1  # counted once, on the library's path
    assert f.fast(packet(0xA0, STATEMENT_MARK.encode() + b"INSERT INTO `jobs` ..."))
    assert f.fast(rows(WRITE, 7))  # msgtable's own (a redrive): not an enqueue
    assert sink.rows == [2]


def test_the_lag_is_now_minus_the_last_events_time_until_a_heartbeat_says_caught_up():
    f = follower(Sink())
    assert f.lag_s is None  # not following
    f.following.set()
    assert f.lag_s == 0.0  # nothing read yet
    f.fast(table_map(7, "app", "jobs"))  # an event of 1700000000 (the packets' timestamp)
    lag = f.lag_s
    assert lag is not None and lag >= time.time() - 1_700_000_000 - 1
    f.fast(packet(0x1B, b"mysql-bin.000001", size=None))  # a heartbeat: nothing more to read
    assert f.lag_s == 0.0
    f.fast(rows(WRITE, 7))
    assert f.lag_s and f.lag_s > 0


def test_the_poll_keys_of_an_insert_the_library_parsed():
    inserted = [{"values": row(1)}, {"values": row(2, time_next=None, priority=-1, unnamed=True)}]
    assert library_keys(inserted, COLUMNS) == [(0, 0, 1), (-1, None, 2)]
    assert library_keys(inserted, ("id", "time_next", "message")) is None  # 2018 layout
    assert library_keys([{"values": row(3, priority=None)}], COLUMNS) is None


class DumpSocket:
    """What DumpConnection touches of its socket: the dump command goes out, no timeouts."""

    def __init__(self):
        self.sent = b""

    def sendall(self, data):
        self.sent += data

    def settimeout(self, timeout):
        pass


def wire(payloads, first_seq=1):
    """Payloads as the server sends them: a 4-byte header (length, sequence number) each."""
    out, seq = b"", first_seq
    for p in payloads:
        out += len(p).to_bytes(3, "little") + bytes([seq % 256]) + p
        seq += 1
    return out


def dumping(payloads):
    from msgtable.engine import binlog

    sink = Sink()
    f = follower(sink)
    f._stream = types.SimpleNamespace(log_file="b.000001", log_pos=4)
    conn = binlog.dump_connection()(defer_connect=True)
    conn._sock, conn._current_timeout = DumpSocket(), None  # (connect() sets them)
    conn._rfile = io.BytesIO(wire(payloads))
    conn._next_seq_id = 0
    binlog._reader.follower = f
    try:
        conn._write_bytes(b"\x0b\x00\x00\x00\x1e" + b"\x00" * 10)  # COM_BINLOG_DUMP_GTID
    finally:
        binlog._reader.follower = None
    conn._next_seq_id = 1
    return conn, f, sink


def test_the_dump_connection_hands_the_library_only_what_the_fast_path_leaves():
    rotate = packet(0x04, b"\x04\x00\x00\x00\x00\x00\x00\x00b.000001")
    theirs = packet(0xA0, b"UPDATE jobs SET time_acked = 5 WHERE id = 1")
    update = rows(UPDATE, 7)
    insert = rows(WRITE, 7)
    elsewhere = [table_map(9, "elsewhere", "x"), rows(WRITE, 9)]
    ours = [table_map(7, "app", "jobs"), theirs, update]
    conn, f, sink = dumping(
        [rotate, *elsewhere, *ours, packet(0xA0, b"INSERT INTO jobs VALUES (2)"), insert]
    )
    first = conn._read_packet()
    assert first.get_all_data() == rotate and first.msgtable_left  # the library's kind
    mapped = conn._read_packet()  # another schema's map and rows: taken here, unseen
    assert mapped.get_all_data() == table_map(7, "app", "jobs")  # ours: the library maps too
    assert (9).to_bytes(6, "little") in f._table_ids
    assert conn._read_packet().get_all_data() == update  # after the annotation, taken here
    assert f._ours is False and sink.inserts == []
    with pytest.raises(pymysql.err.OperationalError):
        conn._read_packet()  # the INSERT taken here as a hint; then the stream ends
    assert sink.inserts == ["jobs"]
    assert f._stream.log_pos == 1234  # the library's position moved as its loop would


def test_the_dump_connection_reads_a_payload_split_in_parts(monkeypatch):
    from pymysql import connections

    monkeypatch.setattr(connections, "MAX_PACKET_LEN", 16)
    rotate = packet(0x04, b"\x04\x00\x00\x00\x00\x00\x00\x00b.000001")  # 44 bytes
    parts = [rotate[:16], rotate[16:32], rotate[32:]]
    conn, _, _ = dumping(parts)
    assert conn._read_packet().get_all_data() == rotate


def test_the_dump_connection_is_pymysqls_until_a_dump_command_on_a_following_thread():
    from msgtable.engine import binlog

    conn = binlog.dump_connection()(defer_connect=True)
    conn._sock, conn._current_timeout = DumpSocket(), None
    conn._rfile = io.BytesIO(wire([b"\x00\x00\x00\x02\x00\x00\x00"]))  # an OK packet
    conn._next_seq_id = 1
    packet_read = conn._read_packet()
    assert packet_read.is_ok_packet() and not getattr(packet_read, "msgtable_left", False)
