"""What information_schema says of the message tables: each table whose COMMENT marks it as one
(msgtable.core.tables.is_message_comment), with its columns and indexes, read in three
statements whatever the number of tables (the engine's discovery, and msgtable.enqueue inside
the application's own transaction). Table and column names reach the rest of the store's SQL
only from here, and always quoted (msgtable.core.sql.quote).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from msgtable.core.sql import placeholders
from msgtable.core.tables import Column, is_message_comment
from msgtable.store.mysql import server_text

_FIND_TABLES = (
    "SELECT TABLE_NAME, TABLE_COMMENT FROM information_schema.TABLES "
    "WHERE TABLE_SCHEMA = %s AND TABLE_TYPE = 'BASE TABLE' AND TABLE_COMMENT LIKE 'vitess%%'"
)
_COLUMNS = (
    "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE "
    "FROM information_schema.COLUMNS "
    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME IN ({names}) ORDER BY TABLE_NAME, ORDINAL_POSITION"
)
_INDEXES = (
    "SELECT TABLE_NAME, INDEX_NAME, COLUMN_NAME, NON_UNIQUE FROM information_schema.STATISTICS "
    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME IN ({names}) "
    "ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX"
)


@dataclass(frozen=True)
class TableDefinition:
    """Raw facts about one table whose COMMENT marks it as a message table."""

    name: str
    comment: str
    columns: tuple[Column, ...]
    unique_indexes: tuple[tuple[str, ...], ...]
    # every index, by name, with its columns (an ordered table's poll needs one:
    # msgtable.engine.ordered)
    indexes: tuple[tuple[str, tuple[str, ...]], ...] = ()


def read_definitions(cur: Any, database: str, only: str | None = None) -> list[TableDefinition]:
    """Every message table of ``database`` (or only the one named ``only``) as
    information_schema describes it, read with a DBAPI cursor (the engine's discovery, and
    msgtable.enqueue inside the application's own transaction)."""
    cur.execute(_FIND_TABLES, [database])
    tables = {n: c for n, c in cur.fetchall() if is_message_comment(c or "") and only in (None, n)}
    if not tables:
        return []
    names = list(tables)
    in_names = placeholders(len(names))
    columns: dict[str, list[Column]] = {n: [] for n in tables}
    cur.execute(_COLUMNS.format(names=in_names), [database, *names])
    for tname, cname, data_type, column_type, nullable in cur.fetchall():
        columns[tname].append(
            Column(
                cname,
                server_text(data_type).lower(),
                server_text(column_type).lower(),
                server_text(nullable).upper() == "YES",
            )
        )
    indexes: dict[tuple[str, str], list[str]] = {}
    unique: set[tuple[str, str]] = set()
    cur.execute(_INDEXES.format(names=in_names), [database, *names])
    for tname, iname, cname, non_unique in cur.fetchall():
        indexes.setdefault((tname, iname), []).append(cname)
        if not int(non_unique):
            unique.add((tname, iname))
    return [
        TableDefinition(
            name=n,
            comment=tables[n],
            columns=tuple(columns[n]),
            unique_indexes=tuple(
                tuple(cols) for (t, i), cols in indexes.items() if t == n and (t, i) in unique
            ),
            indexes=tuple((i, tuple(cols)) for (t, i), cols in indexes.items() if t == n),
        )
        for n in sorted(tables)
    ]
