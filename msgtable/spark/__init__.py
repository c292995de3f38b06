"""msgtable on Apache Spark: the ``msgtable`` data source (batch read, bulk enqueue, a
streaming source that acks on commit), the JDBC fast paths, archive and report.

An optional extra (``pip install 'msgtable[spark]'``); the server never imports it.
``register(spark)`` makes ``format("msgtable")`` known to a session; ``session()`` builds
one (local[*] by default, any cluster by ``master``, Spark Connect by SPARK_REMOTE) with the
MariaDB JDBC driver and the data source registered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Make ``format("msgtable")`` known to this session."""
    from msgtable.spark.source import MsgtableDataSource

    spark.dataSource.register(MsgtableDataSource)
