"""What the ``msgtable`` command prints: the table of message tables, and a message as tail
shows it (text or JSON)."""

from __future__ import annotations

import datetime
import decimal
import json
from collections.abc import Sequence
from typing import Any

from msgtable.client import Field, Message, TableInfo
from msgtable.codec import TableSettings
from msgtable.deadletters import DeadLetter
from msgtable.limits import COUNT_DEAD_CAP


def _seconds(value: float) -> str:
    return f"{value:g}s"


def format_tables(tables: Sequence[TableInfo]) -> str:
    """A readable table of every message table; load errors in full below it."""
    if not tables:
        return "no message tables"
    header = (
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
    rows = [header]
    for t in tables:
        c = t.config
        rows.append(
            (
                t.name,
                t.keyspace,
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
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    moved = [t for t in tables if t.config is not None and t.config.dead_letter]
    if moved:
        lines.append("")
        lines.append("dead letters go to:")
        lines.extend(f"  {t.name} -> {t.config.dead_letter}" for t in moved if t.config)
    failed = [t for t in tables if t.load_error]
    if failed:
        lines.append("")
        lines.append("load errors:")
        lines.extend(f"  {t.name}: {t.load_error}" for t in failed)
    return "\n".join(lines)


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
    lines.append(f"{len(dead)} shown of {total:,}{more} dead letters in {table}")
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
