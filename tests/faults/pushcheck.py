"""Push in the fault suite: a receiver that misbehaves on its own schedule, and the checker
that judges what it received against the pushed table's rows (read with its own SQL).

The receiver (a tests/push_receiver.Receiver: real sockets on loopback, every signature
checked with its own HMAC) records every request as it arrives (a ``Receipt``: the ids, their
attempts and keys, when it began, what it was answered), whatever it answers. Its faults
(``ReceiverFaults``, a thread of their own, apart from the run's faults): it answers 500 for
a while, goes away (its socket closed: connections refused) for a few seconds, and hangs past
the endpoint's time-out. Poison (a payload beginning with ``p``) is always answered
POISON_STATUS: it must end dead, the status in its reason. The table's batches are of one
message (vt_batch_size=1), so a poison answer rejects that message alone.

The invariants (``PushChecker.judge``):

- every non-poison message was answered 2xx at least once, with a valid signature, and its
  row is acked; none is dead;
- no request carries a message after its ack committed: a request that began more than
  ACK_COMMIT_SLACK_S after the row's ``time_acked`` (the server's clock, the same machine's)
  is a violation. A message received again after a 2xx answer is otherwise a POST whose
  answer was lost (the server killed before its ack, the database away for the ack, the
  receiver gone before its answer went out): it began before the ack was stamped, and is
  counted as such (``again_after_2xx``); one within the slack is counted apart
  (``within_slack``);
- a poison message is never answered 2xx and never acked; it ends dead (``time_next`` the
  largest BIGINT, ``time_dead`` set) with ``HTTP 422`` in ``last_error``;
- order per key (the table is ordered, vt_order_key): of two consecutive messages of a key,
  every request carrying the first began before the first request carrying the second.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

import sqlalchemy as sa

from ..push_receiver import TOLERANCE_S, Receiver, expected_signature

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
POISON_STATUS = 422
ACK_COMMIT_SLACK_S = 0.5
DEAD_NEXT = 9223372036854775807  # a dead message's time_next (dead in place)
ENDPOINT_TIMEOUT_S = 1.0
# The receiver's own fault cycle: (what, how long), each after OK_FOR_S of good answers
OK_FOR_S = 3.0
FAULT_CYCLE: tuple[tuple[str, float], ...] = (
    ("500", 2.0),
    ("away", 3.0),
    ("hang", ENDPOINT_TIMEOUT_S + 1.5),
)


@dataclass
class Receipt:
    """One request as it arrived, and what it was answered (None: it hung, no answer)."""

    ids: list[int]
    attempts: list[int]
    keys: list[str]
    webhook_id: str
    began_ns: int
    status: int | None
    signed: bool
    poison: bool


class ChaosReceiver(Receiver):
    """The push endpoint of the fault suite (see the module docstring)."""

    def __init__(self, secret: str = SECRET) -> None:
        super().__init__(secret)
        self.receipts: list[Receipt] = []
        self.cut = 0  # requests whose body was cut short (the receiver went away meanwhile)
        self.mode = "ok"  # "ok", "500", "hang" (going away closes the socket)
        self._release_hung = threading.Event()

    def set_mode(self, mode: str) -> None:
        with self.lock:
            self.mode = mode
        if mode == "hang":
            self._release_hung.clear()
        else:
            self._release_hung.set()

    def stop(self) -> None:
        self._release_hung.set()
        super().stop()

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        began_ns = time.time_ns()
        length = int(h.headers.get("content-length", "0"))
        try:
            body = h.rfile.read(length)
        except OSError:
            body = b""
        if len(body) < length:  # its connection cut by going away: the pusher got no answer
            with self.lock:
                self.cut += 1
            return
        msg_id = h.headers.get("webhook-id", "")
        ts = h.headers.get("webhook-timestamp", "")
        signed = (
            bool(msg_id)
            and ts.isdigit()
            and abs(time.time() - int(ts)) <= TOLERANCE_S
            and expected_signature(self.secret, msg_id, ts, body)
            in h.headers.get("webhook-signature", "").split()
        )
        try:
            events = json.loads(body)
            ids = [int(e["data"]["id"]) for e in events]
            attempts = [int(e["attempt"]) for e in events]
            keys = [str(e["data"]["k"]) for e in events]
            poison = any(str(e["data"]["message"]).startswith("p") for e in events)
        except (ValueError, KeyError, TypeError) as exc:
            with self.lock:
                self.bad_bodies.append(repr(exc))
            self._reply(h, 400, b"bad body")
            return
        with self.lock:
            self.requests += 1
            mode = self.mode
        if not signed:
            status: int | None = 401
        elif mode == "hang":
            status = None
        elif mode == "500":
            status = 500
        elif poison:
            status = POISON_STATUS
        else:
            status = 200
        with self.lock:
            if not signed:
                self.bad_signatures.append(msg_id)
            self.receipts.append(
                Receipt(ids, attempts, keys, msg_id, began_ns, status, signed, poison)
            )
        if status is None:
            self._release_hung.wait(120)
            self._reply(h, 503)
            return
        reply = f"poison {ids}".encode() if status == POISON_STATUS else b""
        self._reply(h, status, reply)


class ReceiverFaults(threading.Thread):
    """The receiver's own fault schedule: OK_FOR_S of good answers, then the next fault of
    FAULT_CYCLE, round and round until stopped. Each fault is logged (began, ended, what),
    in the test process's monotonic clock."""

    def __init__(self, receiver: ChaosReceiver) -> None:
        super().__init__(name="receiver-faults", daemon=True)
        self.receiver = receiver
        self.stopped = threading.Event()
        self.log: list[tuple[float, float, str]] = []

    def run(self) -> None:
        n = 0
        while not self.stopped.wait(OK_FOR_S):
            what, for_s = FAULT_CYCLE[n % len(FAULT_CYCLE)]
            n += 1
            began = time.monotonic()
            if what == "away":
                self.receiver.go_away()
            else:
                self.receiver.set_mode(what)
            self.stopped.wait(for_s)
            if what == "away":
                self.receiver.come_back()
            else:
                self.receiver.set_mode("ok")
            self.log.append((began, time.monotonic(), what))

    def stop(self) -> None:
        self.stopped.set()
        self.join(30)

    def counts(self) -> Counter[str]:
        return Counter(what for _, _, what in self.log)


@dataclass
class PushRow:
    time_acked: int | None
    time_next: int | None
    time_dead: int | None
    last_error: str | None
    epoch: int


def read_push_rows(db: sa.Engine, table: str) -> dict[int, PushRow]:
    """The pushed table's rows, by id."""
    with db.connect() as conn:
        rows = conn.exec_driver_sql(
            f"select id, time_acked, time_next, time_dead, last_error, epoch from {table}"
        )
        return {int(r[0]): PushRow(r[1], r[2], r[3], r[4], int(r[5])) for r in rows}


@dataclass
class PushReport:
    inserted: int = 0
    poison: int = 0
    requests: int = 0
    cut: int = 0
    statuses: Counter[object] = field(default_factory=Counter)
    again_after_2xx: int = 0  # received again after a 2xx answer, before its ack (answer lost)
    within_slack: int = 0  # received within ACK_COMMIT_SLACK_S after its ack was stamped
    max_attempt: int = 0
    receiver_faults: Counter[str] = field(default_factory=Counter)
    findings: dict[str, list[object]] = field(default_factory=dict)

    def add(self, what: str, found: object) -> None:
        self.findings.setdefault(what, []).append(found)

    def summary(self) -> str:
        return (
            f"push: {self.inserted} messages ({self.poison} poison) pushed in "
            f"{self.requests} requests ({self.cut} cut short by going away), answers "
            f"{dict(sorted(self.statuses.items(), key=str))}; "
            f"received again after a 2xx whose ack did not commit {self.again_after_2xx} "
            f"(within {ACK_COMMIT_SLACK_S}s of the ack {self.within_slack}); attempts up to "
            f"{self.max_attempt}; receiver faults {dict(self.receiver_faults)}"
        )


class PushChecker:
    """Judges the pushed table (see the module docstring). ``insert`` is the producer's
    (tests/faults/chaos.Producer) word of what it committed."""

    label = "push"
    order = None

    def __init__(self, receiver: ChaosReceiver, key_of: Callable[[int], str]) -> None:
        self.receiver = receiver
        self.key_of = key_of
        self.inserted: list[int] = []
        self.poison: set[int] = set()
        self.lock = threading.Lock()

    def insert(self, ids: Sequence[int], poison: Iterable[int] = ()) -> None:
        with self.lock:
            self.inserted += ids
            self.poison.update(poison)

    def pending(self, db: sa.Engine, table: str) -> dict[str, list[int]]:
        """What is not settled yet: non-poison not acked, poison not dead."""
        rows = read_push_rows(db, table)
        with self.lock:
            inserted, poison = list(self.inserted), set(self.poison)
        out: dict[str, list[int]] = {}
        for i in inserted:
            row = rows.get(i)
            if i in poison:
                if row is None or row.time_next != DEAD_NEXT:
                    out.setdefault("push: poison not dead", []).append(i)
            elif row is None or row.time_acked is None:
                out.setdefault("push: not acked", []).append(i)
        return out

    def history(self, i: int, rows: dict[int, PushRow] | None = None) -> str:
        """Every request that carried ``i`` (ns since the first request), and its row."""
        receipts = [r for r in self.receiver.receipts if i in r.ids]
        t0 = self.receiver.receipts[0].began_ns if self.receiver.receipts else 0
        parts = [
            f"{(r.began_ns - t0) / 1e9:.3f}s attempt {r.attempts[r.ids.index(i)]} -> "
            f"{r.status if r.status is not None else 'hung'}"
            + ("" if r.signed else " (bad signature)")
            for r in receipts
        ]
        row = rows.get(i) if rows is not None else None
        acked = ""
        if row is not None and row.time_acked is not None:
            acked = f"; acked at {(row.time_acked - t0) / 1e9:.3f}s"
        said = "; ".join(parts) or "never received"
        return f"push {i} ({self.key_of(i)}): {said}{acked}; row {row}"

    def judge(self, db: sa.Engine, table: str, faults: ReceiverFaults) -> PushReport:
        return self.judge_rows(read_push_rows(db, table), faults.counts())

    def judge_rows(self, rows: dict[int, PushRow], faults: Counter[str]) -> PushReport:
        """The verdict on the table's ``rows`` and what the receiver recorded."""
        r = PushReport(inserted=len(self.inserted), poison=len(self.poison))
        r.receiver_faults = faults
        receipts = list(self.receiver.receipts)
        r.requests = len(receipts)
        r.cut = self.receiver.cut
        r.statuses = Counter(x.status if x.status is not None else "hung" for x in receipts)
        by_id: dict[int, list[Receipt]] = {}
        for x in receipts:
            for i, a in zip(x.ids, x.attempts, strict=True):
                by_id.setdefault(i, []).append(x)
                r.max_attempt = max(r.max_attempt, a)
        if self.receiver.bad_signatures:
            r.findings["requests with a bad signature"] = list(self.receiver.bad_signatures)
        if self.receiver.bad_bodies:
            r.findings["requests with a bad body"] = list(self.receiver.bad_bodies)
        slack_ns = int(ACK_COMMIT_SLACK_S * 1e9)
        for i in self.inserted:
            row, got = rows.get(i), by_id.get(i, [])
            if row is None:
                r.add("row gone", i)
                continue
            if i in self.poison:
                if row.time_acked is not None or any(
                    x.status is not None and x.status < 300 for x in got
                ):
                    r.add("poison acked or answered 2xx", i)
                if row.time_next != DEAD_NEXT or row.time_dead is None:
                    r.add("poison not dead", i)
                elif f"HTTP {POISON_STATUS}" not in (row.last_error or ""):
                    r.add("poison dead without its status in the reason", (i, row.last_error))
                continue
            if not any(x.status is not None and 200 <= x.status < 300 for x in got):
                r.add("never answered 2xx", i)
            if row.time_acked is None:
                r.add("dead" if row.time_next == DEAD_NEXT else "not acked", i)
                continue
            first_ok = next((x for x in got if x.status is not None and x.status < 300), None)
            for x in got:
                if x.began_ns > row.time_acked + slack_ns:
                    r.add("received after its ack committed", (i, x.webhook_id))
                elif x.began_ns > row.time_acked:
                    r.within_slack += 1
                elif first_ok is not None and x is not first_ok and x.began_ns > first_ok.began_ns:
                    r.again_after_2xx += 1
        self._judge_order(r, by_id)
        return r

    def _judge_order(self, r: PushReport, by_id: dict[int, list[Receipt]]) -> None:
        by_key: dict[str, list[int]] = {}
        for i in sorted(self.inserted):
            by_key.setdefault(self.key_of(i), []).append(i)
        for key, ids in by_key.items():
            for a, b in itertools.pairwise(ids):
                got_a, got_b = by_id.get(a, []), by_id.get(b, [])
                if not got_a or not got_b:
                    continue
                last_a = max(x.began_ns for x in got_a)
                first_b = min(x.began_ns for x in got_b)
                if last_a > first_b:
                    r.add(
                        "order per key broken (a message before the one before it left)",
                        (b, a, key),
                    )
