"""The Spark bulk enqueue into a vt_dedup table (msgtable.core.dedup): a key the table holds
fails its partition whole, or with onDuplicate=skip is left out and counted; a frame's own
repeated keys go in once."""

from __future__ import annotations

import pytest
from pyspark.errors import PySparkException

from msgtable.core.tables import current_layout_ddl
from msgtable.spark import jdbc

from ..integration.helpers import comment

KEYED = (
    "dedup_key varchar(64),\n  unique index dedup_idx(dedup_key),\n"
    "  index dedup_created_idx(time_created, dedup_key)"
)


def test_a_held_key_fails_the_partition_or_is_skipped_and_counted(spark, sql, db_dsn):
    ddl = current_layout_ddl("keyed", comment(vt_dedup="dedup_key"))
    sql.execute(ddl.replace("  primary key(id)", f"  {KEYED},\n  primary key(id)"))
    sql.execute("insert into keyed(id, dedup_key, message) values (1000, 'k5', 'already')")
    # 20 rows, keys k0..k9 twice each: k5 the table holds, the others go in once
    df = spark.range(20).selectExpr("id", "concat('k', id % 10) as dedup_key", "'new' as message")
    df = df.coalesce(1)
    with pytest.raises(PySparkException, match=r"Duplicate entry 'k5'.*vt_dedup key"):
        df.write.format("msgtable").option("dsn", db_dsn).mode("append").save("keyed")
    assert sql.scalar("select count(*) from keyed") == 1  # all or nothing: nothing
    assert jdbc.enqueue(df, db_dsn, "keyed", on_duplicate="skip") == "msgtable"
    assert sql.scalar("select count(*) from keyed") == 10
    assert sql.scalar("select count(distinct dedup_key) from keyed") == 10
    assert sql.scalar("select message from keyed where dedup_key = 'k5'") == "already"
