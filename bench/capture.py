"""Table events captured from the binlog (msgtable.features.capture.follower) through ``msgtable
serve``: how
many source row changes a second the lease holder's follower writes into a capture table
(the ``capture`` section of ``python -m bench.run``; JSON key ``capture_events_s``, target
>= 10,000).

A server (``msgtable serve``, its own process, no lease of its own: it follows from the
start) serves one capture table, ``bench_events`` (schema/events.sql's layout,
vt_capture=bench_src), and its follower waits at the binlog's end. At go a producer on its
own connection commits ROWS row changes to ``bench_src`` (id int primary key, n int,
payload varchar(100)) as fast as it can: inserts of INSERT_BATCH rows a transaction, then an
UPDATE of every row and a DELETE of half of them, statement by statement of INSERT_BATCH
rows (2.5 changes a row). The clock runs from go until the event table holds every change
(counted every POLL_S); ``capture_events_s`` is changes / that time. The producer's own rate
is in the note: the follower cannot be faster than the changes arrive, so a producer slower
than the target would make the figure say nothing (it is not, by an order of magnitude).
The run checks that every change came exactly once: the events by kind and primary key are
the producer's changes, none missing, none twice.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from bench import smoke
from bench.database import execute
from bench.errors import BenchError
from bench.processes import ServerProcess
from msgtable.core.events import capture_table_ddl

TABLE, SOURCE = "bench_events", "bench_src"
INSERT_BATCH = 500
# source rows; 2.5 changes each
ROWS = {"quick": 40_000, "full": 400_000, "smoke": smoke.CAPTURE_ROWS}
POLL_S = 0.05
TIMEOUT_S = 300.0
TARGET_EVENTS_S = 10_000.0
COMMENT = (
    "vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size=100,"
    f"vt_cache_size=1000,vt_poller_interval=30,vt_capture={SOURCE}"
)
EVENT_DDL = capture_table_ddl(TABLE, COMMENT)


@dataclass
class CaptureResult:
    changes: int
    seconds: float  # go -> every change in the event table
    produce_s: float  # go -> the producer's last commit
    events_s: float
    producer_changes_s: float

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def run(dsn: str, rows: int) -> CaptureResult:
    source = f"create table {SOURCE}(id int primary key, n int, payload varchar(100))"
    execute(dsn, EVENT_DDL, source)
    with ServerProcess(dsn, binlog=False, lease=False) as server:
        _wait_following(dsn, server)
        payload = "x" * 100
        went = time.monotonic()
        statements = []
        for lo in range(0, rows, INSERT_BATCH):
            hi = min(rows, lo + INSERT_BATCH)
            values = ",".join(f"({i},0,'{payload}')" for i in range(lo, hi))
            statements.append(f"insert into {SOURCE} values {values}")
        for lo in range(0, rows, INSERT_BATCH):
            statements.append(
                f"update {SOURCE} set n = 1 where id >= {lo} and id < {lo + INSERT_BATCH}"
            )
        for lo in range(0, rows, 2 * INSERT_BATCH):
            statements.append(
                f"delete from {SOURCE} where id >= {lo} and id < {lo + 2 * INSERT_BATCH} "
                "and id % 2 = 0"
            )
        execute(dsn, *statements)
        produced = time.monotonic() - went
        want = rows * 2 + (rows + 1) // 2
        deadline = went + TIMEOUT_S
        while True:
            ((n,),) = execute(dsn, f"select count(*) from {TABLE} where kind <> 'create'")
            if n >= want:
                break
            if time.monotonic() > deadline:
                raise BenchError(f"capture: {n:,} of {want:,} events after {TIMEOUT_S:g}s")
            server.check_alive()
            time.sleep(POLL_S)
        took = time.monotonic() - went
    _check(dsn, rows)
    return CaptureResult(want, took, produced, want / took, want / produced)


def _wait_following(dsn: str, server: ServerProcess) -> None:
    """Until the follower stored its position (it starts from the binlog's end then)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        server.check_alive()
        found = execute(
            dsn,
            "select count(*) from information_schema.TABLES "
            "where TABLE_SCHEMA = database() and TABLE_NAME = 'msgtable_capture'",
        )
        if found[0][0] and execute(dsn, "select count(*) from msgtable_capture")[0][0]:
            return  # (its stream connects a moment later, from that position: no change lost)
        time.sleep(POLL_S)
    raise BenchError("capture: the follower did not start in 30s:\n" + server.log_tail())


def _check(dsn: str, rows: int) -> None:
    got = execute(
        dsn,
        f"select kind, count(*), count(distinct pk) from {TABLE} where kind <> 'create' "
        "group by kind order by kind",
    )
    want = [("delete", (rows + 1) // 2), ("insert", rows), ("update", rows)]
    have = [(k, n) for k, n, _ in got]
    if have != want or any(n != distinct for _, n, distinct in got):
        raise BenchError(f"capture: events by kind {got}, want {want} each once")
