"""The Spark type each MySQL column type takes (msgtable.spark.schema): pinned, so that building
the mapping from msgtable.store.mysql's column kinds changes no type. Needs no Spark."""

from __future__ import annotations

import pytest

from msgtable.core.tables import Column
from msgtable.spark.schema import spark_schema, spark_type

# (information_schema DATA_TYPE, COLUMN_TYPE) -> the Spark SQL type
MAPPING = [
    # integers: the smallest Spark type that holds every value (Spark has no unsigned types)
    ("tinyint", "tinyint(4)", "INT"),
    ("tinyint", "tinyint(3) unsigned", "INT"),
    ("smallint", "smallint(6)", "INT"),
    ("smallint", "smallint(5) unsigned", "INT"),
    ("mediumint", "mediumint(9)", "INT"),
    ("mediumint", "mediumint(8) unsigned", "INT"),
    ("year", "year(4)", "INT"),
    ("int", "int(11)", "INT"),
    ("int", "int(10) unsigned", "BIGINT"),
    ("integer", "integer", "INT"),
    ("integer", "integer unsigned", "BIGINT"),
    ("bigint", "bigint(20)", "BIGINT"),
    ("bigint", "bigint(20) unsigned", "DECIMAL(20,0)"),
    # floating point and fixed point
    ("float", "float", "FLOAT"),
    ("double", "double", "DOUBLE"),
    ("real", "real", "DOUBLE"),
    ("decimal", "decimal(30,9)", "DECIMAL(30,9)"),
    ("decimal", "decimal(12, 2) unsigned", "DECIMAL(12,2)"),
    ("decimal", "decimal(65,30)", "DECIMAL(38,30)"),
    ("decimal", "decimal(8)", "DECIMAL(8,0)"),
    ("decimal", "decimal", "DECIMAL(10,0)"),
    # information_schema says decimal(p,s) for a NUMERIC column; a column type that said
    # numeric(p,s) would lose its precision, as only decimal(p,s) is read
    ("numeric", "numeric(5,1)", "DECIMAL(10,0)"),
    # bytes
    ("binary", "binary(16)", "BINARY"),
    ("varbinary", "varbinary(255)", "BINARY"),
    ("tinyblob", "tinyblob", "BINARY"),
    ("blob", "blob", "BINARY"),
    ("mediumblob", "mediumblob", "BINARY"),
    ("longblob", "longblob", "BINARY"),
    ("bit", "bit(8)", "BINARY"),
    # dates and times
    ("date", "date", "DATE"),
    ("datetime", "datetime(6)", "TIMESTAMP"),
    ("timestamp", "timestamp", "TIMESTAMP"),
    ("time", "time(6)", "STRING"),  # a duration: its text
    # text, and everything else
    ("char", "char(3)", "STRING"),
    ("varchar", "varchar(128)", "STRING"),
    ("tinytext", "tinytext", "STRING"),
    ("text", "text", "STRING"),
    ("mediumtext", "mediumtext", "STRING"),
    ("longtext", "longtext", "STRING"),
    ("enum", "enum('a','b')", "STRING"),
    ("set", "set('a','b')", "STRING"),
    ("json", "json", "STRING"),
    ("uuid", "uuid", "STRING"),
    ("inet4", "inet4", "STRING"),
    ("inet6", "inet6", "STRING"),
    ("vector", "vector(3)", "STRING"),
    ("geometry", "geometry", "STRING"),
    ("point", "point", "STRING"),
    ("linestring", "linestring", "STRING"),
    ("polygon", "polygon", "STRING"),
    ("multipoint", "multipoint", "STRING"),
    ("multilinestring", "multilinestring", "STRING"),
    ("multipolygon", "multipolygon", "STRING"),
    ("geometrycollection", "geometrycollection", "STRING"),
    ("geomcollection", "geomcollection", "STRING"),
]


@pytest.mark.parametrize(("data_type", "column_type", "expected"), MAPPING)
def test_each_mysql_type_takes_its_spark_type(
    data_type: str, column_type: str, expected: str
) -> None:
    assert spark_type(Column("c", data_type, column_type)) == expected


def test_a_spark_schema_quotes_column_names() -> None:
    columns = (Column("id", "bigint", "bigint(20)"), Column("odd`name", "json", "json"))
    assert spark_schema(columns) == "`id` BIGINT, `odd``name` STRING"
