"""Writing SQL text safely: identifiers quoted, ids as IN lists, msgtable's statement mark.

The modules that hold SQL (store.py: the engine's; bulk.py: the pipeline's; lease.py: the
lease's; capturestore.py: the table events') build their statements with these: a table or
column name reaches SQL only if it came from information_schema, and quoted; every value is a
bound parameter, but for integer ids, which are written as decimal literals.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from typing import Any

from msgtable.errors import InvalidArgument

# Every statement that writes a message table begins with this comment, so that the binlog
# follower knows msgtable's own writes from other clients' (msgtable.engine.binlog).
STATEMENT_MARK = "/* msgtable */ "
MARK = STATEMENT_MARK.replace("%", "%%")  # as it stands in a DBAPI query string


def quote(name: str) -> str:
    """A MySQL identifier, backtick-quoted, for a DBAPI query string (``%`` doubled)."""
    return "`" + name.replace("`", "``").replace("%", "%%") + "`"


def placeholders(n: int) -> str:
    return ",".join(["%s"] * n)


_INT = frozenset({int})


def in_list(ids: Sequence[Hashable]) -> tuple[str, list[Any]]:
    """An IN list for ids and its parameters. Integer ids (the usual key) are written into
    the SQL as decimal literals, which cannot carry anything but digits and a sign, and that
    costs a tenth of the driver's escaping of one parameter each; any other id is a
    parameter."""
    if set(map(type, ids)) <= _INT:  # no Python call per id (the cost guard counts them)
        return ",".join(map(str, ids)), []
    return placeholders(len(ids)), list(ids)


_DATABASE_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")


def quote_database_name(name: str) -> str:
    """A database name msgtable creates or drops (throwaway servers, tests), quoted; only
    [A-Za-z0-9_], 1-64 characters, is accepted."""
    if not _DATABASE_NAME.fullmatch(name):
        raise InvalidArgument(
            f"invalid database name {name!r}: use 1-64 letters, digits or underscores"
        )
    return f"`{name}`"
