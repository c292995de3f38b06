"""What a failure of the Spark pipeline means, in one line: the one place that unwraps Spark's
errors for msgtable's commands (msgtable.spark.commands) and for programs that want the same.

A job's cause arrives wrapped. The msgtable data source runs in Spark's Python workers, so its
errors come back as an AnalysisException or PythonException (classic Spark, or Spark Connect)
whose message holds the worker's Python traceback as text; the JDBC paths fail in Java, as a
Py4JJavaError whose text holds the chain of Java exceptions; the driver's own connections
raise PyMySQL's errors. ``spark_error`` finds the root cause in each and answers the
MsgtableError it means:

* a msgtable error raised in a worker: the same class, the same message;
* a PyMySQL error (in a worker, or on the driver): as msgtable.store.mysql.database_error sorts it
  ("database unavailable: (2003) ...", "database unavailable: (1045) Access denied ...",
  "database error: (1146) ...");
* a JDBC driver's SQLException: "database unavailable: ..." for a connection that failed or
  was refused (a wrong account or password), "database error: ..." otherwise;
* any other Spark error: a SparkError with the first line of Spark's message.

Errors it has no word for (a bug) are left as they are. The full text stays the chained
cause, which ``msgtable --verbose`` prints.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from contextlib import contextmanager

from msgtable.errors import MsgtableError, Unavailable
from msgtable.store.mysql import DRIVER_MODULES, database_error


class SparkError(MsgtableError):
    """A Spark job failed, or Spark did not start, for a reason Spark itself names (its
    message's first line)."""


# A Python traceback's exception line: "package.module.Class: message" (or a bare name).
_EXCEPTION_LINE = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")
# A Java exception of JDBC, as a stack trace names it ("Caused by: java.sql.X: message").
_JAVA_SQL = re.compile(r"(?m)^(?:Caused by: )?java\.sql\.(?P<name>\w+): (?P<message>.*)$")
# Connector/J's ids of a connection, which mean nothing to a user.
_CONNECTION_ID = re.compile(r"^\(conn=\d+\)\s*")
# Java exceptions of JDBC that mean the database could not be reached or refused the account
# (SQLSTATE classes 08 and 28, and the transient ones), as opposed to a statement it rejected;
# msgtable.store.mysql sorts a driver's errors the same way (REFUSED).
_JAVA_UNAVAILABLE = (
    "SQLInvalidAuthorizationSpecException",
    "SQLNonTransientConnectionException",
    "SQLTransientConnectionException",
    "SQLRecoverableException",
    "SQLTimeoutException",
)
# "[CONDITION] message SQLSTATE: 38000": Spark's framing of its own messages.
_SPARK_CONDITION = re.compile(r"^\[[A-Z0-9_.]+\]\s*")
_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+\.?\s*$")
_CHAIN_LIMIT = 8  # exceptions followed through __cause__ / __context__


def spark_error(exc: BaseException) -> BaseException:
    """The MsgtableError ``exc`` means (see the module docstring), or ``exc`` itself."""
    if isinstance(exc, MsgtableError):
        return exc
    if type(exc).__module__.startswith(DRIVER_MODULES):  # the driver's own connections
        return database_error(exc)
    if isinstance(exc, OSError) and exc.filename is not None:  # e.g. the archive's directory
        return MsgtableError(f"{exc.strerror or exc}: {exc.filename}")
    if not _from_spark(exc):
        return exc
    texts = [str(e) for e in _chain(exc)]
    for text in texts:
        found = _python_cause(text)
        if found is not None:
            return found
    for text in texts:
        found = _jdbc_cause(text)
        if found is not None:
            return found
    return SparkError(f"Spark: {_first_line(str(exc)) or type(exc).__name__}")


@contextmanager
def spark_errors() -> Iterator[None]:
    """Raise what a failure inside the block means (spark_error), chained to the failure."""
    try:
        yield
    except MsgtableError:
        raise
    except Exception as exc:
        meant = spark_error(exc)
        if meant is exc:
            raise
        raise meant from exc


def _from_spark(exc: BaseException) -> bool:
    return any(type(e).__module__.startswith(("pyspark", "py4j")) for e in _chain(exc))


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling (PySpark raises its
    own exceptions while handling Py4J's, whose text holds the Java causes)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < _CHAIN_LIMIT:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _python_cause(text: str) -> BaseException | None:
    """What the last Python traceback in ``text`` ended with (None if it holds none)."""
    name, message = None, ""
    in_frames = False
    for line in text.splitlines():
        if line.endswith("Traceback (most recent call last):"):
            in_frames = True
            continue
        if in_frames and line[:1].isspace():
            continue
        if in_frames:
            match = _EXCEPTION_LINE.match(line)
            if match:
                name, message = match["name"], _SQLSTATE.sub("", match["message"] or "")
            in_frames = False
    if name is None:
        return None
    return _python_error(name, message.strip())


def _python_error(name: str, message: str) -> BaseException:
    """The error a worker's ``name: message`` line means."""
    if name.startswith("msgtable."):
        module, _, cls_name = name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), cls_name)
        except (ImportError, AttributeError):
            cls = None
        if isinstance(cls, type) and issubclass(cls, MsgtableError):
            try:
                return cls(message)
            except TypeError:
                return MsgtableError(message)
        return MsgtableError(message)
    if name.startswith("pymysql."):
        return database_error(_DriverError(*_driver_args(message)))
    short = name.rpartition(".")[2]
    return SparkError(f"unexpected {short} in a Spark worker: {message}".rstrip(": "))


class _DriverError(Exception):
    """A driver's error rebuilt from its text: args (code, message), as PyMySQL's."""


def _driver_args(message: str) -> tuple[object, ...]:
    """PyMySQL's ``(1045, "Access denied ...")`` as its args; other text as one arg."""
    try:
        args = ast.literal_eval(message)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return (message,)
    if isinstance(args, tuple) and len(args) >= 2 and isinstance(args[0], int):
        return (args[0], str(args[1]))
    return (message,)


def _jdbc_cause(text: str) -> MsgtableError | None:
    """The deepest java.sql exception in a Java stack trace's text (None if none)."""
    matches = list(_JAVA_SQL.finditer(text))
    if not matches:
        return None
    last = matches[-1]
    message = _CONNECTION_ID.sub("", last["message"].strip())
    if last["name"] in _JAVA_UNAVAILABLE:
        return Unavailable(f"database unavailable: {message}")
    return MsgtableError(f"database error: {message}")


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = _SQLSTATE.sub("", _SPARK_CONDITION.sub("", line.strip()))
        if line:
            return line
    return ""
