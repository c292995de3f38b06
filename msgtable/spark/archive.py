"""``msgtable archive NAME --to PATH``: the purge for teams that keep history. Acked rows older
than a cutoff are copied to Parquet under PATH, partitioned by the day they were acked
(``day=YYYY-MM-DD``, UTC), the copy is counted against the table, and then exactly the
copied rows are deleted.

Each run leaves a manifest, PATH/_runs/RUN.json, that moves through these states:

    (none)     the copy is being written under PATH/_staging/RUN/: not part of the archive
    copied     the copy is complete and counted; its files are being moved into PATH
    moved      every file is in PATH; the copied ids are being deleted from the table
    done

A run starts by finishing the runs before it: a copy without a manifest is thrown away (its
rows are still in the table, and this run copies them), a ``copied`` run's remaining files are
moved, and a ``moved`` run's ids are deleted again (deleting an id that is gone is a no-op).
So a crash at any point loses nothing, and a rerun copies nothing twice. Readers of PATH
(Spark, pyarrow, pandas) skip the ``_runs`` and ``_staging`` directories, as they skip every
name starting with an underscore.
"""

from __future__ import annotations

import json
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from msgtable.core.tables import TableConfig
from msgtable.errors import MsgtableError
from msgtable.spark.database import connection, describe, id_bounds
from msgtable.store.bulk import BulkStatements

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DELETE_IDS = 5_000  # ids per DELETE
READ_PARTITIONS = 8


class ArchiveError(MsgtableError):
    """The archive could not be made safely (nothing was deleted)."""


@dataclass
class ArchiveResult:
    run: str
    copied: int
    deleted: int
    recovered: list[str]  # earlier runs this one finished
    seconds: float


class Progress:
    """A one-line progress bar on a terminal (a line per step elsewhere)."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stderr
        self.tty = self.out.isatty()

    def step(self, text: str) -> None:
        self.out.write(("\r\x1b[K" if self.tty else "") + text + "\n")
        self.out.flush()

    def bar(self, what: str, done: int, total: int) -> None:
        if not self.tty:
            return
        width = 30
        filled = width * done // total if total else width
        self.out.write(f"\r{what} [{'#' * filled}{' ' * (width - filled)}] {done:,}/{total:,}")
        self.out.flush()


def archive(
    spark: SparkSession,
    dsn: str,
    table: str,
    path: str | Path,
    older_than_s: float,
    progress: Progress | None = None,
    clock: Callable[[], int] = time.time_ns,
) -> ArchiveResult:
    """Archive the rows of ``table`` acked more than ``older_than_s`` ago into ``path``."""
    began = time.monotonic()
    show = progress or Progress()
    base = Path(path)
    (base / "_runs").mkdir(parents=True, exist_ok=True)
    cfg = describe(dsn, table)
    recovered = recover(base, cfg, dsn, show)
    run = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(4)
    cutoff = clock() - round(older_than_s * 1e9)
    copied = copy(spark, dsn, cfg, base, run, cutoff, show)
    deleted = 0
    if copied:
        move(base, run, show)
        deleted = delete(base, cfg, dsn, run, show)
    else:
        shutil.rmtree(base / "_staging" / run, ignore_errors=True)
    show.step(f"archive {table}: {copied:,} rows copied to {base}, {deleted:,} deleted")
    return ArchiveResult(run, copied, deleted, recovered, time.monotonic() - began)


# -- the steps ---------------------------------------------------------------------------
def copy(
    spark: SparkSession,
    dsn: str,
    cfg: TableConfig,
    base: Path,
    run: str,
    cutoff_ns: int,
    show: Progress,
) -> int:
    """Copy the rows acked before the cutoff to PATH/_staging/RUN, count them, and write the
    run's manifest (state ``copied``). Returns how many rows it copied (0: nothing to do)."""
    from pyspark.sql import functions as F

    from msgtable.spark.jdbc import jdbc_available, read_query

    bulk = BulkStatements(cfg)
    where, params = bulk.archived(cutoff_ns)
    lo, hi, count = id_bounds(dsn, bulk.id_bounds(where), params)
    if not count:
        return 0
    show.step(f"archive {cfg.name}: copying {count:,} rows acked before the cutoff")
    if jdbc_available(spark) and cfg.id_column.is_integer:
        df = read_query(spark, dsn, bulk.archived_query(cutoff_ns), (int(lo), int(hi)), 8)
    else:  # the msgtable data source (any id type; slower)
        df = (
            spark.read.format("msgtable")
            .option("dsn", dsn)
            .option("state", "acked")
            .option("partitions", READ_PARTITIONS)
            .load(cfg.name)
            .where(F.col("time_acked") < F.lit(cutoff_ns))
        )
    days = F.floor(F.col("time_acked") / F.lit(86_400 * 10**9)).cast("int")  # UTC days
    df = df.withColumn("day", F.date_add(F.lit("1970-01-01").cast("date"), days).cast("string"))
    staging = base / "_staging" / run
    df.write.partitionBy("day").parquet(str(staging))
    written = spark.read.parquet(str(staging)).count()
    if written != count:
        shutil.rmtree(staging, ignore_errors=True)
        raise ArchiveError(
            f"the copy of {cfg.name} has {written:,} rows where the table had {count:,}: rows "
            "changed meanwhile (is the server's purger deleting them? keep vt_purge_after "
            "longer than the archive's cutoff); nothing was deleted, run it again"
        )
    files = sorted(str(p.relative_to(staging)) for p in staging.rglob("*.parquet"))
    _save(base, run, {"run": run, "table": cfg.name, "cutoff_ns": cutoff_ns, "rows": count,
                      "files": files, "state": "copied"})  # fmt: skip
    return int(count)


def move(base: Path, run: str, show: Progress) -> None:
    """Move a copied run's files into the archive (idempotent), then state ``moved``."""
    manifest = _load(base, run)
    staging = base / "_staging" / run
    for name in manifest["files"]:
        source, target = staging / name, base / name
        if source.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            source.replace(target)
        elif not target.exists():
            raise ArchiveError(f"run {run}: {name} is neither staged nor archived")
    manifest["state"] = "moved"
    _save(base, run, manifest)
    shutil.rmtree(staging, ignore_errors=True)


def delete(base: Path, cfg: TableConfig, dsn: str, run: str, show: Progress) -> int:
    """Delete exactly the ids a moved run copied (still acked: an id that is not is left
    alone); then state ``done``. Returns how many rows it deleted."""
    manifest = _load(base, run)
    ids = list(_ids(base, manifest["files"]))
    bulk = BulkStatements(cfg)
    deleted = 0
    with connection(dsn, autocommit=True) as conn, conn.cursor() as cur:
        full = bulk.delete_acked(DELETE_IDS)
        for i in range(0, len(ids), DELETE_IDS):
            chunk = ids[i : i + DELETE_IDS]
            sql = full if len(chunk) == DELETE_IDS else bulk.delete_acked(len(chunk))
            deleted += cur.execute(sql, chunk)
            show.bar(f"archive {cfg.name}: deleting", i + len(chunk), len(ids))
    manifest["state"] = "done"
    manifest["deleted"] = manifest.get("deleted", 0) + deleted
    _save(base, run, manifest)
    return deleted


def recover(base: Path, cfg: TableConfig, dsn: str, show: Progress) -> list[str]:
    """Finish what earlier runs left (see the module docstring); returns their names."""
    finished = []
    for path in sorted((base / "_runs").glob("*.json")):
        manifest = json.loads(path.read_text())
        if manifest.get("table") != cfg.name or manifest["state"] == "done":
            continue
        run = manifest["run"]
        show.step(f"archive {cfg.name}: finishing run {run} (it stopped at {manifest['state']})")
        if manifest["state"] == "copied":
            move(base, run, show)
        delete(base, cfg, dsn, run, show)
        finished.append(run)
    staging = base / "_staging"
    if staging.exists():
        for leftover in staging.iterdir():  # copies never counted: their rows are still there
            if not (base / "_runs" / f"{leftover.name}.json").exists():
                shutil.rmtree(leftover, ignore_errors=True)
    return finished


# -- manifests -----------------------------------------------------------------------------
def _save(base: Path, run: str, manifest: dict[str, Any]) -> None:
    """Write a manifest atomically (a crash leaves the old one or the new one)."""
    target = base / "_runs" / f"{run}.json"
    temp = target.with_suffix(".tmp")
    temp.write_text(json.dumps(manifest, indent=1))
    temp.replace(target)


def _load(base: Path, run: str) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((base / "_runs" / f"{run}.json").read_text())
    return manifest


def _ids(base: Path, files: list[str]) -> Iterator[Any]:
    import pyarrow.parquet as pq

    for name in files:
        yield from pq.read_table(base / name, columns=["id"]).column("id").to_pylist()
