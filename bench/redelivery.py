"""Redeliveries behind a backlog (issue 42, item 4): the ``redelivery`` section of
``python -m bench.run``, through ``msgtable serve`` on the main server.

A table holds SIZES[mode]["backlog"] fresh rows, committed before go, and a group that lags
them: one subscriber (the Python client, in this process) takes batches at RATE messages a
second at most, and of every RELEASE_EVERY-th batch releases its first message with delay
DELAY_S (a redelivery due DELAY_S after the release) and acks the rest. A released message's
delay is its next arrival minus (the release call's start + DELAY_S): an upper bound (the
server counts the delay from its own receipt of the call). The run lasts
SIZES[mode]["seconds"]; RATE x seconds is far below the backlog, so the group lags by about the
whole backlog throughout. ``redelivery_delay_p99_ms`` is the p99 of the released messages that
came back; one that did not come back by the end counts as the time it waited (a lower bound)
and is reported (``not_back``). Target: due time + 1 s (<= 1,000 ms).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from bench import smoke
from bench.database import connect, create_table, execute, message_comment
from bench.errors import BenchError
from bench.fanout import insert_rows
from bench.processes import ServerProcess

TABLE = "redelivery_lag"
BATCH = 100
RATE = 2_000  # messages a second the lagging group takes at most
RELEASE_EVERY = 5  # one message released in this many batches
DELAY_S = 0.2
CLIENT_TIMEOUT_S = 30.0
TARGET_P99_MS = 1_000.0
SIZES = {
    "quick": {"backlog": 100_000, "seconds": 10.0},
    "full": {"backlog": 100_000, "seconds": 30.0},
    "smoke": smoke.REDELIVERY,
}


@dataclass
class RedeliveryResult:
    backlog: int = 0
    seconds: float = 0.0
    delivered: int = 0
    released: int = 0
    delays_ms: list[float] = field(default_factory=list)  # of those that came back, sorted
    not_back: int = 0  # released and not back by the end (counted at their wait so far)
    lag_left: int = 0  # fresh rows still waiting at the end

    def percentile(self, q: float) -> float | None:
        d = self.delays_ms
        return d[min(len(d) - 1, int(q * len(d)))] if d else None

    @property
    def p99_ms(self) -> float | None:
        return self.percentile(0.99)

    def as_dict(self) -> dict[str, Any]:
        def rnd(v: float | None) -> float | None:
            return None if v is None else round(v, 1)

        return {
            "backlog": self.backlog,
            "seconds": round(self.seconds, 2),
            "delivered": self.delivered,
            "released": self.released,
            "not_back": self.not_back,
            "lag_left": self.lag_left,
            "delay_s": DELAY_S,
            "rate": RATE,
            "p50_ms": rnd(self.percentile(0.5)),
            "p99_ms": rnd(self.p99_ms),
            "max_ms": rnd(self.delays_ms[-1] if self.delays_ms else None),
        }


def run(
    server: ServerProcess,
    dsn: str,
    mode: str,
    poller_interval_s: float,
    *,
    postpone_after_s: float | None,
) -> RedeliveryResult:
    """The lagging group's run (see the module docstring)."""
    from msgtable.client import Client

    sizes = SIZES[mode]
    backlog, seconds = int(sizes["backlog"]), float(sizes["seconds"])
    comment = message_comment(BATCH, poller_interval_s, postpone_after_s=postpone_after_s)
    create_table(dsn, TABLE, comment)
    out = RedeliveryResult(backlog=backlog)
    try:
        with contextlib.closing(connect(dsn)) as conn, conn.cursor() as cur:
            insert_rows(cur, TABLE, backlog)
        due: dict[int, float] = {}  # released id -> when it is due again (monotonic)
        delays: list[float] = []
        with Client(server.address, timeout_s=CLIENT_TIMEOUT_S) as client:
            client.list_tables()
            sub = client.subscribe(TABLE, max_in_flight=BATCH)
            began = time.monotonic()
            with sub:
                for batches, batch in enumerate(sub.batches(), 1):
                    now = time.monotonic()
                    out.delivered += len(batch)
                    for m in batch:
                        at = due.pop(int(m.id), None)
                        if at is not None:
                            delays.append((now - at) * 1000)
                    if batches % RELEASE_EVERY == 0:
                        first, rest = batch[:1], batch[1:]
                        called = time.monotonic()
                        if sub.release(first, delay_s=DELAY_S) != 1:
                            raise BenchError("a release did not count its message")
                        due[int(first[0].id)] = called + DELAY_S
                        out.released += 1
                    else:
                        rest = batch
                    if rest:
                        sub.ack(rest)
                    took = time.monotonic() - began
                    if took >= seconds:
                        break
                    pace = out.delivered / RATE - took  # at most RATE a second
                    if pace > 0:
                        time.sleep(pace)
                end = time.monotonic()
        out.seconds = end - began
        out.not_back = sum(1 for at in due.values() if at < end)
        delays += [(end - at) * 1000 for at in due.values() if at < end]
        out.delays_ms = sorted(delays)
        left = execute(dsn, f"select count(*) from {TABLE} where time_acked is null and epoch = 0")
        out.lag_left = int(left[0][0])
    finally:
        execute(dsn, f"drop table if exists {TABLE}")
    return out
