"""Shard faults (issue 20, part 3): a keyspace of 2 and of 4 shards, each shard its own local
MariaDB server, served by `msgtable serve --keyspace-file F --shard NAME` processes (two for
the shard whose sender is killed) behind one `msgtable gateway` process, while a producer
commits ascending ids through ShardedEnqueue and two subscribers read through the gateway,
handle each batch for HANDLE_S (so messages are in flight when a fault strikes) and ack it.

During the traffic one shard's database restarts (stopped, down at least DOWN_S, started
again on its port and data directory): the other shards deliver new messages still in the
outage's second half, and its own come again once it is back. Then the server that sends
the table on another shard gets SIGKILL: that shard's other server takes the lease over and
its messages flow again.

Each shard has its own checker (tests/faults/checker.py), told every record of the ids of
that shard and the faults that hit it, and judged at the end with that shard's own database:
every message delivered and acked, never in flight to two subscribers at once, never
delivered after its ack. And acks went where they belong: every row of a shard's database
hashes to that shard, and every id is acked there.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import sqlalchemy as sa

from msgtable.client import Client, Message, Subscription
from msgtable.core.keyspace import Keyspace, load
from msgtable.core.tables import current_layout_ddl
from msgtable.enqueue.sharded import ShardedEnqueue
from msgtable.errors import MsgtableError, PartlySettled
from msgtable.testing.devdb import LocalServer, free_port

from ..acceptance.helpers import MSGTABLE, Cli, Serve
from ..integration.helpers import comment
from ..waiting import wait_until
from .checker import Checker, Report, read_tables

pytestmark = [pytest.mark.faults, pytest.mark.timeout(420)]

RANGES = {2: ("-80", "80-"), 4: ("-40", "40-80", "80-c0", "c0-")}
TABLE, DEAD_TABLE = "q", "q_dead"
# read_tables reads a dead-letter table: the table has no vt_max_attempts, so it stays empty
DEAD_DDL = (
    f"create table {DEAD_TABLE} (id bigint unsigned primary key, attempts bigint, "
    "last_error varchar(1000), time_dead bigint)"
)
ACK_WAIT_S = 5.0
LEASE_PERIOD_S = 1.0
FIELDS = dict(
    vt_ack_wait=ACK_WAIT_S,
    vt_min_backoff=0.5,
    vt_max_backoff=2,
    vt_poller_interval=0.5,
    vt_batch_size=50,
    vt_cache_size=5000,
    vt_purge_after=3600,  # no purge: the tables hold every row for the judge
)
MIN_TOTAL = int(os.environ.get("MSGTABLE_SHARD_FAULTS_MESSAGES", "3000"))
CHUNK = 40  # ids a producer transaction
PACE_S = 0.4  # between two transactions (about 100 messages a second)
SUBSCRIBERS = 2
HANDLE_S = 0.5  # a subscriber handles a batch this long before it acks it
FLOWING_ACKS = 50  # every shard's acks before the first fault
DOWN_S = 8.0  # the restarted database stays down at least this long
# during the outage's second half, every other shard delivers new messages
OUTAGE_WAIT_S = 60.0
RESUME_WAIT_S = 90.0  # a shard's messages come again after its fault
TAKEOVER_WAIT_S = 30.0
TAIL_S = 3.0  # traffic after the last fault
DRAIN_S = 120.0
START_S = 60.0  # a server or the gateway answering, on a busy machine


class Flow:
    """Routes every record to the checker of its id's shard, and keeps each shard's first
    deliveries and returned acks in time (the waits during the faults read them)."""

    def __init__(self, keyspace: Keyspace) -> None:
        self.keyspace = keyspace
        self.checkers = {
            s.name: Checker(ACK_WAIT_S, label=f"shard {s.name}") for s in keyspace.shards
        }
        self._lock = threading.Lock()
        self._seen: set[int] = set()
        self.firsts: dict[str, list[float]] = {s.name: [] for s in keyspace.shards}
        self.acks: dict[str, list[float]] = {s.name: [] for s in keyspace.shards}
        # the longest time from ack_async to its call's return, by shard
        self.longest_ack_s: dict[str, float] = {s.name: 0.0 for s in keyspace.shards}

    def by_shard(self, ids: Sequence[int]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for shard, i in zip(self.keyspace.shards_of(ids), ids, strict=True):
            out.setdefault(shard.name, []).append(i)
        return out

    def inserted(self, ids: Sequence[int]) -> None:
        for name, part in self.by_shard(ids).items():
            self.checkers[name].insert(part)

    def delivered(self, batch: Sequence[Message], sub: str) -> list[int]:
        ids = [int(m.id) for m in batch]  # type: ignore[call-overload]
        attempts = dict(zip(ids, (m.attempt for m in batch), strict=True))
        now = time.monotonic()
        for name, part in self.by_shard(ids).items():
            self.checkers[name].delivered([(i, attempts[i]) for i in part], sub)
            with self._lock:
                new = [i for i in part if i not in self._seen]
                self._seen.update(new)
                self.firsts[name] += [now] * len(new)
        return ids

    def ack_done(self, ids: list[int], queued: float, future: Future[None]) -> None:
        error = future.exception()
        # a gateway that could not reach some ids' shard names them; the others were acked
        unreached = set(error.unreached) if isinstance(error, PartlySettled) else None
        now = time.monotonic()
        for name, part in self.by_shard(ids).items():
            with self._lock:
                self.longest_ack_s[name] = max(self.longest_ack_s[name], now - queued)
            if error is not None and unreached is None:
                self.checkers[name].ack_failed(part)
                continue
            done = [i for i in part if unreached is None or i not in unreached]
            failed = [i for i in part if unreached is not None and i in unreached]
            if done:
                self.checkers[name].acked(done)
                with self._lock:
                    self.acks[name] += [now] * len(done)
            if failed:
                self.checkers[name].ack_failed(failed)

    def firsts_since(self, name: str, t: float) -> int:
        with self._lock:
            return sum(1 for at in self.firsts[name] if at >= t)


class Producer(threading.Thread):
    """Commits ascending ids, CHUNK a transaction across the shards (ShardedEnqueue), until
    stopped once MIN_TOTAL are in. A transaction that fails (a shard's database away) leaves
    its ids owed, by shard: each round, a shard's owed ids not in its table yet (a commit in
    doubt may have landed) are inserted in a transaction of that shard alone, so the shards
    that answer go on while one is away. The checkers hear of ids once they are committed."""

    def __init__(self, keyspace: Keyspace, flow: Flow) -> None:
        super().__init__(name="producer", daemon=True)
        self.shards = ShardedEnqueue(keyspace, pool_pre_ping=True)
        self.flow = flow
        self.next_id = 1
        self.owed: dict[str, list[int]] = {}
        self.failures = 0
        self.stop_event = threading.Event()
        self.abandon = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None

    @property
    def total(self) -> int:
        return self.next_id - 1

    def run(self) -> None:
        try:
            while not self.abandon.is_set():
                stopping = self.stop_event.is_set() and self.total >= MIN_TOTAL
                if stopping and not self.owed:
                    break
                if not stopping:
                    self._chunk()
                self._pay_owed()
                time.sleep(PACE_S)
        except BaseException as exc:  # a bug of the producer: the test reports it
            self.error = exc
        finally:
            self.shards.close()
            self.done.set()

    def _chunk(self) -> None:
        ids = list(range(self.next_id, self.next_id + CHUNK))
        self.next_id += CHUNK
        try:
            with self.shards.begin() as tx:
                tx.enqueue_many(TABLE, [{"id": i, "message": f"m{i}"} for i in ids])
        except (MsgtableError, sa.exc.SQLAlchemyError):
            self.failures += 1
            for name, part in self.flow.by_shard(ids).items():
                self.owed.setdefault(name, []).extend(part)
            return
        self.flow.inserted(ids)

    def _pay_owed(self) -> None:
        for name, ids in list(self.owed.items()):
            try:
                with self.shards.engines[name].connect() as conn:
                    listed = ",".join(map(str, ids))
                    rows = conn.exec_driver_sql(f"select id from {TABLE} where id in ({listed})")
                    present = {int(r[0]) for r in rows}
                missing = [i for i in ids if i not in present]
                if missing:
                    with self.shards.begin() as tx:
                        tx.enqueue_many(TABLE, [{"id": i, "message": f"m{i}"} for i in missing])
            except (MsgtableError, sa.exc.SQLAlchemyError):
                self.failures += 1
                continue
            del self.owed[name]
            self.flow.inserted(ids)

    def state(self) -> str:
        owed = {name: len(ids) for name, ids in self.owed.items()}
        return f"producer: {self.total} ids, {self.failures} failed transactions, owed {owed}"


class Subscriber(threading.Thread):
    """A worker reading the keyspace through the gateway: each batch recorded as it comes
    off the stream, handled for HANDLE_S by a thread of its own (so messages are in flight
    when a fault strikes, and the stream is read on meanwhile), then acked (ack_async)."""

    def __init__(self, name: str, gateway: str, flow: Flow) -> None:
        super().__init__(name=name, daemon=True)
        self.flow = flow
        self.client = Client(gateway, timeout_s=10, retry_for_s=None)
        self.sub: Subscription | None = None
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.handled: queue.SimpleQueue[tuple[float, list[Message], list[int]] | None] = (
            queue.SimpleQueue()
        )
        self.handler = threading.Thread(target=self._handle, name=f"{name}-handler", daemon=True)

    def run(self) -> None:
        self.handler.start()
        try:
            self.sub = self.client.subscribe(TABLE)
            while batch := self.sub.next_batch():
                ids = self.flow.delivered(batch, self.name)
                self.handled.put((time.monotonic() + HANDLE_S, batch, ids))
        except MsgtableError as exc:
            if not self.stopping.is_set():
                self.error = exc
        finally:
            self.handled.put(None)

    def _handle(self) -> None:
        while (item := self.handled.get()) is not None:
            due, batch, ids = item
            time.sleep(max(0.0, due - time.monotonic()))
            assert self.sub is not None
            queued = time.monotonic()
            try:
                future = self.sub.ack_async(batch)
            except MsgtableError as exc:  # closed meanwhile: the ack was never sent
                failed: Future[None] = Future()
                failed.set_exception(exc)
                self.flow.ack_done(ids, queued, failed)
                continue
            future.add_done_callback(partial(self.flow.ack_done, ids, queued))

    def finish(self) -> None:
        self.stopping.set()
        with contextlib.suppress(MsgtableError):
            if self.sub is not None:
                self.sub.close()  # sends the acks queued first
        self.client.close()
        self.join(30)
        self.handler.join(30)

    def state(self) -> str:
        sub = self.sub
        where = f"{sub.reconnects} reconnects" if sub is not None else "not subscribed"
        return f"{self.name}: {'reading' if self.is_alive() else 'ended'}, {where}"


@dataclass
class Cluster:
    """The keyspace's databases (LocalServer by shard name), its file, its server processes
    (by shard name) and the gateway's address."""

    keyspace: Keyspace
    file: Path
    databases: dict[str, LocalServer]
    dbs: dict[str, sa.Engine]  # the test's own connections, by shard name
    serves: dict[str, list[Serve]]
    gateway: str
    cli: Cli
    timings: dict[str, float] = field(default_factory=dict)
    outage: tuple[float, float] = (0.0, 0.0)  # the restarted database's, from its stop
    delivered_in_outage: dict[str, int] = field(default_factory=dict)  # by other shard

    def sender(self, name: str) -> str | None:
        """The address of the server that holds table q's lease on shard ``name`` (None:
        none, or the database does not answer)."""
        try:
            with self.dbs[name].connect() as conn:
                row = conn.exec_driver_sql(
                    "select address from msgtable_placement where kind = 'table' and name = %s "
                    "and released = 0 and expires > utc_timestamp(6)",
                    (TABLE,),
                ).first()
        except sa.exc.DBAPIError:
            return None
        return str(row[0]) if row is not None else None

    def logs(self) -> str:
        return f"(server and gateway logs in {self.cli.log_dir})"


def start_databases(names: Sequence[str], tmp_path: Path) -> dict[str, LocalServer]:
    """One local MariaDB a shard, started at once (each initialises its own data dir)."""
    databases = {
        name: LocalServer(tmp_path / f"db{k}", port=free_port(), keep=True)
        for k, name in enumerate(names)
    }
    with ThreadPoolExecutor(len(names)) as pool:
        for done in [pool.submit(d.start) for d in databases.values()]:
            done.result()
    for d in databases.values():
        d.create_database("app")
        engine = sa.create_engine(d.dsn("app"), isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.exec_driver_sql(current_layout_ddl(TABLE, comment(**FIELDS)))
            conn.exec_driver_sql(DEAD_DDL)
        engine.dispose()
    return databases


def write_keyspace(path: Path, dsns: dict[str, str], servers: dict[str, list[str]]) -> Path:
    text = 'name = "app"\n'
    for name, dsn in dsns.items():
        listed = ", ".join(f'"{a}"' for a in servers[name])
        text += f'[[shards]]\nkey_range = "{name}"\ndsn = "{dsn}"\nservers = [{listed}]\n'
    path.write_text(text)
    return path


def serve(cli: Cli, file: Path, shard: str, address: str, n: int) -> Serve:
    argv = [
        *MSGTABLE,
        "serve",
        "--keyspace-file",
        str(file),
        "--shard",
        shard,
        "--listen",
        address,
        "--lease-period",
        str(LEASE_PERIOD_S),
        "--discovery-interval",
        "1",
        "--grace-s",
        "3",
    ]
    name = f"serve{shard}-{n}"
    process = Serve(address, argv, cli.env(), cli.log_dir, name)
    cli.processes.append(process)
    return process


@contextlib.contextmanager
def cluster(n: int, tmp_path: Path, killed: str) -> Iterator[Cluster]:
    """n shards, each its own database and server, a second server for shard ``killed``,
    and the gateway; everything stopped afterwards."""
    names = RANGES[n]
    began = time.monotonic()
    databases = start_databases(names, tmp_path)
    cli = Cli(tmp_path)
    dbs = {
        name: sa.create_engine(d.dsn("app"), pool_pre_ping=True) for name, d in databases.items()
    }
    try:
        servers = {
            name: [f"127.0.0.1:{free_port()}" for _ in range(2 if name == killed else 1)]
            for name in names
        }
        dsns = {name: d.dsn("app") for name, d in databases.items()}
        file = write_keyspace(tmp_path / "keyspace.toml", dsns, servers)
        serves = {
            name: [serve(cli, file, name, a, k) for k, a in enumerate(addresses, 1)]
            for name, addresses in servers.items()
        }
        databases_s = time.monotonic() - began
        for name, processes in serves.items():
            for process in processes:
                process.wait_answering(START_S)
                process.wait_for_output(rf"shard {name} of keyspace 'app'", START_S)
        gateway = f"127.0.0.1:{free_port()}"
        cli.start("gateway", "--keyspace-file", str(file), "--listen", gateway).wait_for_output(
            r"gateway of keyspace 'app' \(shards .*; tables q\) on ", START_S
        )
        timings = {"databases": databases_s, "servers and gateway": time.monotonic() - began}
        yield Cluster(load(file), file, databases, dbs, serves, gateway, cli, timings)
    finally:
        cli.stop_all()
        for engine in dbs.values():
            engine.dispose()
        for d in databases.values():
            d.keep = False
            d.stop()


def wait_flowing(c: Cluster, flow: Flow) -> None:
    def stalled() -> list[str]:
        return [s for s in flow.acks if len(flow.acks[s]) < FLOWING_ACKS]

    wait_until(
        lambda: not stalled(),
        RESUME_WAIT_S,
        lambda: (
            f"{FLOWING_ACKS} acks of every shard before the faults; short: {stalled()} " + c.logs()
        ),
    )


def restart_database(c: Cluster, flow: Flow, name: str, producer: Producer) -> None:
    """Stop shard ``name``'s database, keep it down while the other shards deliver new
    messages (DOWN_S at least, and each other shard some in the outage's second half), start
    it again, and wait until its own messages come again."""
    others = [s for s in flow.checkers if s != name]
    began = time.monotonic()
    c.databases[name].stop()
    stopped = time.monotonic()
    half = stopped + DOWN_S / 2

    def stalled() -> list[str]:
        return [s for s in others if flow.firsts_since(s, half) == 0]

    wait_until(
        lambda: time.monotonic() - stopped >= DOWN_S and not stalled(),
        OUTAGE_WAIT_S,
        lambda: (
            f"the other shards to deliver new messages while shard {name}'s database is "
            f"down; stalled (nothing new {DOWN_S / 2:g}s into the outage): {stalled()}; new "
            f"since the stop: { {s: flow.firsts_since(s, stopped) for s in others} }; "
            f"{producer.state()} {c.logs()}"
        ),
    )
    c.delivered_in_outage = {s: flow.firsts_since(s, stopped) for s in others}
    c.databases[name].start()
    back = time.monotonic()
    c.outage = (began, back)
    flow.checkers[name].event("database restart", began)  # over once it answers again
    c.timings["database down"] = back - stopped
    wait_until(
        lambda: flow.firsts_since(name, back) > 0,
        RESUME_WAIT_S,
        lambda: (
            f"shard {name}'s new messages after its database came back; {producer.state()} "
            + c.logs()
        ),
    )
    c.timings["restarted shard resumed"] = time.monotonic() - back


def kill_sender(c: Cluster, flow: Flow, name: str) -> None:
    """SIGKILL the server that sends table q on shard ``name``; its other server takes the
    lease over and the shard's messages flow again."""
    sender = wait_until(
        lambda: c.sender(name), TAKEOVER_WAIT_S, f"a sender of table {TABLE} on shard {name}"
    )
    victims = [p for p in c.serves[name] if p.address == sender]
    assert victims, f"shard {name}'s lease names {sender}, none of its servers {c.logs()}"
    victim = victims[0]
    began = time.monotonic()
    victim.send_signal(signal.SIGKILL)
    victim.popen.wait(10)
    killed = time.monotonic()
    flow.checkers[name].event("msgtable SIGKILL", began, victim.address)
    heir = next(p.address for p in c.serves[name] if p is not victim)
    wait_until(
        lambda: c.sender(name) == heir,
        TAKEOVER_WAIT_S,
        lambda: (
            f"{heir} taking shard {name}'s table over from {victim.address} (the lease now: "
            f"{c.sender(name)}) {c.logs()}"
        ),
    )
    taken = time.monotonic()
    c.timings["takeover"] = taken - killed
    wait_until(
        lambda: flow.firsts_since(name, taken) > 0,
        RESUME_WAIT_S,
        lambda: f"shard {name}'s new messages after the takeover {c.logs()}",
    )
    c.timings["killed shard resumed"] = time.monotonic() - taken


def acked_in_table(db: sa.Engine) -> set[int]:
    with db.connect() as conn:
        rows = conn.exec_driver_sql(f"select id from {TABLE} where time_acked is not null")
        return {int(r[0]) for r in rows}


def drain(c: Cluster, flow: Flow, subscribers: Sequence[Subscriber]) -> None:
    """Wait until every id committed is acked in its shard's table."""

    def missing() -> dict[str, list[int]]:
        out = {}
        for name, checker in flow.checkers.items():
            try:
                left = sorted(checker.inserted - acked_in_table(c.dbs[name]))
            except sa.exc.DBAPIError as exc:
                left = [-1]
                out[f"{name} (database: {exc.__class__.__name__})"] = left
                continue
            if left:
                out[name] = left
        return out

    wait_until(
        lambda: not missing(),
        DRAIN_S,
        lambda: (
            "every id acked in its shard; missing by shard: "
            + "; ".join(f"{s}: {len(ids)} {ids[:10]}" for s, ids in missing().items())
            + "; "
            + "; ".join(s.state() for s in subscribers)
            + f" {c.logs()}"
        ),
    )


def routed_wrong(c: Cluster, flow: Flow) -> list[str]:
    """Rows in a shard's database whose id hashes to another shard, and ids not acked in
    their own shard's database (one line each shard, empty when none)."""
    problems = []
    for name, checker in flow.checkers.items():
        with c.dbs[name].connect() as conn:
            rows = conn.exec_driver_sql(f"select id, time_acked from {TABLE}").fetchall()
        ids = [int(i) for i, _ in rows]
        foreign = [i for i, s in zip(ids, c.keyspace.shards_of(ids), strict=True) if s.name != name]
        unacked = sorted(int(i) for i, acked in rows if acked is None)
        absent = sorted(checker.inserted - set(ids))
        if foreign or unacked or absent:
            problems.append(
                f"shard {name}: rows of other shards {foreign[:10]}, unacked {unacked[:10]}, "
                f"inserted but absent {absent[:10]}"
            )
    return problems


def duplicates_from(checker: Checker, window: tuple[float, float]) -> int:
    """How many of the checker's ids were delivered again after a first delivery in
    ``window`` (call once its subscribers stopped)."""
    began, ended = window
    return sum(
        1
        for ds in checker.deliveries.values()
        if len(ds) > 1 and began <= min(t for t, _, _ in ds) <= ended
    )


def summary(c: Cluster, flow: Flow, name: str, r: Report, restarted: str) -> str:
    reasons = ", ".join(f"{k} {why}" for why, k in r.reasons.most_common()) or "none"
    events = ", ".join(f"{k} {what}" for what, k in sorted(r.events.items())) or "none"
    outage = duplicates_from(flow.checkers[name], c.outage)
    return (
        f"shard {name}: {r.inserted:,} inserted, {r.deliveries:,} delivered, "
        f"{r.duplicates} duplicates ({reasons}; {outage} first delivered while shard "
        f"{restarted}'s database was down), acks in doubt found committed "
        f"{r.acks_in_doubt_committed}, longest ack {flow.longest_ack_s[name]:.1f}s; "
        f"faults: {events}"
    )


def drive(c: Cluster, flow: Flow, restarted: str, killed: str) -> Producer:
    """The traffic, the two faults, the end of the traffic and the drain."""
    producer = Producer(c.keyspace, flow)
    subscribers = [Subscriber(f"sub{k}", c.gateway, flow) for k in range(SUBSCRIBERS)]
    traffic = time.monotonic()
    try:
        for s in subscribers:
            s.start()
        producer.start()
        wait_flowing(c, flow)
        restart_database(c, flow, restarted, producer)
        kill_sender(c, flow, killed)
        time.sleep(TAIL_S)  # traffic after the last fault, by design
        producer.stop_event.set()
        wait_until(
            producer.done.is_set, RESUME_WAIT_S, lambda: f"the producer to end: {producer.state()}"
        )
        c.timings["traffic and faults"] = time.monotonic() - traffic
        drained = time.monotonic()
        drain(c, flow, subscribers)
        c.timings["drain"] = time.monotonic() - drained
    finally:
        producer.abandon.set()
        producer.stop_event.set()
        for s in subscribers:
            s.finish()
    assert producer.error is None, repr(producer.error)
    assert [s.error for s in subscribers if s.error is not None] == []
    return producer


def verdicts(flow: Flow, reports: dict[str, Report]) -> list[str]:
    """Each shard's violations, with the stories of its first ids."""
    return [
        f"shard {name}:\n"
        + "\n".join(f"  {what}: {len(ids)} {ids[:10]}" for what, ids in v.items())
        + "\n"
        + "\n".join(flow.checkers[name].history(i) for i in first_ids(v))
        for name, r in reports.items()
        if (v := r.violations())
    ]


@pytest.mark.parametrize("n", sorted(RANGES))
def test_a_shard_database_restart_and_a_killed_sender_stop_only_their_shard_and_lose_nothing(
    n: int, tmp_path: Path
) -> None:
    restarted, killed = RANGES[n][0], RANGES[n][-1]
    began = time.monotonic()
    with cluster(n, tmp_path, killed) as c:
        flow = Flow(c.keyspace)
        producer = drive(c, flow, restarted, killed)
        reports = {
            name: checker.judge(read_tables(c.dbs[name], TABLE, DEAD_TABLE))
            for name, checker in flow.checkers.items()
        }
        wrong = routed_wrong(c, flow)
    c.timings["whole case"] = time.monotonic() - began
    timings = ", ".join(f"{what} {s:.1f}s" for what, s in c.timings.items())
    text = (
        f"\n{n} shards: {producer.total:,} messages, {producer.failures} producer transactions "
        f"failed (retried); new messages of the other shards delivered while shard "
        f"{restarted}'s database was down: {c.delivered_in_outage}; {timings}\n"
        + "\n".join(summary(c, flow, name, r, restarted) for name, r in reports.items())
    )
    print(text)
    found = verdicts(flow, reports)
    assert not found, "\n".join(found) + text
    assert not wrong, "acks or rows in the wrong shard:\n" + "\n".join(wrong) + text
    # one shard away holds up no other shard's acks: none of their messages first sent
    # during the outage came again (their acks answered within their ack wait)
    held_up = {
        name: k
        for name in flow.checkers
        if name != restarted and (k := duplicates_from(flow.checkers[name], c.outage))
    }
    assert not held_up, f"acks held up by shard {restarted}'s outage: {held_up}" + text
    assert reports[restarted].events["database restart"] == 1, text
    assert reports[killed].events["msgtable SIGKILL"] == 1, text
    # within two lease periods, and a look at the placement table
    assert c.timings["takeover"] <= 2 * LEASE_PERIOD_S + 0.5, text


def first_ids(violations: dict[str, list[object]], n: int = 3) -> list[int]:
    out: list[int] = []
    for found in violations.values():
        for item in found[:n]:
            i = item[0] if isinstance(item, tuple) else item
            if isinstance(i, int) and i not in out:
                out.append(i)
    return out[: 2 * n]
