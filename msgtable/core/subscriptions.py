"""Subscriptions: named consumer groups of a message table, each of which gets every message.

A message table is one work queue: its own columns (time_next, epoch, time_acked) are the
state of its **default group**, served as Vitess serves it. A **subscription** is another
group on the same table, with its own subscribers and its own delivery state: every message
of the table (that matches its filter) reaches every subscription, and within a subscription
it is a work queue as the default group is (round-robin, windows, attempts, backoff, acks,
release / reject / renew, max attempts, dead in place).

Where things are (msgtable.store.subscriptions has the SQL):

* the definitions, in the table ``msgtable_subscriptions`` of the database (one row per
  subscription: its filter, projection, settings and state), so every server of a database
  sees the same ones and changes take effect at the next discovery;
* the delivery state of each subscription, in its **state table** ``<table>__<name>``: one
  row per message handed to it, shaped like a message table's engine columns (id, priority,
  time_next, epoch, time_acked, last_error, time_dead, time_created), so a subscription is
  served by the same manager, cache and statements as a table, its poll joining the message
  table for the columns;
* the hand-over (the **fan-out**): the message table's ``time_fanout`` column is NULL for a
  row no subscription has seen yet. The server that sends (the lease holder) takes such rows
  in batches, in one transaction: it inserts a state row into each active subscription whose
  filter matches, then numbers the rows by the table's fan-out sequence (time_fanout: in
  commit order, msgtable.store.sequences). A row committed late (a long transaction) is NULL
  until then and is handed over (and numbered) when it commits. A subscription
  gets the rows handed over after its definition committed (or, created ``from_start``, also
  every retained row not acked by the default group).

A row of the message table is purged only when the default group acked it (``time_acked``;
with ``vt_default_group=off`` the fan-out sets it) and every subscription that **holds** the
table has settled it (acked; dead rows hold it, as dead letters are kept), all longer ago than
``vt_purge_after``. A subscription stops holding the table when it is expired (no subscriber
for ``expire_after_s``: it also gets no new messages until someone subscribes again) or when
its lag is over its ``max_lag``: the log and ``msgtable tables`` say so.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from msgtable.core.filters import Filter, parse_filter
from msgtable.core.flow import OWN_LIMITS, FlowControl, own_flow
from msgtable.core.sql import quote
from msgtable.core.tables import Column, Layout, TableConfig, order_index_columns
from msgtable.errors import InvalidArgument, TableLoadError

REGISTRY_TABLE = "msgtable_subscriptions"
FANOUT_COLUMN = "time_fanout"
STATE_COMMENT = "msgtable_subscription"
SEPARATOR = "__"
MAX_IDENTIFIER = 64  # MySQL's limit on a table name
STATE_COLUMNS = ("id", "priority", "time_next", "epoch", "time_acked")
STATE_ORDER_INDEX = "order_idx"  # an ordered table's state tables' (msgtable.engine.ordered)
_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
MAX_LAG_LIMIT = 10**12
MAX_EXPIRE_S = 10 * 365 * 86400.0
MAX_LIMIT_TEXT = 64  # a limit's value as written ("100/s"): longer is no limit of ours
# Where a subscription's delivery state lives (design.md next to
# msgtable.features.subscriptions): "eager", a state row per message from the fan-out (the
# default); "lazy", state rows only for messages sent and not settled in cursor order, the
# rest read from the message table behind the subscription's cursor.
EAGER, LAZY = "eager", "lazy"
# the types an index takes only a prefix of (filter_index_advice does not advise those)
UNKEYABLE_TYPES = frozenset(
    {"tinytext", "text", "mediumtext", "longtext", "tinyblob", "blob", "mediumblob", "longblob"}
    | {"json"}
)
STATE_ROWS = (EAGER, LAZY)
# a lazy subscription's state row as it writes one: (id, priority, time_next, epoch,
# time_created)
StateRow = tuple[Hashable, int, int | None, int, int | None]


class SubscriptionState(enum.Enum):
    ACTIVE = "active"
    EXPIRED = "expired"  # no subscriber for expire_after_s: holds nothing, gets nothing


@dataclass(frozen=True)
class Subscription:
    """One row of msgtable_subscriptions: a subscription's definition and state."""

    table: str
    name: str
    filter: str = ""  # a selector or an ODPS matcher (msgtable.core.filters); "": every message
    columns: tuple[str, ...] = ()  # the projection, id first; (): the table's message columns
    ack_wait_s: float | None = None  # None: the table's (vt_ack_wait)
    max_attempts: int | None = None  # None: the table's (vt_max_attempts); 0: no limit
    max_lag: int | None = None  # unsettled messages past which it no longer holds the table
    expire_after_s: float | None = None  # no subscriber this long: expired
    # flow control of its own (msgtable.core.flow.own_flow): (name, value) pairs in
    # OWN_LIMITS' order, each in place of its table's; (): the table's limits
    limits: tuple[tuple[str, str], ...] = ()
    state: SubscriptionState = SubscriptionState.ACTIVE
    time_created_ns: int = 0
    time_active_ns: int = 0  # when it last had a subscriber (or was created)
    state_rows: str = EAGER  # EAGER or LAZY (STATE_ROWS), set when it is created

    @property
    def lazy(self) -> bool:
        """Served from its cursor: state rows only for what is sent and not settled."""
        return self.state_rows == LAZY

    @property
    def state_table(self) -> str:
        return state_table_name(self.table, self.name)

    @property
    def label(self) -> str:
        return f"{self.table}/{self.name}"

    def expired_at(self, now_ns: int) -> bool:
        """Whether it has had no subscriber for longer than expire_after_s by now."""
        if self.expire_after_s is None or self.state is SubscriptionState.EXPIRED:
            return False
        since = max(self.time_active_ns, self.time_created_ns)
        return now_ns - since > self.expire_after_s * 1e9


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name or ""):
        raise InvalidArgument(
            f"invalid subscription name {name!r}: use 1-64 letters, digits or underscores"
        )
    return name


def state_table_name(table: str, name: str) -> str:
    """The state table of subscription ``name`` of ``table``."""
    state = f"{table}{SEPARATOR}{check_name(name)}"
    if len(state) > MAX_IDENTIFIER:
        raise InvalidArgument(
            f"subscription {table}/{name}: its state table {state} would be longer than "
            f"{MAX_IDENTIFIER} characters; choose a shorter name"
        )
    return state


def check_settings(sub: Subscription) -> Subscription:
    """The subscription, or InvalidArgument naming what is wrong with its settings."""
    check_name(sub.name)
    where = f"subscription {sub.label}"
    if sub.ack_wait_s is not None and not (0 < sub.ack_wait_s <= MAX_EXPIRE_S):
        raise InvalidArgument(f"{where}: ack_wait must be more than 0 seconds")
    if sub.max_attempts is not None and not 0 <= sub.max_attempts <= 1_000_000:
        raise InvalidArgument(f"{where}: max_attempts must be 0 (no limit) to 1,000,000")
    if sub.max_lag is not None and not 0 < sub.max_lag <= MAX_LAG_LIMIT:
        raise InvalidArgument(f"{where}: max_lag must be 1 to {MAX_LAG_LIMIT:,} messages")
    if sub.expire_after_s is not None and (
        not math.isfinite(sub.expire_after_s) or not 0 < sub.expire_after_s <= MAX_EXPIRE_S
    ):
        raise InvalidArgument(f"{where}: expire_after must be 1 second to 10 years")
    if sub.state_rows not in STATE_ROWS:
        raise InvalidArgument(
            f"{where}: state_rows must be {' or '.join(STATE_ROWS)}, not {sub.state_rows[:16]!r}"
        )
    if len(sub.filter) > 4000:
        raise InvalidArgument(f"{where}: a filter of {len(sub.filter):,} characters; at most 4,000")
    for key, value in sub.limits:
        if len(key) > MAX_LIMIT_TEXT or len(value) > MAX_LIMIT_TEXT:
            raise InvalidArgument(
                f"{where}: limit {key[:32]!r} is over {MAX_LIMIT_TEXT} characters long"
            )
    return sub


def merge_limits(
    current: Sequence[tuple[str, str]], changes: Mapping[str, str] | Sequence[tuple[str, str]]
) -> tuple[tuple[str, str], ...]:
    """A subscription's own limits with ``changes`` made (a value "": back to the table's),
    in OWN_LIMITS' order (a name not among them last, for the check to name it). A burst
    goes with the rate it was set with: a new rate without a burst has the default one."""
    out = dict(current)
    changes = dict(changes)
    for rate, burst in (("rate", "rate_burst"), ("key_rate", "key_burst")):
        if rate in changes and burst not in changes:
            out.pop(burst, None)
    for key, value in changes.items():
        text = str(value).strip()
        if text:
            out[key] = text
        else:
            out.pop(key, None)
    rank = {k: i for i, k in enumerate(OWN_LIMITS)}
    return tuple(sorted(out.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0])))


def limits_text(limits: Sequence[tuple[str, str]]) -> str:
    """Own limits as the definitions table keeps them: ``rate=100/s,max_in_flight=5``."""
    return ",".join(f"{k}={v}" for k, v in limits)


def parse_limits(text: str) -> tuple[tuple[str, str], ...]:
    """The definitions table's text of own limits (limits_text) as pairs."""
    pairs = (part.partition("=") for part in (text or "").split(",") if part.strip())
    return merge_limits((), [(k.strip(), v) for k, _, v in pairs])


def parse_columns(text: str) -> tuple[str, ...]:
    """A projection as written (``id,kind,amount`` or ``id|kind``)."""
    names = [n.strip() for n in re.split(r"[,|]", text or "")]
    return tuple(n for n in names if n)


def projection(table: TableConfig, names: Sequence[str], what: str) -> tuple[Column, ...]:
    """The message columns ``names`` asks for (id first, always), or InvalidArgument."""
    if not names:
        return table.message_columns
    by_name = {c.name: c for c in table.message_columns}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise InvalidArgument(
            f"{what}: unknown column {unknown[0]!r} (message columns: {', '.join(by_name)})"
        )
    if len(set(names)) != len(names):
        raise InvalidArgument(f"{what}: a column is named twice")
    rest = [n for n in names if n != "id"]
    return (by_name["id"], *(by_name[n] for n in rest))


@dataclass(frozen=True)
class LoadedSubscription:
    """A subscription ready to serve: its definition, the config its manager serves (the
    state table's, joined to the message table) and its compiled filter."""

    sub: Subscription
    config: TableConfig
    filter: Filter | None


def load_subscription(
    table: TableConfig, sub: Subscription, state_columns: Sequence[Column] | None
) -> LoadedSubscription:
    """Build what serves ``sub`` of ``table`` or raise TableLoadError naming what is wrong."""
    where = f"subscription {sub.label}"
    if table.layout is not Layout.CURRENT:
        raise TableLoadError(f"{where}: subscriptions need the current layout (priority column)")
    if not any(c.name == FANOUT_COLUMN for c in table.columns):
        raise TableLoadError(f"{where}: table {table.name} has no {FANOUT_COLUMN} column")
    if state_columns is None:
        raise TableLoadError(f"{where}: its state table {sub.state_table} is missing")
    have = {c.name for c in state_columns}
    missing = [c for c in STATE_COLUMNS if c not in have]
    if table.ordered and not missing:
        _check_order_columns(table, sub, have, where)
    if missing:
        raise TableLoadError(
            f"{where}: state table {sub.state_table} lacks column {', '.join(missing)}"
        )
    if sub.lazy and table.ordered:
        raise TableLoadError(
            f"{where}: state_rows={LAZY} does not serve an ordered table (vt_order_key) yet; "
            f"create it with state_rows={EAGER}"
        )
    try:
        check_settings(sub)
        flt = parse_filter(sub.filter, table.columns, table.name) if sub.filter else None
        cols = projection(table, sub.columns, where)
    except InvalidArgument as exc:
        raise TableLoadError(str(exc)) from None
    flow = _own_flow(table, sub, where)
    _check_flow_columns(flow, cols, where)
    ack_wait = sub.ack_wait_s if sub.ack_wait_s is not None else table.ack_wait_s
    config = dataclasses.replace(
        table,
        name=sub.state_table,
        ack_wait_s=ack_wait,
        columns=tuple(state_columns),
        message_columns=cols,
        max_attempts=sub.max_attempts if sub.max_attempts is not None else table.max_attempts,
        dead_letter="",  # dead in place, in the state table
        default_group=True,
        fanout=False,
        holders=(),
        # a lazy one's settled state rows stay until its cursor passed their messages (a
        # message above it with no state row is read by its scan again)
        cursored=(sub.name,) if sub.lazy else (),
        source=table.name,
        subscription=sub.name,
        # an ordered table's subscription orders on its own: its state rows carry the key
        order_index=STATE_ORDER_INDEX if table.ordered else "",
        flow=flow,
    )
    return LoadedSubscription(sub, config, flt)


class _Problems(list[str]):
    def add(self, problem: str) -> None:
        self.append(problem)


def _own_flow(table: TableConfig, sub: Subscription, where: str) -> FlowControl | None:
    """The subscription's limits: its table's, with those it sets of its own in their
    place (msgtable.core.flow.own_flow), or TableLoadError naming the first wrong one."""
    problems = _Problems()
    flow = own_flow(table.flow, dict(sub.limits), table.ordered, problems)
    if problems:
        raise TableLoadError(f"{where}: {problems[0]}")
    return flow


def _check_flow_columns(flow: FlowControl | None, cols: Sequence[Column], where: str) -> None:
    """A subscription's limits (its table's, or its own: msgtable.core.flow): the columns
    they key on must be among those its projection streams (the sender reads them there)."""
    if flow is None:
        return
    names = {c.name for c in cols}
    for field, column in (("vt_limit_key", flow.key_column), ("vt_fair_key", flow.fair_key)):
        if column and column not in names:
            raise TableLoadError(
                f"{where}: its columns must include {column} (the table's {field})"
            )


def order_columns(table: TableConfig) -> tuple[Column, ...]:
    """An ordered table's key column, and its order column unless it orders by id: what a
    subscription's state table copies of each message (none for an unordered table)."""
    if not table.ordered:
        return ()
    names = [table.order_key] + ([table.order_by] if table.order_by != "id" else [])
    by_name = {c.name: c for c in table.columns}
    return tuple(by_name[n] for n in names)


def state_order_index(table: TableConfig) -> tuple[str, ...]:
    """The columns of an ordered table's state tables' order index (STATE_ORDER_INDEX): the
    table's own order index's (the primary key, id, is every index's last column anyway)."""
    cols = order_index_columns(table.order_key, table.order_by)
    return cols[:2] if table.order_by == "id" else cols


def _check_order_columns(table: TableConfig, sub: Subscription, have: set[str], where: str) -> None:
    """An ordered table's subscription needs the key (and order) column in its state table,
    which a subscription created before the table was ordered lacks: say how to add it."""
    cols = order_columns(table)
    lacking = [c for c in cols if c.name not in have]
    if not lacking:
        return
    adds = ", ".join(f"ADD COLUMN {c.name} {c.column_type} NULL" for c in lacking)
    index = ", ".join(state_order_index(table))
    raise TableLoadError(
        f"{where}: table {table.name} is ordered by {table.order_key}, and state table "
        f"{sub.state_table} lacks column {', '.join(c.name for c in lacking)} (created before "
        f"the table was ordered): ALTER TABLE {sub.state_table} {adds}, "
        f"ADD INDEX {STATE_ORDER_INDEX} ({index})"
    )


def holding(sub: Subscription, lag: int | None) -> tuple[bool, str]:
    """Whether a subscription holds its table's purge, and if not, why."""
    if sub.state is SubscriptionState.EXPIRED:
        return False, "expired"
    if sub.max_lag is not None and lag is not None and lag > sub.max_lag:
        return False, f"lag {lag:,} over max_lag {sub.max_lag:,}"
    return True, ""


def filter_index_advice(table: TableConfig, flt: Filter, indexes: Sequence[Sequence[str]]) -> str:
    """What a lazy subscription's filter lacks to read its matches alone, in one line (""
    when nothing): an index of ``table`` (``indexes``: each one's columns in order) that
    begins with columns the filter compares with ``=`` or ``IN`` in a top-level AND term,
    then time_fanout. Without one its cursor's scan reads, through fanout_idx, every message
    above the cursor to find those the filter passes."""
    equal = {c.casefold() for c in flt.equality_columns}
    for columns in indexes:
        lead = 0
        while lead < len(columns) and columns[lead].casefold() in equal:
            lead += 1
        if lead and lead < len(columns) and columns[lead].casefold() == FANOUT_COLUMN:
            return ""
    reads = "its filter reads every message above its cursor to find its matches"
    types = {c.name: c.data_type for c in table.columns}
    keyable = [c for c in flt.equality_columns if types.get(c, "") not in UNKEYABLE_TYPES]
    if not keyable:
        if flt.equality_columns:
            why = "its AND terms compare with = or IN only text, blob or json columns, which no "
            why += "index holds whole"
        else:
            why = "no AND term of it compares a column with = or IN for an index (that column, "
            why += f"{FANOUT_COLUMN}) to find them by"
        return f"{reads}: {why}; or create it with state_rows={EAGER}"
    col = keyable[0]
    add = f"ADD INDEX {quote(col[:52] + '_fanout_idx')} ({quote(col)}, {FANOUT_COLUMN})"
    return f"{reads}: ALTER TABLE {quote(table.name)} {add}"
