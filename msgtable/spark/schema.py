"""A message table's columns as Spark types: the schema the ``msgtable`` data source gives its
batch reads and streams. What kind a column is comes from msgtable.store.mysql; which Spark type
each kind takes is decided here."""

from __future__ import annotations

import re

from msgtable.core.sqltypes import BINARY_TYPES, BIT, DATE, DATETIME, INTEGER_TYPES, TIMESTAMP, YEAR
from msgtable.core.tables import Column

_DECIMAL = re.compile(r"decimal\((\d+)(?:,(\d+))?\)")
# Spark has no unsigned integers: an unsigned INT or BIGINT takes the next wider type (signed,
# unsigned). The other integers, and YEAR, fit an INT either way.
_WIDE_INTS = {
    "int": ("INT", "BIGINT"),
    "integer": ("INT", "BIGINT"),
    "bigint": ("BIGINT", "DECIMAL(20,0)"),
}
_BYTES = BINARY_TYPES | {BIT}  # PyMySQL reads BIT as bytes


def spark_type(column: Column) -> str:
    """The Spark SQL type (DDL) a column's values take."""
    t, full = column.data_type, column.column_type.lower()
    if t in INTEGER_TYPES or t == YEAR:
        signed, unsigned = _WIDE_INTS.get(t, ("INT", "INT"))
        return unsigned if "unsigned" in full else signed
    # Named one by one, not as FLOAT_TYPES and DECIMAL_TYPES: their aliases (double precision,
    # dec, fixed), which information_schema never reports, take STRING as they always have.
    if t == "float":
        return "FLOAT"
    if t in ("double", "real"):
        return "DOUBLE"
    if t in ("decimal", "numeric"):
        m = _DECIMAL.search(full.replace(" ", ""))
        precision, scale = (int(m.group(1)), int(m.group(2) or 0)) if m else (10, 0)
        return f"DECIMAL({min(precision, 38)},{min(scale, 38)})"
    if t in _BYTES:
        return "BINARY"
    if t == DATE:
        return "DATE"
    if t in (DATETIME, TIMESTAMP):
        return "TIMESTAMP"
    return "STRING"  # text types, json, time (a duration: its text) and anything else


def spark_schema(columns: tuple[Column, ...]) -> str:
    """The Spark schema (DDL) of ``columns``, names quoted."""
    return ", ".join(f"`{c.name.replace('`', '``')}` {spark_type(c)}" for c in columns)
