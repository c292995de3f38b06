"""Ordering per key (msgtable.engine.ordered) end to end through ``msgtable serve``: an ordered
table
against the same table unordered, one hot key, and how a hot key delays the other keys (the
``ordering`` section of ``python -m bench.run``).

Every table here has the same shape: the current layout plus a key column ``k
varchar(64)`` and the order index ``order_idx(k, time_acked, id)``; an ordered table adds
``vt_order_key=k`` to its COMMENT (id order), an unordered one does not (the column and the
index are there all the same, so the two differ only in ordering). Every backlog is
committed before go; at go the run's K subscriber processes subscribe and drain it at the
run's vt_batch_size, acking each batch with ``ack_async`` as bench.engine's subscribers do;
the clock runs from go to the answer of the ack that completes the count. The K processes
are started once for the section's seven drains (a start costs seconds on a busy machine, as
much as a quick drain) and subscribe afresh at each drain's go. Each run's note gives the
rows the database read a message (server-wide, as bench.fanout counts them) and the SELECT
statements it ran a batch (``Com_select``, server-wide): an ordered table's polls read the
runs of keys as they are freed, the unordered one's read pages of up to vt_cache_size rows.

Every run checks what the subscribers saw: each message received exactly once (the tables'
vt_ack_wait, bench.database.ACK_WAIT_S, is longer than any run, so a second delivery is a
bug, not at-least-once redelivery) and acked, none missing, and in the table every row acked
and claimed once (epoch 1). For an ordered table also, per key, from the subscribers' own
clocks (``time.monotonic()``, one clock for the machine): the first deliveries of a key come
in id order, and a key's batch arrives only after its subscriber began to ack the key's batch
before (one batch at a time). Any failure fails the run.

Ordered vs unordered (``ordered_msgs_s``, ``unordered_msgs_s``, ``ordered_ratio``, target
>= 0.5): SIZES["rows"] messages over SIZES["keys"] keys, the key of message ``i`` a
multiplicative hash of ``i`` (key_of: consecutive messages have unrelated keys, as a producer
with a random key per message would make them; ~100 messages a key, so a key's backlog is
about one batch). The two tables are drained alternately, ordered first, ROUNDS times each,
each from a freshly filled table; the figures are the medians and the ratio is theirs
(``round_ratios`` in the JSON has each round's). Full mode has the issue's figure: 1M
messages over 10,000 keys. Quick mode is scaled down to 50,000 over 500 keys (the same ~100
a key) to keep ``make bench`` short.

Hot key (``hot_key_msgs_s``, target >= 5,000): one key holds SIZES["hot"] messages (20,000
quick, 100,000 full) at vt_batch_size HOT_BATCH. The key's batches go one at a time, whatever
the number of subscribers, so the rate is one batch per round trip: the poll of the key's
run, the send, the subscriber's receive and ack, the ack written, the key free again.

Fairness (``fairness_p99_ms``, ``fairness_base_p99_ms``, target: ``fairness_ratio`` <= 2): a
backlog of SIZES["fair_rows"] messages where every tenth is one of SIZES["fair_keys"] other
keys (the keys taking turns; quick 2,000 messages over 200 keys, full 20,000 over 2,000) and
the rest, 90 %, one hot key, whose name sorts before the others' (a pass over the keys
meets it first); against the same other keys' messages (same ids, same keys) with no hot key.
Both tables are ordered and drained the same way, the one without first. A message's wait
is the time from go to its first delivery, as its subscriber saw it; the figures are the p99
of the other keys' waits with the hot key and without, and their ratio. Since every message
is in the table at go, a wait is mostly the message's place in the drain (plus the
subscribe and the first poll, the same in both): the ratio says how far the hot key's
backlog pushes the other keys back (in the polls that page through the keys, in the batches
and subscribers its runs take), not what a producer's message waits behind a hot key in a
live stream (that is latency, another section's kind of figure). Each run still drains the
hot key to its end, for the checks.
"""

from __future__ import annotations

import contextlib
import faulthandler
import signal
import statistics
import threading
import time
import traceback
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bench import smoke
from bench.database import (
    PAYLOAD,
    check_lifecycle,
    connect,
    drop_digits,
    execute,
    make_digits,
    message_comment,
)
from bench.errors import BenchError
from bench.fanout import rows_read
from bench.measure import Throughput, cpu_meter, percentile, run_timeout_s
from bench.processes import CTX, Flag, ServerProcess, Workers
from msgtable.core.tables import current_layout_ddl

CLIENT_TIMEOUT_S = 30.0
LEAVE_POLL_S = 0.01  # how often an idle subscriber checks whether the run is over
KEY_COLUMN = "k varchar(64)"
ORDER_INDEX = "index order_idx(k, time_acked, id)"
ORDERED = ",vt_order_key=k"
HOT_KEY = "hot"
HOT_BATCH = 100  # the figure is at batch 100
FAIR_EVERY = 10  # one message in this many is another key's (the hot key holds 90 %)
ROUNDS = 2  # drains of each of the ordered and unordered tables, alternated
INSERT_CHUNK_ROWS = 100_000
SIZES = {
    "quick": {"rows": 50_000, "keys": 500, "hot": 20_000, "fair_rows": 20_000, "fair_keys": 200},
    "full": {
        "rows": 1_000_000,
        "keys": 10_000,
        "hot": 100_000,
        "fair_rows": 200_000,
        "fair_keys": 2_000,
    },
    "smoke": smoke.ORDERING,
}
HOT_TABLE = "hot_key"
FAIR_TABLES = ("fair_base", "fair_hot")  # without the hot key, with it
# key_of: Knuth's multiplicative hash, its top bits scaled to the number of keys
HASH_MULTIPLIER = 2_654_435_761
HASH_RANGE = 1 << 32


def keyed_table(ordered: bool, rnd: int) -> str:
    """The table of one round's ordered or unordered drain."""
    return f"{'ordered' if ordered else 'unordered'}_{rnd}"


def key_of(i: int, keys: int) -> str:
    """The key of message ``i`` among ``keys`` keys (the same as key_sql's)."""
    return f"k{(i * HASH_MULTIPLIER) % HASH_RANGE * keys // HASH_RANGE}"


def key_sql(i: str, keys: int) -> str:
    """key_of in SQL, of the integer expression ``i``."""
    return f"concat('k', mod({i} * {HASH_MULTIPLIER}, {HASH_RANGE}) * {keys} div {HASH_RANGE})"


def fair_key_of(i: int, keys: int) -> str:
    """The fairness backlog's key of message ``i``: one in FAIR_EVERY another key's."""
    return f"k{i // FAIR_EVERY % keys}" if i % FAIR_EVERY == FAIR_EVERY - 1 else HOT_KEY


def fair_key_sql(i: str, keys: int) -> str:
    last = FAIR_EVERY - 1
    return (
        f"if(mod({i}, {FAIR_EVERY}) = {last}, "
        f"concat('k', mod({i} div {FAIR_EVERY}, {keys})), '{HOT_KEY}')"
    )


@dataclass(frozen=True)
class FairnessResult:
    """The other keys' waits (go -> first delivery) with the hot key and without."""

    hot: Throughput  # the whole drain with the hot key
    base: Throughput  # the other keys alone
    others: int  # messages of the other keys
    keys: int  # other keys
    p50_ms: float
    p99_ms: float
    max_ms: float
    base_p50_ms: float
    base_p99_ms: float
    base_max_ms: float

    @property
    def ratio(self) -> float:
        return self.p99_ms / self.base_p99_ms if self.base_p99_ms > 0 else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {
            "with_hot_key": self.hot.as_dict(),
            "without": self.base.as_dict(),
            "other_messages": self.others,
            "other_keys": self.keys,
            "p50_ms": round(self.p50_ms, 1),
            "p99_ms": round(self.p99_ms, 1),
            "max_ms": round(self.max_ms, 1),
            "base_p50_ms": round(self.base_p50_ms, 1),
            "base_p99_ms": round(self.base_p99_ms, 1),
            "base_max_ms": round(self.base_max_ms, 1),
            "ratio": round(self.ratio, 3),
        }


@dataclass
class OrderingResult:
    """The section's figures; a run left out (None, empty) was not measured."""

    ordered: list[Throughput] = field(default_factory=list)  # one per round
    unordered: list[Throughput] = field(default_factory=list)
    keys: int = 0  # of the ordered / unordered backlog
    hot: Throughput | None = None
    fairness: FairnessResult | None = None

    @property
    def ordered_msgs_s(self) -> float | None:
        return statistics.median(r.msgs_s for r in self.ordered) if self.ordered else None

    @property
    def unordered_msgs_s(self) -> float | None:
        return statistics.median(r.msgs_s for r in self.unordered) if self.unordered else None

    @property
    def ratio(self) -> float | None:
        o, u = self.ordered_msgs_s, self.unordered_msgs_s
        return o / u if o is not None and u else None

    def runs(self) -> list[Throughput]:
        fair = [self.fairness.base, self.fairness.hot] if self.fairness else []
        pairs = [r for pair in zip(self.ordered, self.unordered, strict=False) for r in pair]
        return pairs + ([self.hot] if self.hot else []) + fair

    def as_dict(self) -> dict[str, Any]:
        return {
            "ordered": [r.as_dict() for r in self.ordered],
            "unordered": [r.as_dict() for r in self.unordered],
            "keys": self.keys,
            "round_ratios": [
                round(o.msgs_s / u.msgs_s, 3)
                for o, u in zip(self.ordered, self.unordered, strict=False)
            ],
            "hot_key": self.hot.as_dict() if self.hot else None,
            "fairness": self.fairness.as_dict() if self.fairness else None,
        }


@dataclass(frozen=True)
class Setup:
    """Where the section runs: the main msgtable server, its database and the run's settings."""

    server: ServerProcess
    dsn: str
    batch_size: int
    subscribers: int
    poller_interval_s: float
    postpone_after_s: float | None
    db_pid: int | None

    def comment(self, batch_size: int, ordered: bool) -> str:
        base = message_comment(
            batch_size, self.poller_interval_s, postpone_after_s=self.postpone_after_s
        )
        return base + (ORDERED if ordered else "")


# -- subscribers ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Drain:
    """One drain of the section: a table and the messages it holds."""

    table: str
    target: int  # the drain is over once its subscribers received this many together


@dataclass(frozen=True)
class SubscriberSpec:
    address: str
    drains: tuple[Drain, ...]  # in the order the section runs them


@dataclass
class Shared:
    """Cross-process state of one drain's subscribers."""

    go: Flag  # set by the bench once the drain's table is filled: subscribe
    counter: Any  # messages received, all subscribers together
    done: Flag  # set once the target is reached: every subscriber leaves

    @classmethod
    def new(cls) -> Shared:
        return cls(Flag(), CTX.Value("q", 0), Flag())


def subscriber_worker(
    spec: SubscriberSpec,
    shared: list[Shared],
    name: str,
    ready: Any,
    go: Any,
    results: Any,
) -> None:
    """One subscriber for every drain of the section, one after the other: at each drain's
    go subscribe, receive batches (noting when each came and when its ack began), ack each
    (ack_async) until the drain has them all, and put this drain's result, as
    bench.processes.report does for a whole worker (its CPU seconds from the drain's go)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # Workers dumps stuck workers
    try:
        from msgtable.client import Client

        with Client(spec.address, timeout_s=CLIENT_TIMEOUT_S) as client:
            client.list_tables()  # connected before the clock starts
            ready.put(name)
            for drain, state in zip(spec.drains, shared, strict=True):
                state.go.wait()
                began = time.process_time()
                result = _drain_once(client, drain, state)
                results.put(("ok", name, {**result, "cpu_s": time.process_time() - began}))
    except BaseException:
        results.put(("error", name, traceback.format_exc()))


def _drain_once(client: Any, drain: Drain, state: Shared) -> dict[str, Any]:
    ids = array("q")
    sizes = array("q")  # messages of each batch, in the order received
    received = array("d")  # when each batch came (monotonic)
    acking = array("d")  # when its ack began
    with client.subscribe(drain.table) as sub:

        def leave() -> None:
            state.done.wait(LEAVE_POLL_S)
            sub.close()

        threading.Thread(target=leave, daemon=True).start()
        answered = [0.0]  # when the last ack call returned (set on the ack thread)

        def note_answer(_: object) -> None:
            answered[0] = time.monotonic()

        for batch in sub.batches():
            came = time.monotonic()
            ids.extend(int(m.id) for m in batch)
            began = time.monotonic()
            sub.ack_async(batch).add_done_callback(note_answer)
            sizes.append(len(batch))
            received.append(came)
            acking.append(began)
            with state.counter.get_lock():
                state.counter.value += len(batch)
                reached = state.counter.value >= drain.target
            if reached:
                state.done.set()
                break
        sub.flush_acks(CLIENT_TIMEOUT_S)  # every ack answered: the clock stops here
        if not state.done.is_set():
            raise BenchError(
                f"the server ended the stream of {drain.table} after {len(ids)} "
                f"messages here, {state.counter.value} of {drain.target} in all"
            )
        return {
            "ids": ids.tobytes(),
            "sizes": sizes.tobytes(),
            "received": received.tobytes(),
            "acking": acking.tobytes(),
            "acked": sub.acked,
            "ack_calls": sub.ack_calls,
            "last": answered[0],
        }


@dataclass(frozen=True)
class Batch:
    """One batch as one subscriber saw it."""

    subscriber: str
    received: float  # monotonic
    acking: float  # when its ack began
    ids: array[int]


@dataclass
class Drained:
    """What the subscribers of one drain saw."""

    batches: list[Batch]  # every batch of every subscriber, in the order they came
    acked: int
    ack_calls: int
    seconds: float  # go -> the last ack's answer
    start: float  # go (monotonic)
    cpu_s: dict[str, float]
    rows_read: int  # by the database server, go -> all results in (bench.fanout.rows_read)
    selects: int  # SELECT statements the database server ran meanwhile (Com_select)

    @property
    def messages(self) -> int:
        return sum(len(b.ids) for b in self.batches)


class Subscribers:
    """The run's K subscriber processes, started once for all the section's drains (a start
    of K processes costs seconds on a busy machine, each drain of quick mode about as much):
    each drain has a go flag of its own, set once its table is filled, and each subscriber
    puts one result a drain."""

    def __init__(self, setup: Setup, drains: list[Drain]) -> None:
        self.setup = setup
        self.drains = drains
        self.shared = [Shared.new() for _ in drains]
        self.workers = Workers()
        self._next = 0

    def __enter__(self) -> Subscribers:
        spec = SubscriberSpec(self.setup.server.address, tuple(self.drains))
        try:
            for k in range(self.setup.subscribers):
                self.workers.start(f"sub{k}", subscriber_worker, spec, self.shared)
            self.workers.wait_ready()
        except BaseException:
            self.workers.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.workers.close()

    def drain(self, table: str) -> Drained:
        """The next drain (of ``table``: the drains go in the order given)."""
        i = self._next
        drain, state = self.drains[i], self.shared[i]
        if drain.table != table:
            raise BenchError(f"drain {i} is of {drain.table}, not {table}")
        self._next += 1
        server, db_pid = self.setup.server, self.setup.db_pid
        with (
            contextlib.closing(connect(self.setup.dsn)) as monitor,
            monitor.cursor() as cur,
            cpu_meter(database=db_pid, server=server.pid) as cpu,
        ):
            read, selects = rows_read(cur), com_select(cur)
            start = time.monotonic()
            state.go.set()
            try:
                results = self.workers.collect(run_timeout_s(drain.target))
            except BenchError as exc:
                server.check_alive()
                raise BenchError(
                    f"{exc}\n{table}: {state.counter.value} of {drain.target} messages received"
                ) from None
            read, selects = rows_read(cur) - read, com_select(cur) - selects
        if not db_pid:
            del cpu["database"]
        cpu["subscribers"] = sum(r["cpu_s"] for r in results.values())
        batches: list[Batch] = []
        for name, r in results.items():
            ids, sizes, received, acking = array("q"), array("q"), array("d"), array("d")
            ids.frombytes(r["ids"])
            sizes.frombytes(r["sizes"])
            received.frombytes(r["received"])
            acking.frombytes(r["acking"])
            at = 0
            for n, came, began in zip(sizes, received, acking, strict=True):
                batches.append(Batch(name, came, began, ids[at : at + n]))
                at += n
        batches.sort(key=lambda b: b.received)
        return Drained(
            batches,
            sum(r["acked"] for r in results.values()),
            sum(r["ack_calls"] for r in results.values()),
            max(r["last"] for r in results.values()) - start,
            start,
            cpu,
            read,
            selects,
        )


def com_select(cur: Any) -> int:
    """SELECT statements the database server ran since it started (server-wide)."""
    cur.execute("SHOW GLOBAL STATUS LIKE 'Com_select'")
    row = cur.fetchone()
    return int(row[1]) if row else 0


# -- checks --------------------------------------------------------------------------------------
def check_deliveries(what: str, d: Drained, expected: set[int]) -> None:
    """Every expected id received exactly once and acked."""
    seen: set[int] = set()
    twice = 0
    for b in d.batches:
        for rid in b.ids:
            if rid in seen:
                twice += 1
            seen.add(rid)
    if twice:
        raise BenchError(
            f"{what}: {twice} messages received more than once (the ack wait is longer than "
            "the run: not a redelivery)"
        )
    if d.acked != d.messages:
        raise BenchError(f"{what}: {d.messages} messages received but {d.acked} acked")
    if seen != expected:
        raise BenchError(
            f"{what}: {len(expected - seen)} of {len(expected)} messages never arrived, "
            f"{len(seen - expected)} arrived that should not have"
        )


def check_order(what: str, d: Drained, key: Callable[[int], str]) -> int:
    """Per key, from what the subscribers saw: first deliveries in id order, and a key's batch
    only after its batch before began to be acked. Returns the keys seen."""
    last_id: dict[str, int] = {}
    last_batch: dict[str, Batch] = {}
    problems: list[str] = []
    for b in d.batches:  # in the order they came
        keys_here: set[str] = set()
        for rid in b.ids:
            k = key(rid)
            if k in last_id and rid < last_id[k]:
                problems.append(f"key {k}: {rid} came after {last_id[k]}")
            last_id[k] = rid
            keys_here.add(k)
        for k in keys_here:
            before = last_batch.get(k)
            if before is not None and b.received < before.acking:
                problems.append(
                    f"key {k}: a batch came to {b.subscriber} "
                    f"{(before.acking - b.received) * 1000:.1f} ms before {before.subscriber} "
                    "began to ack the key's batch before"
                )
            last_batch[k] = b
        if len(problems) >= 10:
            break
    if problems:
        raise BenchError(f"{what}: out of order\n  " + "\n  ".join(problems[:10]))
    return len(last_id)


# -- tables --------------------------------------------------------------------------------------
def create_keyed_table(dsn: str, table: str, comment: str) -> None:
    """The recommended message table with the key column and the order index."""
    ddl = current_layout_ddl(table, comment)
    anchor = "  primary key(id),"
    if anchor not in ddl:
        raise BenchError(f"msgtable.core.tables.current_layout_ddl changed: no {anchor.strip()!r}")
    ddl = ddl.replace(anchor, f"  {KEY_COLUMN},\n{anchor}\n  {ORDER_INDEX},")
    execute(dsn, f"drop table if exists {table}", ddl)


def insert_keyed(
    dsn: str, table: str, count: int, key: Callable[[str], str], where: str = ""
) -> int:
    """Rows ``i`` = 0 .. ``count`` - 1 (those matching ``where``, an SQL condition on ``{i}``),
    due, each with ``key("{i}")`` (an SQL expression) as its key, as bench.database.bulk_insert
    inserts: INSERT ... SELECT from a cross join of a digits table. Returns the rows inserted."""
    digits = "bench_order_digits"
    inserted = 0
    with contextlib.closing(connect(dsn)) as conn, conn.cursor() as cur:
        source = make_digits(cur, digits)
        for lo in range(0, count, INSERT_CHUNK_ROWS):
            rows = min(INSERT_CHUNK_ROWS, count - lo)
            i = f"({lo} + s.n)"
            cond = f" and {where.format(i=i)}" if where else ""
            inserted += cur.execute(
                f"insert into {table}(id, priority, time_next, epoch, message, k) "
                f"select {i}, 0, 0, 0, %s, {key(i)} from ({source}) s where s.n < %s{cond}",
                (PAYLOAD, rows),
            )
        drop_digits(cur, digits)
    return inserted


def check_keys(dsn: str, table: str, expected: dict[str, int]) -> None:
    """The table's messages per key are what the bench's key function says (its SQL twin put
    them there)."""
    got = {str(k): int(n) for k, n in execute(dsn, f"select k, count(*) from {table} group by k")}
    if got != expected:
        wrong = sorted(k for k in got.keys() | expected.keys() if got.get(k) != expected.get(k))
        raise BenchError(f"{table}: messages per key differ from the bench's for {wrong[:5]}")


def count_keys(ids: range | list[int], key: Callable[[int], str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in ids:
        k = key(i)
        out[k] = out.get(k, 0) + 1
    return out


@contextlib.contextmanager
def _filled(
    setup: Setup,
    table: str,
    comment: str,
    ids: list[int] | range,
    key: Callable[[int], str],
    key_sql_of: Callable[[str], str],
    where: str = "",
) -> Iterator[None]:
    """A keyed table holding the due rows ``ids`` (checked against ``key``), dropped after."""
    create_keyed_table(setup.dsn, table, comment)
    try:
        n = insert_keyed(setup.dsn, table, (max(ids) + 1) if ids else 0, key_sql_of, where)
        if n != len(ids):
            raise BenchError(f"{table}: {n} rows inserted, {len(ids)} expected")
        check_keys(setup.dsn, table, count_keys(ids, key))
        yield
    finally:
        execute(setup.dsn, f"drop table if exists {table}")


def _throughput(kind: str, batch: int, clients: int, d: Drained, note: str) -> Throughput:
    n = d.messages
    return Throughput(
        kind,
        batch,
        clients,
        n,
        d.seconds,
        note=f"{note}; {n / max(len(d.batches), 1):.1f} messages a batch, "
        f"{len(d.batches) / max(d.ack_calls, 1):.1f} batches a MessageAck, "
        f"{d.rows_read / max(n, 1):.2f} rows read a message and "
        f"{d.selects / max(len(d.batches), 1):.1f} SELECTs a batch (server-wide)",
        cpu_s=d.cpu_s,
    )


# -- the runs ------------------------------------------------------------------------------------
def keyed_drain(
    setup: Setup, subs: Subscribers, rows: int, keys: int, ordered: bool, rnd: int
) -> Throughput:
    """``rows`` messages over ``keys`` keys (key_of) drained from an ordered or unordered
    table."""
    kind = "ordered" if ordered else "unordered"
    table = keyed_table(ordered, rnd)

    def key(i: int) -> str:
        return key_of(i, keys)

    ids = range(rows)
    comment = setup.comment(setup.batch_size, ordered)
    with _filled(setup, table, comment, ids, key, lambda i: key_sql(i, keys)):
        d = subs.drain(table)
        check_deliveries(f"{kind} table {table}", d, set(ids))
        seen = check_order(f"table {table}", d, key) if ordered else 0
        check_lifecycle(setup.dsn, table, rows)
    checked = f"order checked over {seen:,} keys" if ordered else "no vt_order_key"
    return _throughput(
        kind,
        setup.batch_size,
        setup.subscribers,
        d,
        f"round {rnd + 1}: {rows:,} due rows over {keys:,} keys (~{rows // keys} a key), {checked}",
    )


def hot_key(setup: Setup, subs: Subscribers, rows: int) -> Throughput:
    """One key holds every one of ``rows`` messages, vt_batch_size HOT_BATCH."""
    table = HOT_TABLE

    def key(i: int) -> str:
        return HOT_KEY

    ids = range(rows)
    with _filled(setup, table, setup.comment(HOT_BATCH, True), ids, key, lambda i: f"'{HOT_KEY}'"):
        d = subs.drain(table)
        check_deliveries(f"hot key table {table}", d, set(ids))
        check_order(f"table {table}", d, key)
        check_lifecycle(setup.dsn, table, rows)
    return _throughput(
        "hot_key",
        HOT_BATCH,
        setup.subscribers,
        d,
        f"{rows:,} due rows of one key, one batch at a time, order checked",
    )


def _waits_ms(d: Drained, others: set[int]) -> list[float]:
    """The other keys' waits, go -> first delivery, sorted."""
    waits = [(b.received - d.start) * 1000 for b in d.batches for rid in b.ids if rid in others]
    return sorted(waits)


def fairness(setup: Setup, subs: Subscribers, rows: int, keys: int) -> FairnessResult:
    """The other keys' waits without the hot key, then with it (see the module docstring)."""
    last = FAIR_EVERY - 1
    others = [i for i in range(rows) if i % FAIR_EVERY == last]
    others_set = set(others)

    def key(i: int) -> str:
        return fair_key_of(i, keys)

    comment = setup.comment(setup.batch_size, True)
    where = f"mod({{i}}, {FAIR_EVERY}) = {last}"
    base_table, hot_table = FAIR_TABLES
    with _filled(setup, base_table, comment, others, key, lambda i: fair_key_sql(i, keys), where):
        base = subs.drain(base_table)
        check_deliveries(f"fairness table {base_table}", base, others_set)
        check_order(f"table {base_table}", base, key)
        check_lifecycle(setup.dsn, base_table, len(others))
    ids = range(rows)
    with _filled(setup, hot_table, comment, ids, key, lambda i: fair_key_sql(i, keys)):
        hot = subs.drain(hot_table)
        check_deliveries(f"fairness table {hot_table}", hot, set(ids))
        check_order(f"table {hot_table}", hot, key)
        check_lifecycle(setup.dsn, hot_table, rows)
    w, bw = _waits_ms(hot, others_set), _waits_ms(base, others_set)
    b, k = setup.batch_size, setup.subscribers
    return FairnessResult(
        hot=_throughput(
            "fairness_hot",
            b,
            k,
            hot,
            f"{rows - len(others):,} messages of one hot key and {len(others):,} over "
            f"{keys:,} other keys, interleaved; order checked",
        ),
        base=_throughput(
            "fairness_base",
            b,
            k,
            base,
            f"the same {len(others):,} messages over {keys:,} keys without the hot key",
        ),
        others=len(others),
        keys=keys,
        p50_ms=percentile(w, 50),
        p99_ms=percentile(w, 99),
        max_ms=w[-1],
        base_p50_ms=percentile(bw, 50),
        base_p99_ms=percentile(bw, 99),
        base_max_ms=bw[-1],
    )


def run(
    server: ServerProcess,
    dsn: str,
    mode: str,
    batch_size: int,
    subscribers: int,
    poller_interval_s: float,
    *,
    postpone_after_s: float | None,
    db_pid: int | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> OrderingResult:
    """Ordered vs unordered (alternated, ROUNDS each), the hot key, and fairness."""
    sizes = SIZES[mode]
    setup = Setup(server, dsn, batch_size, subscribers, poller_interval_s, postpone_after_s, db_pid)
    result = OrderingResult(keys=sizes["keys"])
    rows, fair_rows = sizes["rows"], sizes["fair_rows"]
    fair_others = len(range(FAIR_EVERY - 1, fair_rows, FAIR_EVERY))
    drains = [
        Drain(keyed_table(ordered, rnd), rows) for rnd in range(ROUNDS) for ordered in (True, False)
    ]
    drains += [
        Drain(HOT_TABLE, sizes["hot"]),
        Drain(FAIR_TABLES[0], fair_others),
        Drain(FAIR_TABLES[1], fair_rows),
    ]
    with Subscribers(setup, drains) as subs:
        for rnd in range(ROUNDS):
            for ordered in (True, False):
                r = keyed_drain(setup, subs, rows, sizes["keys"], ordered, rnd)
                (result.ordered if ordered else result.unordered).append(r)
                progress(f"{r.kind}, round {rnd + 1}: {r.msgs_s:,.0f} msgs/s")
        result.hot = hot_key(setup, subs, sizes["hot"])
        progress(f"hot key: {result.hot.msgs_s:,.0f} msgs/s")
        result.fairness = fairness(setup, subs, fair_rows, sizes["fair_keys"])
    return result
