"""What dead means, and what a dead-letter table must be.

A message is **dead** when a subscriber rejects it, or when it was sent vt_max_attempts times
and its last ack wait ended with no ack (it falls due again at that epoch). A dead message is
never sent again. Where it goes:

* with ``vt_dead_letter=TABLE``, it is **moved**: in one transaction its row is copied to the
  dead-letter table (with when it died, how many times it was sent, and the last error) and
  deleted from its own, so it is in exactly one of the two tables whatever crashes. The
  dead-letter table is itself a message table: its rows are due at once, so it can be
  streamed, acked, purged and analysed like any other;
* without it, it **stays in place**: time_next becomes DEAD_TIME_NEXT (the largest BIGINT, a
  time no poll reaches), and time_dead is set where the table has that column. SQL sees it
  as ``time_acked IS NULL AND time_next = 9223372036854775807``.

Either way the reason (a reject's, else the message's last release / renew reason, else
"no ack after N attempts") is kept in ``last_error``. A redrive (msgtable redrive) moves dead
messages back as fresh ones (epoch 0, due now), batch by batch, each batch one transaction.

This module is pure: the checks of a dead-letter table and the columns a move copies. The SQL
is in msgtable.store.deadletters.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from msgtable.core.tables import (
    LAST_ERROR_COLUMN,
    TEXT_TYPES,
    TIME_DEAD_COLUMN,
    Layout,
    TableConfig,
)

ATTEMPTS_COLUMN = "attempts"
# The columns a dead-letter table has besides the message columns of the tables it serves.
DEAD_LETTER_COLUMNS = (TIME_DEAD_COLUMN, ATTEMPTS_COLUMN, LAST_ERROR_COLUMN)
# Engine columns copied from a table to its dead-letter table (and back) when both have them.
CARRIED_COLUMNS = ("priority", "time_created")


def holds_dead_letters(columns: Iterable[str]) -> bool:
    """Whether a table with these columns is a dead-letter table (it has every one of
    DEAD_LETTER_COLUMNS: what check_dead_letter asks of one)."""
    names = set(columns)
    return all(c in names for c in DEAD_LETTER_COLUMNS)


def exhausted_reason(max_attempts: int) -> str:
    """The last error of a message that died of vt_max_attempts with none of its own."""
    return f"no ack after {max_attempts} attempts (vt_max_attempts={max_attempts})"


def check_dead_letter(cfg: TableConfig, dead: TableConfig | None, dead_error: str | None) -> str:
    """Why ``cfg``'s vt_dead_letter table cannot take its dead messages ("" when it can).

    ``dead`` is the dead-letter table's config if it loaded, ``dead_error`` its load error if
    it is a message table that did not."""
    name = cfg.dead_letter
    field = f"vt_dead_letter={name}"
    if dead is None:
        if dead_error is not None:
            return f"{field}: that table failed to load ({dead_error})"
        return (
            f"{field}: no message table {name} in this database (create it: schema/dead_letter.sql)"
        )
    if dead.dead_letter == cfg.name:
        return f"{field}: {name} sends its dead messages back here (vt_dead_letter={cfg.name})"
    have = {c.name: c for c in dead.columns}
    missing = [c.name for c in cfg.message_columns if c.name not in have]
    missing += [c for c in DEAD_LETTER_COLUMNS if c not in have]
    if missing:
        return f"{field}: {name} lacks column {', '.join(missing)}"
    for col in (TIME_DEAD_COLUMN, ATTEMPTS_COLUMN):
        if not have[col].is_integer:
            return f"{field}: {name}.{col} must be an integer (bigint)"
    if have[LAST_ERROR_COLUMN].data_type not in TEXT_TYPES:
        return f"{field}: {name}.{LAST_ERROR_COLUMN} must be text (varchar)"
    return ""


@dataclass(frozen=True)
class Move:
    """The columns a move between two message tables copies: ``values`` by name from the
    source (its message columns, then priority and time_created where both have them; the
    last error is the statement's to set)."""

    source: TableConfig
    target: TableConfig
    values: tuple[str, ...]

    @classmethod
    def between(cls, source: TableConfig, target: TableConfig) -> Move:
        have = {c.name for c in target.columns}
        names = [
            c.name
            for c in source.message_columns
            if c.name in have and c.name not in DEAD_LETTER_COLUMNS  # the statement sets these
        ]
        for extra in CARRIED_COLUMNS:
            if source.has_column(extra) and extra in have and extra not in names:
                names.append(extra)
        if target.layout is Layout.V2018 or source.layout is Layout.V2018:
            names = [n for n in names if n != "priority"]
        return cls(source, target, tuple(names))


def redrive_problem(dead: TableConfig, target: TableConfig) -> str:
    """Why dead letters of ``dead`` cannot go to ``target`` ("" when they can): every column
    the target streams must come from the dead-letter table. Dead in place (the same table,
    or a subscription's state table) they live again where they are: nothing to copy."""
    if dead.name == target.name:
        return ""
    have = {c.name for c in dead.columns}
    missing = [c.name for c in target.message_columns if c.name not in have]
    if missing:
        return f"{dead.name} lacks column {', '.join(missing)} of {target.name}"
    return ""


@dataclass(frozen=True)
class DeadLetter:
    """One dead message as ``msgtable dead`` lists it."""

    id: object
    time_dead_ns: int | None  # None: dead in place in a table without time_dead
    attempts: int
    last_error: str | None


@dataclass(frozen=True)
class RedriveBatch:
    """What one redrive batch (one transaction) did: ``moved`` dead letters back; ``skipped``
    ids whose target table already has a row of that id (left where they are); ``last`` the
    greatest id it looked at (the next batch starts after it; None: there was nothing left)."""

    moved: int
    skipped: tuple[object, ...]
    last: object | None
