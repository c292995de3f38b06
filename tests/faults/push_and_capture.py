"""Push and table events in the fault suite's run (tests/faults/test_chaos.py): their
tables, their moving parts, their hooks into the run's faults and their verdicts. The
judges are tests/faults/pushcheck.py and tests/faults/capturecheck.py.

- **Push**: PUSH (ordered by ``k``, batches of one, acked rows kept) is pushed, its default
  group, to a ChaosReceiver on loopback, which misbehaves on its own schedule; its producer
  is a chaos.Producer (the same kinds: about 1% poison, answered 422 by the receiver).
- **Table events**: EVENTS captures SOURCE and SOURCE_T (``chaos_src*``); a SourceProducer
  writes them (rolling some transactions back, one ALTER, one TRUNCATE); DRAINERS drainers
  read EVENTS and ack, and every subscriber fault of the run hits one of them too (a kill, a
  stall, a late ack). The server faults (SIGKILL, SIGTERM) and the database restart hit the
  follower, the pushers and the producers as they hit everything else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import sqlalchemy as sa

from msgtable.client import Client
from msgtable.core.tables import current_layout_ddl

from ..integration.helpers import comment
from ..waiting import wait_until
from .capturecheck import (
    EVENTS,
    PATTERN,
    SOURCE_DDL,
    CaptureChecker,
    CaptureReport,
    Drainer,
    DrainLog,
    SourceProducer,
    events_ddl,
    read_events,
)
from .chaos import ORDER_KEY, Producer, key_of
from .pushcheck import (
    ENDPOINT_TIMEOUT_S,
    SECRET,
    ChaosReceiver,
    PushChecker,
    PushReport,
    ReceiverFaults,
    read_push_rows,
)

PUSH = "chaos_push"
PUSH_MAX_IN_FLIGHT = 8
DRAINERS = 2


class PushAndCapture:
    """See the module docstring. ``total`` scales both (MSGTABLE_CHAOS_MESSAGES)."""

    def __init__(
        self, dsn: str, targets: str, total: int, produce_for_s: float, fields: dict[str, object]
    ) -> None:
        self.dsn, self.targets, self.fields = dsn, targets, fields
        self.push_total = max(200, total // 50)
        self.changes = max(300, total // 20)
        self.receiver = ChaosReceiver()
        self.receiver_faults = ReceiverFaults(self.receiver)
        self.push_checker = PushChecker(self.receiver, key_of)
        self.push_producer = Producer(
            dsn,
            PUSH,
            self.push_total,
            20,
            produce_for_s / max(1, self.push_total // 20),
            [self.push_checker],  # type: ignore[list-item]
            keyed=True,
        )
        self.source = SourceProducer(dsn, self.changes, produce_for_s)
        self.drained = DrainLog()
        self.capture_checker = CaptureChecker(self.source, self.drained)
        self.drainers: list[Drainer] = []
        self.retired: list[Drainer] = []
        self._names = iter(range(1, 1_000_000))
        self._faults_hit = 0

    # -- set-up ------------------------------------------------------------------------------
    def ddl(self) -> list[str]:
        """The tables, created before the servers start (the sources before the capture
        table: their CREATEs are no events)."""
        push_fields = dict(self.fields, vt_batch_size=1, vt_purge_after=3600)
        push_ddl = current_layout_ddl(PUSH, comment(**push_fields, vt_order_key=ORDER_KEY))
        push_ddl = push_ddl.replace(
            "  primary key(id)",
            f"  last_error varchar(1000), time_dead bigint, bucket int not null,\n"
            f"  {ORDER_KEY} varchar(32),\n"
            f"  primary key(id),\n  index order_idx({ORDER_KEY}, time_acked, id)",
        )
        event_fields = dict(self.fields, vt_batch_size=50, vt_purge_after=3600)
        capture = comment(**event_fields, vt_capture=PATTERN, vt_order_key="row_key")
        return [*SOURCE_DDL, push_ddl, events_ddl(capture)]

    def start(self, leader: str) -> None:
        """Set the endpoint, wait until the leader follows the binlog, then start the
        receiver's faults, the producers and the drainers."""
        self.receiver.start()
        client = Client(leader, timeout_s=30)
        try:
            client.set_endpoint(
                PUSH,
                self.receiver.url("/chaos"),
                SECRET,
                max_in_flight=PUSH_MAX_IN_FLIGHT,
                timeout_s=ENDPOINT_TIMEOUT_S,
            )
        finally:
            client.close()
        wait_until(self._following, timeout_s=30, what=f"a server following the binlog: {EVENTS}")
        self.receiver_faults.start()
        self.push_producer.start()
        self.source.start()
        self.drainers = [self._drainer() for _ in range(DRAINERS)]

    def _following(self) -> bool:
        for address in self.targets.split(","):
            client = Client(address, timeout_s=5)
            try:
                for t in client.list_tables():
                    if t.name == EVENTS and t.capture_position and not t.capture_problem:
                        return True
            except Exception:  # a server not answering yet
                pass
            finally:
                client.close()
        return False

    def _drainer(self) -> Drainer:
        d = Drainer(f"drain{next(self._names)}", self.targets, self.drained)
        d.start()
        return d

    # -- during the run ----------------------------------------------------------------------
    @property
    def producers_done(self) -> bool:
        return self.push_producer.done.is_set() and self.source.done.is_set()

    def before_fault(self, fault: Callable[[], None]) -> None:
        """A subscriber fault of the run hits a drainer too (the others hit it anyway)."""
        order = {"kill_subscriber": "kill", "stall_subscriber": "stall", "late_ack": "late"}
        what = order.get(getattr(fault, "__name__", ""))
        if what is None:
            return
        live = [d for d in self.drainers if not d.done.is_set() and d.order is None]
        if live:
            self._faults_hit += 1
            live[self._faults_hit % len(live)].order = what

    def keep(self) -> None:
        for n, d in enumerate(self.drainers):
            if d.done.is_set():
                self.retired.append(d)
                self.drainers[n] = self._drainer()

    def pending(self, db: sa.Engine) -> dict[str, list[int]]:
        out = self.push_checker.pending(db, PUSH)
        out.update(self.capture_checker.pending(db))
        if not self.producers_done:
            out["push and table events: producers still producing"] = []
        return out

    def stuck_stories(self, db: sa.Engine, pending: dict[str, list[int]]) -> list[str]:
        """The first stuck ids' stories (for a verdict)."""
        lines = []
        for what, ids in pending.items():
            if what.startswith("push:"):
                lines += [self.push_checker.history(i) for i in ids[:3]]
        if any(what.startswith("table events:") for what in pending):
            try:
                events = read_events(db)
            except sa.exc.DBAPIError as exc:
                return [*lines, f"table events: the database does not answer ({exc})"]
            got = {e.change() for e in events}
            missing = [c for c in self.source.log if c not in got][:3]
            lines += [self.capture_checker.history(c, events) for c in missing]
            unacked = [e for e in events if e.time_acked is None][:3]
            with self.drained.lock:
                lines += [
                    f"event {e.id} ({e.row_key}) not acked; delivered "
                    f"{self.drained.deliveries.get(e.id, [])}"
                    for e in unacked
                ]
        return lines

    def finish(self) -> None:
        self.receiver_faults.stop()
        for d in self.drainers + self.retired:
            d.finish()
        self.receiver.stop()

    # -- the verdicts ------------------------------------------------------------------------
    def judge(self, db: sa.Engine) -> tuple[PushReport, CaptureReport]:
        return (
            self.push_checker.judge(db, PUSH, self.receiver_faults),
            self.capture_checker.judge(db),
        )

    def errors(self) -> list[str]:
        return [
            f"{d.name}: {d.error!r}" for d in self.drainers + self.retired if d.error is not None
        ]

    def verdicts(self, db: sa.Engine, push: PushReport, capture: CaptureReport) -> list[str]:
        out = []
        if push.findings:
            rows = None
            with contextlib.suppress(sa.exc.DBAPIError):
                rows = read_push_rows(db, PUSH)
            lines = [f"  {what}: {len(f)} {f[:10]}" for what, f in push.findings.items()]
            ids = [
                f[0] if isinstance(f, tuple) else f
                for found in push.findings.values()
                for f in found[:2]
                if isinstance(f, (int, tuple))
            ]
            lines += [
                "  " + self.push_checker.history(i, rows) for i in ids[:6] if isinstance(i, int)
            ]
            out.append("push:\n" + "\n".join(lines))
        if capture.findings:
            out.append(
                "table events:\n"
                + "\n".join(
                    f"  {what}: {len(found)}\n    " + "\n    ".join(str(f) for f in found[:5])
                    for what, found in capture.findings.items()
                )
            )
        return out

    def counts_ok(self, push: PushReport, capture: CaptureReport) -> list[str]:
        """What the run must have exercised (else it proved little)."""
        problems = []
        if push.inserted != self.push_total or push.poison == 0:
            problems.append(
                f"push: {push.inserted} of {self.push_total} inserted, {push.poison} poison"
            )
        for what in ("500", "away", "hang"):
            if not push.receiver_faults[what]:
                problems.append(f"push: the receiver never had its {what} fault")
        if push.max_attempt < 2:
            problems.append("push: no message was pushed twice")
        if capture.transactions_rolled_back == 0:
            problems.append("table events: no transaction rolled back")
        if capture.ddl != {"alter": 1, "truncate": 1}:
            problems.append(f"table events: DDL events {dict(capture.ddl)}, wanted one each")
        if capture.redelivered == 0:
            problems.append("table events: the drainers' faults made no redelivery")
        return problems
