"""Several server processes over one database's tables (full mode; ``--only servers``).

Four message tables (TABLES), a producer process and a subscriber process per table, through
1 and then 2 ``msgtable serve`` processes sharing the database (msgtable.engine.placement spreads
the tables: two each). The subscribers name every server and follow the redirects to each
table's sender. Before a run the bench waits until the placement is even (each table has one
sender, and each server the same number), so no table changes hands during it.

A round measures both counts side by side, every other round 2 first (the machine's speed
drifts over minutes); the figure of each count is its median round's. Each run reports its
messages a second and each part's CPU per message (microseconds): the database, the
servers together, the producers, the subscribers (``cpu_us_per_msg_by_part``). With the
parts' costs the README models what N machines would do (its section says how). Every
message must arrive exactly once and be acked (bench.engine's checks), each table's rows
all acked with epoch 1.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bench import smoke
from bench.database import check_lifecycle, create_table, execute, message_comment
from bench.engine import Shared, SubscriberSpec, check_deliveries, subscriber_worker
from bench.errors import BenchError
from bench.measure import Throughput, cpu_meter, run_timeout_s
from bench.processes import ServerProcess, Workers
from bench.producer import ProducerSpec, producer_rows, producer_worker

TABLES = ("mt_s1", "mt_s2", "mt_s3", "mt_s4")
PROCS = (1, 2)
BATCH = 100
# all tables together, per run
MESSAGES = {"quick": 40_000, "full": 200_000, "smoke": smoke.SERVERS_MESSAGES}
ROUNDS = {"quick": 1, "full": 3, "smoke": smoke.ROUNDS}
LEASE_PERIOD_S = 2.0  # a join takes its share within a step or two of this
PLACED_TIMEOUT_S = 60.0


@dataclass
class ServersResult:
    runs: dict[int, list[Throughput]] = field(default_factory=dict)  # by server processes

    def median(self, procs: int) -> Throughput | None:
        runs = sorted(self.runs.get(procs, []), key=lambda r: r.msgs_s)
        return runs[len(runs) // 2] if runs else None

    def msgs_s_by_server_procs(self) -> dict[str, float]:
        return {str(p): round(r.msgs_s) for p in PROCS if (r := self.median(p)) is not None}

    def cpu_us_per_msg_by_part(self) -> dict[str, dict[str, float]]:
        return {str(p): r.cpu_per_msg() for p in PROCS if (r := self.median(p)) is not None}

    def ratio(self) -> float | None:
        one, two = self.median(1), self.median(2)
        return two.msgs_s / one.msgs_s if one and two else None

    def spread(self, procs: int) -> list[float]:
        return sorted(round(r.msgs_s) for r in self.runs.get(procs, []))

    def as_dict(self) -> dict[str, Any]:
        return {
            "tables": len(TABLES),
            "batch_size": BATCH,
            "runs": {str(p): [round(r.msgs_s) for r in rs] for p, rs in self.runs.items()},
        }


def run(
    dsn: str,
    mode: str,
    poller_interval_s: float,
    *,
    postpone_after_s: float | None,
    db_pid: int | None,
    progress: Callable[[str], None],
) -> ServersResult:
    out = ServersResult()
    first_id = 0
    for n in range(ROUNDS[mode]):
        order = PROCS if n % 2 == 0 else tuple(reversed(PROCS))
        for procs in order:
            r = one_run(
                dsn,
                procs,
                MESSAGES[mode],
                first_id,
                poller_interval_s,
                postpone_after_s=postpone_after_s,
                db_pid=db_pid,
            )
            first_id += MESSAGES[mode]
            out.runs.setdefault(procs, []).append(r)
            progress(
                f"servers: {procs} process(es) over {len(TABLES)} tables: {r.msgs_s:,.0f} msgs/s; "
                f"CPU us/msg {r.cpu_per_msg()}"
            )
    return out


@contextlib.contextmanager
def servers(dsn: str, procs: int) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    try:
        for _ in range(procs):
            s = ServerProcess(dsn, extra=("--lease-period", str(LEASE_PERIOD_S)))
            s.start()
            started.append(s)
        yield started
    finally:
        for s in started:
            s.stop()


def placed(dsn: str, procs: int) -> bool:
    """Each table has one live sender, and the servers send as many tables each."""
    rows = execute(
        dsn,
        "select name, holder from msgtable_placement where kind = 'table' and released = 0 "
        "and expires > utc_timestamp(6)",
    )
    holders = {str(name): str(holder) for name, holder in rows}
    if set(holders) != set(TABLES):
        return False
    counts = sorted(list(holders.values()).count(h) for h in set(holders.values()))
    return len(counts) == procs and counts[-1] - counts[0] <= 0


def one_run(
    dsn: str,
    procs: int,
    n: int,
    first_id: int,
    poller_interval_s: float,
    *,
    postpone_after_s: float | None,
    db_pid: int | None,
) -> Throughput:
    comment = message_comment(BATCH, poller_interval_s, postpone_after_s=postpone_after_s)
    per = n // len(TABLES)
    n = per * len(TABLES)
    for t in TABLES:
        create_table(dsn, t, comment)
    try:
        with servers(dsn, procs) as started:
            deadline = time.monotonic() + PLACED_TIMEOUT_S
            while not placed(dsn, procs):
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"the {len(TABLES)} tables were not spread over {procs} server(s) in "
                        f"{PLACED_TIMEOUT_S:g}s: "
                        f"{execute(dsn, 'select kind, name, address from msgtable_placement')}"
                    )
                time.sleep(0.2)
            addresses = ",".join(s.address for s in started)
            shared = Shared.new(0)
            with Workers() as workers:
                for k, t in enumerate(TABLES):
                    workers.start(
                        f"sub{k}", subscriber_worker, SubscriberSpec(addresses, t, n), shared
                    )
                for k, t in enumerate(TABLES):
                    spec = ProducerSpec(dsn, t, first_id + k * per, per, producer_rows(BATCH), 1)
                    workers.start(f"producer{k}", producer_worker, spec)
                workers.wait_ready()
                pids = {f"server{i}": s.pid for i, s in enumerate(started)}
                with cpu_meter(database=db_pid, **pids) as cpu:
                    workers.go.set()
                    results = workers.collect(run_timeout_s(n))
            for s in started:
                s.check_alive()
        start = min(r["start"] for name, r in results.items() if name.startswith("producer"))
        end = max(r["last"] for name, r in results.items() if name.startswith("sub"))
        check_deliveries(results, range(first_id, first_id + n), n)
        for t in TABLES:
            check_lifecycle(dsn, t, per)
        parts = {
            "database": cpu.get("database", 0.0) if db_pid else None,
            "servers": sum(v for name, v in cpu.items() if name.startswith("server")),
            "producers": sum(
                r["cpu_s"] for name, r in results.items() if name.startswith("producer")
            ),
            "subscribers": sum(r["cpu_s"] for name, r in results.items() if name.startswith("sub")),
        }
        cpu_s = {k: v for k, v in parts.items() if v is not None}
        return Throughput("msgtable", BATCH, len(TABLES), n, end - start, cpu_s=cpu_s)
    finally:
        for t in TABLES:
            execute(dsn, f"drop table if exists {t}")


def model(result: ServersResult, cores: int) -> dict[str, Any] | None:
    """What the parts' CPU per message say (the README's model), to set beside the measured
    points: on one machine of ``cores`` cores every part shares them, so the whole does at
    most cores * 1e6 / (the parts' us per message together) messages a second; a server
    process, one Python interpreter, does at most 1e6 / its us per message (about a core);
    a database core 1e6 / the database's."""
    one = result.median(1)
    if one is None:
        return None
    us = one.cpu_per_msg()
    total = sum(us.values())
    server, database = us.get("servers", 0.0), us.get("database", 0.0)
    return {
        "one_machine_bound_msgs_s": round(cores * 1e6 / total) if total else None,
        "server_process_bound_msgs_s": round(1e6 / server) if server else None,
        "database_core_bound_msgs_s": round(1e6 / database) if database else None,
    }
