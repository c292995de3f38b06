"""Flow control, the pure part: a table's limits (its comment's vt_rate, vt_key_rate,
vt_max_in_flight, vt_key_concurrency, vt_fair_key), checked at load, and the token bucket
that a rate is.

A limit holds messages back at the sender (msgtable.engine.flow); it never changes a row:
a held-back message is not an attempt (its epoch is not counted) and keeps its place in the
queue (its priority and time_next). Every limit is of the **group** (the table's default
group, or a subscription, which has the table's limits unless it sets its own), across all
its subscribers:

* **vt_rate=N** (``N``, ``N/s``, ``N/m`` or ``N/h``): at most N messages a second (minute,
  hour) handed to the group's subscribers, with bursts of at most **vt_rate_burst** (default:
  a tenth of a second's worth, at least 1): in any interval of T seconds at most
  ``burst + N * T`` are sent (a token bucket; :func:`rate_violations` checks a record of
  sends against it);
* **vt_key_rate=N** (with **vt_key_burst**): the same per value of the **vt_limit_key**
  column;
* **vt_max_in_flight=N**: at most N messages in flight at once (sent, and neither settled nor
  past their ack wait);
* **vt_key_concurrency=N**: at most N in flight per value of vt_limit_key. With vt_order_key
  only 1 is allowed (ordering is one batch of a key at a time already);
* **vt_fair_key=col**: the sender serves the values of ``col`` (tenants) in turn, so a
  tenant's backlog does not delay the others', and takes whatever the others leave
  (work-conserving). Priority orders within a tenant.

A NULL vt_limit_key is no key (not limited per key); a NULL vt_fair_key is one tenant.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

FLOW_KEYS = (
    "vt_rate",
    "vt_rate_burst",
    "vt_key_rate",
    "vt_key_burst",
    "vt_limit_key",
    "vt_max_in_flight",
    "vt_key_concurrency",
    "vt_fair_key",
)
MAX_RATE_PER_S = 1_000_000.0  # a higher rate is no limit at all on one sender
MAX_BURST = 1_000_000
MAX_CAP = 10_000_000
# A burst by default: this long at the rate (at least one message)
DEFAULT_BURST_S = 0.1
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
# Why a send held messages back (ListTables' throttled_* counts, the metric's ``reason``):
# vt_rate, vt_max_in_flight, vt_key_rate, vt_key_concurrency
REASONS = ("rate", "in_flight", "key_rate", "key_cap")


class Found(Protocol):
    """Where the problems of a table's definition go (msgtable.core.tables.Problems)."""

    def add(self, problem: str) -> None: ...


@dataclass(frozen=True)
class FlowControl:
    """A group's limits (see the module docstring); 0 or "": that limit is off."""

    rate_per_s: float = 0.0
    burst: int = 0
    key_column: str = ""  # vt_limit_key (or, on an ordered table, vt_order_key)
    key_rate_per_s: float = 0.0
    key_burst: int = 0
    max_in_flight: int = 0
    key_concurrency: int = 0
    fair_key: str = ""
    # an index that begins (time_acked, fair key): a poll skipping the keys at their share
    # reads the others' rows by it, not through the skipped keys' backlog ("": none)
    fair_index: str = ""

    @property
    def per_key(self) -> bool:
        """Whether a limit holds per value of the key column."""
        return bool(self.key_column) and bool(self.key_rate_per_s or self.key_concurrency)

    @property
    def capped(self) -> bool:
        """Whether a cap counts what is in flight (the group's, or per key)."""
        return bool(self.max_in_flight or self.key_concurrency)

    @property
    def keyed_column(self) -> str:
        """The column the due rows are kept by, per value (msgtable.engine.flow.KeyedDue):
        the fairness key, else the key column of the limits per key; "" for neither."""
        return self.fair_key or (self.key_column if self.per_key else "")

    def describe(self) -> str:
        """The limits as a user wrote them, for ``msgtable tables``."""
        out = []
        if self.rate_per_s:
            out.append(f"rate {self.rate_per_s:g}/s (burst {self.burst})")
        if self.max_in_flight:
            out.append(f"max in flight {self.max_in_flight}")
        if self.key_rate_per_s:
            out.append(
                f"{self.key_column}: rate {self.key_rate_per_s:g}/s (burst {self.key_burst})"
            )
        if self.key_concurrency:
            out.append(f"{self.key_column}: at most {self.key_concurrency} in flight")
        if self.fair_key:
            out.append(f"fair share by {self.fair_key}")
        return ", ".join(out)


def parse_flow(
    fields: Mapping[str, str],
    columns: Sequence[str],
    engine_columns: Sequence[str],
    message_columns: Sequence[str],
    order_key: str,
    problems: Found,
    indexes: Iterable[tuple[str, Sequence[str]]] = (),
) -> FlowControl | None:
    """The limits of a comment's fields (None: it sets none), or the problems noted.
    ``columns``: the table's; ``message_columns``: those its sender sees of each row;
    ``order_key``: vt_order_key ("": an unordered table); ``indexes``: the table's, by name
    with their columns (a fair table's index: :func:`fair_index_columns`)."""
    if not any(k in fields for k in FLOW_KEYS):
        return None
    rate = _rate(fields, "vt_rate", problems)
    burst = _burst(fields, "vt_rate_burst", "vt_rate", rate, problems)
    key_rate = _rate(fields, "vt_key_rate", problems)
    key_burst = _burst(fields, "vt_key_burst", "vt_key_rate", key_rate, problems)
    max_in_flight = _whole(fields, "vt_max_in_flight", problems)
    key_concurrency = _whole(fields, "vt_key_concurrency", problems)
    column = _column(fields, "vt_limit_key", columns, engine_columns, message_columns, problems)
    fair = _column(fields, "vt_fair_key", columns, engine_columns, message_columns, problems)
    per_key = [k for k in ("vt_key_rate", "vt_key_concurrency") if k in fields]
    if order_key:
        if key_concurrency > 1:
            problems.add(
                f"vt_key_concurrency={key_concurrency} with vt_order_key: an ordered table "
                "sends one batch of a key at a time (vt_key_concurrency=1); drop vt_order_key "
                "for a cap without order"
            )
        for key in ("vt_key_rate", "vt_limit_key", "vt_fair_key"):
            if key in fields:
                problems.add(f"{key} needs an unordered table (not with vt_order_key)")
        # vt_key_concurrency=1 with order is the ordering itself: nothing more to count
        return FlowControl(rate_per_s=rate, burst=burst, max_in_flight=max_in_flight)
    if per_key and "vt_limit_key" not in fields:
        problems.add(f"{per_key[0]} needs vt_limit_key (the column whose values are the keys)")
    if "vt_limit_key" in fields and not per_key:
        problems.add("vt_limit_key needs vt_key_rate or vt_key_concurrency")
    return FlowControl(
        rate_per_s=rate,
        burst=burst,
        key_column=column,
        key_rate_per_s=key_rate,
        key_burst=key_burst,
        max_in_flight=max_in_flight,
        key_concurrency=key_concurrency,
        fair_key=fair,
        fair_index=_fair_index(fair, indexes),
    )


# A subscription's own limits (msgtable.core.subscriptions), by name: each the comment's
# vt_<name>, for its group only, in place of its table's
OWN_LIMITS = ("rate", "rate_burst", "max_in_flight", "key_rate", "key_burst", "key_concurrency")
OFF = "off"  # a subscription's value that turns its table's limit off for it


def own_flow(
    base: FlowControl | None, own: Mapping[str, str], ordered: bool, problems: Found
) -> FlowControl | None:
    """A subscription's limits: its table's (``base``), each limit it sets in ``own`` (by
    OWN_LIMITS' names, values as the comment's; "off": none for it) in place of the table's.
    A rate it sets comes with its own burst (the field, or the default), never the table's.
    The per-key limits count on the table's vt_limit_key (the subscription has no other)."""
    if not own:
        return base
    for key in own:
        if key not in OWN_LIMITS:
            problems.add(f"unknown limit {key!r} (one of {', '.join(OWN_LIMITS)})")
    b = base or FlowControl()
    rate, burst = _own_rate(own, "rate", "rate_burst", (b.rate_per_s, b.burst), problems)
    key_rate, key_burst = _own_rate(
        own, "key_rate", "key_burst", (b.key_rate_per_s, b.key_burst), problems
    )
    keyed = [k for k in ("key_rate", "key_concurrency") if own.get(k, OFF).strip().lower() != OFF]
    if keyed and ordered:
        problems.add(f"{keyed[0]} needs an unordered table (not with vt_order_key)")
    elif keyed and not b.key_column:
        problems.add(f"{keyed[0]} needs the table's vt_limit_key (the column of the keys)")
    flow = dataclasses.replace(
        b,
        rate_per_s=rate,
        burst=burst,
        key_rate_per_s=key_rate,
        key_burst=key_burst,
        max_in_flight=_own_whole(own, "max_in_flight", b.max_in_flight, problems),
        key_concurrency=_own_whole(own, "key_concurrency", b.key_concurrency, problems),
    )
    if not (flow.rate_per_s or flow.max_in_flight or flow.per_key or flow.fair_key):
        return None  # every limit off: the sender pays nothing
    return flow


def _own_rate(
    own: Mapping[str, str], key: str, burst_key: str, table: tuple[float, int], problems: Found
) -> tuple[float, int]:
    """A subscription's rate and burst (``table``: its table's)."""
    rate, burst = table
    raw = own.get(key)
    if raw is not None and raw.strip().lower() == OFF:
        rate, burst = 0.0, 0
    elif raw is not None:
        rate = _rate(own, key, problems)
        burst = max(1, math.ceil(rate * DEFAULT_BURST_S)) if rate else 0
    if burst_key in own:
        if not rate:
            problems.add(f"{burst_key} needs {key} (the subscription's or the table's)")
            return rate, 0
        burst = _whole(own, burst_key, problems, MAX_BURST)
    return rate, burst


def _own_whole(own: Mapping[str, str], key: str, base: int, problems: Found) -> int:
    raw = own.get(key)
    if raw is None:
        return base
    return 0 if raw.strip().lower() == OFF else _whole(own, key, problems)


def fair_index_columns(fair_key: str) -> tuple[str, ...]:
    """The columns a fair table's index begins with: time_acked (unsettled rows first), the
    fairness key, then the poll's order (priority, time_next)."""
    return ("time_acked", fair_key, "priority", "time_next")


def fair_index_hint(table: str, flow: FlowControl | None) -> str:
    """One line for a fair table without its index (logged at load), "" otherwise."""
    if flow is None or not flow.fair_key or flow.fair_index:
        return ""
    cols = ", ".join(fair_index_columns(flow.fair_key))
    return (
        f"vt_fair_key={flow.fair_key} without an index on (time_acked, {flow.fair_key}, ...): "
        "a poll past a noisy key's backlog reads through it row by row; add one: "
        f"ALTER TABLE {table} ADD INDEX fair_idx ({cols})"
    )


def _fair_index(fair: str, indexes: Iterable[tuple[str, Sequence[str]]]) -> str:
    """The name of the table's index that begins (time_acked, fair key), "" for none."""
    if not fair:
        return ""
    want = fair_index_columns(fair)[:2]
    return next((name for name, cols in indexes if tuple(cols[:2]) == want), "")


def _rate(fields: Mapping[str, str], key: str, problems: Found) -> float:
    """``N``, ``N/s``, ``N/m`` or ``N/h``, as messages a second (0: absent or wrong)."""
    raw = fields.get(key)
    if raw is None:
        return 0.0
    number, _, unit = raw.partition("/")
    per = _UNITS.get(unit.strip().lower() or "s")
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    if per is None or not math.isfinite(value):
        problems.add(f"{key}={raw!r} is not a rate (N, N/s, N/m or N/h)")
        return 0.0
    rate = value / per
    if not 0 < rate <= MAX_RATE_PER_S:
        problems.add(f"{key}={raw} must be above 0 and at most {MAX_RATE_PER_S:,.0f}/s")
        return 0.0
    return rate


def _burst(fields: Mapping[str, str], key: str, rate_key: str, rate: float, problems: Found) -> int:
    """A rate's burst: the field, or a tenth of a second of the rate (at least 1)."""
    if key not in fields:
        return max(1, math.ceil(rate * DEFAULT_BURST_S)) if rate else 0
    if rate_key not in fields:
        problems.add(f"{key} needs {rate_key}")
        return 0
    return _whole(fields, key, problems, MAX_BURST)


def _whole(fields: Mapping[str, str], key: str, problems: Found, most: int = MAX_CAP) -> int:
    raw = fields.get(key)
    if raw is None:
        return 0
    try:
        value = int(raw)
    except ValueError:
        problems.add(f"{key}={raw!r} is not a whole number")
        return 0
    if not 1 <= value <= most:
        problems.add(f"{key}={raw} must be between 1 and {most:,}")
        return 0
    return value


def _column(
    fields: Mapping[str, str],
    key: str,
    columns: Sequence[str],
    engine_columns: Sequence[str],
    message_columns: Sequence[str],
    problems: Found,
) -> str:
    raw = fields.get(key)
    if raw is None:
        return ""
    name = raw.strip()
    if not name:
        problems.add(f"{key} must name a column")
    elif name not in columns:
        problems.add(f"{key} names unknown column {name!r}")
    elif name in engine_columns or name == "id":
        problems.add(f"{key}={name} is an engine column (or id): name an application column")
    elif name not in message_columns:
        problems.add(f"{key}={name} must be one of the message columns (vt_message_cols)")
    else:
        return name
    return ""


class TokenBucket:
    """A rate of ``rate_per_s`` with bursts of ``burst``: ``burst`` tokens at most, one a
    message, refilled continuously. Starts empty at ``start_ns`` (a new sender knows nothing
    of what the one before it sent: starting empty, the two together stay within one
    bucket's bound). Time is passed in.

    Messages are spent at the instant they go (:meth:`spend`), which may be a little after
    the sender asked what is :meth:`available` (the send's check runs in between): asking
    changes nothing, so what goes at each instant is what a bucket spent at those instants
    allows, whatever the check took."""

    __slots__ = ("burst", "rate_per_ns", "tokens", "updated_ns")

    def __init__(self, rate_per_s: float, burst: int, start_ns: int, tokens: float = 0.0) -> None:
        self.rate_per_ns = rate_per_s / 1e9
        self.burst = burst
        self.tokens = tokens
        self.updated_ns = start_ns

    def _at(self, now_ns: int) -> float:
        if now_ns <= self.updated_ns:
            return self.tokens
        return min(float(self.burst), self.tokens + (now_ns - self.updated_ns) * self.rate_per_ns)

    def available(self, now_ns: int) -> int:
        """Whole tokens at ``now_ns`` (nothing spent)."""
        return int(self._at(now_ns) + 1e-9)

    def spend(self, n: int, at_ns: int) -> None:
        """``n`` messages went at ``at_ns`` (no more than were available then)."""
        self.tokens = self._at(at_ns) - n
        self.updated_ns = max(self.updated_ns, at_ns)

    def full_at_ns(self) -> int:
        """When the bucket is full again (a full bucket is as good as a new one)."""
        if self.rate_per_ns <= 0:
            return self.updated_ns
        return self.updated_ns + math.ceil((self.burst - self.tokens) / self.rate_per_ns)

    def next_ns(self, wanted: float = 1.0) -> int:
        """When ``wanted`` tokens are there (at the last spend, if they were already)."""
        if self.tokens >= wanted - 1e-9 or self.rate_per_ns <= 0:
            return self.updated_ns
        return self.updated_ns + math.ceil((wanted - self.tokens) / self.rate_per_ns)


def rate_violations(
    sent_ns: Sequence[int], rate_per_s: float, burst: int, slack: int = 0
) -> list[tuple[int, int, int]]:
    """The intervals a record of sends (their times, in order) overshoots a rate in: each
    (first, last, count) whose count is over ``burst + slack + rate * (last - first)``, one
    per last send, the worst. Empty: the rate held in every interval."""
    out = []
    per_ns = rate_per_s / 1e9
    best_i, best = 0, math.inf  # the i <= j with the least (i - rate * t_i)
    for j, t in enumerate(sent_ns):
        v = j - per_ns * t
        if v < best:
            best, best_i = v, j
        count = j - best_i + 1
        if count > burst + slack + per_ns * (t - sent_ns[best_i]) + 1e-6:
            out.append((sent_ns[best_i], t, count))
    return out
