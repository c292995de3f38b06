"""Subscriptions (msgtable.core.subscriptions) end to end through ``msgtable serve``: one table
fanned out to GROUPS subscriptions, and a subscription with a filter, each against a table
without subscriptions drained the same way on the same server in the same run (the ``fanout``
section of ``python -m bench.run``).

Every group (the default group of the baseline, or one subscription) is served by SUBSCRIBERS
subscriber processes at vt_batch_size BATCH, acking each batch with ``ack_async`` as
bench.engine's subscribers do; a group's clock runs from go to the ack answer that completes
its count. Each group must receive every one of its messages exactly once and ack it, and its
table (the state table of a subscription) must end with those rows acked, each sent once.

Baseline: a table without subscriptions holds SIZES["rows"] due rows, committed before the
clock; at go its subscribers subscribe and drain it.

Fan-out: the same table with ``vt_default_group=off`` and GROUPS subscriptions, created before
the backlog is enqueued (no from_start), so the server's fan-out loop
(msgtable.features.subscriptions.fanout) hands
every row to all of them. The backlog is inserted in one transaction, still open while the
subscribers subscribe, and committed at go: the hand-over happens inside the measured
interval, after the COMMIT (``commit_s``, in the interval too). Each subscription's rate is
its rows over go -> its last ack's answer; ``fanout_ratio`` is the slowest one's over the
baseline's, ``drain_all_s`` the time until all of them were drained.

Filter: a table of SIZES["filter"] rows with an indexed ``region`` column, one row in
FILTER_EVERY ``'eu'``; once they are committed, one subscription with FILTER is created
``from_start`` (CreateSubscription hands it the retained rows that match: ``handover_s``, and
the rows that read, ``handover_rows_read``, counted on their own). Then at go its subscribers
subscribe and drain the matches: ``filter_ratio`` is that rate over the baseline's,
``rows_read_per_msg`` the rows the database read during the drain over the messages
delivered, and ``table_rows_read_per_msg`` the rows of the message table alone (what the
filter's poll reads; the rest is the state table's poll, locking read and ack).

Fan-out at the cost of a delivery (issue 42, item 3): ``fanout_cpu_ratio`` is one subscription
delivery's CPU (database, server and subscribers: the fan-out run's, over its GROUPS x rows
deliveries) over one default-group delivery of the baseline (target <= 1.25);
``fanout_writes_per_msg`` the rows the database wrote during the fan-out run, plus the state
rows left for the purge to delete, per message a subscription settled (target <= 1);
``fanout_aggregate_ratio`` the GROUPS subscriptions' rates summed over the baseline's (target
>= 0.8); ``filter_rows_ratio`` the filtered drain's rows read per delivered message over the
fan-out's (target <= 1.25). The fan-out run goes again with its subscriptions created
``state_rows="lazy"`` (msgtable.features.subscriptions.lazy): ``fanout_lazy_*``, the same three,
each the median of LAZY_ROUNDS rounds of a baseline and a lazy run side by side, the order
alternating (``..._spread`` [min, max] and ``..._rounds`` with them). The filter run goes
again for a lazy subscription (created before its rows, which the fan-out numbers before go;
its scan reads the message table through an index (region, time_fanout)):
``filter_lazy_rows_ratio``, its drain's rows read per delivered message over the first lazy
round's fan-out's (target <= 1.25).

Rows read come from SHOW GLOBAL STATUS: ``Innodb_rows_read`` where the server has it (MySQL),
else ``Rows_read`` (MariaDB 10.6+ dropped the InnoDB one; Rows_read counts the rows the SQL
layer read from any engine, temporary tables excepted). Either counter is server-wide, so
nothing else may use the database server meanwhile: the bench runs one section at a time,
and the msgtable server's own background work (discovery, the lease) is measured while idle
(``idle_rows_read_s``). The subscribers' set-up (their first ListTables) is before go. Rows
read of one table come from MariaDB's TABLE_STATISTICS (the bench turns ``userstat`` on) or
MySQL's performance_schema (table_rows_read).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bench import smoke
from bench.database import (
    PAYLOAD,
    check_lifecycle,
    connect,
    create_table,
    execute,
    make_digits,
    message_comment,
)
from bench.errors import BenchError
from bench.measure import Throughput, cpu_meter, run_timeout_s
from bench.processes import CTX, Flag, ServerProcess, Workers, report

CLIENT_TIMEOUT_S = 30.0
HANDOVER_TIMEOUT_S = 600.0  # CreateSubscription from_start of the full mode's 1M rows
LEAVE_POLL_S = 0.01  # how often an idle subscriber checks whether its group is done
GROUPS = 4  # subscriptions of the fan-out table
SUBSCRIBERS = 2  # subscriber processes per group (and of the baseline, and of the filter)
BATCH = 100  # vt_batch_size of every table here
FILTER = "region = 'eu'"
FILTER_EVERY = 100  # one row in this many matches FILTER (1 %)
SIZES = {  # rows of the baseline and fan-out tables; rows of the filter table
    "quick": {"rows": 20_000, "filter": 100_000},
    "full": {"rows": 50_000, "filter": 1_000_000},
    "smoke": smoke.FANOUT,
}
# The lazy fan-out against the baseline, rounds side by side (the order alternating): the
# lazy figures are their medians (``fanout_lazy_*``, with ``..._spread`` and ``..._rounds``).
LAZY_ROUNDS = {"quick": 5, "full": 5, "smoke": 1}
INSERT_CHUNK_ROWS = 100_000
IDLE_SAMPLE_S = 0.5  # how long the idle rows read are counted before the filtered drain
REGION_COLUMNS = "region varchar(8) not null default 'us'"
# Rows read, server-wide: InnoDB's counter (MySQL; MariaDB 10.6+ no longer has it), else
# MariaDB's Rows_read (rows the SQL layer read from any engine, temporary tables excepted:
# all InnoDB here, the message and state tables and the subscriptions' definitions).
COUNTERS = ("Innodb_rows_read", "Rows_read")
# Rows written, server-wide: InnoDB's counters (MySQL), else the handler's (MariaDB 10.6+, whose
# Handler_write and Handler_update leave out internal temporary tables: Handler_tmp_*)
WRITE_COUNTERS = (
    ("Innodb_rows_inserted", "Innodb_rows_updated", "Innodb_rows_deleted"),
    ("Handler_write", "Handler_update", "Handler_delete"),
)


@dataclass
class FanoutResult:
    """The section's figures; a run left out (None) was not measured."""

    baseline: Throughput | None = None
    groups: list[Throughput] = field(default_factory=list)  # one per subscription
    drain_all_s: float = 0.0  # go -> the last group drained
    commit_s: float = 0.0  # the COMMIT of the fan-out backlog (inside the interval)
    filtered: Throughput | None = None
    filter_rows: int = 0  # rows of the filter table
    handover_s: float = 0.0  # CreateSubscription from_start, answered
    handover_rows_read: int = 0  # rows read while it ran
    drain_rows_read: int = 0  # rows read during the filtered drain
    baseline_rows_read: int = 0  # rows read during the baseline's drain
    fanout_rows_read: int = 0  # rows read during the fan-out run (hand-over and deliveries)
    idle_rows_read_s: float = 0.0  # rows read a second with nothing running
    counter: str = ""  # the status counter of the rows read (COUNTERS)
    # rows of the filtered message table read during its drain (table_rows_read; None: the
    # server cannot count rows per table)
    drain_table_rows_read: int | None = None
    # rows the database wrote during the fan-out run (WRITE_COUNTERS), and the rows its
    # subscriptions' state tables still hold after it (each one a DELETE of the purge later)
    fanout_rows_written: int = 0
    fanout_state_rows_left: int = 0
    lazy: FanoutResult | None = None  # the fan-out run again, its subscriptions state_rows=lazy
    # every lazy round (LAZY_ROUNDS; the first is ``lazy``), each with its own baseline
    lazy_rounds: list[FanoutResult] = field(default_factory=list)

    @property
    def slowest(self) -> Throughput | None:
        return min(self.groups, key=lambda g: g.msgs_s) if self.groups else None

    @property
    def fanout_ratio(self) -> float | None:
        slowest = self.slowest
        return slowest.msgs_s / self.baseline.msgs_s if slowest and self.baseline else None

    @property
    def filter_ratio(self) -> float | None:
        f = self.filtered
        return f.msgs_s / self.baseline.msgs_s if f and self.baseline else None

    @property
    def fanout_cpu_ratio(self) -> float | None:
        """CPU (database + server + subscribers) of one subscription delivery over one of the
        baseline's default-group deliveries: the fan-out run's database and server CPU and
        every group's subscribers', over its deliveries (GROUPS x rows)."""
        b = self.baseline
        delivered = sum(g.messages for g in self.groups)
        if not (b and b.messages and b.cpu_s and delivered):
            return None
        fan = sum(sum(g.cpu_s.values()) for g in self.groups) / delivered
        return fan / (sum(b.cpu_s.values()) / b.messages)

    @property
    def writes_per_msg(self) -> float | None:
        """Rows written per message a subscription settled in the fan-out run: the run's
        writes (the hand-over, deliveries, acks) and the DELETEs the purge owes the state rows
        left, over the subscriptions' deliveries. The message table's own purge is left out
        (a table pays it once, with or without subscriptions)."""
        delivered = sum(g.messages for g in self.groups)
        if not delivered:
            return None
        return (self.fanout_rows_written + self.fanout_state_rows_left) / delivered

    @property
    def aggregate_ratio(self) -> float | None:
        """The GROUPS subscriptions' rates summed, over the baseline's default group alone."""
        b = self.baseline
        return sum(g.msgs_s for g in self.groups) / b.msgs_s if b and self.groups else None

    @property
    def filter_rows_ratio(self) -> float | None:
        """Rows read per delivered message of the filtered subscription over the fan-out's
        unfiltered ones (its run's rows read over its deliveries)."""
        delivered = sum(g.messages for g in self.groups)
        per_filtered = self.rows_read_per_msg
        if per_filtered is None or not delivered or not self.fanout_rows_read:
            return None
        return per_filtered / (self.fanout_rows_read / delivered)

    @property
    def rows_read_per_msg(self) -> float | None:
        """Of the filtered drain: rows read over the messages delivered."""
        f = self.filtered
        return self.drain_rows_read / f.messages if f and f.messages else None

    @property
    def table_rows_read_per_msg(self) -> float | None:
        """Of the filtered drain: rows of the message table (not of its state table) read
        over the messages delivered: what the filter's poll costs."""
        f = self.filtered
        if self.drain_table_rows_read is None or not (f and f.messages):
            return None
        return self.drain_table_rows_read / f.messages

    def lazy_figure(self, name: str) -> tuple[float | None, list[float]]:
        """A lazy figure (a property's ``name``) as the median of the lazy rounds, and each
        round's (those measured)."""
        rounds = [v for r in self.lazy_rounds if (v := getattr(r, name)) is not None]
        return (statistics.median(rounds) if rounds else None), rounds

    def as_dict(self) -> dict[str, Any]:
        b, slowest = self.baseline, self.slowest
        delivered = sum(g.messages for g in self.groups)
        return {
            "baseline": b.as_dict() if b else None,
            "groups": [g.as_dict() for g in self.groups],
            "slowest_msgs_s": round(slowest.msgs_s) if slowest else None,
            "drain_all_s": round(self.drain_all_s, 3),
            "commit_s": round(self.commit_s, 3),
            "filtered": self.filtered.as_dict() if self.filtered else None,
            "filter_rows": self.filter_rows,
            "filter": FILTER,
            "handover_s": round(self.handover_s, 3),
            "handover_rows_read": self.handover_rows_read,
            "drain_rows_read": self.drain_rows_read,
            "drain_table_rows_read": self.drain_table_rows_read,
            "baseline_rows_read_per_msg": (
                round(self.baseline_rows_read / b.messages, 2) if b and b.messages else None
            ),
            "fanout_rows_read_per_msg": (
                round(self.fanout_rows_read / delivered, 2) if delivered else None
            ),
            "idle_rows_read_s": round(self.idle_rows_read_s, 1),
            "rows_read_counter": self.counter,
            "fanout_rows_written": self.fanout_rows_written,
            "fanout_state_rows_left": self.fanout_state_rows_left,
            "fanout_cpu_us_per_delivery": (
                round(sum(sum(g.cpu_s.values()) for g in self.groups) / delivered * 1e6, 1)
                if delivered
                else None
            ),
            "baseline_cpu_us_per_delivery": (
                round(sum(b.cpu_s.values()) / b.messages * 1e6, 1) if b and b.messages else None
            ),
            "lazy": self.lazy.as_dict() if self.lazy else None,
        }


@dataclass(frozen=True)
class Setup:
    """Where the section runs: the main msgtable server, its database and the run's table
    settings; ``monitor`` a connection of the bench's own for the status counters."""

    server: ServerProcess
    dsn: str
    poller_interval_s: float
    postpone_after_s: float | None
    db_pid: int | None
    monitor: Any

    def comment(self, extra: str = "") -> str:
        return (
            message_comment(BATCH, self.poller_interval_s, postpone_after_s=self.postpone_after_s)
            + extra
        )

    def rows_read(self) -> int:
        return rows_read(self.monitor)


# -- subscribers ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupSpec:
    address: str
    table: str
    subscription: str  # "": the table's default group
    target: int  # the group is done once its subscribers received this many together
    subscribe_after_go: bool  # True: subscribe at go (the rows are there already)


@dataclass
class Shared:
    """Cross-process state of one group's subscribers."""

    counter: Any  # messages received by the group's subscribers together
    done: Flag  # set once the group's target is reached: its subscribers leave

    @classmethod
    def new(cls) -> Shared:
        return cls(CTX.Value("q", 0), Flag())


def subscriber_worker(
    spec: GroupSpec, shared: Shared, name: str, ready: Any, go: Any, results: Any
) -> None:
    """Receive batches of one group and ack each (ack_async) until the group has them all."""

    def work() -> dict[str, Any]:
        from msgtable.client import Client

        ids = array("q")
        batches = 0
        with Client(spec.address, timeout_s=CLIENT_TIMEOUT_S) as client:
            client.list_tables()  # connected before the clock starts
            if spec.subscribe_after_go:
                ready.put(name)
                go.wait()
                sub = client.subscribe(spec.table, subscription=spec.subscription)
            else:
                sub = client.subscribe(spec.table, subscription=spec.subscription)
                ready.put(name)
                go.wait()
            with sub:

                def leave() -> None:
                    shared.done.wait(LEAVE_POLL_S)
                    sub.close()

                threading.Thread(target=leave, daemon=True).start()
                answered = [0.0]  # when the last ack call returned (set on the ack thread)

                def note_answer(_: object) -> None:
                    answered[0] = time.monotonic()

                for batch in sub.batches():
                    sub.ack_async(batch).add_done_callback(note_answer)
                    ids.extend(int(m.id) for m in batch)  # type: ignore[call-overload]
                    batches += 1
                    with shared.counter.get_lock():
                        shared.counter.value += len(batch)
                        reached = shared.counter.value >= spec.target
                    if reached:
                        shared.done.set()
                        break
                sub.flush_acks(CLIENT_TIMEOUT_S)  # every ack answered: the clock stops here
                acked, ack_calls = sub.acked, sub.ack_calls
                if not shared.done.is_set():
                    group = spec.subscription or "the default group"
                    raise BenchError(
                        f"the server ended the stream of {spec.table} ({group}) after "
                        f"{len(ids)} messages here, {shared.counter.value} of {spec.target} "
                        "in the group"
                    )
        return {
            "ids": ids.tobytes(),
            "acked": acked,
            "batches": batches,
            "ack_calls": ack_calls,
            "last": answered[0],
        }

    report(name, results, work)


@dataclass
class Drained:
    """One group's part of a drain."""

    ids: array[int]
    acked: int
    batches: int
    ack_calls: int
    seconds: float  # go -> its last ack's answer
    cpu_s: float  # its subscribers' CPU seconds


def _drain(
    setup: Setup,
    groups: dict[str, GroupSpec],
    at_go: Callable[[], None] | None = None,
    table_read: Callable[[], int | None] | None = None,
) -> tuple[dict[str, Drained], dict[str, float], int, int | None]:
    """SUBSCRIBERS processes for each group until every group has its target; ``at_go`` (if
    given) runs right after go (the fan-out's COMMIT). Returns each group's part, the CPU
    seconds of the database and the server over the whole drain, and the rows the database
    read from go to the last answer. The workers' set-up (their first ListTables reads rows
    of every table: counts of dead messages, of each subscription's lag) is before go.
    ``table_read`` (if given) counts the rows read of one table; the last value returned is
    its difference over the same interval (None: not counted)."""
    server, db_pid = setup.server, setup.db_pid
    shared = {g: Shared.new() for g in groups}
    with Workers() as workers:
        for g, spec in groups.items():
            for k in range(SUBSCRIBERS):
                workers.start(f"{g}.sub{k}", subscriber_worker, spec, shared[g])
        workers.wait_ready()
        with cpu_meter(database=db_pid, server=server.pid) as cpu:
            read_before = setup.rows_read()
            table_before = table_read() if table_read else None
            start = time.monotonic()
            workers.go.set()
            if at_go is not None:
                at_go()
            try:
                results = workers.collect(run_timeout_s(sum(s.target for s in groups.values())))
            except BenchError as exc:
                server.check_alive()
                got = ", ".join(f"{g} {shared[g].counter.value}" for g in groups)
                raise BenchError(f"{exc}\nreceived by group: {got}") from None
            read = setup.rows_read() - read_before
            table_after = table_read() if table_read else None
    table_delta = (
        table_after - table_before if table_before is not None and table_after is not None else None
    )
    if not db_pid:
        del cpu["database"]
    out: dict[str, Drained] = {}
    for g in groups:
        mine = [r for name, r in results.items() if name.rpartition(".")[0] == g]
        ids = array("q")
        for r in mine:
            ids.frombytes(r["ids"])
        out[g] = Drained(
            ids,
            sum(r["acked"] for r in mine),
            sum(r["batches"] for r in mine),
            sum(r["ack_calls"] for r in mine),
            max(r["last"] for r in mine) - start,
            sum(r["cpu_s"] for r in mine),
        )
    return out, cpu, read, table_delta


def _check(what: str, d: Drained, expected: set[int]) -> None:
    """Every expected id received exactly once by the group, and every one acked."""
    distinct = set(d.ids)
    if len(distinct) != len(d.ids):
        raise BenchError(f"{what}: {len(d.ids) - len(distinct)} messages received more than once")
    if d.acked != len(d.ids):
        raise BenchError(f"{what}: {len(d.ids)} messages received but {d.acked} acked")
    if distinct != expected:
        raise BenchError(
            f"{what}: {len(expected - distinct)} of {len(expected)} messages never arrived, "
            f"{len(distinct - expected)} arrived that should not have"
        )


def _throughput(kind: str, d: Drained, cpu: dict[str, float], note: str) -> Throughput:
    return Throughput(
        kind,
        BATCH,
        SUBSCRIBERS,
        len(d.ids),
        d.seconds,
        note=f"{note}; {len(d.ids) / max(d.batches, 1):.1f} messages a batch, "
        f"{d.batches / max(d.ack_calls, 1):.1f} batches a MessageAck",
        cpu_s={**cpu, "subscribers": d.cpu_s},
    )


# -- the database ----------------------------------------------------------------------------
def rows_read(cur: Any) -> int:
    """Rows read by the database server since it started (server-wide; see COUNTERS)."""
    cur.execute("SHOW GLOBAL STATUS WHERE Variable_name IN (%s, %s)", COUNTERS)
    got = {name: int(value) for name, value in cur.fetchall()}
    for name in COUNTERS:
        if name in got:
            return got[name]
    raise BenchError(f"the database server has none of the status counters {COUNTERS}")


def count_rows_per_table(cur: Any) -> bool:
    """Turn on the server's rows-read count per table where it needs it (MariaDB's userstat;
    MySQL's performance_schema counts without asking). False: it cannot count (no such
    variable or no right to set it)."""
    cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN ('userstat', 'performance_schema')")
    have = {name: str(value).upper() for name, value in cur.fetchall()}
    if "userstat" not in have:  # MySQL: performance_schema.table_io_waits_summary_by_table
        return have.get("performance_schema") == "ON"
    if have["userstat"] != "ON":
        try:
            cur.execute("SET GLOBAL userstat = 1")
        except Exception:  # an account without the right: the figure is left out
            return False
    return True


def table_rows_read(cur: Any, table: str) -> int | None:
    """Rows of ``table`` (in the connection's database) the server has read so far: MariaDB's
    information_schema.TABLE_STATISTICS (userstat) or MySQL's performance_schema (a fetch is
    a row read); None where neither can tell."""
    queries = (
        "SELECT ROWS_READ FROM information_schema.TABLE_STATISTICS "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
        "SELECT COUNT_READ FROM performance_schema.table_io_waits_summary_by_table "
        "WHERE OBJECT_SCHEMA = DATABASE() AND OBJECT_NAME = %s",
    )
    for sql in queries:
        try:
            cur.execute(sql, [table])
        except Exception:  # the server has no such table
            continue
        row = cur.fetchone()
        return int(row[0]) if row else 0  # no row yet: nothing read since counting began
    return None


def rows_written(cur: Any) -> int:
    """Rows the database server inserted, updated and deleted since it started (server-wide;
    see WRITE_COUNTERS)."""
    names = [n for group in WRITE_COUNTERS for n in group]
    cur.execute(
        f"SHOW GLOBAL STATUS WHERE Variable_name IN ({', '.join(['%s'] * len(names))})", names
    )
    got = {name: int(value) for name, value in cur.fetchall()}
    for group in WRITE_COUNTERS:
        if all(n in got for n in group):
            return sum(got[n] for n in group)
    raise BenchError(f"the database server has none of the status counters {WRITE_COUNTERS}")


def rows_read_counter(cur: Any) -> str:
    """Which of COUNTERS the database server has (the first)."""
    cur.execute("SHOW GLOBAL STATUS WHERE Variable_name IN (%s, %s)", COUNTERS)
    have = {name for name, _ in cur.fetchall()}
    return next((n for n in COUNTERS if n in have), "")


def insert_rows(cur: Any, table: str, count: int, region: bool = False) -> None:
    """``count`` due rows (ids 0 .. count - 1) through ``cur``, as bench.database.bulk_insert
    does; with ``region``, the rows whose id is a multiple of FILTER_EVERY are 'eu'. Commits
    nothing: the caller decides (autocommit, or one transaction)."""
    source = make_digits(cur, f"bench_digits_{os.getpid()}")
    columns, extra = "", ""
    if region:
        columns, extra = ", region", f", if(mod(%s + s.n, {FILTER_EVERY}) = 0, 'eu', 'us')"
    for lo in range(0, count, INSERT_CHUNK_ROWS):
        rows = min(INSERT_CHUNK_ROWS, count - lo)
        params: list[Any] = [lo, PAYLOAD] + ([lo] if region else []) + [rows]
        cur.execute(
            f"insert into {table}(id, priority, time_next, epoch, message{columns}) "
            f"select %s + s.n, 0, 0, 0, %s{extra} from ({source}) s where s.n < %s",
            params,
        )


@contextlib.contextmanager
def _table(setup: Setup, table: str, comment: str, columns: str = "") -> Iterator[None]:
    """A message table (bench.database.create_table; ``columns`` added), dropped afterwards
    with its subscriptions (DropSubscription: definition and state table)."""
    from msgtable.client import Client

    create_table(setup.dsn, table, comment)
    if columns:
        execute(setup.dsn, f"alter table {table} {columns}")
    try:
        yield
    finally:
        with Client(setup.server.address, timeout_s=CLIENT_TIMEOUT_S) as client:
            for sub in client.list_subscriptions(table):
                client.drop_subscription(table, sub.subscription)
        execute(setup.dsn, f"drop table if exists {table}")


# -- the runs ------------------------------------------------------------------------------------
def baseline(setup: Setup, rows: int, result: FanoutResult, nth: int = 0) -> None:
    """The default group of a table without subscriptions drains ``rows`` committed rows
    (``nth`` round: a table of its own for each, as a table made anew under the same name is
    not the server's to know at once)."""
    table = f"fan_base{nth or ''}"
    with _table(setup, table, setup.comment()):
        with contextlib.closing(connect(setup.dsn)) as conn, conn.cursor() as cur:
            insert_rows(cur, table, rows)
        spec = GroupSpec(setup.server.address, table, "", rows, subscribe_after_go=True)
        drained, cpu, read, _ = _drain(setup, {"base": spec})
        d = drained["base"]
        _check("baseline", d, set(range(rows)))
        check_lifecycle(setup.dsn, table, rows)
    result.baseline_rows_read = read
    result.baseline = _throughput(
        "fanout_base",
        d,
        cpu,
        f"{rows:,} due rows drained by the default group, no subscription; "
        f"{read / rows:.2f} rows read a message",
    )


def fanout(
    setup: Setup, rows: int, result: FanoutResult, state_rows: str = "eager", nth: int = 0
) -> None:
    """GROUPS subscriptions of one table handed ``rows`` rows by the server's fan-out, the
    backlog committed at go (``state_rows="lazy"``: served from their cursors, their state
    tables left empty by acks in order, so not checked row by row)."""
    from msgtable.client import Client

    table = ("fan_out" if state_rows == "eager" else "fan_lazy") + (f"{nth}" if nth else "")
    names = [f"g{i}" for i in range(GROUPS)]
    with _table(setup, table, setup.comment(",vt_default_group=off")):
        with Client(setup.server.address, timeout_s=CLIENT_TIMEOUT_S) as client:
            for name in names:
                client.create_subscription(table, name, state_rows=state_rows)
        with contextlib.closing(connect(setup.dsn)) as conn:
            with conn.cursor() as cur:
                cur.execute("begin")
                insert_rows(cur, table, rows)  # not committed: nobody sees them before go

            def commit() -> None:
                began = time.monotonic()
                conn.commit()
                result.commit_s = time.monotonic() - began

            groups = {
                n: GroupSpec(setup.server.address, table, n, rows, subscribe_after_go=False)
                for n in names
            }
            written = rows_written(setup.monitor)
            drained, cpu, result.fanout_rows_read, _ = _drain(setup, groups, at_go=commit)
            result.fanout_rows_written = rows_written(setup.monitor) - written
        result.fanout_state_rows_left = sum(
            int(execute(setup.dsn, f"select count(*) from {table}__{n}")[0][0]) for n in names
        )
        unseen = execute(setup.dsn, f"select count(*) from {table} where time_fanout is null")
        if int(unseen[0][0]):
            raise BenchError(f"{unseen[0][0]} rows of {table} were never handed over")
        share = {k: v / GROUPS for k, v in cpu.items()}  # the database's and server's CPU
        for n in names:
            d = drained[n]
            _check(f"subscription {n}", d, set(range(rows)))
            if state_rows == "eager":
                check_lifecycle(setup.dsn, f"{table}__{n}", rows)  # its state table
            result.groups.append(
                _throughput(
                    "fanout_group",
                    d,
                    share,
                    f"subscription {n}: {rows:,} rows handed over by the fan-out after go; "
                    f"database and server CPU: 1/{GROUPS} of the run's",
                )
            )
    result.drain_all_s = max(d.seconds for d in drained.values())


def _filter_columns(index: str) -> str:
    """A filter table's columns beyond a plain table's, with its index on ``index``."""
    name = "_".join(c.strip() for c in index.split(",")).replace("time_", "")
    return (
        f"add column ({REGION_COLUMNS}, time_fanout bigint null), "
        f"add index {name}_idx({index}), add index fanout_idx(time_fanout)"
    )


def _insert_filtered(cur: Any, table: str, rows: int) -> None:
    """``rows`` rows, one in FILTER_EVERY matching FILTER, and the table's statistics."""
    insert_rows(cur, table, rows, region=True)
    cur.execute(f"analyze table {table}")
    cur.fetchall()


def _drain_matches(
    setup: Setup,
    table: str,
    result: FanoutResult,
    expected: set[int],
    per_table: bool,
    kind: str,
) -> tuple[Drained, dict[str, float]]:
    """A filter run's drain of its subscription "eu" on ``table``: the idle rows read first,
    then at go its subscribers drain ``expected`` (rows read into ``result``), checked."""
    idle = setup.rows_read()
    time.sleep(IDLE_SAMPLE_S)
    result.idle_rows_read_s = (setup.rows_read() - idle) / IDLE_SAMPLE_S
    spec = GroupSpec(setup.server.address, table, "eu", len(expected), subscribe_after_go=True)
    drained, cpu, result.drain_rows_read, result.drain_table_rows_read = _drain(
        setup,
        {"eu": spec},
        table_read=(lambda: table_rows_read(setup.monitor, table)) if per_table else None,
    )
    d = drained["eu"]
    _check(f"the filtered {kind}subscription", d, expected)
    return d, cpu


def filtered(setup: Setup, rows: int, result: FanoutResult, per_table: bool = False) -> None:
    """A from_start subscription with FILTER on a table of ``rows`` rows (see the module
    docstring); ``per_table``: the server counts rows read per table (count_rows_per_table)."""
    from msgtable.client import Client

    table = "fan_filter"
    expected = set(range(0, rows, FILTER_EVERY))
    with _table(setup, table, setup.comment(",vt_default_group=off"), _filter_columns("region")):
        with contextlib.closing(connect(setup.dsn)) as conn, conn.cursor() as cur:
            _insert_filtered(cur, table, rows)
        with Client(setup.server.address, timeout_s=HANDOVER_TIMEOUT_S) as client:
            before = setup.rows_read()
            began = time.monotonic()
            got = client.create_subscription(table, "eu", filter=FILTER, from_start=True)
            result.handover_s = time.monotonic() - began
            result.handover_rows_read = setup.rows_read() - before
        if got != len(expected):
            raise BenchError(
                f"the from_start subscription got {got:,} rows, {len(expected):,} match"
            )
        d, cpu = _drain_matches(setup, table, result, expected, per_table, "")
        check_lifecycle(setup.dsn, f"{table}__eu", len(expected))  # its state table
    result.filter_rows = rows
    result.filtered = _throughput(
        "fanout_filter",
        d,
        cpu,
        f"{len(expected):,} of {rows:,} rows match {FILTER} (indexed), handed over from_start "
        f"in {result.handover_s:.2f} s reading {result.handover_rows_read:,} rows; the drain "
        f"read {result.drain_rows_read:,} rows",
    )


def filtered_lazy(setup: Setup, rows: int, result: FanoutResult, per_table: bool = False) -> None:
    """The filtered run for a lazy subscription (``result``: the first lazy round's): it is
    created with FILTER before ``rows`` rows are inserted, the fan-out numbers them with no
    subscriber connected (waited for, outside the count), then at go its subscribers drain
    the matches, which its scan reads from the message table itself through the index
    (region, time_fanout) that the subscriptions guide tells such a filter to have."""
    from msgtable.client import Client

    table = "fan_filter_lazy"
    expected = set(range(0, rows, FILTER_EVERY))
    columns = _filter_columns("region, time_fanout")
    with _table(setup, table, setup.comment(",vt_default_group=off"), columns):
        with Client(setup.server.address, timeout_s=HANDOVER_TIMEOUT_S) as client:
            client.create_subscription(table, "eu", filter=FILTER, state_rows="lazy")
        with contextlib.closing(connect(setup.dsn)) as conn, conn.cursor() as cur:
            _insert_filtered(cur, table, rows)
            deadline = time.monotonic() + HANDOVER_TIMEOUT_S
            while True:  # the fan-out numbers every row (msgtable.store.sequences)
                cur.execute(f"select count(*) from {table} where time_fanout is null")
                left = cur.fetchone()[0]
                if not left:
                    break
                if time.monotonic() > deadline:
                    raise BenchError(f"the fan-out left {left:,} of {rows:,} rows unnumbered")
                time.sleep(0.05)
        d, cpu = _drain_matches(setup, table, result, expected, per_table, "lazy ")
    result.filter_rows = rows
    result.filtered = _throughput(
        "fanout_filter_lazy",
        d,
        cpu,
        f"{len(expected):,} of {rows:,} rows match {FILTER}, a lazy subscription's scan "
        f"through (region, time_fanout); the drain read {result.drain_rows_read:,} rows",
    )


def run(
    server: ServerProcess,
    dsn: str,
    mode: str,
    poller_interval_s: float,
    *,
    postpone_after_s: float | None,
    db_pid: int | None = None,
) -> FanoutResult:
    """The baseline, the fan-out and the filter runs, one after the other, on ``server``."""
    sizes = SIZES[mode]
    result = FanoutResult()
    with contextlib.closing(connect(dsn)) as monitor, monitor.cursor() as cur:
        setup = Setup(server, dsn, poller_interval_s, postpone_after_s, db_pid, cur)
        result.counter = rows_read_counter(cur)
        per_table = count_rows_per_table(cur)
        baseline(setup, sizes["rows"], result)
        fanout(setup, sizes["rows"], result)
        result.lazy = FanoutResult(baseline=result.baseline)
        fanout(setup, sizes["rows"], result.lazy, state_rows="lazy")
        result.lazy_rounds.append(result.lazy)
        for n in range(1, LAZY_ROUNDS[mode]):  # more rounds, the other one first each time
            base, lazy = FanoutResult(), FanoutResult()
            if n % 2:
                fanout(setup, sizes["rows"], lazy, state_rows="lazy", nth=n)
                baseline(setup, sizes["rows"], base, nth=n)
            else:
                baseline(setup, sizes["rows"], base, nth=n)
                fanout(setup, sizes["rows"], lazy, state_rows="lazy", nth=n)
            lazy.baseline = base.baseline
            result.lazy_rounds.append(lazy)
        filtered(setup, sizes["filter"], result, per_table)
        filtered_lazy(setup, sizes["filter"], result.lazy, per_table)
    return result
