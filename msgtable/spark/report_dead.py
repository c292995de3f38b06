"""The dead letters of a ``msgtable report``: how many messages of a table no poll sends again,
where they are, and why they died (msgtable.core.deadletters says what dead means).

A table's dead letters are in one or two places:

* **in place**: its own rows that died there (no vt_dead_letter), ``time_acked IS NULL AND
  time_next = DEAD_TIME_NEXT``; the sends are the row's ``epoch``, the reason its
  ``last_error`` and the time of death its ``time_dead``, where the table has those columns;
* **in its dead-letter table** (``vt_dead_letter=TABLE``): every unacked row there, with the
  ``attempts``, ``last_error`` and ``time_dead`` the move wrote. A report of a dead-letter
  table itself counts its own unacked rows so.

Counted by reason (the most common DEAD_REASONS_AT_MOST, the rest folded into one row) and by
attempts, each split by place. Spark computes every figure; msgtable.spark.report prints
them (the summary line, then the two tables), msgtable.spark.report_html draws them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from msgtable.core.deadletters import ATTEMPTS_COLUMN, holds_dead_letters
from msgtable.core.tables import DEAD_TIME_NEXT, LAST_ERROR_COLUMN, TIME_DEAD_COLUMN, TableConfig
from msgtable.errors import MsgtableError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

DEAD_REASONS_AT_MOST = 10  # reasons listed one by one, the most common first; the rest: one row
NO_REASON = "(none recorded)"  # a dead message whose last_error is NULL
NO_REASON_COLUMN = "(not kept: no last_error column)"  # a table without last_error
REASON_TEXT_WIDTH = 60  # a reason longer than this is cut in the terminal's table


@dataclass(frozen=True)
class Place:
    """Where some of a table's dead letters are: its own rows dead in place, or the unacked
    rows of a dead-letter table (``moved``)."""

    table: str
    moved: bool
    dead: int = 0

    @property
    def label(self) -> str:
        return f"in {self.table}" if self.moved else "in place"


@dataclass
class DeadLetters:
    """The dead-letter figures of one report. ``by_reason`` and ``by_attempts`` are split by
    place (its label); reasons come most common first, attempts in order."""

    places: list[Place] = field(default_factory=list)  # the report's own source first
    by_reason: list[tuple[str, str, int]] = field(default_factory=list)  # (reason, place, n)
    by_attempts: list[tuple[int, str, int]] = field(default_factory=list)  # (attempts, place, n)
    first_ns: int | None = None  # the first and last time_dead, where the rows have one
    last_ns: int | None = None
    max_attempts: int = 0  # the table's vt_max_attempts (0: none, or not known)
    problem: str = ""  # why a place was not read (a dead-letter table that is not there)

    @property
    def total(self) -> int:
        return sum(p.dead for p in self.places)

    @property
    def here(self) -> int:
        """Dead rows of the report's own source (counted among its unacked rows)."""
        return self.places[0].dead if self.places else 0

    @property
    def labels(self) -> list[str]:
        return [p.label for p in self.places]

    def summary(self) -> str:
        """One line: how many, where, when they died, and vt_max_attempts."""
        where = [p for p in self.places if p.dead]
        if not where:
            looked = " or ".join(p.label for p in self.places)
            line = f"none ({looked})" if len(self.places) > 1 else "none"
        elif len(where) == 1 and len(self.places) == 1:
            line = f"{where[0].dead:,} {where[0].label}"
        else:
            line = f"{self.total:,} (" + ", ".join(f"{p.dead:,} {p.label}" for p in where) + ")"
        if self.total and self.first_ns is not None and self.last_ns is not None:
            line += f"; died {_moment(self.first_ns)} to {_moment(self.last_ns)} UTC"
        if self.max_attempts:
            line += f"; vt_max_attempts={self.max_attempts}"
        if self.problem:
            line += f"; {self.problem}"
        return line

    @property
    def reasons(self) -> list[str]:
        """The reasons, most common first (the other reasons' row last)."""
        return list(dict.fromkeys(r for r, _, _ in self.by_reason))

    @property
    def attempts(self) -> list[int]:
        return sorted({a for a, _, _ in self.by_attempts})

    def reason_rows(self, width: int | None = None) -> list[tuple[object, ...]]:
        """(reason, n per place..., all when more than one place), the reason cut to
        ``width`` characters."""
        return [(cut(r, width), *self._counts(self.by_reason, r)) for r in self.reasons]

    def attempt_rows(self) -> list[tuple[object, ...]]:
        """(attempts, n per place..., all when more than one place)."""
        return [(a, *self._counts(self.by_attempts, a)) for a in self.attempts]

    def headers(self, first: str) -> tuple[str, ...]:
        if len(self.places) == 1:
            return (first, "dead")
        return (first, *self.labels, "all")

    @staticmethod
    def count(rows: Sequence[tuple[object, str, int]], key: object, label: str) -> int:
        """The n of (key, place ``label``) in ``by_reason`` or ``by_attempts``."""
        return sum(n for k, p, n in rows if k == key and p == label)

    def _counts(self, rows: Sequence[tuple[object, str, int]], key: object) -> tuple[int, ...]:
        counts = tuple(self.count(rows, key, label) for label in self.labels)
        return counts if len(counts) == 1 else (*counts, sum(counts))


def _moment(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S")


def cut(text: str, width: int | None) -> str:
    """``text``, or its first ``width`` - 3 characters and "..."."""
    if width is None or len(text) <= width:
        return text
    return text[: width - 3] + "..."


# -- computed by Spark ---------------------------------------------------------------------
def dead_letters(
    spark: SparkSession,
    df: DataFrame,
    name: str,
    dsn: str | None = None,
    cfg: TableConfig | None = None,
) -> DeadLetters:
    """The dead letters of ``df`` (the rows of table or archive ``name``) and, when ``cfg``
    has vt_dead_letter, of its dead-letter table (read from ``dsn``)."""
    from pyspark.sql import functions as F

    own = holds_dead_letters(df.columns)
    places = [Place(name, moved=own)]
    frames = [_dead_rows(df, places[0].label)]
    problem = ""
    if cfg is not None and cfg.dead_letter and dsn:
        from msgtable.spark.database import dead_letter_table

        try:
            dead_letter_table(dsn, cfg)
        except MsgtableError as exc:
            problem = f"not read: {exc}"
        else:
            place = Place(cfg.dead_letter, moved=True)
            # unacked, not dead: a dead-letter table's own vt_dead_letter is not followed
            reader = spark.read.format("msgtable").option("dsn", dsn).option("state", "unacked")
            frames.append(_dead_rows(reader.load(cfg.dead_letter), place.label))
            places.append(place)
    max_attempts = cfg.max_attempts if cfg is not None and not own else 0

    dead = frames[0]
    for frame in frames[1:]:
        dead = dead.unionByName(frame)
    dead = dead.cache()
    try:
        counts = {r["place"]: int(r["count"]) for r in dead.groupBy("place").count().collect()}
        places = [Place(p.table, p.moved, counts.get(p.label, 0)) for p in places]
        out = DeadLetters(places, max_attempts=max_attempts, problem=problem)
        if not out.total:
            return out
        span = dead.agg(F.min("time_dead"), F.max("time_dead")).first()
        if span is not None and span[0] is not None:
            out.first_ns, out.last_ns = int(span[0]), int(span[1])
        out.by_reason = _by_reason(dead)
        attempts = dead.groupBy("attempts", "place").count().orderBy("attempts", "place")
        out.by_attempts = [
            (int(r["attempts"] or 0), r["place"], int(r["count"])) for r in attempts.collect()
        ]
        return out
    finally:
        dead.unpersist()


def _dead_rows(df: DataFrame, label: str) -> DataFrame:
    """The dead rows of ``df`` as (place, reason, attempts, time_dead)."""
    from pyspark.sql import functions as F

    columns = set(df.columns)
    unacked = F.col("time_acked").isNull()
    if holds_dead_letters(columns):
        dead, attempts = unacked, F.col(ATTEMPTS_COLUMN)
    else:
        dead, attempts = unacked & (F.col("time_next") == F.lit(DEAD_TIME_NEXT)), F.col("epoch")
    reason: Column = (
        F.coalesce(F.col(LAST_ERROR_COLUMN).cast("string"), F.lit(NO_REASON))
        if LAST_ERROR_COLUMN in columns
        else F.lit(NO_REASON_COLUMN)
    )
    died = F.col(TIME_DEAD_COLUMN) if TIME_DEAD_COLUMN in columns else F.lit(None)
    return df.where(dead).select(
        F.lit(label).alias("place"),
        reason.alias("reason"),
        attempts.cast("long").alias("attempts"),
        died.cast("long").alias("time_dead"),
    )


def _by_reason(dead: DataFrame) -> list[tuple[str, str, int]]:
    """(reason, place, n) of the most common reasons, then one row for all the others."""
    from pyspark.sql import functions as F

    ranked = dead.groupBy("reason").count().orderBy(F.desc("count"), "reason")
    top = [r["reason"] for r in ranked.limit(DEAD_REASONS_AT_MOST).collect()]
    order = {reason: i for i, reason in enumerate(top)}
    kept = F.col("reason").isin(top)
    rows = [
        (r["reason"], r["place"], int(r["count"]))
        for r in dead.where(kept).groupBy("reason", "place").count().collect()
    ]
    rows.sort(key=lambda t: (order[t[0]], t[1]))
    rest = dead.where(~kept)
    others = rest.agg(F.countDistinct("reason")).first()
    if others is not None and others[0]:
        label = f"({int(others[0]):,} other reasons)"
        by_place = rest.groupBy("place").count().orderBy("place").collect()
        rows += [(label, r["place"], int(r["count"])) for r in by_place]
    return rows
