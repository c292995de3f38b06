"""Idempotent enqueue, the pure part: a table's deduplication key (``vt_dedup=COLUMN``, with
``vt_dedup_window=SECONDS``, 300 by default as SQS's), checked at load.

How it works, in the database alone, for every client (a plain SQL INSERT as much as
msgtable.enqueue, the Spark bulk enqueue or the SQS API's MessageDeduplicationId):

* The key column has a UNIQUE index of its own, so the database refuses a second row with a
  key a row still holds (error 1062, ER_DUP_ENTRY), whoever inserts it, however many
  producers race: the index decides, once, under InnoDB's lock of the key.
* The column takes NULL: a row without a key (NULL) never collides (a unique index holds any
  number of NULLs), and a key whose window has passed is cleared to NULL by the table's purger
  (msgtable.engine.purger): after the window the key may be used again.
* The window runs from the row's ``time_created`` (the database's clock at the INSERT), which
  the table must have; an index that begins ``(time_created, COLUMN)`` lets the purger find
  the keys to clear in a short range scan of that index, never the table.
* The purge leaves a row while it holds its key (``AND COLUMN IS NULL``): an acked row
  keeps refusing its duplicates until its window is over, however short vt_purge_after.

A key is cleared in the first purger pass after its window (every max(vt_poller_interval,
1 s)): a key frees between ``window`` and ``window + interval`` after its INSERT. A table
without vt_dedup pays nothing: no statement changes, and the purger checks one attribute.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from msgtable.core.sqltypes import BINARY_TYPES, INTEGER_TYPES, TEXT_TYPES

if TYPE_CHECKING:
    from msgtable.core.tables import Column

DEFAULT_DEDUP_WINDOW_S = 300.0  # SQS's five minutes
# A window of at most ten years (its cutoff stays a valid BIGINT of nanoseconds).
MAX_DEDUP_WINDOW_S = 10 * 365 * 86400.0
# The column the window runs from: the database's clock at the INSERT, in unix ns.
CREATED_COLUMN = "time_created"
KEY_TYPES = TEXT_TYPES | BINARY_TYPES | INTEGER_TYPES
# A transaction that commits its keyed row this long after its INSERT still has its key
# cleared on time (the purger scans back this far each pass); a later one at the next full
# sweep (DEDUP_FULL_SWEEP_S).
DEDUP_LATE_COMMIT_S = 60.0
DEDUP_FULL_SWEEP_S = 3600.0


class _Problems(Protocol):
    table: str

    def add(self, problem: str) -> None: ...


@dataclass(frozen=True)
class Dedup:
    """A table's deduplication (column "": none)."""

    column: str = ""
    window_s: float = 0.0
    index: str = ""


NO_DEDUP = Dedup()


def dedup_fields(
    fields: Mapping[str, str],
    by_name: Mapping[str, Column],
    engine_columns: Iterable[str],
    unique_indexes: Iterable[Sequence[str]],
    indexes: Iterable[tuple[str, Sequence[str]]],
    problems: _Problems,
) -> Dedup:
    """vt_dedup / vt_dedup_window, checked with the column and the indexes they need."""
    if "vt_dedup" not in fields:
        if "vt_dedup_window" in fields:
            problems.add("vt_dedup_window needs vt_dedup")
        return NO_DEDUP
    column = fields["vt_dedup"].strip()
    window = _window(fields.get("vt_dedup_window"), problems)
    if not _key_column(column, by_name, set(engine_columns), problems) or window is None:
        return NO_DEDUP
    ok = _created(by_name, problems)
    unique = [tuple(cols) for cols in unique_indexes]
    named = [(name, tuple(cols)) for name, cols in indexes]
    index = next((name for name, cols in named if cols == (column,)), "")
    has_unique = (column,) in unique
    has_created = any(cols[:1] == (CREATED_COLUMN,) for _, cols in named)
    if not (has_unique and has_created):
        add = []
        if not has_unique:
            add.append(f"ADD UNIQUE INDEX dedup_idx ({column})")
        if not has_created:
            add.append(f"ADD INDEX dedup_created_idx ({CREATED_COLUMN}, {column})")
        problems.add(
            f"vt_dedup={column} needs a unique index on {column} alone (it refuses a "
            f"duplicate) and an index that begins with {CREATED_COLUMN} (the purger clears "
            f"keys past the window through it): ALTER TABLE {problems.table} {', '.join(add)}"
        )
        return NO_DEDUP
    if not ok:
        return NO_DEDUP
    return Dedup(column, window, index)


def _window(raw: str | None, problems: _Problems) -> float | None:
    if raw is None:
        return DEFAULT_DEDUP_WINDOW_S
    try:
        value = float(raw)
    except ValueError:
        problems.add(f"vt_dedup_window={raw!r} is not a number")
        return None
    if not 0 < value <= MAX_DEDUP_WINDOW_S:  # NaN fails this too
        problems.add(
            f"vt_dedup_window={raw} must be greater than zero and at most "
            f"{MAX_DEDUP_WINDOW_S:.0f} seconds (ten years)"
        )
        return None
    return value


def _key_column(
    column: str, by_name: Mapping[str, Column], engine: set[str], problems: _Problems
) -> bool:
    if not column:
        problems.add("vt_dedup must name a column")
        return False
    col = by_name.get(column)
    if col is None:
        problems.add(f"vt_dedup names unknown column {column!r}")
        return False
    if column == "id" or column in engine:
        problems.add(f"vt_dedup={column} is an engine column: name an application column")
        return False
    if col.data_type not in KEY_TYPES:
        problems.add(
            f"vt_dedup: column {column} must be text, binary or an integer, not {col.column_type}"
        )
        return False
    if not col.nullable:
        problems.add(
            f"vt_dedup: column {column} must take NULL (a key past its window is cleared to "
            f"NULL): ALTER TABLE {problems.table} MODIFY {column} {col.column_type} NULL"
        )
        return False
    return True


def _created(by_name: Mapping[str, Column], problems: _Problems) -> bool:
    col = by_name.get(CREATED_COLUMN)
    if col is None or not col.is_integer:
        problems.add(
            f"vt_dedup needs an integer column {CREATED_COLUMN} (when each key was enqueued): "
            f"ALTER TABLE {problems.table} ADD COLUMN {CREATED_COLUMN} bigint "
            "DEFAULT (unix_timestamp(now(6)) * 1000000000)"
        )
        return False
    return True


def is_duplicate_of(message: str, table: str, index: str) -> bool:
    """Whether a MySQL / MariaDB error 1062's text names the dedup index (MariaDB says
    ``for key 'dedup_idx'``, MySQL 8 ``for key 'table.dedup_idx'``)."""
    if not index:
        return False
    tail = message.rstrip().rstrip(")").rstrip()
    return tail.endswith((f"'{index}'", f".{index}'")) or tail.endswith(f"'{table}.{index}'")
