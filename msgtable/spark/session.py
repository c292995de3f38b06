"""A Spark session for msgtable's jobs: local[*] by default, any cluster by ``master``, Spark
Connect when SPARK_REMOTE is set; with the MariaDB JDBC driver on its classpath when the
machine has it, and the msgtable data source registered."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from msgtable.spark import register

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Debian's libmariadb-java (MariaDB Connector/J): Spark's fastest way in and out of MariaDB.
DEFAULT_JDBC_JAR = "/usr/share/java/mariadb-java-client.jar"


def jdbc_jar() -> str | None:
    """The MariaDB Connector/J jar (MSGTABLE_JDBC_JAR, else Debian's), if there is one."""
    path = os.environ.get("MSGTABLE_JDBC_JAR") or DEFAULT_JDBC_JAR
    return path if Path(path).is_file() else None


def describe_session(spark: SparkSession) -> str:
    """Which Spark this is: "Spark Connect at URL" or "Spark MASTER"."""
    remote = os.environ.get("SPARK_REMOTE")
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return f"Spark Connect at {remote}"
    return f"Spark {spark.sparkContext.master}"


def session(master: str | None = None, app_name: str = "msgtable") -> SparkSession:
    from pyspark.sql import SparkSession

    # Python workers run this interpreter (its packages: pyarrow, pymysql, msgtable).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    remote = os.environ.get("SPARK_REMOTE")
    if remote and not master:
        builder = builder.remote(remote)
    else:
        builder = builder.master(master or "local[*]")
        builder = builder.config("spark.ui.enabled", "false")
        builder = builder.config("spark.ui.showConsoleProgress", "false")
        jar = jdbc_jar()
        if jar is not None:
            builder = builder.config("spark.jars", jar)
    spark = builder.getOrCreate()
    register(spark)
    return spark
