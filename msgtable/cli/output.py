"""What the ``msgtable`` command prints: the table of message tables and their
subscriptions (narrow, wide or JSON), the list of subscriptions (text or JSON), dead letters,
and a message as tail shows it (text or JSON)."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from msgtable.client import Field, Message, TableInfo
from msgtable.core.codec import TableSettings
from msgtable.core.deadletters import DeadLetter
from msgtable.core.schedules import Schedule
from msgtable.limits import COUNT_DEAD_CAP, LAG_CAP


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _aligned(rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    """Rows as lines of left-aligned columns, two spaces apart (the last one not padded)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    ]


TABLES_HEADER = (
    "TABLE",
    "KEYSPACE",
    "STATUS",
    "BATCH",
    "CACHE",
    "ACK WAIT",
    "CACHED",
    "IN FLIGHT",
    "SUBSCRIBERS",
    "SENT",
    "ACKED",
    "RELEASED",
    "REJECTED",
    "RENEWED",
    "DIED",
    "DEAD",
    "MAX ATTEMPTS",
)


# The default view: what most looks answer (is it loaded, is anyone reading, is it moving,
# is anything dead), narrow enough for an 80-column terminal; --wide shows TABLES_HEADER.
NARROW_HEADER = ("TABLE", "KEYSPACE", "STATUS", "SUBSCRIBERS", "IN FLIGHT", "SENT", "ACKED", "DEAD")


def format_tables(
    tables: Sequence[TableInfo], now_ns: int | None = None, *, wide: bool = False
) -> str:
    """A readable table of every message table; below it, the subscriptions under their
    tables (when there are any), where dead letters go, and load errors in full. Without
    ``wide``, the table has the columns of NARROW_HEADER (KEYSPACE only when the tables are
    in more than one keyspace or shard); with it, every column (TABLES_HEADER)."""
    subs = [t for t in tables if t.subscription]
    tables = [t for t in tables if not t.subscription]
    if not tables and not subs:
        return "no message tables"
    rows = [TABLES_HEADER, *(_table_row(t) for t in tables)]
    if not wide:
        several = len({r[1] for r in rows[1:]}) > 1
        keep = [TABLES_HEADER.index(h) for h in NARROW_HEADER if h != "KEYSPACE" or several]
        rows = [rows[0], *(_narrow(t) for t in tables)]
        rows = [tuple(r[i] for i in keep) for r in rows]
    lines = _aligned(rows) if tables else ["no message tables"]
    if subs:
        lines.append("")
        lines.append("subscriptions:")
        lines.extend(_subscriptions_by_table(tables, subs, now_ns))
    for title, body in _notes(tables, subs):
        if body:
            lines.append("")
            lines.append(title)
            lines.extend(body)
    return "\n".join(lines)


def format_sqs(listen: str, calls: Mapping[str, int]) -> str:
    """The SQS API's line under the tables: where it listens, its calls by action (at a
    gateway, which serves none: the shards' servers' calls)."""
    shown = ", ".join(f"{action} {n}" for action, n in sorted(calls.items())) or "none yet"
    where = f"http://{listen}" if listen else "at the shards' servers"
    return f"sqs: {where} (calls: {shown})"


def _table_row(t: TableInfo) -> tuple[str, ...]:
    c = t.config
    return (
        t.name,
        f"{t.keyspace}/{t.shard}" if t.shard else t.keyspace,
        "loaded" if c is not None else "error",
        str(c.batch_size) if c else "-",
        str(c.cache_size) if c else "-",
        _seconds(c.ack_wait_s) if c else "-",
        str(t.cached),
        str(t.in_flight),
        str(t.subscribers),
        str(t.sent),
        str(t.acked),
        str(t.released),
        str(t.rejected),
        str(t.renewed),
        str(t.dead_lettered),
        _dead(t.dead),
        _max_attempts(c),
    )


def _narrow(t: TableInfo) -> tuple[str, ...]:
    """A table's row with its counters compact (12345, 123k, 9.9M): as wide as a few digits."""
    return tuple(
        _compact(cell) if name in _COUNTERS else cell
        for name, cell in zip(TABLES_HEADER, _table_row(t), strict=True)
    )


_COUNTERS = frozenset({"CACHED", "IN FLIGHT", "SUBSCRIBERS", "SENT", "ACKED", "DEAD"})


def _compact(cell: str) -> str:
    """A count of 100,000 or more in thousands, millions, billions ("100k", "9.9G"); "+"
    kept."""
    digits, plus = cell.removesuffix("+"), "+" if cell.endswith("+") else ""
    if not digits.isdigit() or int(digits) < 100_000:
        return cell
    n = int(digits)
    for unit, size in (("G", 10**9), ("M", 10**6)):
        if n >= size:
            return _short(n / size) + unit + plus
    return _short(n / 1000) + "k" + plus


def _notes(tables: list[TableInfo], subs: list[TableInfo]) -> list[tuple[str, list[str]]]:
    """The sections below the tables and subscriptions, each a title and its lines (none:
    the section is left out)."""
    both = (*tables, *subs)
    by_name = sorted(both, key=lambda t: (t.name, t.subscription))
    # a server that shares its database names each table's sender ("this server" when it
    # shares it with none; "" everywhere from a server of an earlier version)
    shared = [t for t in tables if t.sender != "this server" and t.config is not None]
    senders = [
        f"  {t.name}{f' (shard {t.shard})' if t.shard else ''}: {t.sender or 'no server now'}"
        for t in shared
    ]
    return [
        ("backlog (read from the database):", [_backlog(t) for t in by_name if t.due is not None]),
        (
            "sent by (the servers of the database share its tables):",
            senders if any(t.sender for t in shared) else [],
        ),
        (
            "held after a takeover (the old lease holder's last sends may be in flight):",
            [_held(t) for t in by_name if t.hold_s > 0],
        ),
        (
            "ordered per key:",
            [_ordered(t) for t in tables if t.config is not None and t.config.order_key],
        ),
        (
            "deduplicated by (vt_dedup):",
            [_deduplicated(t) for t in tables if t.config is not None and t.config.dedup],
        ),
        (
            "flow control (held back: the sends a limit held messages back in):",
            [_limited(t) for t in by_name if t.limits],
        ),
        (
            "table events:",
            [_capturing(t) for t in tables if t.config is not None and t.config.capture],
        ),
        ("pushed to:", [_pushed(t) for t in both if t.push is not None]),
        (
            "schedules (msgtable schedule list):",
            [_scheduled(s) for t in tables for s in t.schedules],
        ),
        (
            "dead letters go to:",
            [
                f"  {t.name} -> {t.config.dead_letter}"
                for t in tables
                if t.config is not None and t.config.dead_letter
            ],
        ),
        ("advice:", [_advice(s) for s in subs if s.advice]),
        ("load errors:", [_load_error(t) for t in both if t.load_error]),
    ]


def _advice(s: TableInfo) -> str:
    """What the server advises for a subscription (a lazy one's filter that reads every
    message above its cursor: the index that would find its matches)."""
    return f"  {s.name}/{s.subscription}: {s.advice}"


def _backlog(t: TableInfo) -> str:
    label = f"{t.name}/{t.subscription}" if t.subscription else t.name
    oldest = (
        "" if t.oldest_unacked_age_s is None else f", oldest unacked {age(t.oldest_unacked_age_s)}"
    )
    return f"  {label}: {t.due:,} due, {t.scheduled or 0:,} scheduled{oldest}"


def _held(t: TableInfo) -> str:
    label = f"{t.name}/{t.subscription}" if t.subscription else t.name
    what = (
        "every send of the table"
        if t.hold_whole
        else "only messages due before the old lease ended, the rest flow"
    )
    return f"  {label}: {age(t.hold_s)} more; {what}"


def _ordered(t: TableInfo) -> str:
    c = t.config
    assert c is not None
    return (
        f"  {t.name}: by {c.order_key} in {c.order_by} order; keys in flight "
        f"{t.keys_in_flight}, keys waiting {t.keys_waiting}"
    )


def _deduplicated(t: TableInfo) -> str:
    c = t.config
    assert c is not None
    return f"  {t.name}: key {c.dedup}, window {_seconds(c.dedup_window_s)}"


def _limited(t: TableInfo) -> str:
    label = f"{t.name}/{t.subscription}" if t.subscription else t.name
    held = ", ".join(f"{why} {n:,}" for why, n in sorted(t.throttled.items()) if n)
    cap = f"; {t.keys_at_cap:,} keys at their cap now" if t.keys_at_cap else ""
    return f"  {label}: {t.limits}; held back: {held or 'never'}{cap}"


def _capturing(t: TableInfo) -> str:
    c = t.config
    assert c is not None
    kinds = "all kinds" if len(c.capture_kinds) == 8 else "|".join(c.capture_kinds)
    where = (
        f"at {t.capture_position}, lag {t.capture_lag_s:.1f}s, {t.capture_events} written"
        if t.capture_position and t.capture_lag_s is not None
        else t.capture_problem or "not followed yet"
    )
    return f"  {t.name} <- {'|'.join(c.capture)} ({kinds}); {where}"


def _load_error(t: TableInfo) -> str:
    """A load error under its table's name, or its subscription's (once)."""
    label = f"{t.name}/{t.subscription}" if t.subscription else t.name
    if t.subscription and label in t.load_error:
        return f"  {t.load_error}"
    return f"  {label}: {t.load_error}"


def _subscriptions_by_table(
    tables: Sequence[TableInfo], subs: Sequence[TableInfo], now_ns: int | None
) -> list[str]:
    """Each table that has subscriptions (with its rows not handed to them yet), and its
    subscriptions indented under it."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    unseen = {t.name: t.unseen for t in tables}
    rows: list[tuple[str, ...]] = [
        ("TABLE", "UNSEEN", "STATE", "SUBSCRIBERS", "LAG", "OLDEST", "HOLDING", "FILTER")
    ]
    for name in dict.fromkeys(s.name for s in subs):  # in the server's order
        seen = unseen.get(name)
        rows.append((name, "-" if seen is None else str(seen), "", "", "", "", "", ""))
        for s in subs:
            if s.name == name:
                rows.append(("  " + s.subscription, "", *_subscription_cells(s, now_ns)))
    return _aligned(rows, indent="  ")


def _subscription_cells(s: TableInfo, now_ns: int) -> tuple[str, ...]:
    """State, subscribers, lag, oldest age, holding and filter of a subscription's entry (a
    lazy one's state says so, its lag how much of it is above its cursor)."""
    if s.load_error:
        return ("error", "-", "-", "-", "-", s.filter or "-")
    oldest = None if s.oldest_ns is None else max(0, now_ns - s.oldest_ns) / 1e9
    lazy = s.state_rows == "lazy"  # its mode, and how much of its lag is above its cursor
    return (
        (s.state or "-") + (" (lazy)" if lazy else ""),
        str(s.subscribers),
        _lag(s.lag) + (f" (cursor {_lag(s.cursor_lag)})" if lazy else ""),
        age(oldest),
        "yes" if s.holding else f"no: {s.not_holding or 'unknown'}",
        s.filter or "-",
    )


def _lag(lag: int | None) -> str:
    if lag is None:
        return "-"
    return f"{lag}+" if lag >= LAG_CAP else str(lag)


def age(seconds: float | None) -> str:
    """A duration as people read it: "0.4s", "42s", "5m", "2.5h", "3d" ("-" for none)."""
    if seconds is None:
        return "-"
    for unit, size, next_size in (("s", 1, 60), ("m", 60, 60), ("h", 3600, 24)):
        text = _short(seconds / size)
        if float(text) < next_size:  # 59.96 s is "1m", not "60s"
            return text + unit
    return _short(seconds / 86400) + "d"


def _short(value: float) -> str:
    """One decimal below 10, whole numbers from there: 3.2, 5, 42."""
    if value < 9.95:
        return f"{value:.1f}".removesuffix(".0")
    return f"{value:.0f}"


def format_subscriptions(
    subs: Sequence[TableInfo], table: str = "", now_ns: int | None = None
) -> str:
    """The subscriptions as ``msgtable subscription list`` prints them; load errors in full
    below."""
    if not subs:
        return f"no subscriptions of {table}" if table else "no subscriptions"
    now_ns = time.time_ns() if now_ns is None else now_ns
    rows: list[tuple[str, ...]] = [
        ("TABLE", "SUBSCRIPTION", "STATE", "SUBSCRIBERS", "LAG", "OLDEST", "HOLDING", "FILTER")
    ]
    rows.extend((s.name, s.subscription, *_subscription_cells(s, now_ns)) for s in subs)
    lines = _aligned(rows)
    advised = [s for s in subs if s.advice]
    if advised:
        lines.append("")
        lines.append("advice:")
        lines.extend(_advice(s) for s in advised)
    failed = [s for s in subs if s.load_error]
    if failed:
        lines.append("")
        lines.append("load errors:")
        lines.extend(_load_error(s) for s in failed)
    return "\n".join(lines)


def _scheduled(s: Schedule) -> str:
    """A schedule's line under ``msgtable tables``: its last and next tick, in UTC."""

    def when(ns: int | None) -> str:
        if not ns:
            return "none yet"
        at = datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC)
        return at.strftime("%Y-%m-%dT%H:%M:%SZ")

    return (
        f"  {s.table} <- {s.name} ({s.cron!r} in {s.timezone}): last tick "
        f"{when(s.last_tick_ns)}, next {when(s.next_tick_ns)}, {s.ticks:,} enqueued"
    )


def _pushed(t: TableInfo) -> str:
    p = t.push
    assert p is not None
    group = f"{t.name}/{t.subscription}" if t.subscription else t.name
    return (
        f"  {group} -> {p.url}: {p.state}; in flight {p.in_flight}/{p.max_in_flight}, "
        f"pushed {p.pushed:,}, failed {p.failed:,}"
    )


def format_endpoints(tables: Sequence[TableInfo]) -> str:
    """The push endpoints as ``msgtable endpoint list`` prints them (never a secret)."""
    pushed = [t for t in tables if t.push is not None]
    if not pushed:
        return "no push endpoints"
    rows: list[tuple[str, ...]] = [
        ("TABLE", "SUBSCRIPTION", "URL", "IN FLIGHT", "PUSHED", "FAILED", "STATE")
    ]
    for t in pushed:
        p = t.push
        assert p is not None
        rows.append(
            (
                t.name,
                t.subscription or "-",
                p.url,
                f"{p.in_flight}/{p.max_in_flight}",
                f"{p.pushed:,}",
                f"{p.failed:,}",
                p.state,
            )
        )
    return "\n".join(_aligned(rows))


def subscription_json(s: TableInfo, now_ns: int | None = None) -> str:
    """One subscription as a JSON line: what the list shows, in numbers, and its settings
    where the server reports them (its ack wait, max attempts and columns)."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    c = s.config
    out: dict[str, Any] = {
        "table": s.name,
        "keyspace": s.keyspace,
        "subscription": s.subscription,
        "state": "error" if s.load_error else s.state,
        "subscribers": s.subscribers,
        "lag": s.lag,
        "oldest_ns": s.oldest_ns,
        "oldest_age_s": None
        if s.oldest_ns is None
        else round(max(0, now_ns - s.oldest_ns) / 1e9, 3),
        "holding": s.holding,
        "not_holding": s.not_holding,
        "filter": s.filter,
        "columns": [f.name for f in c.message_columns] if c else None,
        "ack_wait_s": c.ack_wait_s if c else None,
        "max_attempts": c.max_attempts if c else None,
        "in_flight": s.in_flight,
        "sent": s.sent,
        "acked": s.acked,
        "dead": s.dead,
        "due": s.due,
        "scheduled": s.scheduled,
        "oldest_unacked_age_s": s.oldest_unacked_age_s,
        "hold_s": s.hold_s,
        "hold_whole": s.hold_whole,
        "sender": s.sender,
        "limits": s.limits,  # its flow control: its table's, or its own (msgtable.core.flow)
        "state_rows": s.state_rows,  # eager or lazy (msgtable.core.subscriptions)
        "cursor_lag": s.cursor_lag,  # a lazy one's: above its cursor, never sent
        "advice": s.advice,  # a lazy one's filter: the index it lacks ("": none)
        "load_error": s.load_error,
    }
    return json.dumps(out, ensure_ascii=False)


def table_json(t: TableInfo) -> str:
    """One entry of ListTables (a table, or a subscription's: ``subscription`` says) as a
    JSON line: every field, its config's too (None when it failed to load); column types by
    name."""
    out = dataclasses.asdict(t)
    if t.config is not None:
        out["config"]["message_columns"] = [
            {"name": f.name, "type": f.type.name.lower(), "column_type": f.column_type}
            for f in t.config.message_columns
        ]
    for s in out["schedules"]:
        s["missed"] = s["missed"].value
    return json.dumps(out, ensure_ascii=False)


def _dead(count: int | None) -> str:
    if count is None:
        return "-"
    return f"{count}+" if count >= COUNT_DEAD_CAP else str(count)


def _max_attempts(config: TableSettings | None) -> str:
    if config is None or not config.max_attempts:
        return "-"
    return str(config.max_attempts)


def format_dead(dead: Sequence[DeadLetter], total: int, table: str) -> str:
    """Dead letters as ``msgtable dead`` prints them: id, when, attempts, reason."""
    if not dead:
        return f"no dead letters in {table}"
    rows = [("ID", "DIED", "ATTEMPTS", "LAST ERROR")]
    for d in dead:
        when = (
            datetime.datetime.fromtimestamp(d.time_dead_ns / 1e9).isoformat(" ", "seconds")
            if d.time_dead_ns
            else "-"
        )
        rows.append(
            (
                _text(d.id) if not isinstance(d.id, int) else str(d.id),
                when,
                str(d.attempts),
                d.last_error or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [
        "  ".join([*(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)), r[3]]) for r in rows
    ]
    more = "+" if total >= COUNT_DEAD_CAP else ""
    plural = "" if total == 1 and not more else "s"
    lines.append(f"{len(dead)} shown of {total:,}{more} dead letter{plural} in {table}")
    return "\n".join(lines)


def _json_default(value: Any) -> str:
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return "0x" + value.hex()
    raise TypeError(f"cannot show {type(value).__name__}")


def _text(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return str(value)


def sent_time(message: Message) -> str:
    """When the server sent a message, local time to the millisecond ("-" if it did not say)."""
    if not message.sent_ns:
        return "-"
    sent = datetime.datetime.fromtimestamp(message.sent_ns / 1e9)
    return sent.isoformat(" ", timespec="milliseconds")


def format_message(
    message: Message, fields: Sequence[Field], as_json: bool = False, show_time: bool = False
) -> str:
    """One message as tail prints it: its columns; a redelivery says which attempt it is
    (``attempt 2``: the second delivery); ``show_time`` puts the send time first."""
    if as_json:
        out = dict(message.values)
        if message.attempt > 1:
            out["_attempt"] = message.attempt
        if show_time:
            out["_sent"] = sent_time(message)
        return json.dumps(out, default=_json_default, ensure_ascii=False)
    text = " ".join(f"{f.name}={_text(v)}" for f, v in zip(fields, message.row, strict=True))
    if message.attempt > 1:
        text += f" (attempt {message.attempt})"
    return f"{sent_time(message)} {text}" if show_time else text
