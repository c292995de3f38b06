"""The kinds of a MySQL or MariaDB column, by information_schema's DATA_TYPE (lower case): what
the codec, the table definitions and the filters decide by. Pure facts, no driver."""

from __future__ import annotations

INTEGER_TYPES = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint"})
FLOAT_TYPES = frozenset({"float", "double", "real", "double precision"})
DECIMAL_TYPES = frozenset({"decimal", "numeric", "dec", "fixed"})
TEXT_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext"})
CHOICE_TYPES = frozenset({"enum", "set"})  # text values from a list
MARIADB_TEXT_TYPES = frozenset({"uuid", "inet4", "inet6"})  # MariaDB types read as text
BINARY_TYPES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
SPATIAL_TYPES = frozenset(
    {
        "geometry",
        "point",
        "linestring",
        "polygon",
        "multipoint",
        "multilinestring",
        "multipolygon",
        "geometrycollection",
        "geomcollection",
    }
)
# BIT and YEAR read as integers in PyMySQL only for YEAR; BIT comes back as bytes.
BIT, YEAR, JSON, VECTOR = "bit", "year", "json", "vector"
DATETIME, TIMESTAMP, DATE, TIME = "datetime", "timestamp", "date", "time"
