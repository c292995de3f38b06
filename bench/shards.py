"""A keyspace of 1, 2 and 4 shards on this machine (full mode; ``--only shards``).

Each shard is a local MariaDB/MySQL server of its own (msgtable.testing.devdb.LocalServer, started
for
the section, with the same settings as the bench's main server), holding message table TABLE
and served by one ``msgtable serve --keyspace-file F --shard NAME``. One ``msgtable gateway``
serves the keyspace; SUBSCRIBERS subscriber processes read the table through it and ack each
batch (each ack goes from the gateway to the shard of its ids). One producer process a shard
inserts the ids that hash to its shard (msgtable.core.keyspace), batch-sized multi-row INSERTs, so
the keyspace gets ids first_id .. first_id + n - 1 in all.

A round measures every shard count, in alternating order (the machine's speed drifts over
minutes); each count's figure is its median round's. Each run reports messages a second and
each part's CPU per message (microseconds): the databases together, the shard servers
together, the gateway, the producers, the subscribers. Every message must arrive exactly once
and be acked (bench.engine's checks), every shard's rows all acked with epoch 1.
"""

from __future__ import annotations

import contextlib
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql

from bench import smoke
from bench.database import PAYLOAD, check_lifecycle, create_table, message_comment
from bench.engine import Shared, SubscriberSpec, check_deliveries, subscriber_worker
from bench.errors import BenchError
from bench.measure import Throughput, cpu_meter, run_timeout_s
from bench.processes import ServerProcess, Workers
from bench.producer import insert_worker
from msgtable.core.keyspace import KeyRange, Keyspace, Shard
from msgtable.testing.devdb import LocalServer, free_port

SHARDS = (1, 2, 4)
RANGES = {1: ("-",), 2: ("-80", "80-"), 4: ("-40", "40-80", "80-c0", "c0-")}
TABLE = "mt_sh"
DATABASE = "bench"
BATCH = 100
SUBSCRIBERS = 2
# the keyspace's, per run
MESSAGES = {"quick": 40_000, "full": 200_000, "smoke": smoke.SHARDS_MESSAGES}
ROUNDS = {"quick": 1, "full": 3, "smoke": smoke.ROUNDS}
GATEWAY_START_S = 60.0
# 2 shards / 1 on this machine: what a second shard's database, server and merge cost where
# they cannot add cores (bench.report's target shards_2_ratio)
TARGET_RATIO = 0.9


@dataclass
class ShardsResult:
    runs: dict[int, list[Throughput]] = field(default_factory=dict)  # by shard count

    def median(self, shards: int) -> Throughput | None:
        runs = sorted(self.runs.get(shards, []), key=lambda r: r.msgs_s)
        return runs[len(runs) // 2] if runs else None

    def msgs_s_by_shards(self) -> dict[str, float]:
        return {str(n): round(r.msgs_s) for n in SHARDS if (r := self.median(n)) is not None}

    def cpu_us_per_msg_by_part(self) -> dict[str, dict[str, float]]:
        return {str(n): r.cpu_per_msg() for n in SHARDS if (r := self.median(n)) is not None}

    def ratio(self, shards: int) -> float | None:
        one, many = self.median(1), self.median(shards)
        return many.msgs_s / one.msgs_s if one and many else None

    def spread(self, shards: int) -> list[float]:
        return sorted(round(r.msgs_s) for r in self.runs.get(shards, []))

    def as_dict(self) -> dict[str, Any]:
        return {
            "table_per_shard": TABLE,
            "subscribers": SUBSCRIBERS,
            "batch_size": BATCH,
            "runs": {str(n): [round(r.msgs_s) for r in rs] for n, rs in self.runs.items()},
        }


@dataclass(frozen=True)
class ShardProducerSpec:
    """What one shard's producer inserts: ``ids`` into ``table``, ``rows`` a statement."""

    dsn: str
    table: str
    ids: tuple[int, ...]
    rows: int


def shard_producer_worker(
    spec: ShardProducerSpec, name: str, ready: Any, go: Any, results: Any
) -> None:
    """Insert the shard's ids as fast as its database takes them, once ``go`` is set."""
    literal = "'" + pymysql.converters.escape_string(PAYLOAD) + "'"
    statements = [
        f"insert into {spec.table}(id, message) values "
        + ",".join(f"({i},{literal})" for i in spec.ids[k : k + spec.rows])
        for k in range(0, len(spec.ids), spec.rows)
    ]
    insert_worker(spec.dsn, statements, name, ready, go, results)


@contextlib.contextmanager
def databases(count: int) -> Iterator[list[LocalServer]]:
    """``count`` local servers, each with database DATABASE (stopped and deleted after)."""
    started: list[LocalServer] = []
    try:
        for _ in range(count):
            server = LocalServer()
            server.start()
            server.create_database(DATABASE)
            started.append(server)
        yield started
    finally:
        for server in started:
            server.stop()


def run(
    mode: str,
    poller_interval_s: float,
    *,
    postpone_after_s: float | None,
    progress: Callable[[str], None],
) -> ShardsResult:
    out = ShardsResult()
    first_id = 0
    with databases(max(SHARDS)) as dbs:
        for n in range(ROUNDS[mode]):
            order = SHARDS if n % 2 == 0 else tuple(reversed(SHARDS))
            for count in order:
                r = one_run(
                    dbs[:count],
                    MESSAGES[mode],
                    first_id,
                    poller_interval_s,
                    postpone_after_s=postpone_after_s,
                )
                first_id += MESSAGES[mode]
                out.runs.setdefault(count, []).append(r)
                progress(
                    f"shards: {count} shard(s), {SUBSCRIBERS} subscribers through a gateway: "
                    f"{r.msgs_s:,.0f} msgs/s; CPU us/msg {r.cpu_per_msg()}"
                )
    return out


def keyspace_file(dbs: Sequence[LocalServer], ports: Sequence[int], path: Path) -> Keyspace:
    keyspace = Keyspace(
        "bench",
        tuple(
            Shard(KeyRange.parse(rng), db.dsn(DATABASE), (f"127.0.0.1:{port}",))
            for rng, db, port in zip(RANGES[len(dbs)], dbs, ports, strict=True)
        ),
    )
    text = 'name = "bench"\n' + "".join(
        f'[[shards]]\nkey_range = "{s.name}"\ndsn = "{s.dsn}"\nservers = ["{s.servers[0]}"]\n'
        for s in keyspace.shards
    )
    path.write_text(text, encoding="utf-8")
    return keyspace


@contextlib.contextmanager
def gateway(file: Path) -> Iterator[tuple[str, int]]:
    """``msgtable gateway`` of the keyspace: its address and pid once it serves."""
    address = f"127.0.0.1:{free_port()}"
    log = tempfile.NamedTemporaryFile(prefix="msgtable-bench-gateway-", suffix=".log")  # noqa: SIM115
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "msgtable", "gateway", "--keyspace-file", str(file)),
            *("--listen", address, "--log-level", "warning", "--grace-s", "1"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(
            target=lambda: [lines.put(line) for line in process.stdout or ()],
            daemon=True,
            name="bench-gateway-stdout",
        ).start()
        try:  # its one line once it serves
            line = lines.get(timeout=GATEWAY_START_S)
        except queue.Empty:
            line = ""
        if "gateway of keyspace" not in line:
            log.seek(0)
            raise BenchError(
                f"msgtable gateway did not start within {GATEWAY_START_S:g}s: {line!r} "
                f"{log.read()[-2000:]!r}"
            )
        yield address, process.pid
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()


def one_run(
    dbs: Sequence[LocalServer],
    n: int,
    first_id: int,
    poller_interval_s: float,
    *,
    postpone_after_s: float | None,
) -> Throughput:
    comment = message_comment(BATCH, poller_interval_s, postpone_after_s=postpone_after_s)
    with tempfile.TemporaryDirectory(prefix="msgtable-bench-shards-") as tmp:
        ports = [free_port() for _ in dbs]
        keyspace = keyspace_file(dbs, ports, Path(tmp) / "keyspace.toml")
        ids = range(first_id, first_id + n)
        by_shard: dict[str, list[int]] = {s.name: [] for s in keyspace.shards}
        for shard, i in zip(keyspace.shards_of(list(ids)), ids, strict=True):
            by_shard[shard.name].append(i)
        for s in keyspace.shards:
            create_table(s.dsn, TABLE, comment)
        servers = [
            ServerProcess(
                s.dsn,
                target=("--keyspace-file", str(Path(tmp) / "keyspace.toml"), "--shard", s.name),
                listen=s.servers[0],
            )
            for s in keyspace.shards
        ]
        try:
            for server in servers:
                server.start()
            with gateway(Path(tmp) / "keyspace.toml") as (address, gateway_pid):
                results, cpu = _traffic(keyspace, by_shard, servers, address, gateway_pid, dbs, n)
            for server in servers:
                server.check_alive()
        finally:
            for server in servers:
                server.stop()
        start = min(r["start"] for name, r in results.items() if name.startswith("producer"))
        end = max(r["last"] for name, r in results.items() if name.startswith("sub"))
        check_deliveries(results, ids, n)
        for s in keyspace.shards:
            check_lifecycle(s.dsn, TABLE, len(by_shard[s.name]))
        parts = {
            "databases": sum(v for k, v in cpu.items() if k.startswith("database")),
            "servers": sum(v for k, v in cpu.items() if k.startswith("server")),
            "gateway": cpu.get("gateway", 0.0),
            "producers": sum(r["cpu_s"] for k, r in results.items() if k.startswith("producer")),
            "subscribers": sum(r["cpu_s"] for k, r in results.items() if k.startswith("sub")),
        }
        return Throughput("msgtable", BATCH, SUBSCRIBERS, n, end - start, cpu_s=parts)


def _traffic(
    keyspace: Keyspace,
    by_shard: dict[str, list[int]],
    servers: Sequence[ServerProcess],
    address: str,
    gateway_pid: int,
    dbs: Sequence[LocalServer],
    n: int,
) -> tuple[dict[str, Any], dict[str, float]]:
    shared = Shared.new(0)
    with Workers() as workers:
        for k in range(SUBSCRIBERS):
            workers.start(f"sub{k}", subscriber_worker, SubscriberSpec(address, TABLE, n), shared)
        for k, s in enumerate(keyspace.shards):
            spec = ShardProducerSpec(s.dsn, TABLE, tuple(by_shard[s.name]), BATCH)
            workers.start(f"producer{k}", shard_producer_worker, spec)
        workers.wait_ready()
        pids: dict[str, int | None] = {f"server{i}": s.pid for i, s in enumerate(servers)}
        pids.update({f"database{i}": db.pid for i, db in enumerate(dbs)})
        pids["gateway"] = gateway_pid
        with cpu_meter(**pids) as cpu:
            workers.go.set()
            results = workers.collect(run_timeout_s(n))
    return results, dict(cpu)


def model(result: ShardsResult, cores: int) -> dict[str, Any] | None:
    """What the parts' CPU per message at one shard say, beside the measured points (the
    README's model): on this machine every part shares ``cores`` cores, so the keyspace does
    at most cores * 1e6 / (all parts' us per message); on machines of their own, a shard (its
    database and its one server process) does at most min(1e6 / the server's us per message,
    1e6 / the database's) per core the database gets, so N shards do N times that while
    gateways (1e6 / the gateway's us per message each) and clients are added beside them."""
    one = result.median(1)
    if one is None:
        return None
    us = one.cpu_per_msg()
    total = sum(us.values())
    server, database, gw = us.get("servers", 0.0), us.get("databases", 0.0), us.get("gateway", 0.0)
    shard_bound = min(
        1e6 / server if server else float("inf"), 1e6 / database if database else float("inf")
    )
    return {
        "one_machine_bound_msgs_s": round(cores * 1e6 / total) if total else None,
        "shard_bound_msgs_s": round(shard_bound) if shard_bound != float("inf") else None,
        "gateway_process_bound_msgs_s": round(1e6 / gw) if gw else None,
        "measured_msgs_s": result.msgs_s_by_shards(),
    }
