"""What changes with size (full mode only): a large backlog, purge under load, the poll's plan.

Backlog: a table holds SMALL_BACKLOG or LARGE_BACKLOG due rows, inserted before anyone
subscribes; K subscribers then drain WINDOW messages of it. The figure is messages per second
over those WINDOW messages, counted from the moment the subscribers are told to subscribe,
so both sizes do the same work (subscribing and the first polls included) and differ only in
what the table holds. A WINDOW takes well under a second, so the sizes are drained in DRAINS
rounds side by side (a fresh small table each time; the same large one, which still holds
~1M rows each time), every other round the large one first; the ratio is the median round's
large / small, with the rounds' spread (a machine busy with other work moves single runs
10-20 %). Every drain starts QUIET_S after the previous one ended, so that none runs while
the last one's subscribers are still going away and the messages they left in flight are
still waiting for their postpone (vt_postpone_after). The last drain of the large backlog
goes on to SUSTAINED messages, whose rate is reported too. Target: the large backlog within
20% of the small one.

Purge: a table holds PURGE_ROWS acked rows, acked two hours ago. Delivery is measured on it
with the usual producer and K subscribers in PURGE_ROUNDS rounds of two runs side by side:
one with vt_purge_after one day (nothing is old enough, the purger finds nothing) and one
with vt_purge_after PURGE_AFTER_S, so the purger deletes the old rows (500 a statement, paced
by msgtable.engine.purger) during the delivery; every other round the purge goes first. Each run is
at least PURGE_MESSAGES_MIN messages, so that it lasts seconds. The setting changes by an
ALTER TABLE ... COMMENT the server applies live, and the bench waits until ListTables shows it.
The ratio is the median round's during / without (a machine busy with other work moves single
runs 10-20 %), with the rounds' spread; it says how many rows each run with the purge deleted
(a run that deleted none measured nothing: an error) and how many were left. Target: delivery
keeps >= 80% of its throughput.

Explain: EXPLAIN of the engine's poll query at the large backlog (the shape
msgtable/store/mysqlstore.py
builds, with literal values).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from bench import engine
from bench.database import (
    NS,
    bulk_insert,
    connect,
    count_rows,
    create_table,
    execute,
    message_comment,
)
from bench.errors import BenchError
from bench.measure import Throughput
from bench.processes import ServerProcess
from msgtable.core.tables import DEFAULT_POSTPONE_AFTER_S

SMALL_BACKLOG = 10_000
LARGE_BACKLOG = 1_000_000
WINDOW = 10_000
SUSTAINED = 100_000
DRAINS = 9  # rounds of a small and a large drain side by side (odd: the median round ran)
QUIET_S = DEFAULT_POSTPONE_AFTER_S + 0.5  # between drains, for both sizes
PURGE_ROWS = 1_000_000
PURGE_AFTER_S = 60
PURGE_SETTLE_S = 1.0
PURGE_OFF_S = 86400  # nothing acked two hours ago is this old: the purger finds nothing
PURGE_ROUNDS = 5  # rounds of one run without the purge and one during it (odd: a median ran)
PURGE_MESSAGES_MIN = 100_000
CONFIG_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class BacklogSizes:
    """The backlog's sizes (the module's constants; bench.smoke's for --smoke)."""

    small: int = SMALL_BACKLOG
    large: int = LARGE_BACKLOG
    window: int = WINDOW
    sustained: int = SUSTAINED
    drains: int = DRAINS


@dataclass(frozen=True)
class PurgeSizes:
    """The purge's sizes (the module's constants; bench.smoke's for --smoke)."""

    rows: int = PURGE_ROWS
    rounds: int = PURGE_ROUNDS
    min_messages: int = PURGE_MESSAGES_MIN


def poll_sql(table: str, now_ns: int, limit: int) -> str:
    """The engine's poll (msgtable/store/mysqlstore.py, current layout, a new pass) with literal
    values."""
    return (
        f"select priority, time_next, epoch, id, message from {table} "
        f"where time_acked is null and (time_next is null or time_next <= {now_ns}) "
        f"order by priority, time_next, id limit {limit}"
    )


def explain(dsn: str, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("explain " + sql)
            header = [d[0] for d in cur.description]
            return header, [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


@dataclass
class BacklogResult:
    small: list[float] = field(default_factory=list)  # msgs/s over WINDOW, each drain
    large: list[float] = field(default_factory=list)
    sustained: float = 0.0  # msgs/s over SUSTAINED messages of the large backlog
    insert_s: float = 0.0  # bulk insert of the large backlog
    poll_ms: dict[int, float] = field(default_factory=dict)  # one poll of 10,000 rows
    explain_header: list[str] = field(default_factory=list)
    explain_rows: list[tuple[Any, ...]] = field(default_factory=list)
    sizes: BacklogSizes = BacklogSizes()

    @property
    def small_rate(self) -> float:
        return statistics.median(self.small)

    @property
    def large_rate(self) -> float:
        return statistics.median(self.large)

    @property
    def rounds(self) -> list[float]:
        """Each round's large / small, run side by side."""
        return [lg / sm for sm, lg in zip(self.small, self.large, strict=True)]

    @property
    def ratio(self) -> float:
        return statistics.median(self.rounds)

    @property
    def spread(self) -> list[float]:
        return [round(min(self.rounds), 3), round(max(self.rounds), 3)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "window": self.sizes.window,
            "drains": self.sizes.drains,
            "ratio_each": [round(r, 3) for r in self.rounds],
            "ratio_spread": self.spread,
            "msgs_s_10k": round(self.small_rate),
            "msgs_s_1m": round(self.large_rate),
            "msgs_s_10k_each": [round(r) for r in self.small],
            "msgs_s_1m_each": [round(r) for r in self.large],
            "ratio_1m_vs_10k": round(self.ratio, 3),
            "msgs_s_1m_sustained": round(self.sustained),
            "sustained_window": self.sizes.sustained,
            "insert_s_1m": round(self.insert_s, 2),
            "poll_ms_10k": round(self.poll_ms[self.sizes.small], 1),
            "poll_ms_1m": round(self.poll_ms[self.sizes.large], 1),
            "explain_poll_1m": [
                dict(zip(self.explain_header, map(_jsonable, row), strict=True))
                for row in self.explain_rows
            ],
        }


def _jsonable(value: Any) -> Any:
    return value if value is None or isinstance(value, int | float | str) else str(value)


def _timed_poll_ms(dsn: str, table: str) -> float:
    began = time.monotonic()
    execute(dsn, poll_sql(table, time.time_ns(), 10_000))
    return (time.monotonic() - began) * 1000


def backlog(
    server: ServerProcess,
    dsn: str,
    batch_size: int,
    subscribers: int,
    poller_interval_s: float,
    *,
    postpone_after_s: float | None,
    sizes: BacklogSizes = BacklogSizes(),
) -> BacklogResult:
    """DRAINS rounds of a drain of WINDOW messages from a fresh SMALL_BACKLOG table and one
    from the LARGE_BACKLOG table side by side, every other round the large one first (the
    last large drain going on to SUSTAINED messages); the ratio is the median round's.
    ``sizes``: those five, the constants unless given."""
    s = sizes
    result = BacklogResult(sizes=s)
    comment = message_comment(batch_size, poller_interval_s, postpone_after_s=postpone_after_s)
    large = "backlog_large"

    def drain_small(i: int) -> None:
        table = f"backlog_small_{i}"
        create_table(dsn, table, comment)
        try:
            bulk_insert(dsn, table, s.small)
            if i == 0:
                result.poll_ms[s.small] = _timed_poll_ms(dsn, table)
            time.sleep(QUIET_S)
            mark_s, _ = engine.drain(server, table, (s.window,), subscribers)
            result.small.append(s.window / mark_s[0])
        finally:
            execute(dsn, f"drop table if exists {table}")

    def drain_large(i: int) -> None:
        marks = (s.window,) if i < s.drains - 1 else (s.window, s.sustained)
        time.sleep(QUIET_S)
        mark_s, _ = engine.drain(server, large, marks, subscribers)
        result.large.append(s.window / mark_s[0])
        if i == s.drains - 1:
            result.sustained = s.sustained / mark_s[-1]

    create_table(dsn, large, comment)
    try:
        result.insert_s = bulk_insert(dsn, large, s.large)
        execute(dsn, f"analyze table {large}")
        sql = poll_sql(large, time.time_ns(), 10_000)
        result.explain_header, result.explain_rows = explain(dsn, sql)
        result.poll_ms[s.large] = _timed_poll_ms(dsn, large)
        for i in range(s.drains):
            for step in (drain_large, drain_small) if i % 2 else (drain_small, drain_large):
                step(i)
    finally:
        execute(dsn, f"drop table if exists {large}")
    return result


@dataclass
class PurgeResult:
    without: list[Throughput]  # by round
    during: list[Throughput]  # by round
    purged: list[int]  # old rows deleted during each round's run with the purge
    left_after: int  # old rows left after the last round
    acked_rows: int = PURGE_ROWS  # old rows the table held first

    @property
    def purged_during(self) -> int:
        return sum(self.purged)

    @property
    def rounds(self) -> list[float]:
        """Each round's during / without."""
        return [d.msgs_s / w.msgs_s for w, d in zip(self.without, self.during, strict=True)]

    @property
    def ratio(self) -> float:
        return statistics.median(self.rounds)

    @property
    def spread(self) -> list[float]:
        return [round(min(self.rounds), 3), round(max(self.rounds), 3)]

    @property
    def without_rate(self) -> float:
        return statistics.median(r.msgs_s for r in self.without)

    @property
    def during_rate(self) -> float:
        return statistics.median(r.msgs_s for r in self.during)

    def as_dict(self) -> dict[str, Any]:
        return {
            "acked_rows": self.acked_rows,
            "msgs_s_without_purge": round(self.without_rate),
            "msgs_s_during_purge": round(self.during_rate),
            "msgs_s_without_each": [round(r.msgs_s) for r in self.without],
            "msgs_s_during_each": [round(r.msgs_s) for r in self.during],
            "ratio": round(self.ratio, 3),
            "ratio_each": [round(r, 3) for r in self.rounds],
            "ratio_spread": self.spread,
            "purged_each_run": self.purged,
            "purged_during_runs": self.purged_during,
            "old_rows_left_after_runs": self.left_after,
        }


def purge(
    server: ServerProcess,
    dsn: str,
    n: int,
    batch_size: int,
    subscribers: int,
    poller_interval_s: float,
    *,
    postpone_after_s: float | None,
    sizes: PurgeSizes = PurgeSizes(),
) -> PurgeResult:
    """PURGE_ROUNDS rounds of a delivery without the purge and one during it, side by side
    (module docstring); ``sizes``: PURGE_ROWS, PURGE_ROUNDS and PURGE_MESSAGES_MIN unless
    given."""
    from msgtable.client import Client

    table = "purge_load"
    n = max(n, sizes.min_messages)
    old = f"time_acked < {time.time_ns() - 3600 * NS}"
    next_id = 0

    def deliver() -> Throughput:
        nonlocal next_id
        first, next_id = next_id, next_id + n
        return engine.run(
            server,
            dsn,
            n,
            batch_size,
            subscribers,
            poller_interval_s,
            postpone_after_s=postpone_after_s,
            table=table,
            first_id=first,
        )

    def purge_after(client: Client, after_s: float) -> None:
        comment = message_comment(
            batch_size, poller_interval_s, postpone_after_s=postpone_after_s, purge_after_s=after_s
        )
        execute(dsn, f"alter table {table} comment '{comment}'")
        deadline = time.monotonic() + CONFIG_TIMEOUT_S
        while True:
            status = {t.name: t for t in client.list_tables()}.get(table)
            if status and status.config and status.config.purge_after_s == after_s:
                return
            if time.monotonic() > deadline:
                raise BenchError(
                    f"purge: the server did not take vt_purge_after={after_s:g} within "
                    f"{CONFIG_TIMEOUT_S:g} s"
                )
            time.sleep(0.2)

    create_table(
        dsn,
        table,
        message_comment(batch_size, poller_interval_s, postpone_after_s=postpone_after_s),
    )
    without: list[Throughput] = []
    during: list[Throughput] = []
    purged: list[int] = []
    try:
        bulk_insert(
            dsn, table, sizes.rows, first_id=1 << 40, time_acked_ns=time.time_ns() - 7200 * NS
        )
        with Client(server.address, timeout_s=30) as client:
            for i in range(sizes.rounds):
                for purging in (True, False) if i % 2 else (False, True):
                    if not purging:
                        purge_after(client, PURGE_OFF_S)
                        time.sleep(PURGE_SETTLE_S)  # a DELETE begun before the change ends
                        before = count_rows(dsn, table, old)
                        without.append(deliver())
                        if count_rows(dsn, table, old) != before:
                            raise BenchError(
                                "purge: rows were purged while vt_purge_after was one day"
                            )
                        continue
                    purge_after(client, PURGE_AFTER_S)
                    before = count_rows(dsn, table, old)
                    during.append(deliver())
                    purged.append(before - count_rows(dsn, table, old))
                    if purged[-1] == 0:
                        raise BenchError(
                            f"purge: round {i + 1}'s run with the purge deleted no row "
                            f"({before:,} old rows before it): it measured no purge"
                        )
        left = count_rows(dsn, table, old)
    finally:
        execute(dsn, f"drop table if exists {table}")
    return PurgeResult(without, during, purged, left, sizes.rows)
