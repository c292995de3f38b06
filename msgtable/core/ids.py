"""Message ids as a request brings them: checked against the id column's type, deduplicated.

An ack names messages by id. Over gRPC an id may come typed (an integer, text, bytes) or as
text standing for an integer; whatever does not fit the table's id column is a clean
InvalidArgument naming the id, never a database error.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence

from msgtable.core.tables import Column
from msgtable.errors import InvalidArgument
from msgtable.limits import MAX_ACK_IDS

# An integer id sent as text: ASCII digits only (str.isdigit also takes "²" and other
# Unicode digits that int() refuses; int() also takes "1_000").
_DECIMAL_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)


_INT = frozenset({int})


def coerce_ids(
    table: str, column: Column, ids: Sequence[object], verb: str = "ack"
) -> list[Hashable]:
    """Validate the ids of an ack (or another ``verb``: release, reject, renew, redrive)
    against the id column's type; deduplicate, keep order."""
    if not ids:
        raise InvalidArgument(f"table {table}: no ids to {verb}")
    if len(ids) > MAX_ACK_IDS:
        raise InvalidArgument(f"table {table}: {len(ids)} ids in one {verb}; at most {MAX_ACK_IDS}")
    if column.is_integer and set(map(type, ids)) <= _INT:  # the usual case, fast
        return list(dict.fromkeys(ids))
    out: dict[Hashable, None] = {}
    for raw in ids:
        out[_coerce_id(table, column, raw)] = None
    return list(out)


def coerce_id_pairs(
    table: str, column: Column, ids: Sequence[object], values: Sequence[int], verb: str
) -> tuple[list[Hashable], list[int]]:
    """:func:`coerce_ids`, each id with its item of ``values`` (in the order of ``ids``; an id
    named twice keeps its first): a release's or renew's ids and their attempts."""
    clean = coerce_ids(table, column, ids, verb)
    if len(clean) == len(ids):
        return clean, list(values)
    first: dict[Hashable, int] = {}
    for raw, value in zip(ids, values, strict=True):
        first.setdefault(_coerce_id(table, column, raw), value)
    return list(first), list(first.values())


def _coerce_id(table: str, column: Column, raw: object) -> Hashable:
    bad = InvalidArgument(
        f"table {table}: malformed id {raw!r} for id column of type {column.column_type}"
    )
    if raw is None or isinstance(raw, bool):
        raise bad
    if column.is_integer:
        if isinstance(raw, int):
            return raw
        if isinstance(raw, float) and raw.is_integer():
            return int(raw)
        if isinstance(raw, str) and _DECIMAL_INTEGER.fullmatch(raw.strip()):
            return int(raw)
        raise bad
    if column.is_binary:
        if isinstance(raw, bytes):
            return raw
        if isinstance(raw, str):
            return raw.encode()
        raise bad
    if isinstance(raw, str | int):
        return str(raw) if isinstance(raw, int) else raw
    if isinstance(raw, bytes):
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise bad from None
    raise bad
