"""Table events in the fault suite: a source producer that logs what it committed, a drainer
that reads the capture table's events through the run's faults, and the checker that judges
the event table (read with its own SQL) against the producer's log.

The producer (``SourceProducer``) writes SOURCE (INSERT, UPDATE, DELETE; each change gives
the row a fresh version ``v``, and ``note`` = ``n<v>``) and SOURCE_T, in transactions of a
few changes; about one in ROLLBACK_EVERY it rolls back on purpose. Each committed
transaction also writes its number into TXLOG (not captured), in the same transaction: a
COMMIT whose answer was lost (the database restarting) is looked up there once the database
answers again, so the log holds exactly the changes that committed, in commit order. A third
of the way in it runs ``ALTER TABLE SOURCE ADD COLUMN extra``, two thirds of the way in
``TRUNCATE TABLE SOURCE_T`` (each once: one in doubt is looked up in information_schema / by
the table's count).

The invariants (``CaptureChecker.judge``):

- every committed change is exactly one event: the same table, kind, primary key and
  before/after versions and notes (never lost, never repeated), and no event is of a change
  that did not commit (a rolled-back or failed transaction's versions never appear);
- the events of a source row (its ``row_key``) are in the table in its commit order;
- the ALTER and the TRUNCATE are one event each, and no other DDL event appears;
- the drainer (a subscriber of the capture table's default group, through the run's
  subscriber faults) received every event, every event row ends acked, no event was
  delivered after its ack committed (DELIVERY_SLACK_S, as for push), and a row_key's first
  deliveries come in event order.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from msgtable.client import Client, Message, Subscription
from msgtable.core.events import capture_table_ddl
from msgtable.errors import MsgtableError

from .checker import committed_by

EVENTS = "chaos_events"
SOURCE, SOURCE_T, TXLOG = "chaos_src", "chaos_src_t", "chaos_txlog"
PATTERN = "chaos_src*"
ROLLBACK_EVERY = 10
DELIVERY_SLACK_S = 0.5
# the server stamps time_acked a moment after the client's call began (clocks of one machine)
ACK_STAMP_SLACK_NS = 100_000_000


def events_ddl(comment: str) -> str:
    """schema/events.sql's table as EVENTS with ``comment``."""
    return capture_table_ddl(EVENTS, comment)


SOURCE_DDL = (
    f"create table {SOURCE}(id int primary key, v int not null, note varchar(32))",
    f"create table {SOURCE_T}(id int primary key, v int not null, note varchar(32))",
    f"create table {TXLOG}(tx int primary key)",
)

# a change: (table, kind, id, before v, after v); a DDL: (table, kind, None, None, None)
Change = tuple[str, str, int | None, int | None, int | None]


class SourceProducer(threading.Thread):
    """See the module docstring. ``log`` is what committed, in commit order; ``failed`` the
    versions of changes that did not (rolled back on purpose, or lost with their
    transaction)."""

    def __init__(self, dsn: str, changes: int, produce_for_s: float) -> None:
        super().__init__(name="source-producer", daemon=True)
        self.db = sa.create_engine(dsn, pool_pre_ping=True)
        self.changes, self.pace_s = changes, produce_for_s / changes
        self.log: list[Change] = []
        self.failed: set[int] = set()
        self.rolled_back = 0
        self.in_doubt = 0  # commits whose answer was lost (looked up in TXLOG)
        self.retries = 0
        self.took_s = 0.0
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._live: dict[tuple[str, int], int] = {}  # (table, id) -> its v
        self._v = 0
        self._next_id = 1
        self._rng = random.Random(7)
        self._tx = 0  # the last transaction's number (TXLOG's key)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # a bug of the producer: the verdict says so
            self.error = exc
        finally:
            self.done.set()
            self.db.dispose()

    def _run(self) -> None:
        began = time.monotonic()
        ddl = {self.changes // 3: "alter", 2 * self.changes // 3: "truncate"}
        while len(self.log) < self.changes:
            for at in [at for at in ddl if len(self.log) >= at]:
                self._ddl(ddl.pop(at))
            self._tx += 1
            tx = self._tx
            self._transaction(tx, self._plan(tx), rollback=tx % ROLLBACK_EVERY == 0)
            # on schedule (spread over changes * pace_s), never faster; behind it, at once
            due = began + self.pace_s * len(self.log)
            time.sleep(max(0.0, due - time.monotonic()) * self._rng.uniform(0.5, 1.5))
        self.took_s = time.monotonic() - began

    def _transaction(self, tx: int, plan: list[Change], rollback: bool) -> None:
        """Commit (or roll back) ``plan`` as transaction ``tx``, riding out the database's
        restarts: a transaction that did not commit is made again with fresh versions."""
        while True:
            try:
                if self._commit(tx, plan, rollback):
                    self._apply(plan)
                else:
                    self.failed.update(c[4] for c in plan if c[4] is not None)
                return
            except sa.exc.DBAPIError:
                self.retries += 1
                time.sleep(0.3)
                while (committed := self._committed(tx)) is None:
                    time.sleep(0.3)  # the database is still away
                self.in_doubt += 1
                if committed:
                    self._apply(plan)
                    return
                self.failed.update(c[4] for c in plan if c[4] is not None)
                plan = self._plan(tx, plan)

    def _version(self) -> int:
        self._v += 1
        return self._v

    def _plan(self, tx: int, again: Sequence[Change] = ()) -> list[Change]:
        """The changes of transaction ``tx`` (``again``: a failed plan's, with fresh
        versions)."""
        if again:
            return [
                (t, k, i, b, None if k == "delete" else self._version()) for t, k, i, b, _ in again
            ]
        out: list[Change] = []
        touched: set[tuple[str, int]] = set()
        for _ in range(self._rng.randint(1, 6)):
            table = SOURCE_T if self._rng.random() < 0.1 else SOURCE
            live = [i for (t, i) in self._live if t == table and (t, i) not in touched]
            r = self._rng.random()
            if not live or r < 0.45:
                i = self._next_id
                self._next_id += 1
                out.append((table, "insert", i, None, self._version()))
            elif r < 0.8:
                i = self._rng.choice(live)
                out.append((table, "update", i, self._live[(table, i)], self._version()))
            else:
                i = self._rng.choice(live)
                out.append((table, "delete", i, self._live[(table, i)], None))
            touched.add((table, i))
        return out

    def _commit(self, tx: int, plan: Sequence[Change], rollback: bool) -> bool:
        """Run ``plan`` in one transaction; commit it (True) or roll it back (False)."""
        with self.db.connect() as conn:
            trans = conn.begin()
            for table, kind, i, _, after in plan:
                if kind == "insert":
                    sql = f"insert into {table}(id, v, note) values ({i}, {after}, 'n{after}')"
                elif kind == "update":
                    sql = f"update {table} set v = {after}, note = 'n{after}' where id = {i}"
                else:
                    sql = f"delete from {table} where id = {i}"
                conn.exec_driver_sql(sql)
            if rollback:
                trans.rollback()
                self.rolled_back += 1
                return False
            conn.exec_driver_sql(f"insert into {TXLOG} values ({tx})")
            trans.commit()
        return True

    def _committed(self, tx: int) -> bool | None:
        """Whether transaction ``tx`` committed (None: the database does not answer)."""
        try:
            with self.db.connect() as conn:
                row = conn.exec_driver_sql(f"select count(*) from {TXLOG} where tx = {tx}").first()
        except sa.exc.DBAPIError:
            return None
        return bool(row and row[0])

    def _apply(self, plan: Sequence[Change]) -> None:
        for table, kind, i, _, after in plan:
            assert i is not None
            if kind == "delete":
                del self._live[(table, i)]
            else:
                assert after is not None
                self._live[(table, i)] = after
        self.log += plan

    def _ddl(self, kind: str) -> None:
        if kind == "truncate" and not any(t == SOURCE_T for t, _ in self._live):
            # a row to truncate: a TRUNCATE in doubt is then known by the table's count
            self._tx += 1
            row = (SOURCE_T, "insert", self._next_id, None, self._version())
            self._next_id += 1
            self._transaction(self._tx, [row], rollback=False)
        table, sql = (
            (SOURCE, f"alter table {SOURCE} add column extra int")
            if kind == "alter"
            else (SOURCE_T, f"truncate table {SOURCE_T}")
        )
        while True:
            try:
                with self.db.connect() as conn:
                    conn.exec_driver_sql(sql)
                break
            except sa.exc.DBAPIError:
                self.retries += 1
                time.sleep(0.3)
                if self._ddl_done(kind):
                    self.in_doubt += 1
                    break
        if kind == "truncate":
            for key in [k for k in self._live if k[0] == SOURCE_T]:
                del self._live[key]
        self.log.append((table, kind, None, None, None))

    def _ddl_done(self, kind: str) -> bool:
        while True:
            try:
                with self.db.connect() as conn:
                    if kind == "alter":
                        sql = (
                            "select count(*) from information_schema.COLUMNS where TABLE_SCHEMA"
                            f" = database() and TABLE_NAME = '{SOURCE}' and COLUMN_NAME = 'extra'"
                        )
                        return bool(conn.exec_driver_sql(sql).scalar())
                    n = conn.exec_driver_sql(f"select count(*) from {SOURCE_T}").scalar()
                    had = any(t == SOURCE_T for t, _ in self._live)
                    return bool(had and n == 0)
            except sa.exc.DBAPIError:
                time.sleep(0.3)


@dataclass
class Event:
    id: int
    table: str
    kind: str
    pk: Any
    row_key: str
    before: Any
    after: Any
    time_acked: int | None

    def change(self) -> Change:
        if self.kind not in ("insert", "update", "delete"):
            return (self.table, self.kind, None, None, None)
        pk = self.pk["id"] if isinstance(self.pk, dict) else None
        before = self.before["v"] if isinstance(self.before, dict) else None
        after = self.after["v"] if isinstance(self.after, dict) else None
        return (self.table, self.kind, pk, before, after)

    def notes_right(self) -> bool:
        return all(
            values["note"] == f"n{values['v']}"
            for values in (self.before, self.after)
            if isinstance(values, dict)
        )


def read_events(db: sa.Engine) -> list[Event]:
    with db.connect() as conn:
        rows = conn.exec_driver_sql(
            "select id, source_table, kind, pk, row_key, before_values, after_values, "
            f"time_acked from {EVENTS} order by id"
        )
        return [
            Event(
                int(r[0]),
                str(r[1]),
                str(r[2]),
                None if r[3] is None else json.loads(r[3]),
                str(r[4]),
                None if r[5] is None else json.loads(r[5]),
                None if r[6] is None else json.loads(r[6]),
                r[7],
            )
            for r in rows
        ]


class Drainer(threading.Thread):
    """A subscriber of the capture table's default group: records each event as it comes
    off the stream (when, in the wall clock, to compare with ``time_acked``) and acks each
    batch. ``order`` ("kill", "stall", "late") is what it does with its next batch: a kill
    drops the batch unacked and stops like a dead process, a stall stops reading for
    ``stall_s`` first, a late ack acks after ``late_s`` (on a timer: the stream is read
    on)."""

    def __init__(self, name: str, targets: str, log: DrainLog) -> None:
        super().__init__(name=name, daemon=True)
        self.client = Client(targets, timeout_s=10, retry_for_s=120)
        self.log = log
        self.order: str | None = None
        self.stall_s = 5.0
        self.late_s = 6.0
        self.done = threading.Event()
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.sub: Subscription | None = None
        self._timers: list[threading.Timer] = []

    def run(self) -> None:
        try:
            self.sub = self.client.subscribe(EVENTS, max_in_flight=200)
            for batch in self.sub.batches():
                self.log.delivered(batch, self.name)
                order, self.order = self.order, None
                if order in ("kill", "stall"):
                    self._cancel_timers()  # a dead process makes no more calls
                    if order == "stall":  # stops reading: the stream backs up
                        self.stopping.wait(self.stall_s)
                    break
                if order == "late":  # its ack after its ack wait; the stream read on
                    timer = threading.Timer(self.late_s, self._ack, (batch,))
                    timer.daemon = True
                    self._timers.append(timer)
                    timer.start()
                else:
                    self._ack(batch)
                if self.stopping.is_set():
                    break
        except MsgtableError as exc:
            if not self.stopping.is_set():
                self.error = exc
        finally:
            self.client.close()
            self.done.set()

    def _ack(self, batch: Sequence[Message]) -> None:
        """Queue the batch's ack: the stream is never held up by an ack call (a delivery is
        recorded when it comes off the wire); one that fails comes again after its ack
        wait."""
        sub = self.sub
        if sub is None or self.done.is_set():
            return
        ids = [int(m.id) for m in batch]  # type: ignore[call-overload]
        began = time.time_ns()

        def answered(f: Any) -> None:
            self.log.acked(ids, began, None if f.exception() else time.time_ns())

        with contextlib.suppress(MsgtableError):
            future = sub.ack_async(list(batch))
            future.add_done_callback(answered)

    def _cancel_timers(self) -> None:
        for t in self._timers:
            t.cancel()

    def finish(self) -> None:
        self.stopping.set()
        self._cancel_timers()
        self.client.close()


@dataclass
class DrainLog:
    """What the drainers received: (wall ns, drainer) per event id; and their ack calls:
    (began, ended) in wall ns per event id (ended None: no answer came)."""

    deliveries: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    acks: dict[int, list[tuple[int, int | None]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def delivered(self, batch: Sequence[Message], name: str) -> None:
        now = time.time_ns()
        with self.lock:
            for m in batch:
                self.deliveries.setdefault(int(m.id), []).append((now, name))  # type: ignore[call-overload]

    def acked(self, ids: Sequence[int], began_ns: int, ended_ns: int | None) -> None:
        with self.lock:
            for i in ids:
                self.acks.setdefault(i, []).append((began_ns, ended_ns))

    def committed_by(self, i: int, time_acked: int) -> int:
        """The latest the ack that stamped ``time_acked`` committed: the stamp (taken as its
        call began), or the return of an ack call of ``i`` in flight at that stamp (its
        UPDATE may have waited for a send's lock); a call with no answer bounds nothing."""
        calls = [(began, end) for began, end in self.acks.get(i, []) if end is not None]
        return int(committed_by(time_acked, calls, ACK_STAMP_SLACK_NS))


@dataclass
class CaptureReport:
    changes: int = 0
    transactions_rolled_back: int = 0
    in_doubt: int = 0
    took_s: float = 0.0
    events: int = 0
    ddl: Counter[str] = field(default_factory=Counter)
    delivered: int = 0
    redelivered: int = 0
    findings: dict[str, list[object]] = field(default_factory=dict)

    def add(self, what: str, found: object) -> None:
        self.findings.setdefault(what, []).append(found)

    def summary(self) -> str:
        return (
            f"table events: {self.changes} committed source changes -> {self.events} events "
            f"(DDL {dict(self.ddl)}); {self.transactions_rolled_back} transactions rolled back, "
            f"{self.in_doubt} commits in doubt looked up, produced in {self.took_s:.0f}s; "
            f"{self.delivered} deliveries "
            f"({self.redelivered} again)"
        )


class CaptureChecker:
    """Judges the capture table against the producer's log (see the module docstring)."""

    def __init__(self, producer: SourceProducer, drained: DrainLog) -> None:
        self.producer = producer
        self.drained = drained

    def pending(self, db: sa.Engine) -> dict[str, list[int]]:
        """Changes committed without their event yet, events not acked yet."""
        events = read_events(db)
        got = Counter(e.change() for e in events)
        missing = [c for c in self.producer.log if not got[c]]
        out: dict[str, list[int]] = {}
        if missing:
            out["table events: changes without an event"] = [c[2] or 0 for c in missing]
        unacked = [e.id for e in events if e.time_acked is None]
        if unacked:
            out["table events: events not acked"] = unacked
        return out

    def history(self, change: Change, events: Sequence[Event]) -> str:
        """What the log and the event table say of a change's row."""
        table, kind, i, _, _ = change
        if i is None:  # a DDL: the table's
            ddl = [(e.id, e.kind, e.after) for e in events if e.table == table and e.pk is None]
            committed = [c for c in self.producer.log if c == change]
            return f"{table} {kind}: committed {committed}; DDL events {ddl}"
        log = [c for c in self.producer.log if c[0] == table and c[2] == i]
        found = [
            (e.id, e.kind, e.before, e.after, e.time_acked)
            for e in events
            if e.table == table and e.change()[2] == i
        ]
        return f"{table} id {i}: committed {log}; events {found}"

    def judge(self, db: sa.Engine) -> CaptureReport:
        return self.judge_events(read_events(db))

    def judge_events(self, events: list[Event]) -> CaptureReport:
        """The verdict on the event table's rows ``events`` (in id order)."""
        p = self.producer
        r = CaptureReport(
            changes=len(p.log),
            transactions_rolled_back=p.rolled_back,
            in_doubt=p.in_doubt,
            took_s=p.took_s,
            events=len(events),
        )
        want = Counter(p.log)
        got = Counter(e.change() for e in events)
        r.ddl = Counter(e.kind for e in events if e.kind not in ("insert", "update", "delete"))
        for c in sorted(want - got, key=str):
            r.add("committed change without its event", self.history(c, events))
        for c, n in sorted(got.items(), key=str):
            if n > 1 and want[c] == 1:
                r.add("change written more than once", f"{n} times: {self.history(c, events)}")
            if not want[c]:
                versions = {c[3], c[4]} - {None}
                what = (
                    "event of a change that did not commit"
                    if versions & p.failed
                    else "event of no change the producer made"
                )
                r.add(what, self.history(c, events))
        for e in events:
            if not e.notes_right():
                r.add("event with wrong values", (e.id, e.before, e.after))
        # commit order per row_key
        log_by_key: dict[tuple[str, int | None], list[Change]] = {}
        for c in p.log:
            log_by_key.setdefault((c[0], c[2]), []).append(c)
        ev_by_key: dict[str, list[Event]] = {}
        for e in events:
            ev_by_key.setdefault(e.row_key, []).append(e)
        for key, es in ev_by_key.items():
            seq = [e.change() for e in es]
            expected = log_by_key.get((seq[0][0], seq[0][2]), [])
            if seq != expected and Counter(seq) == Counter(expected):
                r.add("a row's events out of commit order", (key, [e.id for e in es], expected))
        if p.error is not None:
            r.add("the producer failed", repr(p.error))
        self._judge_deliveries(r, events)
        return r

    def _judge_deliveries(self, r: CaptureReport, events: Sequence[Event]) -> None:
        with self.drained.lock:
            deliveries = {i: list(ds) for i, ds in self.drained.deliveries.items()}
        r.delivered = sum(len(ds) for ds in deliveries.values())
        r.redelivered = r.delivered - len(deliveries)
        slack_ns = int(DELIVERY_SLACK_S * 1e9)
        first: dict[int, int] = {}
        for e in events:
            ds = deliveries.get(e.id)
            if not ds:
                r.add("event never delivered", e.id)
                continue
            first[e.id] = min(t for t, _ in ds)
            if e.time_acked is None:
                r.add("event not acked", e.id)
                continue
            committed = self.drained.committed_by(e.id, e.time_acked)
            if any(t > committed + slack_ns for t, _ in ds):
                story = [(f"{(t - e.time_acked) / 1e9:+.3f}s", who) for t, who in ds]
                if committed != e.time_acked:
                    story.append((f"{(committed - e.time_acked) / 1e9:+.3f}s", "ack returned"))
                r.add("event delivered after its ack committed", (e.id, "after its ack:", story))
        by_key: dict[str, list[int]] = {}
        for e in events:
            by_key.setdefault(e.row_key, []).append(e.id)
        for key, ids in by_key.items():
            firsts = [first[i] for i in ids if i in first]
            if firsts != sorted(firsts):
                r.add("a row_key's events first delivered out of order", (key, ids, firsts))
