"""How many rows a binlog WRITE_ROWS event holds, from its raw bytes (msgtable.engine.binlog's fast
path, for msgtable_messages_enqueued_total): the table map gives each column's type and
metadata, and each row is stepped over by its values' stored sizes, never decoded.

Anything it does not know (a column type, an event that does not end where its last row
does) is None, and the caller has the library parse the event instead: a count is exact or
not made here. The sizes are the binlog's row format (MySQL's log_event.cc
``calc_field_size``, as python-mysql-replication reads it).
"""

from __future__ import annotations

from msgtable.core.rows import PollKey

# Column types (MySQL's enum_field_types)
TINY, SHORT, LONG, FLOAT, DOUBLE, NULL, TIMESTAMP, LONGLONG, INT24 = 1, 2, 3, 4, 5, 6, 7, 8, 9
DATE, TIME, DATETIME, YEAR, NEWDATE, VARCHAR, BIT = 10, 11, 12, 13, 14, 15, 16
TIMESTAMP2, DATETIME2, TIME2 = 17, 18, 19
JSON, NEWDECIMAL, ENUM, SET = 245, 246, 247, 248
TINY_BLOB, MEDIUM_BLOB, LONG_BLOB, BLOB, VAR_STRING, STRING, GEOMETRY = (
    249,
    250,
    251,
    252,
    253,
    254,
    255,
)

FIXED = {
    TINY: 1,
    YEAR: 1,
    SHORT: 2,
    INT24: 3,
    DATE: 3,
    TIME: 3,
    NEWDATE: 3,
    LONG: 4,
    FLOAT: 4,
    TIMESTAMP: 4,
    LONGLONG: 8,
    DOUBLE: 8,
    DATETIME: 8,
    NULL: 0,
}
ONE_BYTE_META = {FLOAT, DOUBLE, TIMESTAMP2, DATETIME2, TIME2, JSON, GEOMETRY}
ONE_BYTE_META |= {TINY_BLOB, MEDIUM_BLOB, LONG_BLOB, BLOB}
TWO_BYTE_META = {VARCHAR, BIT, NEWDECIMAL, VAR_STRING, STRING, ENUM, SET}
PREFIXED = {JSON, GEOMETRY, TINY_BLOB, MEDIUM_BLOB, LONG_BLOB, BLOB}  # meta: length bytes
FRACTION_BASE = {TIMESTAMP2: 4, DATETIME2: 5, TIME2: 3}
DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
WRITE_ROWS_V1 = 0x17

# Each column as a row stores its value: a size in bytes (>= 0), or minus the width of the
# length that comes first (-1 to -4).
Shape = tuple[int, ...]


def lenenc(data: bytes, p: int) -> tuple[int, int]:
    """A packed integer at ``p``: its value and where it ends."""
    first = data[p]
    if first < 251:
        return first, p + 1
    width = {252: 2, 253: 3, 254: 8}.get(first)
    if width is None:
        raise ValueError(f"not a packed integer: {first}")
    return int.from_bytes(data[p + 1 : p + 1 + width], "little"), p + 1 + width


def table_shape(data: bytes) -> Shape | None:
    """The columns of a TABLE_MAP packet (the OK byte, the 19-byte header, the event)."""
    try:
        n = data[28]
        m = data[30 + n]
        count, p = lenenc(data, 32 + n + m)
        types = data[p : p + count]
        _, p = lenenc(data, p + count)
        shape = []
        for t in types:
            a = b = 0
            if t in TWO_BYTE_META:
                a, b = data[p], data[p + 1]
                p += 2
            elif t in ONE_BYTE_META:
                a = data[p]
                p += 1
            stored = column_size(t, a, b)
            if stored is None:
                return None
            shape.append(stored)
        return tuple(shape)
    except (IndexError, ValueError):
        return None


def column_size(t: int, a: int, b: int) -> int | None:
    """How a column of type ``t`` (metadata bytes ``a``, ``b``) stores a value: its size,
    or minus the width of its length prefix (None: a type not known)."""
    size = FIXED.get(t)
    if size is not None:
        return size
    if t in FRACTION_BASE:
        return FRACTION_BASE[t] + (a + 1) // 2
    if t in PREFIXED:
        return -a if 1 <= a <= 4 else None
    if t == VARCHAR:
        max_length = a | (b << 8)
    elif t in (STRING, VAR_STRING, ENUM, SET):
        if a in (ENUM, SET):
            return b
        max_length = (((a << 4) & 0x300) ^ 0x300) + b
    elif t == BIT:
        return (a + b * 8 + 7) // 8
    elif t == NEWDECIMAL:
        whole, scale = a - b, b
        return whole // 9 * 4 + DIG2BYTES[whole % 9] + scale // 9 * 4 + DIG2BYTES[scale % 9]
    else:
        return None
    return -2 if max_length > 255 else -1


def _rows_head(data: bytes, shape: Shape) -> tuple[int, list[int]] | None:
    """Where a WRITE_ROWS packet's (v1 or v2) rows begin, and the places in ``shape`` of the
    columns they carry; None when the packet's column count is not the shape's."""
    p = 28 if data[5] == WRITE_ROWS_V1 else 28 + int.from_bytes(data[28:30], "little")
    count, p = lenenc(data, p)
    if count != len(shape):
        return None
    present_bytes = (count + 7) // 8
    present = int.from_bytes(data[p : p + present_bytes], "little")
    return p + present_bytes, [i for i in range(count) if present >> i & 1]


def count_rows(data: bytes, shape: Shape, checksum: bool) -> int | None:
    """The rows of a WRITE_ROWS packet (v1 or v2) of a table of ``shape``; None when the
    event is not one this reads to its exact end."""
    try:
        head = _rows_head(data, shape)
        if head is None:
            return None
        p, present = head
        columns = [shape[i] for i in present]
        null_bytes = (len(columns) + 7) // 8
        end = len(data) - (4 if checksum else 0)
        plans: dict[int, _Plan] = {}
        rows = 0
        while p < end:
            # (the common cases without a slice: a 1-byte bitmap, 1- and 2-byte lengths)
            nulls = (
                data[p] if null_bytes == 1 else int.from_bytes(data[p : p + null_bytes], "little")
            )
            plan = plans.get(nulls)
            if plan is None:
                plan = plans[nulls] = _plan(columns, nulls, null_bytes)
            steps, tail, at, skip = plan
            if at and null_bytes == 1:
                # A row of one length-prefixed value (a message table's usual row), and the
                # rows after it with the same bitmap (a multi-row INSERT's usually have):
                # each is a step of ``skip`` bytes and its value's length, in a tight loop.
                if at > 0:  # a 1-byte length at ``at``
                    while True:
                        p += skip + data[p + at]
                        rows += 1
                        if p >= end or data[p] != nulls:
                            break
                else:  # a 2-byte length at ``-at``
                    at = -at
                    while True:
                        p += skip + (data[p + at] | data[p + at + 1] << 8)
                        rows += 1
                        if p >= end or data[p] != nulls:
                            break
                continue
            p += null_bytes
            for run, width in steps:
                p += run
                if width == 1:
                    p += 1 + data[p]
                elif width == 2:
                    p += 2 + (data[p] | data[p + 1] << 8)
                else:
                    p += width + int.from_bytes(data[p : p + width], "little")
            p += tail
            rows += 1
        return rows if p == end else None
    except (IndexError, ValueError):
        return None


# How a row with a given null bitmap is stepped over (see _plan)
_Plan = tuple[tuple[tuple[int, int], ...], int, int, int]


def _plan(columns: list[int], nulls: int, null_bytes: int) -> _Plan:
    """How a row whose null bitmap is ``nulls`` is stepped over: before each length-prefixed
    value, the bytes of the fixed-size ones since the last (and its length's width); then
    the fixed-size bytes after the last. A table's rows share a few bitmaps: each is worked
    out once an event, not once a row. When the row has exactly one length-prefixed value
    of a 1- or 2-byte length, also where that length is from the row's start (``at``;
    negative for 2 bytes; 0 otherwise) and the bytes of the row besides the value
    (``skip``)."""
    steps = []
    run = 0
    for c in columns:
        if not nulls & 1:
            if c >= 0:
                run += c
            else:
                steps.append((run, -c))
                run = 0
        nulls >>= 1
    at = skip = 0
    if len(steps) == 1 and steps[0][1] <= 2:
        before, width = steps[0]
        at = (null_bytes + before) * (1 if width == 1 else -1)
        skip = null_bytes + before + width + run
    return tuple(steps), run, at, skip


def row_keys(
    data: bytes, shape: Shape, checksum: bool, at: tuple[int, int, int]
) -> list[PollKey] | None:
    """The (priority, time_next, id) of each row of a WRITE_ROWS packet (v1 or v2) of a table
    of ``shape``, whose columns ``at`` hold them (signed integers of 8 bytes; a NULL is
    None): what a hinted poll compares with where its pass got to (msgtable.engine.tail).
    None when the event is not one this reads to its exact end, or a key is NULL where
    it may not be (an id or a priority)."""
    try:
        if any(shape[i] != 8 for i in at):
            return None
        head = _rows_head(data, shape)
        if head is None:
            return None
        p, columns = head
        null_bytes = (len(columns) + 7) // 8
        end = len(data) - (4 if checksum else 0)
        keys: list[PollKey] = []
        while p < end:
            nulls = int.from_bytes(data[p : p + null_bytes], "little")
            p += null_bytes
            found: dict[int, int | None] = dict.fromkeys(at)
            for i in columns:
                if nulls & 1:
                    nulls >>= 1
                    continue
                nulls >>= 1
                size = shape[i]
                if i in found:
                    found[i] = int.from_bytes(data[p : p + 8], "little", signed=True)
                if size >= 0:
                    p += size
                else:
                    p += -size + int.from_bytes(data[p : p - size], "little")
            priority, time_next, rid = (found[i] for i in at)
            if rid is None or priority is None:
                return None
            keys.append((priority, time_next, rid))
        return keys if p == end else None
    except (IndexError, ValueError):
        return None
