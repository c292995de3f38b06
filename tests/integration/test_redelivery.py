"""Redeliveries in a group that lags its producer (issue 42, item 4), on a real MySQL-family
server through the real gRPC server and client: a due redelivery (a release, an ack wait
over) goes out at its time, not after every fresh row of the backlog before it.

Judged by order and counts, not by a clock: the subscriber takes the backlog at a bounded
pace, and the redelivery must come back while most of the backlog is still unsent."""

from __future__ import annotations

import time

import pytest

from .helpers import Served, serve

BACKLOG = 3_000
CACHE = 100
BATCH = 10
PACE_PER_S = 300  # the lagging subscriber takes at most this many messages a second
# fresh messages the subscriber may take between the release and the redelivery: what it
# takes in the redelivery's delay plus a second, and a cache or two it already had; a tenth
# of the backlog's more than that, and far below the backlog (the order before the fix)
MAX_BEFORE = 600


@pytest.fixture
def served(db_dsn: str):
    with serve(db_dsn) as s:
        yield s


def fill(s: Served, table: str, n: int) -> None:
    for start in range(1, n + 1, 1000):
        ids = range(start, min(n, start + 999) + 1)
        s.sql(f"insert into {table}(id, message) values " + ",".join(f"({i}, 'm')" for i in ids))


@pytest.mark.parametrize("how", ["release", "ack wait over"])
def test_a_due_redelivery_does_not_wait_for_the_backlog_of_fresh_rows(served: Served, how: str):
    served.create_table(
        "lagging",
        vt_cache_size=CACHE,
        vt_batch_size=BATCH,
        vt_ack_wait=30 if how == "release" else 0.5,
        vt_min_backoff=0.1,
        vt_max_backoff=0.2,
        vt_poller_interval=1,
    )
    fill(served, "lagging", BACKLOG)
    sub = served.client.subscribe("lagging", max_in_flight=2 * BATCH)
    target = None  # the message released (or left unacked)
    fresh_after = 0  # fresh messages taken after it was let go, before it came back
    taken = 0
    came_back = False
    began = time.monotonic()
    try:
        for batch in sub.batches():
            for m in batch:
                if target is not None and m.id == target:
                    came_back = True
                elif target is not None:
                    fresh_after += 1
            if came_back or fresh_after > MAX_BEFORE or taken + len(batch) >= BACKLOG:
                break
            rest = list(batch)
            if target is None:
                first = rest.pop(0)
                target = first.id
                if how == "release":
                    assert sub.release([first], delay_s=0.3) == 1
            if rest:
                sub.ack(rest)
            taken += len(batch)
            pace = taken / PACE_PER_S - (time.monotonic() - began)
            if pace > 0:
                time.sleep(pace)  # the subscriber's own pace: the group lags the backlog
    finally:
        sub.close()
    assert came_back, (
        f"{how}: message {target} not sent again while {fresh_after} fresh messages of the "
        f"backlog of {BACKLOG} went out after it was let go (at most {MAX_BEFORE} expected)"
    )
