from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from msgtable.engine.binlogrows import (
    BLOB,
    LONGLONG,
    NEWDECIMAL,
    STRING,
    TIMESTAMP2,
    VARCHAR,
    count_rows,
    row_keys,
    table_shape,
)

HEADER = b"\x00" + bytes(19)  # the OK byte and an event header (its bytes unread here)


def table_map(types: bytes, meta: bytes) -> bytes:
    body = (7).to_bytes(6, "little") + b"\x00\x00"
    body += b"\x03app\x00" + b"\x04jobs\x00"
    body += bytes([len(types)]) + types + bytes([len(meta)]) + meta
    return HEADER + body + b"\x00"  # and the columns' null bitmap


# id bigint, message varchar(300) (2-byte lengths), amount decimal(10,2), at timestamp(3),
# note text (2-byte lengths), tag char(4)
TYPES = bytes([LONGLONG, VARCHAR, NEWDECIMAL, TIMESTAMP2, BLOB, STRING])
META = (300).to_bytes(2, "little") + bytes([10, 2]) + bytes([3]) + bytes([2]) + bytes([0xFE, 4])


def row(message: bytes | None, note: bytes | None) -> bytes:
    nulls = (0 if message is not None else 0b10) | (0 if note is not None else 0b10000)
    out = bytes([nulls]) + (1).to_bytes(8, "little")
    if message is not None:
        out += len(message).to_bytes(2, "little") + message
    out += bytes(5)  # decimal(10,2): 8 whole digits in 4 bytes, 2 decimals in 1
    out += bytes(4 + 2)  # timestamp(3): 4 bytes and 2 of fraction
    if note is not None:
        out += len(note).to_bytes(2, "little") + note
    return out + b"\x02ab"  # char(4): a 1-byte length


def write_rows(rows: list[bytes], v2: bool = True, checksum: bool = False) -> bytes:
    kind = 0x1E if v2 else 0x17
    header = bytearray(HEADER)
    header[5] = kind
    body = (7).to_bytes(6, "little") + b"\x01\x00"
    if v2:
        body += (2).to_bytes(2, "little")  # no extra data
    body += bytes([6]) + bytes([0b111111])  # 6 columns, all present
    return bytes(header) + body + b"".join(rows) + (b"\xde\xad\xbe\xef" if checksum else b"")


def test_rows_are_counted_by_their_columns_stored_sizes_nulls_included():
    shape = table_shape(table_map(TYPES, META))
    assert shape == (8, -2, 5, 6, -2, -1)
    rows = [row(b"hello", b"x" * 300), row(None, b""), row(b"", None)]
    assert count_rows(write_rows(rows), shape, checksum=False) == 3
    assert count_rows(write_rows(rows, checksum=True), shape, checksum=True) == 3
    assert count_rows(write_rows(rows[:1], v2=False), shape, checksum=False) == 1


def test_an_event_that_does_not_end_with_its_last_row_is_not_counted_here():
    shape = table_shape(table_map(TYPES, META))
    assert shape is not None
    packet = write_rows([row(b"hello", None)])
    assert count_rows(packet + b"\x00", shape, checksum=False) is None  # a row cut short
    assert count_rows(packet, shape, checksum=True) is None  # 4 bytes missing
    assert count_rows(packet, shape[:-1], checksum=False) is None  # another column count


def test_a_column_type_it_does_not_know_is_no_shape():
    assert table_shape(table_map(bytes([LONGLONG, 0xF2]), b"\x00")) is None


def test_a_two_byte_null_bitmap_and_long_length_prefixes_are_stepped_over():
    """Nine columns or more: the bitmap takes two bytes; a mediumblob's length takes three,
    a longblob's four (each row's bitmap picks its own way over the row, worked out once)."""
    types = bytes([LONGLONG] * 8 + [BLOB, BLOB])
    shape = table_shape(table_map(types, bytes([3, 4])))
    assert shape == (8,) * 8 + (-3, -4)

    def wide(medium: bytes | None, long: bytes | None) -> bytes:
        nulls = (0 if medium is not None else 1 << 8) | (0 if long is not None else 1 << 9)
        out = nulls.to_bytes(2, "little") + bytes(8 * 8)
        if medium is not None:
            out += len(medium).to_bytes(3, "little") + medium
        if long is not None:
            out += len(long).to_bytes(4, "little") + long
        return out

    header = bytearray(HEADER)
    header[5] = 0x1E
    body = (7).to_bytes(6, "little") + b"\x01\x00" + (2).to_bytes(2, "little")
    body += bytes([10]) + (0b1111111111).to_bytes(2, "little")
    rows = [wide(b"m" * 70_000, b"l"), wide(None, b""), wide(b"", None), wide(b"x", b"y" * 3)]
    packet = bytes(header) + body + b"".join(rows)
    assert count_rows(packet, shape, checksum=False) == 4
    assert count_rows(packet[:-1], shape, checksum=False) is None


def test_a_message_tables_rows_of_one_short_value_are_counted_whatever_their_bitmaps():
    """The usual row (fixed-size columns and one length-prefixed value) takes the tight
    loop; rows whose bitmaps change midway, or that leave the value out, each take theirs."""
    shape = (8, 8, 8, 8, 8, 8, -1)  # bigints (time_acked nullable) and a varchar(128)

    def msg_row(text: bytes | None, acked: bool) -> bytes:
        nulls = (0 if acked else 1 << 4) | (0 if text is not None else 1 << 6)
        out = bytes([nulls]) + bytes(8 * (6 if acked else 5))
        return out + (bytes([len(text)]) + text if text is not None else b"")

    rows = [msg_row(b"m%d" % i, False) for i in range(50)] + [msg_row(None, False)]
    rows += [msg_row(b"x" * 255, True), msg_row(b"", False), msg_row(b"y", False)]
    header = bytearray(HEADER)
    header[5] = 0x1E
    body = (7).to_bytes(6, "little") + b"\x01\x00" + (2).to_bytes(2, "little") + b"\x07\x7f"
    packet = bytes(header) + body + b"".join(rows)
    assert count_rows(packet, shape, checksum=False) == len(rows)
    assert count_rows(packet + b"\x00" * 4, shape, checksum=True) == len(rows)
    assert count_rows(packet[:-1], shape, checksum=False) is None  # the last row cut short
    assert count_rows(packet + b"\x10", shape, checksum=False) is None  # a row that never ends


@given(
    st.lists(st.sampled_from([8, 4, 3, 0, -1, -2, -3, -4]), min_size=1, max_size=12),
    st.lists(st.tuples(st.integers(0, 2**12 - 1), st.lists(st.binary(max_size=300))), max_size=8),
)
def test_rows_of_any_shape_are_counted_as_stepping_over_each_value_would(columns, specs):
    """Against a plain reference: each row's bitmap, then each present column's value."""
    shape = tuple(columns)
    null_bytes = (len(shape) + 7) // 8
    rows = []
    for nulls, values in specs:
        nulls &= (1 << len(shape)) - 1
        out, it = nulls.to_bytes(null_bytes, "little"), iter(values)
        for i, c in enumerate(shape):
            if nulls >> i & 1:
                continue
            if c >= 0:
                out += bytes(c)
            else:
                value = next(it, b"v")[: 256 ** (-c) - 1]
                out += len(value).to_bytes(-c, "little") + value
        rows.append(out)
    header = bytearray(HEADER)
    header[5] = 0x1E
    body = (7).to_bytes(6, "little") + b"\x01\x00" + (2).to_bytes(2, "little")
    body += bytes([len(shape)]) + ((1 << len(shape)) - 1).to_bytes(null_bytes, "little")
    packet = bytes(header) + body + b"".join(rows)
    assert count_rows(packet, shape, checksum=False) == len(rows)
    if rows and len(rows[-1]) > null_bytes:  # one byte short: never a count
        assert count_rows(packet[:-1], shape, checksum=False) is None


def test_the_poll_keys_of_an_insert_s_rows_are_read_from_its_bytes():
    """(priority, time_next, id) as msgtable.engine.tail compares them: read where the table
    map says, a NULL time_next as None; not read when a key column is not a bigint."""
    # id, priority, time_next bigint, message varchar(300), note text
    types = bytes([LONGLONG, LONGLONG, LONGLONG, VARCHAR, BLOB])
    shape = table_shape(table_map(types, (300).to_bytes(2, "little") + bytes([2])))
    assert shape == (8, 8, 8, -2, -2)

    def keyed(rid: int, priority: int, time_next: int | None, message: bytes) -> bytes:
        out = bytes([0 if time_next is not None else 0b100])
        out += rid.to_bytes(8, "little") + priority.to_bytes(8, "little", signed=True)
        if time_next is not None:
            out += time_next.to_bytes(8, "little")
        return out + len(message).to_bytes(2, "little") + message + (1).to_bytes(2, "little") + b"n"

    header = bytearray(HEADER)
    header[5] = 0x1E
    body = (7).to_bytes(6, "little") + b"\x01\x00" + (2).to_bytes(2, "little")
    body += bytes([5, 0b11111])
    rows = [keyed(7, 0, 0, b"a"), keyed(8, -3, None, b"bb" * 200), keyed(9, 2, 5, b"")]
    packet = bytes(header) + body + b"".join(rows)
    at = (1, 2, 0)
    assert row_keys(packet, shape, False, at) == [(0, 0, 7), (-3, None, 8), (2, 5, 9)]
    assert row_keys(packet + b"\x00", shape, False, at) is None  # a row cut short
    assert row_keys(packet, shape, False, (1, 3, 0)) is None  # time_next is no bigint here
