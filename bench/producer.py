"""The producer of the throughput runs: the multi-row INSERTs that both the raw run
(bench.raw) and the msgtable run (bench.engine) time, and the worker process that sends them.

Both runs insert the same rows the same way, so their figures differ only in how the rows are
consumed. The rows of the k-th INSERT get priority k % partitions: the raw run gives each
consumer the rows of one priority, so that consumers never contend for a row.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import pymysql

from bench.database import PAYLOAD, connect
from bench.processes import report

MIN_PRODUCER_ROWS = 100  # rows per INSERT, at least: see producer_rows


def producer_rows(batch_size: int) -> int:
    """Rows per producer INSERT: the batch size, but at least MIN_PRODUCER_ROWS, so that at
    batch 10 the figure is the lifecycle's and not a 10-row INSERT loop's."""
    return max(batch_size, MIN_PRODUCER_ROWS)


def producer_statements(
    table: str, first_id: int, n: int, rows_per_insert: int, partitions: int
) -> list[str]:
    """Multi-row INSERTs of ids first_id .. first_id + n - 1; the rows of the k-th INSERT get
    priority k % partitions (bench.raw gives each consumer the rows of one priority)."""
    literal = "'" + pymysql.converters.escape_string(PAYLOAD) + "'"
    out = []
    for k, lo in enumerate(range(first_id, first_id + n, rows_per_insert)):
        hi = min(first_id + n, lo + rows_per_insert)
        priority = k % partitions
        values = ",".join(f"({i},{priority},{literal})" for i in range(lo, hi))
        out.append(f"insert into {table}(id, priority, message) values {values}")
    return out


def partition_sizes(n: int, rows_per_insert: int, partitions: int) -> list[int]:
    """How many of the producer's rows get each priority (see producer_statements)."""
    sizes = [0] * partitions
    for k, lo in enumerate(range(0, n, rows_per_insert)):
        sizes[k % partitions] += min(n, lo + rows_per_insert) - lo
    return sizes


@dataclass(frozen=True)
class ProducerSpec:
    """What one producer process inserts: ``n`` rows from ``first_id`` into ``table``."""

    dsn: str
    table: str
    first_id: int
    n: int
    rows_per_insert: int
    partitions: int


def producer_worker(spec: ProducerSpec, name: str, ready: Any, go: Any, results: Any) -> None:
    """Insert the rows as fast as the database takes them, once ``go`` is set."""
    statements = producer_statements(
        spec.table, spec.first_id, spec.n, spec.rows_per_insert, spec.partitions
    )
    insert_worker(spec.dsn, statements, name, ready, go, results)


def insert_worker(
    dsn: str, statements: list[str], name: str, ready: Any, go: Any, results: Any
) -> None:
    """Run ``statements`` on one connection as fast as the database takes them, once ``go``
    is set. Reports ``start`` (just before the first) and ``end`` (after the last commit)."""

    def work() -> dict[str, Any]:
        with contextlib.closing(connect(dsn)) as conn, conn.cursor() as cur:
            ready.put(name)
            go.wait()
            start = time.monotonic()
            for statement in statements:
                cur.execute(statement)
            end = time.monotonic()
        return {"start": start, "end": end}

    report(name, results, work)
