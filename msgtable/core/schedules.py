"""Schedules, the pure part: recurring messages defined in the database.

A schedule (a row of msgtable_schedules: msgtable.store.schedules) names a message table, a
cron expression in a time zone, the column values of each message, and what to do with ticks
missed while no server ran (``missed``: ``skip`` or ``once``). Its ``next_tick`` is the time
(unix ns) of the next message to enqueue.

Ticks are exactly once across all the servers of the database: the server that holds the
placement's SCHEDULES unit (msgtable.engine.placement) enqueues a due tick and moves the
schedule's next_tick past it in **one transaction**, whose UPDATE is conditional on the
next_tick it read (msgtable.features.schedules.ticker): a server killed before the commit left
nothing (the next holder enqueues the tick), one killed after it left both, and two servers
that both believed they held the unit (a hand-over) cannot both move the same next_tick. The
message's id is a hash of the schedule and the tick (:func:`tick_id`), so even a second INSERT
of one tick would meet the primary key.

What a due tick enqueues (:func:`plan`), ``now`` the ticker's clock:

* a tick at most MISSED_AFTER_S late is on time, or late because of a hand-over or a restart:
  it is enqueued, then the next one (a schedule behind by several ticks catches up one tick a
  transaction);
* a tick later than that was missed while no server ran: with ``missed=once`` one message is
  enqueued for all of them (its tick the last one due), with ``skip`` none unless the last one
  due is itself on time; either way the schedule then goes on from ``now``.

Cron expressions and time zones are croniter's (5 fields: minute hour day month weekday; a
sixth is seconds, a seventh the year; ``@hourly`` and the like), DST as it defines it: a local
time that does not exist is skipped (02:30 on the night clocks go forward comes the next day),
one that happens twice comes twice (02:30 summer time, then 02:30 winter time, an hour apart).
"""

from __future__ import annotations

import datetime
import enum
import hashlib
import json
import re
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from msgtable.errors import InvalidArgument

SCHEDULES_TABLE = "msgtable_schedules"
# A tick at most this late is enqueued whatever the schedule's ``missed`` says: more than a
# hand-over of the placement takes (its lease period) or a restart.
MISSED_AFTER_S = 120.0
MAX_CRON_LENGTH = 255
MAX_NAME_LENGTH = 64
MAX_VALUES_LENGTH = 65_535
FIELD_NAMES = ("minute", "hour", "day of month", "month", "day of week", "second", "year")
# The column a message gets its tick in (unix ns) and its schedule's name in, where its table
# has them.
TICK_COLUMN = "schedule_tick"
NAME_COLUMN = "schedule_name"
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_SECOND = datetime.timedelta(seconds=1)


class Missed(enum.Enum):
    """What becomes of the ticks missed while no server ran (see the module docstring)."""

    SKIP = "skip"
    ONCE = "once"

    @classmethod
    def parse(cls, text: str) -> Missed:
        try:
            return cls(str(text).strip().lower())
        except ValueError:
            raise InvalidArgument(f"missed must be skip or once, not {_shown(text)}") from None


@dataclass(frozen=True)
class Schedule:
    """One schedule as msgtable_schedules holds it (times in unix ns)."""

    name: str
    table: str
    cron: str
    timezone: str = "UTC"
    values: Mapping[str, Any] = field(default_factory=dict)
    missed: Missed = Missed.SKIP
    next_tick_ns: int = 0
    last_tick_ns: int | None = None  # the tick last enqueued
    last_enqueued_ns: int | None = None  # when it was (the ticker's clock)
    ticks: int = 0  # messages enqueued so far

    def after(self, when_ns: int) -> int:
        """The first tick after ``when_ns``."""
        return next_tick(self.cron, self.timezone, when_ns)


@dataclass(frozen=True)
class Tick:
    """What one due schedule does now: enqueue the tick ``enqueue`` (None: nothing) and move
    next_tick to ``next_ns``; ``skipped`` ticks were missed and left out."""

    enqueue: int | None
    next_ns: int
    skipped: bool = False


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgument(
            f"a schedule's name is 1 to {MAX_NAME_LENGTH} letters, digits, '_', '-' or '.', "
            f"not {_shown(name)}"
        )
    return name


def check_cron(expr: object) -> str:
    """``expr`` if croniter takes it and it ever comes, else InvalidArgument naming the field
    (by its position) that is wrong."""
    if not isinstance(expr, str) or not expr.strip():
        raise InvalidArgument(f"a cron expression is text, not {_shown(expr)}")
    if len(expr) > MAX_CRON_LENGTH:
        raise InvalidArgument(
            f"cron expression of {len(expr)} characters: at most {MAX_CRON_LENGTH}"
        )
    bad = next((i for i, c in enumerate(expr) if not c.isprintable() or not c.isascii()), None)
    if bad is not None:
        raise InvalidArgument(
            f"cron expression {_shown(expr)}: character {bad + 1} ({expr[bad]!r}) is not "
            "printable ASCII"
        )
    fields = expr.split()
    if not fields[0].startswith("@") and not 5 <= len(fields) <= 7:
        raise InvalidArgument(
            f"cron expression {_shown(expr)} has {len(fields)} fields: it takes 5 (minute "
            "hour day-of-month month day-of-week), 6 (and second) or 7 (and year)"
        )
    from croniter import croniter  # the server's (a client never parses cron)

    if not croniter.is_valid(expr):
        for i, f in enumerate(fields):
            alone = ["*"] * len(fields)
            alone[i] = f
            if len(fields) == 1 or not croniter.is_valid(" ".join(alone)):
                what = FIELD_NAMES[i] if len(fields) > 1 else "expression"
                raise InvalidArgument(
                    f"cron expression {_shown(expr)}: field {i + 1} ({what}) {_shown(f)} is "
                    "not valid"
                )
        raise InvalidArgument(f"cron expression {_shown(expr)} is not valid")
    try:
        next_tick(expr, "UTC", 0)
    except InvalidArgument:
        raise
    except Exception:
        raise InvalidArgument(f"cron expression {_shown(expr)} never comes") from None
    return expr


def check_timezone(tz: object) -> str:
    if not isinstance(tz, str) or not tz or len(tz) > 64:
        raise InvalidArgument(f"unknown time zone {_shown(tz)}")
    try:
        zoneinfo.ZoneInfo(tz)
    except (ValueError, zoneinfo.ZoneInfoNotFoundError, OSError):
        raise InvalidArgument(
            f"unknown time zone {_shown(tz)} (an IANA name: Europe/Paris)"
        ) from None
    return tz


def check_values(values: object) -> dict[str, Any]:
    """The column values of each message: a JSON object of column names to scalars."""
    if isinstance(values, str):
        try:
            values = json.loads(values)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(
                f"values are not JSON: {exc.msg} at character {exc.pos + 1}"
            ) from None
    if not isinstance(values, dict):
        raise InvalidArgument(f"values must be a JSON object of columns, not {_shown(values)}")
    for name, value in values.items():
        if not isinstance(value, str | int | float | bool) and value is not None:
            raise InvalidArgument(
                f"values: column {_shown(name)} must be text, a number, true/false or null, "
                f"not {_shown(value)}"
            )
    if len(json.dumps(values)) > MAX_VALUES_LENGTH:
        raise InvalidArgument(f"values are longer than {MAX_VALUES_LENGTH} characters of JSON")
    return dict(values)


def next_tick(expr: str, tz: str, after_ns: int) -> int:
    """The first time of ``expr`` in zone ``tz`` strictly after ``after_ns`` (unix ns)."""
    from croniter import croniter

    zone = zoneinfo.ZoneInfo(tz)
    start = datetime.datetime.fromtimestamp(after_ns // 1_000_000_000, zone)
    at = croniter(expr, start).get_next(datetime.datetime)
    return _ns(at)


def prev_tick(expr: str, tz: str, at_or_before_ns: int) -> int:
    """The last time of ``expr`` in zone ``tz`` at or before ``at_or_before_ns``."""
    from croniter import croniter

    zone = zoneinfo.ZoneInfo(tz)
    start = datetime.datetime.fromtimestamp(at_or_before_ns // 1_000_000_000, zone) + _SECOND
    return _ns(croniter(expr, start).get_prev(datetime.datetime))


def plan(s: Schedule, now_ns: int, missed_after_s: float = MISSED_AFTER_S) -> Tick | None:
    """What the due schedule ``s`` does now (None: it is not due): see the module docstring."""
    if s.next_tick_ns > now_ns:
        return None
    late_ns = round(missed_after_s * 1e9)
    if now_ns - s.next_tick_ns <= late_ns:
        return Tick(s.next_tick_ns, s.after(s.next_tick_ns))
    last = prev_tick(s.cron, s.timezone, now_ns)
    on_time = now_ns - last <= late_ns
    if s.missed is Missed.ONCE or on_time:
        return Tick(last, s.after(last), skipped=not on_time or last != s.next_tick_ns)
    return Tick(None, s.after(now_ns), skipped=True)


def tick_id(name: str, tick_ns: int, kind: str) -> Any:
    """The id of the message of one tick of schedule ``name``: a hash of the two, as an
    integer below 2**63 (``kind`` "integer"), 16 bytes ("binary") or hex text ("text")."""
    digest = hashlib.blake2b(f"{name}\0{tick_ns}".encode(), digest_size=16).digest()
    if kind == "integer":
        return int.from_bytes(digest[:8], "big") >> 1
    if kind == "binary":
        return digest
    return digest.hex()


def _ns(at: datetime.datetime) -> int:
    return int(at.timestamp()) * 1_000_000_000 + at.microsecond * 1000


def _shown(value: object, most: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= most else text[: most - 3] + "..."
