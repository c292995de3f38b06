"""msgtable archive on a real local Spark session and a real MySQL-family server: old acked
rows go to Parquet by day and leave the table, exactly once, whatever step a run stops at."""

from __future__ import annotations

import subprocess
import sys
import time

import pyarrow.dataset as ds
import pytest

import msgtable.spark.archive as archive_module
from msgtable.core.tables import current_layout_ddl
from msgtable.spark.archive import ArchiveError, Progress, archive

from ..integration.helpers import comment

DAY_NS = 86_400 * 10**9
OLD = 1_000  # acked 2-3 days ago: archived
RECENT = 50  # acked now: kept
UNACKED = 30


def fill(sql, table: str = "jobs") -> int:
    """OLD old acked rows over two UTC days, RECENT recently acked, UNACKED unacked."""
    sql.execute(current_layout_ddl(table, comment()))
    now = time.time_ns()
    day0 = (now // DAY_NS - 3) * DAY_NS  # midnight UTC three days ago
    values = [f"({i}, null, 1, {day0 + (i % 2) * DAY_NS + i * 10**6}, 'old')" for i in range(OLD)]
    values += [f"({OLD + i}, null, 1, {now}, 'recent')" for i in range(RECENT)]
    values += [f"({OLD + RECENT + i}, 0, 0, null, 'waiting')" for i in range(UNACKED)]
    sql.execute(
        f"insert into {table}(id, time_next, epoch, time_acked, message) values " + ",".join(values)
    )
    return day0


def archived_ids(path) -> list[int]:
    if not list(path.glob("day=*/*.parquet")):
        return []
    return sorted(ds.dataset(str(path), format="parquet", partitioning="hive").to_table(
        columns=["id"]).column("id").to_pylist())  # fmt: skip


def test_old_acked_rows_go_to_parquet_by_day_and_leave_the_table(spark, sql, db_dsn, tmp_path):
    day0 = fill(sql)
    result = archive(spark, db_dsn, "jobs", tmp_path / "arch", older_than_s=86_400)
    assert (result.copied, result.deleted) == (OLD, OLD)
    assert archived_ids(tmp_path / "arch") == list(range(OLD))
    days = sorted(p.name for p in (tmp_path / "arch").glob("day=*"))
    first = time.strftime("%Y-%m-%d", time.gmtime(day0 / 1e9))
    second = time.strftime("%Y-%m-%d", time.gmtime((day0 + DAY_NS) / 1e9))
    assert days == [f"day={first}", f"day={second}"]
    back = spark.read.parquet(str(tmp_path / "arch"))
    assert back.count() == OLD and set(back.columns) >= {"id", "time_acked", "message", "day"}
    assert sql.scalar("select count(*) from jobs where id < :n", {"n": OLD}) == 0
    assert sql.scalar("select count(*) from jobs") == RECENT + UNACKED
    again = archive(spark, db_dsn, "jobs", tmp_path / "arch", older_than_s=86_400)
    assert (again.copied, again.deleted) == (0, 0)  # nothing new is old enough


def test_a_run_stopped_between_copy_and_delete_is_finished_by_the_next(
    spark, sql, db_dsn, tmp_path, monkeypatch
):
    fill(sql)
    real_delete = archive_module.delete

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies after the copy, before any delete

    monkeypatch.setattr(archive_module, "delete", crash)
    with pytest.raises(KeyboardInterrupt):
        archive(spark, db_dsn, "jobs", tmp_path / "arch", older_than_s=86_400)
    assert sql.scalar("select count(*) from jobs where id < :n", {"n": OLD}) == OLD
    monkeypatch.setattr(archive_module, "delete", real_delete)

    result = archive(spark, db_dsn, "jobs", tmp_path / "arch", older_than_s=86_400)
    assert len(result.recovered) == 1 and result.copied == 0  # finished, nothing copied twice
    assert archived_ids(tmp_path / "arch") == list(range(OLD))  # each row once
    assert sql.scalar("select count(*) from jobs where id < :n", {"n": OLD}) == 0


def test_a_run_stopped_during_the_copy_leaves_nothing_and_the_next_copies_once(
    spark, sql, db_dsn, tmp_path, monkeypatch
):
    fill(sql)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # the copy is written, not yet counted

    monkeypatch.setattr(archive_module, "_save", crash)
    with pytest.raises(KeyboardInterrupt):
        archive(spark, db_dsn, "jobs", tmp_path / "arch", older_than_s=86_400)
    monkeypatch.undo()
    assert archived_ids(tmp_path / "arch") == []  # the staged copy is not in the archive
    result = archive(spark, db_dsn, "jobs", tmp_path / "arch", older_than_s=86_400)
    assert result.copied == OLD and archived_ids(tmp_path / "arch") == list(range(OLD))
    assert not any((tmp_path / "arch" / "_staging").iterdir())


def test_a_copy_that_does_not_match_the_table_deletes_nothing(
    spark, sql, db_dsn, tmp_path, monkeypatch
):
    fill(sql)
    real_copy_count = archive_module.BulkStatements.id_bounds

    def one_more(self, where):  # as if a row were deleted by someone between count and copy
        return real_copy_count(self, where).replace("COUNT(*)", "COUNT(*) + 1")

    monkeypatch.setattr(archive_module.BulkStatements, "id_bounds", one_more)
    with pytest.raises(ArchiveError, match="rows changed meanwhile"):
        archive(spark, db_dsn, "jobs", tmp_path / "arch", older_than_s=86_400)
    assert sql.scalar("select count(*) from jobs") == OLD + RECENT + UNACKED
    assert archived_ids(tmp_path / "arch") == []


def test_the_archive_command_shows_progress_and_says_what_it_did(sql, db_dsn, tmp_path):
    fill(sql)
    done = subprocess.run(
        [sys.executable, "-m", "msgtable", "archive", "jobs", "--to", str(tmp_path / "a"),
         "--older-than", "1d", "--dsn", db_dsn, "--master", "local[1]"],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"archived {OLD:,} rows of jobs" in done.stdout
    assert "copying" in done.stderr
    assert archived_ids(tmp_path / "a") == list(range(OLD))


def test_progress_draws_a_bar_on_a_terminal():
    class Tty:
        def __init__(self):
            self.text = ""

        def isatty(self):
            return True

        def write(self, s):
            self.text += s

        def flush(self):
            pass

    out = Tty()
    Progress(out).bar("deleting", 5, 10)  # type: ignore[arg-type]
    assert "[###############               ] 5/10" in out.text
