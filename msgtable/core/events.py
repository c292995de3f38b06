"""Table events, the pure part: which source tables and kinds a capture table wants, a row
value as JSON, a row's key, and the tables a DDL statement names
(msgtable.features.capture.follower follows
the binlog and writes them; this module reads nothing and writes nothing).

An event is one committed change of a source table: ``kind`` is insert / update / delete
(one per row) or create / alter / drop / rename / truncate (one per table a DDL statement
names; a RENAME or DROP of several tables: one each). ``pk`` is the JSON object of the row's
primary key columns (NULL for DDL, and for a table without a primary key), ``row_key`` the
source table and its primary key in one string (what vt_order_key=row_key orders by).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ROW_KINDS = ("insert", "update", "delete")
DDL_KINDS = ("create", "alter", "drop", "rename", "truncate")
KINDS = ROW_KINDS + DDL_KINDS
MAX_PATTERN = 64  # a MySQL table name is at most 64 characters: a longer pattern is a mistake
ROW_KEY_MAX = 255  # the row_key column's length: a longer key becomes the table and a hash
# The columns an event table has besides the engine's, in the order the follower writes them.
EVENT_COLUMNS = (
    "source_table",
    "kind",
    "pk",
    "row_key",
    "before_values",
    "after_values",
    "time_commit",
    "position",
)


CAPTURE_DEMO_TABLE = "table_events"
CAPTURE_DEMO_COMMENT = (
    "vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=10,vt_cache_size=10000,"
    "vt_poller_interval=30,vt_capture=orders_*|customers,vt_order_key=row_key"
)


def capture_table_ddl(table: str = CAPTURE_DEMO_TABLE, comment: str = CAPTURE_DEMO_COMMENT) -> str:
    """The recommended DDL of a capture table (schema/events.sql is this, rendered for
    table_events): the engine's columns, the event columns the follower writes, and the
    order index that vt_order_key=row_key needs."""
    return f"""create table {table}(
  id bigint not null auto_increment,
  priority bigint not null default 0,
  time_next bigint default 0,
  epoch bigint not null default 0,
  time_acked bigint,
  time_created bigint default (unix_timestamp(now(6)) * 1000000000),
  source_table varchar(64) not null,
  kind varchar(16) not null,
  pk json,
  row_key varchar(255) not null,
  before_values json,
  after_values json,
  time_commit bigint not null,
  position varchar(255) not null,
  primary key(id),
  index poller_idx(time_acked, priority, time_next),
  index order_idx(row_key, time_acked, id)
) engine=InnoDB comment '{comment}'"""


@dataclass(frozen=True)
class Capture:
    """What a capture table wants: source tables by pattern (``*`` any run of characters,
    ``?`` one; everything else literal) and the kinds of change."""

    patterns: tuple[str, ...]
    kinds: frozenset[str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_regex", re.compile(_alternatives(self.patterns), re.DOTALL))

    def wants_table(self, table: str) -> bool:
        return self._regex.fullmatch(table) is not None  # type: ignore[attr-defined]

    def wants(self, table: str, kind: str) -> bool:
        return kind in self.kinds and self.wants_table(table)


def _alternatives(patterns: Sequence[str]) -> str:
    parts = []
    for p in patterns:
        parts.append("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in p))
    return "|".join(f"(?:{p})" for p in parts) or "(?!)"


def parse_patterns(raw: str) -> tuple[tuple[str, ...], list[str]]:
    """vt_capture's value as its patterns, and what is wrong with it (empty: nothing)."""
    problems: list[str] = []
    patterns = tuple(p.strip() for p in raw.split("|"))
    if not raw.strip():
        return (), ["vt_capture must name at least one table or pattern"]
    for p in patterns:
        if not p:
            problems.append(f"vt_capture={raw!r} has an empty pattern")
        elif len(p) > MAX_PATTERN:
            problems.append(f"vt_capture pattern {p[:20]!r}... is longer than {MAX_PATTERN}")
        elif any(ord(c) < 32 or c in "`/\\." for c in p):
            problems.append(
                f"vt_capture pattern {p!r}: only table names of this database, with * and ? "
                "(no quotes, dots, slashes or control characters)"
            )
    return patterns, problems


def parse_kinds(raw: str | None) -> tuple[frozenset[str], list[str]]:
    """vt_capture_kinds' value (None: every kind) and what is wrong with it."""
    if raw is None:
        return frozenset(KINDS), []
    kinds = [k.strip().lower() for k in raw.split("|")]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not raw.strip():
        return frozenset(KINDS), [
            f"vt_capture_kinds={raw!r}: each kind is one of {'|'.join(KINDS)}"
        ]
    return frozenset(kinds), []


def excluded(table: str) -> bool:
    """msgtable's own tables are never captured (the lease, the follower's position)."""
    return table.lower().startswith("msgtable_")


# -- values -----------------------------------------------------------------------------------
def json_value(value: Any) -> Any:
    """A value the binlog library read, as JSON can hold it: dates and times ISO 8601,
    decimals as strings (no precision lost), bytes base64, sets as sorted lists, NULL null."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return _duration(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, set | frozenset):
        return sorted(json_value(v) for v in value)
    if isinstance(value, dict):
        return {_key(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    return str(value)


def _key(key: Any) -> str:
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)


def _duration(value: datetime.timedelta) -> str:
    """A TIME value as MySQL writes it ([-]H:MM:SS[.ffffff]; hours may pass 24)."""
    us = value.days * 86_400_000_000 + value.seconds * 1_000_000 + value.microseconds
    sign, us = ("-", -us) if us < 0 else ("", us)
    s, frac = divmod(us, 1_000_000)
    text = f"{sign}{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    return f"{text}.{frac:06d}" if frac else text


def row_json(values: dict[str, Any]) -> str:
    return json.dumps({_key(k): json_value(v) for k, v in values.items()}, ensure_ascii=False)


def pk_of(values: dict[str, Any], primary_key: Sequence[str]) -> str | None:
    """The JSON of a row's primary key columns (None: the table has none)."""
    if not primary_key:
        return None
    return json.dumps({k: json_value(values.get(k)) for k in primary_key}, ensure_ascii=False)


def row_key(table: str, pk: str | None) -> str:
    """The source table and primary key in one string (at most ROW_KEY_MAX characters: a
    longer one keeps the table and a hash of the key)."""
    key = f"{table}:{pk}" if pk is not None else table
    if len(key) <= ROW_KEY_MAX:
        return key
    return f"{table}:sha256:{hashlib.sha256((pk or '').encode()).hexdigest()}"


def primary_key_columns(primary_key: Any) -> tuple[str, ...]:
    """The library's primary_key (a name, a tuple of names, or "" / None) as a tuple."""
    if not primary_key:
        return ()
    if isinstance(primary_key, str):
        return (primary_key,)
    return tuple(primary_key)


# -- DDL ----------------------------------------------------------------------------------------
_TOKEN = re.compile(
    r"""\s+|/\*.*?\*/|--[ \t][^\n]*|\#[^\n]*|`(?:[^`]|``)*`|'(?:[^'\\]|\\.|'')*'"""
    r"""|"(?:[^"\\]|\\.|"")*"|[^\W\d][\w$]*|[\w$]+|.""",
    re.DOTALL,
)


def _tokens(statement: str, limit: int = 4096) -> list[str]:
    """The statement's first tokens (comments and whitespace left out; a version comment
    ``/*!50100 ... */`` is code: its text is read)."""
    out: list[str] = []
    pos = 0
    while pos < len(statement) and len(out) < limit:
        m = _TOKEN.match(statement, pos)
        if m is None:  # pragma: no cover - the last alternative matches any character
            break
        tok = m.group(0)
        pos = m.end()
        if tok.startswith("/*!") or tok.startswith("/*M!"):
            body = re.sub(r"^/\*M?!\d*", "", tok)[:-2]
            out += _tokens(body, limit - len(out))
        elif tok[0].isspace() or tok.startswith(("/*", "--", "#")):
            continue
        else:
            out.append(tok)
    return out


def _ident(tok: str) -> str | None:
    if tok.startswith("`"):
        return tok[1:-1].replace("``", "`")
    if tok[0].isalnum() or tok[0] in "_$":
        return tok
    return None


Name = tuple[str, str]  # (schema, table)


class _Names:
    """Reads table names from a token list."""

    def __init__(self, tokens: list[str], default_schema: str) -> None:
        self.t = tokens
        self.i = 0
        self.default = default_schema

    def peek(self, *words: str) -> bool:
        return self.i < len(self.t) and self.t[self.i].upper() in words

    def skip(self, *words: str) -> bool:
        if self.peek(*words):
            self.i += 1
            return True
        return False

    def skip_all(self, *phrases: tuple[str, ...]) -> None:
        moved = True
        while moved:
            moved = False
            for phrase in phrases:
                n = len(phrase)
                if [w.upper() for w in self.t[self.i : self.i + n]] == list(phrase):
                    self.i += n
                    moved = True

    def name(self) -> tuple[str, str] | None:
        """(schema, table) at the cursor."""
        if self.i >= len(self.t):
            return None
        first = _ident(self.t[self.i])
        if first is None:
            return None
        self.i += 1
        if self.i + 1 < len(self.t) and self.t[self.i] == ".":
            second = _ident(self.t[self.i + 1])
            if second is None:
                return None
            self.i += 2
            return first, second
        return self.default, first


def ddl_tables(statement: str, default_schema: str) -> list[tuple[str, tuple[Name, ...]]]:
    """The tables a DDL statement names, as (kind, names): CREATE / ALTER / DROP / RENAME /
    TRUNCATE TABLE, one entry a table (a RENAME: one a pair, the old name and the new).
    Anything else (a view, an index, a temporary table, BEGIN): nothing. A name is (schema,
    table); ``default_schema``, the statement's session database, for names not qualified."""
    r = _Names(_tokens(statement), default_schema)
    verb = r.t[0].upper() if r.t else ""
    r.i = 1
    out: list[tuple[str, tuple[Name, ...]]] = []
    if verb == "CREATE":
        r.skip_all(("OR", "REPLACE"))
        if r.peek("TEMPORARY") or not r.skip("TABLE"):
            return []
        r.skip_all(("IF", "NOT", "EXISTS"))
        n = r.name()
        return [("create", (n,))] if n else []
    if verb == "ALTER":
        r.skip_all(("ONLINE",), ("IGNORE",))
        if not r.skip("TABLE"):
            return []
        r.skip_all(("IF", "EXISTS"))
        n = r.name()
        return [("alter", (n,))] if n else []
    if verb == "TRUNCATE":
        r.skip("TABLE")
        n = r.name()
        return [("truncate", (n,))] if n else []
    if verb == "DROP":
        if r.peek("TEMPORARY") or not r.skip("TABLE", "TABLES"):
            return []
        r.skip_all(("IF", "EXISTS"))
        while (n := r.name()) is not None:
            out.append(("drop", (n,)))
            if not r.skip(","):
                break
        return out
    if verb == "RENAME":
        if not r.skip("TABLE", "TABLES"):
            return []
        r.skip_all(("IF", "EXISTS"))
        while (old := r.name()) is not None:
            r.skip_all(("WAIT",), ("NOWAIT",))
            if not r.skip("TO") or (new := r.name()) is None:
                break
            out.append(("rename", (old, new)))
            if not r.skip(","):
                break
        return out
    return []
