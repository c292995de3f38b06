"""A message table's columns as Spark types: the schema the ``msgtable`` data source gives its
batch reads and streams."""

from __future__ import annotations

import re

from msgtable.tables import Column

_DECIMAL = re.compile(r"decimal\((\d+)(?:,(\d+))?\)")
_TEXT = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "json"}
_BYTES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "bit"}
_SMALL_INTS = {"tinyint", "smallint", "mediumint", "year"}


def spark_type(column: Column) -> str:
    """The Spark SQL type (DDL) a column's values take."""
    t, full = column.data_type, column.column_type.lower()
    unsigned = "unsigned" in full
    if t in _SMALL_INTS:
        return "INT"
    if t in ("int", "integer"):
        return "BIGINT" if unsigned else "INT"
    if t == "bigint":
        return "DECIMAL(20,0)" if unsigned else "BIGINT"
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
    if t == "date":
        return "DATE"
    if t in ("datetime", "timestamp"):
        return "TIMESTAMP"
    return "STRING"  # text types, json, time (a duration: its text) and anything else


def spark_schema(columns: tuple[Column, ...]) -> str:
    return ", ".join(f"`{c.name.replace('`', '``')}` {spark_type(c)}" for c in columns)
