"""msgtable on Apache Spark: the ``msgtable`` data source (batch read, bulk enqueue, a
streaming source that acks on commit), the JDBC fast paths, archive and report.

An optional extra (``pip install 'msgtable[spark]'``); the server never imports it.
``register(spark)`` makes ``format("msgtable")`` known to a session; ``session()`` builds
one (local[*] by default, any cluster by ``master``, Spark Connect by SPARK_REMOTE) with the
MariaDB JDBC driver and the data source registered.

Modules:
    archive      ``msgtable archive NAME --to PATH``
    commands     The pipeline's commands, ``msgtable archive`` and ``msgtable report``
    database     How the Spark driver and its executors reach the database
    errors       What a failure of the Spark pipeline means, in one line
    jdbc         The fast paths
    options      The ``format("msgtable")`` data source's options
    report       ``msgtable report NAME``
    report_dead  The dead letters of a ``msgtable report``
    report_html  The HTML page of a msgtable report (msgtable.spark.report)
    schema       A message table's columns as Spark types
    session      A Spark session for msgtable's jobs
    source       The ``msgtable`` Spark data source (PySpark 4's Python Data Source API)
    stream       ``spark.readStream.format("msgtable")``
    subview      The pipeline's SQL of a subscription's view of its message table
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Make ``format("msgtable")`` known to this session."""
    from msgtable.spark.source import MsgtableDataSource

    spark.dataSource.register(MsgtableDataSource)
