"""``msgtable schedule create / list / drop``: schedules (msgtable.core.schedules) through a
server's admin rpcs, and what they print."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from typing import TextIO

from msgtable.cli.output import _aligned
from msgtable.client import Client
from msgtable.core.schedules import Schedule

EXIT_OK = 0


def _client(args: argparse.Namespace) -> Client:
    return Client(args.server, token=args.token, tls_ca=args.tls_ca, wait_for_server=False)


def create(args: argparse.Namespace, out: TextIO | None = None) -> int:
    with _client(args) as client:
        s = client.create_schedule(
            args.name,
            args.table,
            args.cron,
            values=args.values,
            timezone=args.timezone,
            missed=args.missed,
            keyspace=args.keyspace,
        )
    print(
        f"created schedule {s.name}: {s.cron!r} in {s.timezone} into table {s.table}, first "
        f"tick {_when(s.next_tick_ns, s.timezone)}",
        file=out or sys.stdout,
    )
    return EXIT_OK


def listed(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    with _client(args) as client:
        schedules = client.list_schedules(args.table, keyspace=args.keyspace)
    if args.json:
        for s in schedules:
            print(schedule_json(s), file=out)
    else:
        print(format_schedules(schedules, args.table), file=out)
    return EXIT_OK


def drop(args: argparse.Namespace, out: TextIO | None = None) -> int:
    with _client(args) as client:
        gone = client.drop_schedule(args.name, keyspace=args.keyspace)
    said = f"dropped schedule {args.name}" if gone else f"no schedule {args.name}: nothing to drop"
    print(said, file=out or sys.stdout)
    return EXIT_OK


def schedule_json(s: Schedule) -> str:
    return json.dumps(
        {
            "name": s.name,
            "table": s.table,
            "cron": s.cron,
            "timezone": s.timezone,
            "values": dict(s.values),
            "missed": s.missed.value,
            "next_tick_ns": s.next_tick_ns,
            "last_tick_ns": s.last_tick_ns,
            "last_enqueued_ns": s.last_enqueued_ns,
            "ticks": s.ticks,
        }
    )


def format_schedules(schedules: Sequence[Schedule], table: str = "") -> str:
    """The schedules as ``msgtable schedule list`` prints them (times in each one's zone)."""
    if not schedules:
        return f"no schedules of {table}" if table else "no schedules"
    rows: list[tuple[str, ...]] = [
        ("SCHEDULE", "TABLE", "CRON", "TIMEZONE", "MISSED", "LAST TICK", "NEXT TICK", "TICKS")
    ]
    rows.extend(
        (
            s.name,
            s.table,
            s.cron,
            s.timezone,
            s.missed.value,
            _when(s.last_tick_ns, s.timezone),
            _when(s.next_tick_ns, s.timezone),
            f"{s.ticks:,}",
        )
        for s in schedules
    )
    return "\n".join(_aligned(rows))


def _when(ns: int | None, tz: str) -> str:
    if not ns:
        return "-"
    import zoneinfo

    try:
        zone: datetime.tzinfo = zoneinfo.ZoneInfo(tz)
    except (ValueError, zoneinfo.ZoneInfoNotFoundError):
        zone = datetime.UTC
    at = datetime.datetime.fromtimestamp(ns / 1e9, zone)
    return at.isoformat(timespec="seconds")
