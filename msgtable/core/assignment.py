"""Which server sends which unit: the units a database's servers share (its message tables,
the table-event follower, the schedules), the rendezvous rank of a server for a unit, and the
assignment every server works out alike from the rows it read (msgtable.engine.placement
reads and writes those rows)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

# the unit of the table-event follower (msgtable.features.capture.follower): no table is named ''
CAPTURE = ""
# the unit of every schedule (msgtable.features.schedules): the name of their own table, which
# is no message table's
SCHEDULES = "msgtable_schedules"
SERVER, TABLE, CAPTURE_KIND, SCHEDULES_KIND = "server", "table", "capture", "schedules"


def kind_of(unit: str) -> str:
    if unit == CAPTURE:
        return CAPTURE_KIND
    return SCHEDULES_KIND if unit == SCHEDULES else TABLE


def rank(server: str, unit: str) -> int:
    """How much ``server`` (its id) wants ``unit``: the rendezvous hash of the two."""
    digest = hashlib.blake2b(f"{server}\0{unit}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def assign(
    units: Iterable[str], servers: Iterable[str], holders: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Which server (by id) sends each unit. Of U units over N servers each server's share is
    U // N, and U % N of them (the first to reach it) take one more: every server has U // N
    or one more. First each unit held by a live server (``holders``: unit -> server id)
    stays there while that server is below its share, in name order; then each of the
    others, in name order, goes to the server that ranks it highest among those below their
    share. The same on every server that read the same rows; a server that joins takes its
    share from the others and nothing else moves, and the units of one that leaves go to
    the others, the rest staying where they are (tests.unit.engine.test_placement)."""
    members = sorted(set(servers))
    names = sorted(set(units))
    if not members:
        return {}
    share, extra = divmod(len(names), len(members))
    load = dict.fromkeys(members, 0)
    out: dict[str, str] = {}

    def place(u: str, s: str) -> bool:
        nonlocal extra
        if load[s] < share or (load[s] == share and extra > 0):
            if load[s] == share:
                extra -= 1
            out[u] = s
            load[s] += 1
            return True
        return False

    held = holders or {}
    for u in names:
        if held.get(u) in load:
            place(u, held[u])
    for u in names:
        if u not in out:
            any(place(u, s) for s in sorted(members, key=lambda s: rank(s, u), reverse=True))
    return out


LOGGED_NAMES = 10  # a log line names this many units at most, then counts the rest


def unit_names(units: list[str]) -> str:
    """Units for a log line: "table a, table b and the table events", or "N tables: a,
    b, ... and K more"."""
    tables = sorted(u for u in units if u not in (CAPTURE, SCHEDULES))
    shown = tables[:LOGGED_NAMES]
    text = (
        (f"table {shown[0]}" if len(tables) == 1 else f"{len(tables)} tables: {', '.join(shown)}")
        if tables
        else ""
    )
    if len(tables) > LOGGED_NAMES:
        text += f" and {len(tables) - LOGGED_NAMES} more"
    for unit in (CAPTURE, SCHEDULES):
        if unit in units:
            text = f"{text} and {what(unit)}" if text else what(unit)
    return text


def what(unit: str) -> str:
    if unit in (CAPTURE, SCHEDULES):
        return "the table events" if unit == CAPTURE else "the schedules"
    return f"table {unit}"
