"""One local Spark session for the whole test session (it costs several seconds to start),
with the MariaDB JDBC driver and the msgtable data source. A missing pyspark, Java or JDBC jar
is a broken setup (`make test` installs them), not a reason to skip. The JVM writes to a file
of the session's, whose tail a JVM that does not start is reported with."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from msgtable.spark.session import jdbc_jar

SPARK_SETUP = "make test installs it (pip install -e '.[spark]'; apt-get install libmariadb-java)"


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        pytest.fail(f"pyspark is not installed: {SPARK_SETUP}", pytrace=False)
    if shutil.which("java") is None:
        pytest.fail("no java on PATH: Spark needs a JDK (17)", pytrace=False)
    if jdbc_jar() is None:
        pytest.fail(f"no MariaDB JDBC jar: {SPARK_SETUP}", pytrace=False)
    from msgtable.spark.session import session

    jvm_output = tmp_path_factory.mktemp("spark") / "jvm.log"
    try:
        s = session("local[2]", "msgtable-tests", jvm_output=jvm_output)
    except Exception as exc:
        said = jvm_output.read_text(errors="replace") if jvm_output.exists() else ""
        pytest.fail(f"Spark did not start: {exc}\nthe JVM said: {said[-3000:]}", pytrace=False)
    s.conf.set("spark.sql.shuffle.partitions", "4")
    yield s
    s.stop()
