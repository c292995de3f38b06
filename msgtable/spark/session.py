"""A Spark session for msgtable's jobs: local[*] by default, any cluster by ``master``, Spark
Connect when SPARK_REMOTE is set; with the MariaDB JDBC driver on its classpath when the
machine has it, and the msgtable data source registered.

Spark's JVM writes to the stdout and stderr it inherits (the JDK's warnings, log4j's lines,
the Python workers' tracebacks): a session can send all of that to a file instead, and then a
JVM that does not start is a SparkError naming the line where it says why.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from msgtable.spark import register
from msgtable.spark.errors import SparkError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# What a line of the JVM's output that says why it did not start speaks of.
_FAILURE = re.compile(r"(?i)error|exception|not set|not found|no such")

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


def java_command() -> str:
    """The java Spark's launcher runs (JAVA_HOME's, else the one on PATH), or a SparkError
    saying there is none: checked before Spark starts, whose own failure says only that its
    gateway exited."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        if not os.access(java, os.X_OK):
            raise SparkError(
                f"Spark needs Java 17 or later, and JAVA_HOME ({home}) has no bin/java"
            )
        return str(java)
    found = shutil.which("java")
    if found is None:
        raise SparkError(
            "Spark needs Java 17 or later: no java on PATH and JAVA_HOME is not set "
            "(on Debian: apt-get install default-jre-headless)"
        )
    return found


def session(
    master: str | None = None, app_name: str = "msgtable", jvm_output: Path | None = None
) -> SparkSession:
    """A session (see the module docstring); ``jvm_output``: the file the JVM it starts
    writes to (None: this process's stdout and stderr)."""
    from pyspark.sql import SparkSession

    # Python workers run this interpreter (its packages: pyarrow, pymysql, msgtable).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    remote = os.environ.get("SPARK_REMOTE")
    local_jvm = "PYSPARK_GATEWAY_PORT" not in os.environ  # else spark-submit started this
    if remote and not master:
        builder = builder.remote(remote)
        local_jvm = local_jvm and remote.startswith("local")  # a local Connect server
    else:
        builder = builder.master(master or "local[*]")
        builder = builder.config("spark.ui.enabled", "false")
        builder = builder.config("spark.ui.showConsoleProgress", "false")
        jar = jdbc_jar()
        if jar is not None:
            builder = builder.config("spark.jars", jar)
    if local_jvm:
        java_command()
    with _output_to(jvm_output), _jvm_started_without_python_in_the_child():
        try:
            spark = builder.getOrCreate()
        except Exception as exc:
            said = _cause_line(jvm_output)
            if _condition(exc) != "JAVA_GATEWAY_EXITED" or not said:
                raise
            raise SparkError(f"Spark did not start: {said}") from exc
    register(spark)
    return spark


@contextmanager
def _jvm_started_without_python_in_the_child() -> Iterator[None]:
    """Within the block, PySpark starts its JVM with no Python code between fork and exec.

    PySpark passes a ``preexec_fn`` (to ignore SIGINT in the JVM), and a child with one runs
    every handler registered for fork: gRPC's, in a process whose gRPC threads are busy, can
    kill that child before it execs java, and PySpark then says only that the gateway exited.
    Without ``preexec_fn`` the child execs at once; a session of its own keeps the JVM out of
    the terminal's Ctrl-C as PySpark meant (it still ends with this process, when its stdin
    pipe closes)."""
    from pyspark import java_gateway

    names = vars(java_gateway)  # PySpark's module calls its own name Popen
    started = names["Popen"]

    def popen(command: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        kwargs.pop("preexec_fn", None)
        child: subprocess.Popen[bytes] = subprocess.Popen(command, start_new_session=True, **kwargs)
        return child

    names["Popen"] = popen
    try:
        yield
    finally:
        names["Popen"] = started


@contextmanager
def _output_to(path: Path | None) -> Iterator[None]:
    """Within the block, this process's stdout and stderr (file descriptors 1 and 2, which a
    JVM started in it inherits for good) are ``path`` (None: left as they are)."""
    if path is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (target, *saved):
            os.close(fd)


def _condition(exc: BaseException) -> str | None:
    """A PySpark error's condition ("JAVA_GATEWAY_EXITED"), None for any other error."""
    get = getattr(exc, "getCondition", None)
    try:
        return get() if callable(get) else None
    except Exception:
        return None


def _cause_line(path: Path | None) -> str:
    """The line of a JVM's output in ``path`` most likely to say why it did not start: the
    first that speaks of an error, else the last ("" without output)."""
    if path is None:
        return ""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [line for line in lines if line]
    cause = next((line for line in lines if _FAILURE.search(line)), None)
    return cause or (lines[-1] if lines else "")
