"""Message table definitions: the COMMENT grammar, the two column layouts, and TableConfig.

A message table is an ordinary InnoDB table whose COMMENT starts with ``vitess_message``.
Everything here is pure: the SQL that reads information_schema lives in store.py and hands
the raw facts (comment, columns, unique indexes) to :func:`load_table`, which returns either
a frozen :class:`TableConfig` or a :class:`TableLoadError` naming the table and the field.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from msgtable.core.dedup import dedup_fields
from msgtable.core.events import EVENT_COLUMNS, ROW_KEY_MAX, Capture, parse_kinds, parse_patterns
from msgtable.core.flow import FLOW_KEYS, FlowControl, parse_flow
from msgtable.core.sqltypes import BINARY_TYPES, INTEGER_TYPES
from msgtable.errors import TableLoadError

COMMENT_MARKER = "vitess_message"

REQUIRED_KEYS = (
    "vt_ack_wait",
    "vt_purge_after",
    "vt_batch_size",
    "vt_cache_size",
    "vt_poller_interval",
)
OPTIONAL_KEYS = (
    "vt_min_backoff",
    "vt_max_backoff",
    "vt_message_cols",
    "vt_postpone_after",
    "vt_max_attempts",
    "vt_dead_letter",
    "vt_default_group",
    "vt_order_key",
    "vt_order_by",
    "vt_capture",
    "vt_capture_kinds",
    # flow control (msgtable.core.flow)
    *FLOW_KEYS,
    # idempotent enqueue (msgtable.core.dedup)
    "vt_dedup",
    "vt_dedup_window",
)

# A sent message is postponed in the database (time_next by backoff, epoch + 1) only once it
# has gone this long without an ack; an ack that comes sooner writes the row once, for both.
# Never later than vt_ack_wait. 0 postpones before the send, as Vitess does.
DEFAULT_POSTPONE_AFTER_S = 1.0

# How often the server looks for new, changed and dropped message tables (msgtable serve
# --discovery-interval); also at once when a request names a table it does not know.
DEFAULT_DISCOVERY_INTERVAL_S = 5.0

# A backoff with no upper bound (vt_max_backoff=0) still stops here, so time_next stays a
# valid BIGINT of nanoseconds for centuries.
BACKOFF_CEILING_S = 365 * 86400.0


# time_next of a message that is dead in place (vt_max_attempts or a reject on a table without
# vt_dead_letter): the largest BIGINT, a time no poll ever reaches (msgtable.core.deadletters).
DEAD_TIME_NEXT = 2**63 - 1
# Optional columns of a message table that settlement writes when they exist: the reason of
# the last release / reject / renew, and (dead in place) when the message died.
LAST_ERROR_COLUMN = "last_error"
TIME_DEAD_COLUMN = "time_dead"
TEXT_TYPES = ("char", "varchar", "tinytext", "text", "mediumtext", "longtext")
# vt_max_attempts at most this (a message sent more often is not a poison candidate but a bug)
MAX_ATTEMPTS_LIMIT = 1_000_000


class Layout(enum.Enum):
    """Which engine columns a table has."""

    CURRENT = "current"  # id, priority, time_next, epoch, time_acked (Vitess 6.0+), time_created
    V2018 = "2018"  # time_scheduled, id, time_next, epoch, time_created, time_acked


ENGINE_COLUMNS = {
    # time_created is optional here (when a message was enqueued: the report's latency);
    # so is time_fanout (whether the row was handed to the subscriptions:
    # msgtable.core.subscriptions)
    Layout.CURRENT: ("priority", "time_next", "epoch", "time_acked", "time_created", "time_fanout"),
    Layout.V2018: (
        "time_scheduled",
        "time_next",
        "epoch",
        "time_created",
        "time_acked",
        "time_fanout",
    ),
}
REQUIRED_COLUMNS = {
    Layout.CURRENT: ("id", "priority", "time_next", "epoch", "time_acked"),
    Layout.V2018: ("id", "time_scheduled", "time_next", "epoch", "time_acked"),
}
INTEGER_COLUMNS = (
    "priority",
    "time_next",
    "epoch",
    "time_acked",
    "time_scheduled",
    "time_created",
    "time_fanout",
)


@dataclass(frozen=True)
class Column:
    """One column of a message table as information_schema describes it."""

    name: str
    data_type: str  # lower case, e.g. "bigint", "varchar", "json"
    column_type: str  # full type, e.g. "bigint(20) unsigned"
    nullable: bool = True  # information_schema's IS_NULLABLE

    @property
    def is_integer(self) -> bool:
        return self.data_type in INTEGER_TYPES

    @property
    def is_binary(self) -> bool:
        return self.data_type in BINARY_TYPES


def text_limit(column: Column) -> int:
    """How many characters a text column takes (what a reason is cut to before it is
    written): char(N) / varchar(N) say so; the text types are long enough for any reason."""
    head, _, rest = column.column_type.partition("(")
    if head in ("char", "varchar") and rest[:-1].isdigit():
        return int(rest[:-1])
    return 255 if head == "tinytext" else 16_000


@dataclass(frozen=True)
class TableConfig:
    """Everything the engine needs to serve one message table. Times are seconds."""

    name: str
    ack_wait_s: float
    purge_after_s: float
    batch_size: int
    cache_size: int
    poller_interval_s: float
    min_backoff_s: float
    max_backoff_s: float  # 0 means no bound (but BACKOFF_CEILING_S still applies)
    layout: Layout
    columns: tuple[Column, ...]
    message_columns: tuple[Column, ...]  # streamed to subscribers, id first
    postpone_after_s: float = DEFAULT_POSTPONE_AFTER_S  # see DEFAULT_POSTPONE_AFTER_S
    max_attempts: int = 0  # vt_max_attempts: sent this often and unacked -> dead; 0: never
    dead_letter: str = ""  # vt_dead_letter: where dead messages go; "": dead in place
    # Subscriptions (msgtable.core.subscriptions). Of a message table: whether its own columns
    # are a work queue (vt_default_group), whether its rows are handed to subscriptions
    # (fanout: it has some), and the state tables whose unsettled rows hold its purge.
    default_group: bool = True
    fanout: bool = False
    holders: tuple[str, ...] = ()
    # of the holders, the lazy subscriptions' (by name): a row they were never sent has no
    # state row, so it holds the purge until their cursor passes it
    cursored: tuple[str, ...] = ()
    # Of a subscription (its state table is ``name``): the message table whose rows its poll
    # joins for the message columns, and the subscription's name.
    source: str = ""
    subscription: str = ""
    # Ordering per key (msgtable.engine.ordered): the key column (vt_order_key; "": unordered), the
    # column that orders a key's messages (vt_order_by; "id" by default) and the index the
    # poll finds each key's head through (its columns begin key, time_acked[, order_by]).
    order_key: str = ""
    order_by: str = ""
    order_index: str = ""
    # A capture table's (msgtable.features.capture.follower): the source tables and kinds of change
    # it takes
    # (vt_capture, vt_capture_kinds); None: not a capture table.
    capture: Capture | None = None
    # Flow control (msgtable.core.flow): rate limits, caps, fair share; None: none.
    flow: FlowControl | None = None
    # Idempotent enqueue (msgtable.core.dedup): the key column (vt_dedup; "": none), how long
    # a key refuses its duplicates (vt_dedup_window) and the unique index that refuses them.
    dedup: str = ""
    dedup_window_s: float = 0.0
    dedup_index: str = ""

    def has_column(self, name: str) -> bool:
        return any(c.name == name for c in self.columns)

    @property
    def keeps_errors(self) -> bool:
        """Whether the table has a last_error column (settlement reasons are kept there)."""
        return self.has_column(LAST_ERROR_COLUMN)

    @property
    def postpone_after_ns(self) -> int:
        """How long after its send an unacked message is postponed (at most vt_ack_wait)."""
        return round(min(self.postpone_after_s, self.ack_wait_s) * 1e9)

    @property
    def ordered(self) -> bool:
        return bool(self.order_key)

    @property
    def label(self) -> str:
        """How users name it: the table, or ``table/subscription``."""
        return f"{self.source}/{self.subscription}" if self.source else self.name

    @property
    def id_column(self) -> Column:
        return self.message_columns[0]

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


def is_message_comment(comment: str) -> bool:
    return comment.split(",", 1)[0].strip() == COMMENT_MARKER


class Problems:
    """What is wrong with a table's definition: every problem found, not only the first, so a
    user fixes a comment once (TableLoadError names the table and each field)."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.found: list[str] = []

    def add(self, problem: str) -> None:
        self.found.append(problem)

    def raise_any(self) -> None:
        if self.found:
            raise TableLoadError(f"table {self.table}: " + "; ".join(self.found))


def parse_comment(table: str, comment: str) -> dict[str, str]:
    """Split a ``vitess_message,vt_key=value,...`` comment into raw key/value strings."""
    problems = Problems(table)
    fields = _comment_fields(comment, problems)
    problems.raise_any()
    return fields


def _comment_fields(comment: str, problems: Problems) -> dict[str, str]:
    parts = [p.strip() for p in comment.split(",")]
    if not parts or parts[0] != COMMENT_MARKER:
        problems.add(f"comment does not start with {COMMENT_MARKER!r}")
        return {}
    fields: dict[str, str] = {}
    for part in parts[1:]:
        if not part:
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            problems.add(f"comment field {part!r} is not of the form vt_key=value")
        elif key not in REQUIRED_KEYS and key not in OPTIONAL_KEYS:
            problems.add(f"unknown comment field {key!r}")
        elif key in fields:
            problems.add(f"comment field {key} is given twice")
        else:
            fields[key] = value
    missing = [k for k in REQUIRED_KEYS if k not in fields]
    if missing:
        problems.add(f"missing comment field {', '.join(missing)}")
    return fields


def _seconds(
    problems: Problems, fields: dict[str, str], key: str, default: float, *, allow_zero: bool
) -> float:
    """The field in seconds (``default`` when absent, or wrong: the problem is noted)."""
    raw = fields.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        problems.add(f"{key}={raw!r} is not a number")
        return default
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        need = "zero or more" if allow_zero else "greater than zero"
        problems.add(f"{key}={raw} must be {need}")
        return default
    return value


def _count(problems: Problems, fields: dict[str, str], key: str) -> int:
    raw = fields.get(key)
    if raw is None:
        return 1
    try:
        value = int(raw)
    except ValueError:
        problems.add(f"{key}={raw!r} is not a whole number")
        return 1
    if value < 1:
        problems.add(f"{key}={raw} must be at least 1")
        return 1
    return value


def detect_layout(columns: Iterable[Column]) -> Layout:
    names = {c.name for c in columns}
    if "priority" not in names and "time_scheduled" in names:
        return Layout.V2018
    return Layout.CURRENT


def load_table(
    table: str,
    comment: str,
    columns: Sequence[Column],
    unique_indexes: Iterable[Sequence[str]],
    indexes: Iterable[tuple[str, Sequence[str]]] = (),
) -> TableConfig:
    """Build the config of one table, or raise TableLoadError naming the table and every
    field or column that is wrong.

    ``unique_indexes`` lists the column names of each unique index (primary key included);
    ``indexes``, every index by name with its columns (an ordered table needs one).
    """
    problems = Problems(table)
    fields = _comment_fields(comment, problems)
    if not fields and problems.found:
        problems.raise_any()  # not a comment of fields at all
    ack_wait = _seconds(problems, fields, "vt_ack_wait", 1.0, allow_zero=False)
    purge_after = _seconds(problems, fields, "vt_purge_after", 0.0, allow_zero=True)
    batch_size = _count(problems, fields, "vt_batch_size")
    cache_size = _count(problems, fields, "vt_cache_size")
    poller = _seconds(problems, fields, "vt_poller_interval", 1.0, allow_zero=False)
    min_backoff = _seconds(problems, fields, "vt_min_backoff", ack_wait, allow_zero=False)
    max_backoff = _seconds(problems, fields, "vt_max_backoff", 0.0, allow_zero=True)
    if 0 < max_backoff < min_backoff:
        problems.add(
            f"vt_max_backoff={fields['vt_max_backoff']} is below vt_min_backoff ({min_backoff:g})"
        )
    postpone_after = _seconds(
        problems, fields, "vt_postpone_after", DEFAULT_POSTPONE_AFTER_S, allow_zero=True
    )
    max_attempts = _max_attempts(fields, problems)
    dead_letter = _dead_letter(table, fields, problems)
    default_group = _switch(problems, fields, "vt_default_group", True)
    layout = detect_layout(columns)
    by_name = _checked_columns(columns, unique_indexes, layout, problems)
    message_columns = _message_columns(fields, columns, layout, problems)
    order_key, order_by, order_index = _ordering(fields, by_name, layout, indexes, problems)
    capture = _capture(fields, by_name, layout, problems)
    flow = parse_flow(
        fields,
        [c.name for c in columns],
        ENGINE_COLUMNS[layout],
        [c.name for c in message_columns],
        order_key,
        problems,
        indexes,
    )
    dedup = dedup_fields(fields, by_name, ENGINE_COLUMNS[layout], unique_indexes, indexes, problems)
    problems.raise_any()

    return TableConfig(
        name=table,
        ack_wait_s=ack_wait,
        purge_after_s=purge_after,
        batch_size=batch_size,
        cache_size=cache_size,
        poller_interval_s=poller,
        min_backoff_s=min_backoff,
        max_backoff_s=max_backoff,
        layout=layout,
        columns=tuple(columns),
        message_columns=message_columns,
        postpone_after_s=postpone_after,
        max_attempts=max_attempts,
        dead_letter=dead_letter,
        default_group=default_group,
        order_key=order_key,
        order_by=order_by,
        order_index=order_index,
        capture=capture,
        flow=flow,
        dedup=dedup.column,
        dedup_window_s=dedup.window_s,
        dedup_index=dedup.index,
    )


def _max_attempts(fields: dict[str, str], problems: Problems) -> int:
    """vt_max_attempts: sends before a message dies (0: no limit)."""
    max_attempts = _count(problems, fields, "vt_max_attempts") if "vt_max_attempts" in fields else 0
    if max_attempts > MAX_ATTEMPTS_LIMIT:
        problems.add(f"vt_max_attempts={max_attempts} must be at most {MAX_ATTEMPTS_LIMIT:,}")
        max_attempts = 0
    return max_attempts


def _dead_letter(table: str, fields: dict[str, str], problems: Problems) -> str:
    """vt_dead_letter: the table dead messages move to ("": dead in place)."""
    dead_letter = fields.get("vt_dead_letter", "")
    if "vt_dead_letter" in fields:
        if not dead_letter:
            problems.add("vt_dead_letter must name a table")
        elif dead_letter == table:
            problems.add(f"vt_dead_letter={dead_letter} is the table itself")
    return dead_letter


def _checked_columns(
    columns: Sequence[Column],
    unique_indexes: Iterable[Sequence[str]],
    layout: Layout,
    problems: Problems,
) -> dict[str, Column]:
    """The columns by name, once the layout's required ones, their types and id's unique
    index are checked."""
    by_name = {c.name: c for c in columns}
    missing = [c for c in REQUIRED_COLUMNS[layout] if c not in by_name]
    if missing:
        problems.add(f"missing required column {', '.join(missing)}")
    for name in INTEGER_COLUMNS:
        col = by_name.get(name)
        if col is not None and not col.is_integer:
            problems.add(f"column {name} must be an integer (bigint), not {col.column_type}")
    if not any(list(idx) == ["id"] for idx in unique_indexes):
        problems.add("column id must be unique on its own (primary key or unique index on id)")
    last_error = by_name.get(LAST_ERROR_COLUMN)
    if last_error is not None and last_error.data_type not in TEXT_TYPES:
        problems.add(
            f"column {LAST_ERROR_COLUMN} must be text (varchar), not {last_error.column_type}"
        )
    time_dead = by_name.get(TIME_DEAD_COLUMN)
    if time_dead is not None and not time_dead.is_integer:
        problems.add(
            f"column {TIME_DEAD_COLUMN} must be an integer (bigint), not {time_dead.column_type}"
        )
    return by_name


# What an event table's columns must be (msgtable.features.capture.follower writes them): a type
# family each.
EVENT_COLUMN_TYPES = {
    "source_table": TEXT_TYPES,
    "kind": TEXT_TYPES,
    "pk": ("json", "longtext", "mediumtext", "text"),
    "row_key": TEXT_TYPES,
    "before_values": ("json", "longtext", "mediumtext"),
    "after_values": ("json", "longtext", "mediumtext"),
    "time_commit": INTEGER_TYPES,
    "position": TEXT_TYPES,
}


# The shortest text an event column may be (a table name, a kind, msgtable.core.events.row_key,
# a binlog position).
EVENT_TEXT_LENGTHS = {"source_table": 64, "kind": 8, "row_key": ROW_KEY_MAX, "position": 255}


def _capture(
    fields: dict[str, str], by_name: dict[str, Column], layout: Layout, problems: Problems
) -> Capture | None:
    """vt_capture / vt_capture_kinds, checked with the event columns they need."""
    if "vt_capture" not in fields:
        if "vt_capture_kinds" in fields:
            problems.add("vt_capture_kinds needs vt_capture")
        return None
    patterns, wrong = parse_patterns(fields["vt_capture"])
    kinds, wrong_kinds = parse_kinds(fields.get("vt_capture_kinds"))
    for p in wrong + wrong_kinds:
        problems.add(p)
    if layout is not Layout.CURRENT:
        problems.add("vt_capture needs the current layout (see schema/events.sql)")
    missing = [c for c in EVENT_COLUMNS if c not in by_name]
    if missing:
        problems.add(
            f"vt_capture: missing event column {', '.join(missing)} (see schema/events.sql)"
        )
    for name in EVENT_COLUMNS:
        col = by_name.get(name)
        # MariaDB reports a JSON column as longtext
        if col is not None and col.data_type not in EVENT_COLUMN_TYPES[name]:
            problems.add(f"vt_capture: column {name} cannot be {col.column_type}")
        elif col is not None and text_limit(col) < EVENT_TEXT_LENGTHS.get(name, 0):
            # shorter, and one event would fail to be written, stopping all of them
            problems.add(
                f"vt_capture: column {name} must hold {EVENT_TEXT_LENGTHS[name]} "
                f"characters, not {col.column_type}"
            )
    if wrong or wrong_kinds:
        return None
    return Capture(patterns, kinds)


def order_index_columns(order_key: str, order_by: str) -> tuple[str, ...]:
    """The columns an ordered table's index begins with (msgtable.engine.ordered): the key, then
    time_acked (unsettled rows first), then the order column (InnoDB appends the primary key
    to every index, so for id order the index may end at time_acked)."""
    return (order_key, "time_acked", order_by)


def _ordering(
    fields: dict[str, str],
    by_name: dict[str, Column],
    layout: Layout,
    indexes: Iterable[tuple[str, Sequence[str]]],
    problems: Problems,
) -> tuple[str, str, str]:
    """vt_order_key / vt_order_by, checked: (key column, order column, index name), or
    ("", "", "") for an unordered table."""
    if "vt_order_key" not in fields:
        if "vt_order_by" in fields:
            problems.add("vt_order_by needs vt_order_key")
        return "", "", ""
    key = fields["vt_order_key"].strip()
    order_by = fields.get("vt_order_by", "id").strip()
    engine = set(ENGINE_COLUMNS[layout]) | {"id"}
    ok = True
    for field, name in (("vt_order_key", key), ("vt_order_by", order_by)):
        if not name:
            problems.add(f"{field} must name a column")
            ok = False
        elif name not in by_name:
            problems.add(f"{field} names unknown column {name!r}")
            ok = False
    if key in engine:
        problems.add(f"vt_order_key={key} is an engine column: name an application column")
        ok = False
    if order_by in engine - {"id"}:
        problems.add(f"vt_order_by={order_by} is an engine column: use id or an application column")
        ok = False
    if order_by == key and key:
        problems.add("vt_order_by must be another column than vt_order_key")
        ok = False
    if layout is not Layout.CURRENT:
        problems.add("vt_order_key needs the current layout (time_acked and priority columns)")
        ok = False
    if not ok:
        return "", "", ""
    want = order_index_columns(key, order_by)
    for name, cols in indexes:
        cols = tuple(cols)
        if cols[:3] == want or (order_by == "id" and cols == want[:2]):
            return key, order_by, name
    problems.add(
        f"vt_order_key={key} needs an index that begins ({', '.join(want)}), so that a poll "
        f"finds each key's first message without a scan: "
        f"ALTER TABLE {problems.table} ADD INDEX order_idx ({', '.join(want)})"
    )
    return "", "", ""


_ON = ("1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")


def _switch(problems: Problems, fields: dict[str, str], key: str, default: bool) -> bool:
    raw = fields.get(key)
    if raw is None:
        return default
    if raw.lower() in _ON:
        return True
    if raw.lower() in _OFF:
        return False
    problems.add(f"{key}={raw!r} must be on or off")
    return default


def _message_columns(
    fields: dict[str, str], columns: Sequence[Column], layout: Layout, problems: Problems
) -> tuple[Column, ...]:
    """The columns streamed to subscribers: vt_message_cols, or id and every application
    column."""
    by_name = {c.name: c for c in columns}
    if "vt_message_cols" not in fields:
        engine_cols = set(ENGINE_COLUMNS[layout])
        rest = (c for c in columns if c.name != "id" and c.name not in engine_cols)
        return (by_name["id"], *rest) if "id" in by_name else ()
    names = [n.strip() for n in fields["vt_message_cols"].split("|")]
    if not names or names[0] != "id":
        problems.add("vt_message_cols must start with id")
    unknown = [n for n in names if n not in by_name]
    for n in unknown:
        problems.add(f"vt_message_cols names unknown column {n!r}")
    if len(set(names)) != len(names):
        problems.add("vt_message_cols repeats a column")
    return tuple(by_name[n] for n in names if n in by_name)


DEMO_TABLE = "my_message"
DEMO_COMMENT = (
    "vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=10,"
    "vt_cache_size=10000,vt_poller_interval=30"
)


def current_layout_ddl(table: str = DEMO_TABLE, comment: str = DEMO_COMMENT) -> str:
    """The recommended DDL (schema/current.sql is this, rendered for my_message)."""
    return f"""create table {table}(
  id bigint not null,
  priority bigint not null default 0,
  time_next bigint default 0,
  epoch bigint not null default 0,
  time_acked bigint,
  time_created bigint default (unix_timestamp(now(6)) * 1000000000),
  message varchar(128),
  primary key(id),
  index poller_idx(time_acked, priority, time_next)
) engine=InnoDB comment '{comment}'"""
