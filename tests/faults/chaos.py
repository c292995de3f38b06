"""The parts of the fault suite: msgtable servers as real processes, subscribers as threads of
this process (each with a handler thread for its settlement calls), the producer, and what
each message is (its kind, marked in its payload). The judge is tests/faults/checker.py.

Message kinds (by id, spread evenly; the payload says which, as ``<kind><id>``):

- ``m`` ordinary: acked at once (in batches, without waiting);
- ``p`` poison (about 1%): never acked. A third of them are rejected from their second
  delivery on (``msg.reject``), the others released every time (``sub.release`` of the
  batch's poison, a short delay), so they die of vt_max_attempts;
- ``r`` (about 1%): released once with a delay (``msg.release``), then acked;
- ``s`` (about 0.5%): a slow handler holds it twice its ack wait, renewing it (``msg.renew``;
  the auto-renewing subscriber leaves that to its client), then acks it.

Each row also has a ``bucket`` (``bucket_of``: the id modulo BUCKETS), for a subscription's
filter to choose a known subset by. A subscriber reads as the table's default group or as a
subscription (``group``), with a stream filter of its own or none (``stream_filter``); every
group handles every kind the same way, and has a checker, told when each subscriber is ready
(reading, with room) and when it stops (tests/faults/filtercheck.py).

An ordered table's rows also have a key (``ORDER_KEY``, ``key_of``: runs of RUN consecutive
ids share one of KEYS keys, so a key has a backlog of several messages at once). Its
subscribers record each message in their checker's OrderLog (tests/ordering.py) as it comes
off the stream, and mark when they begin to settle it (an ack, a release, a reject).
"""

from __future__ import annotations

import heapq
import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from functools import partial
from pathlib import Path

import sqlalchemy as sa
from opentelemetry.trace import TracerProvider

from msgtable.client import Client, Message, Subscription
from msgtable.client.requests import UNHANDED_REASON
from msgtable.core.subscriptions import state_table_name
from msgtable.errors import MsgtableError
from msgtable.testing.devdb import free_port

from ..acceptance.helpers import health_status
from ..ordering import Delivery, OrderLog
from ..waiting import wait_until
from .checker import DEAD_TIME_NEXT, Checker
from .tracecheck import producer_traceparent

# How long a late subscriber holds a batch before it acks: past its ack wait (vt_ack_wait), the
# backoff (vt_max_backoff) and a poll, so the batch went to another subscriber meanwhile.
LATE_BY_S = 6.0
# At the latest, a late ack comes this long after its batch. A group that lags the producer
# sends its late batch again only once it caught up (fresh rows go first): on a slow machine
# that took over 40 s of the faults, and the late acks, made first, found nothing acked by
# others (the verdict "ack too late" failed with and without tracing on 2026-11-28). The drain
# catches every group up, so a redelivery comes well before this.
LATE_MAX_S = 150.0
POISON_SHARE, RELEASE_SHARE, SLOW_SHARE = 0.01, 0.01, 0.005
POISON_DELAY_S = 0.1  # a poison message's release: due again almost at once
RELEASE_DELAY_S = 2.0  # an ordinary message released once: due again after this
SLOW_ACK_WAITS = 2.0  # a slow handler holds its message this many ack waits
RENEW_ACK_WAITS = 0.5  # and renews it this often (each renewal for one ack wait)
BUCKETS = 4
ORDER_KEY = "k"  # an ordered table's key column (vt_order_key)
KEYS, RUN = 50, 5  # its keys, and how many consecutive ids share a key in turn
PUSH_ALLOW = "http://127.0.0.0/8"  # the servers push to the receiver on loopback


def key_of(i: int) -> str:
    """The key of message ``i`` of an ordered table: ids 1..RUN key0, the next RUN key1, ...
    round the KEYS keys."""
    return f"key{(i - 1) // RUN % KEYS}"


def bucket_of(i: int) -> int:
    """The bucket column of message ``i`` (independent of its kind and of ``rejects``)."""
    return i % BUCKETS


def kind_of(i: int) -> str:
    """The kind of message ``i`` (see the module docstring): a multiplicative hash spreads
    each kind evenly over the ids."""
    r = (i * 2654435761 % 2**32) / 2**32
    if r < POISON_SHARE:
        return "p"
    if r < POISON_SHARE + RELEASE_SHARE:
        return "r"
    if r < POISON_SHARE + RELEASE_SHARE + SLOW_SHARE:
        return "s"
    return "m"


def rejects(i: int) -> bool:
    """Whether poison ``i`` is rejected (from its second delivery on) rather than released."""
    return i % 3 == 0


def answers(address: str, path: str, timeout_s: float = 5.0) -> bool:
    """Whether http://ADDRESS/PATH answers 200 (a server's metrics or dashboard)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=timeout_s) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


class ServerProcess:
    """One `msgtable serve` process on fixed ports (gRPC, --metrics-listen, --http), killed
    or stopped and started again. ``live_pid`` is the process's pid from the moment all
    three answer until just before it is signalled (None otherwise): what the scrape
    checker calls a live server."""

    def __init__(self, dsn: str, log_dir: Path, name: str, lease_period_s: float) -> None:
        self.dsn = dsn
        self.name = name
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        # where clients reach it (--advertise: the lease table names it, redirects go to it;
        # a fault proxy in front of it); its own address by default
        self.advertised = self.address
        self.metrics_address = f"127.0.0.1:{free_port()}"
        self.http_address = f"127.0.0.1:{free_port()}"
        self.live_pid: int | None = None
        self.lease_period_s = lease_period_s
        self.log = log_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.exit_codes: list[int] = []

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MSGTABLE_")}
        command = [
            sys.executable,
            "-m",
            "msgtable",
            "serve",
            "--dsn",
            self.dsn,
            "--listen",
            self.address,
            "--advertise",
            self.advertised,
            "--lease-period",
            str(self.lease_period_s),
            "--discovery-interval",
            "1",
            "--grace-s",
            "3",
            "--push-allow",
            PUSH_ALLOW,
            "--metrics-listen",
            self.metrics_address,
            "--http",
            self.http_address,
        ]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        wait_until(
            lambda: health_status(self.address) is not None,
            timeout_s=30,
            what=f"{self.name} answering",
        )
        # the metrics and the dashboard open after the gRPC server: wait for both too
        wait_until(
            lambda: (
                answers(self.metrics_address, "/metrics")
                and answers(self.http_address, "/api/state")
            ),
            timeout_s=30,
            what=f"{self.name}'s /metrics and /api/state answering",
        )
        self.live_pid = self.process.pid

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind."""
        assert self.process is not None
        self.live_pid = None
        self.process.send_signal(signal.SIGKILL)
        self.exit_codes.append(self.process.wait(10))

    def terminate(self) -> int:
        """SIGTERM: a graceful shutdown (returns the exit status)."""
        assert self.process is not None
        self.live_pid = None
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(30)
        self.exit_codes.append(code)
        return code

    def stop(self) -> None:
        self.live_pid = None
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Handler(threading.Thread):
    """A subscriber's handler thread: its settlement calls and timed acks, in time order, off
    the thread that reads the stream (so a delivery's time is when it came off the wire,
    whatever a call waits for). Each task names the ids it settles (acks, releases, rejects;
    a renewal names none: the ack after it does): a kill drops them, and the checker hears
    that they were left unsettled on purpose."""

    def __init__(self, name: str) -> None:
        super().__init__(name=f"{name}-handler", daemon=True)
        self._cond = threading.Condition()
        self._tasks: list[tuple[float, int, Callable[[], None], list[int]]] = []
        self._order = itertools.count()
        self._stopped = False
        self.error: BaseException | None = None

    def at(self, delay_s: float, task: Callable[[], None], ids: list[int]) -> None:
        with self._cond:
            heapq.heappush(self._tasks, (time.monotonic() + delay_s, next(self._order), task, ids))
            self._cond.notify()

    def run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    wait = self._tasks[0][0] - time.monotonic() if self._tasks else None
                    if wait is not None and wait <= 0:
                        break
                    self._cond.wait(wait)
                if self._stopped:
                    return
                _, _, task, _ = heapq.heappop(self._tasks)
            try:
                task()
            except Exception as exc:  # the tasks catch MsgtableError: anything else is a bug
                self.error = exc
                return

    def queued(self) -> int:
        with self._cond:
            return len(self._tasks)

    def stop(self) -> list[int]:
        """Stop; returns the ids of the tasks dropped."""
        with self._cond:
            self._stopped = True
            dropped = [i for *_, ids in self._tasks for i in ids]
            self._tasks.clear()
            self._cond.notify()
        return dropped


class Subscriber(threading.Thread):
    """A worker: reads batches, records them, acks the ordinary messages of each in one call
    (unless told not to), and settles the others by their kind (see the module docstring)."""

    def __init__(
        self,
        name: str,
        targets: str,
        table: str,
        checker: Checker,
        auto_renew: bool = False,
        group: str = "",
        dsn: str = "",
        tracer_provider: TracerProvider | None = None,
        stream_filter: str = "",
        lazy: bool = False,
    ) -> None:
        super().__init__(name=name, daemon=True)
        # its group is a lazy subscription's: a message it holds has no state row until its
        # send is postponed or settled, so a close's release is a state row there, not a gap
        self.lazy = lazy
        # its stream's filter ("": none): of its group's messages, only those it passes
        self.stream_filter = stream_filter
        self.dsn = dsn  # where a close's releases are read back ("": they are not)
        self.targets = targets
        self.table = table
        self.checker = checker
        self.auto_renew = auto_renew
        self.group = group  # the subscription it reads as ("": the table's default group)
        self.order: str | None = None  # "kill", "stall", "late": what to do with the next batch
        self.late_log: list[str] = []  # what became of its "late" orders (for a verdict)
        # it holds a late batch, its ack to come: another fault would lose that ack
        self.late_pending = False
        self._late_renewed = False  # the late batch's renewal of its replaced delivery is made
        self.stall_s = 0.0
        self.done = threading.Event()
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        # consumer spans to ``tracer_provider`` (tests/faults/tracecheck.py; None: none)
        self.client = Client(
            targets, timeout_s=10, retry_for_s=120, tracer_provider=tracer_provider
        )
        self.died = False  # it ended as a killed process does (_die)
        self.unhanded: set[int] = set()  # received and never handed out (a close mid-batch)
        self.sub: Subscription | None = None
        self.handler = Handler(name)
        # an ordered table's: the deliveries not settled yet, by id (the OrderLog's records)
        self._unsettled: dict[int, Delivery] = {}
        self._unsettled_lock = threading.Lock()

    def run(self) -> None:
        self.handler.start()
        try:
            self.sub = self.client.subscribe(
                self.table,
                max_in_flight=400,
                auto_renew=self.auto_renew,
                subscription=self.group,
                filter=self.stream_filter,
            )
            self.checker.ready(self.name, self.stream_filter)  # reads, acks: has room
            while True:
                if self.order == "close":  # a worker shutting down, between two messages
                    self._close_mid_batch()
                    return
                batch = self.sub.next_batch()
                if not batch:
                    break
                ids = self._record(batch)
                order = self.order
                if order == "close":
                    order = None  # this batch is handled; the close comes before the next
                elif order == "late" and all(str(m.values["message"])[0] == "p" for m in batch):
                    order = None  # poison is never acked: late waits for a batch with more
                else:
                    self.order = None
                if order == "kill":  # mid-batch: received, never acked
                    self.checker.dropped(ids, self.name, "subscriber killed")
                    self._die("subscriber killed")
                    return
                if order == "stall":  # stops reading: the stream backs up to its window
                    self.checker.unready(self.name)
                    self.checker.dropped(ids, self.name, "subscriber stalled")
                    time.sleep(self.stall_s)
                    self._die("subscriber stalled")
                    return
                self._handle(batch, late=order == "late")
                if self.stop_event.is_set():
                    break
        except MsgtableError as exc:
            if not self.stop_event.is_set():
                self.error = exc
        finally:
            self.checker.unready(self.name)
            self.done.set()

    def _record(self, batch: list[Message]) -> list[int]:
        """Tell the checker (and an ordered table's OrderLog) that ``batch`` came off the
        stream now; returns its ids."""
        assert self.sub is not None
        ids = [int(m.id) for m in batch]  # type: ignore[call-overload]
        self.checker.delivered(
            [(i, m.attempt) for i, m in zip(ids, batch, strict=True)],
            self.name,
            self.sub.target,  # the server whose stream it came off: its sender
            [m.sent_ns for m in batch],
        )
        if self.checker.order is not None:
            recorded = self.checker.order.received(self.name, batch, ORDER_KEY)
            with self._unsettled_lock:
                self._unsettled.update((int(d.id), d) for d in recorded)  # type: ignore[call-overload]
        return ids

    def _close_mid_batch(self) -> None:
        """Iterate messages, take the first of the next batch, and close: the message taken
        is left to its ack wait (its handler never finished), the rest of the batch, never
        handed out, is released by close() (bound to its deliveries; the checker expects
        it back before its ack wait). Then this subscriber is gone, as a worker that
        stopped."""
        sub = self.sub
        assert sub is not None
        self.order = None
        self.checker.unready(self.name)  # a worker stopping
        try:
            first = next(sub)  # the client pulls a whole batch and hands out one message
        except StopIteration:  # closed meanwhile (the run is ending)
            return
        rest = list(sub._pending)  # received, never handed out: what close() releases
        received = sub._pending_at  # when the client received them (monotonic)
        self.unhanded.update(int(m.id) for m in rest)  # type: ignore[call-overload]
        ids = self._record([first, *rest])
        why = "subscriber closed mid-batch"
        self.checker.dropped(ids, self.name, why)
        self.checker.dropped(self.handler.stop(), self.name, why)
        began = time.monotonic()

        def closing() -> None:
            sub.close()  # its release's answer is not told (one try, errors swallowed)

        if rest:
            self._settle("release", rest, closing, 0.0, UNHANDED_REASON)
        else:
            closing()
        ended = time.monotonic()
        rest_ids = [int(m.id) for m in rest]  # type: ignore[call-overload]
        found, rows = self._released_in_table(rest) if rest else (set(), {})
        self.checker.closed_mid_batch(rest_ids, began, ended, found, received, rows)
        self.client.close()

    def _released_in_table(
        self, rest: list[Message]
    ) -> tuple[set[int] | None, dict[int, tuple[int, int, float | None]]]:
        """Those of ``rest`` the table shows released (read right after close()): the send
        counted (epoch = its attempt) and due now, or sent again since (epoch above it), or
        dead (a release at the last attempt makes it due, and due it dies: moved to the
        dead-letter table, or dead in place). A row neither released nor postponed yet has
        epoch = attempt - 1, one postponed (left to its ack wait) a time_next after now.
        None: the table did not answer. Also, for each of the others, what the table showed:
        (attempt delivered, epoch, time_next's distance from now in s; None: NULL)."""
        if not self.dsn:
            return None, {}
        table = state_table_name(self.table, self.group) if self.group else self.table
        attempts = {int(m.id): m.attempt for m in rest}  # type: ignore[call-overload]
        now_ns = time.time_ns()
        db = sa.create_engine(self.dsn)
        try:
            with db.connect() as conn:
                rows = conn.exec_driver_sql(
                    f"select id, epoch, time_next from {table} where id in "
                    f"({','.join(map(str, attempts))})"
                ).fetchall()
        except sa.exc.DBAPIError:
            return None, {}
        finally:
            db.dispose()
        # gone: dead, moved (a lazy subscription's: never written, so not released)
        found = set() if self.lazy else set(attempts) - {int(r[0]) for r in rows}
        others: dict[int, tuple[int, int, float | None]] = {}
        for i, epoch, time_next in rows:
            a, e = attempts[int(i)], epoch or 0
            due = time_next is not None and (time_next <= now_ns or time_next == DEAD_TIME_NEXT)
            if e > a or (e == a and due):
                found.add(int(i))
            else:
                away = None if time_next is None else round((time_next - now_ns) / 1e9, 3)
                others[int(i)] = (a, e, away)
        return found, others

    def state(self) -> str:
        """What this subscriber is doing (for a verdict)."""
        sub = self.sub
        parts = [
            "done" if self.done.is_set() else "reading",
            f"order {self.order}",
            f"{self.handler.queued()} handler tasks",
        ]
        if sub is not None:
            parts.append(f"server {sub.target}, {sub.reconnects} reconnects")
            if sub.leaser is not None:
                parts.append(f"{sub.leaser.leased} leased")
        return f"{self.name}: {', '.join(parts)}"

    def _settling(self, ids: Iterable[int], verb: str) -> list[Delivery]:
        """An ordered table's: this subscriber begins to ``verb`` ``ids`` now (ack, release
        or reject; for the OrderLog the first counts; a renewal is no settlement). Returns
        their deliveries, for OrderLog.settled once the call returned."""
        if self.checker.order is None:
            return []
        ids = list(ids)
        self.checker.settle_began(ids, verb)
        with self._unsettled_lock:
            ds = [d for i in ids if (d := self._unsettled.pop(i, None)) is not None]
        OrderLog.settling(ds)
        return ds

    def _die(self, why: str) -> None:
        """Stop like a killed process: no more calls of any kind."""
        self.died = True
        self.checker.unready(self.name)
        self.checker.dropped(self.handler.stop(), self.name, why)
        if self.sub is not None and self.sub.leaser is not None:
            self.sub.leaser.close()
        self.client.close()

    def _handle(self, batch: list[Message], late: bool) -> None:
        by_kind: dict[str, list[Message]] = {"m": [], "p": [], "r": [], "s": []}
        for m in batch:
            by_kind[str(m.values["message"])[0]].append(m)
        poison = by_kind["p"]
        if poison:
            poison_ids = [int(m.id) for m in poison]  # type: ignore[call-overload]
            self.handler.at(0, partial(self._fail_poison, poison), poison_ids)
        rest = by_kind["m"] + by_kind["r"] + by_kind["s"]
        if late:  # acks after its ack wait ended: redelivered meanwhile
            ids = [int(m.id) for m in rest]  # type: ignore[call-overload]
            self.late_log.append(f"{time.monotonic():.3f} late batch of {len(ids)}")
            self.late_pending = True
            self.checker.dropped(ids, self.name, "ack too late")
            deadline = time.monotonic() + LATE_MAX_S
            self._late_renewed = False
            self.handler.at(LATE_BY_S, partial(self._late_ack, rest, deadline), ids)
            return
        plain = by_kind["m"]
        for m in by_kind["r"]:
            if self.checker.was_released(int(m.id)):  # type: ignore[call-overload]
                plain.append(m)
            else:
                i = int(m.id)  # type: ignore[call-overload]
                self.handler.at(0, partial(self._release_once, m), [i])
        if by_kind["s"]:
            self._hold_slowly(by_kind["s"])
        if plain:
            self._ack(plain)

    # -- the kinds ----------------------------------------------------------------------------
    def _fail_poison(self, poison: list[Message]) -> None:
        """Poison: rejected from the second delivery on (a third of them), else released."""
        released: dict[int, list[Message]] = {}
        for m in poison:
            i = int(m.id)  # type: ignore[call-overload]
            if rejects(i) and m.attempt >= 2:
                reason = f"poison {i}: rejected at attempt {m.attempt}"
                self._settle("reject", [m], partial(m.reject, reason), reason=reason)
            else:
                released.setdefault(m.attempt, []).append(m)
        sub = self.sub
        assert sub is not None
        for attempt, ms in released.items():
            reason = f"poison: failed at attempt {attempt}"
            self._settle(
                "release",
                ms,
                partial(sub.release, ms, POISON_DELAY_S, reason),
                POISON_DELAY_S,
                reason,
            )

    def _release_once(self, m: Message) -> None:
        reason = f"busy: try {m.id} later"
        self._settle(
            "release", [m], partial(m.release, RELEASE_DELAY_S, reason), RELEASE_DELAY_S, reason
        )

    def _hold_slowly(self, slow: list[Message]) -> None:
        """Held two ack waits, renewed every half (by hand, or by the client's auto-renewal),
        then acked."""
        ids = [int(m.id) for m in slow]  # type: ignore[call-overload]
        self.checker.held_slowly(ids, self.name)
        ack_wait = self.checker.ack_wait_s
        if not self.auto_renew:
            every = RENEW_ACK_WAITS * ack_wait
            for k in range(1, round(SLOW_ACK_WAITS / RENEW_ACK_WAITS)):
                for m in slow:
                    call = partial(m.renew, ack_wait)
                    renew = partial(self._settle, "renew", [m], call, ack_wait)
                    self.handler.at(k * every, renew, [])
        self.handler.at(SLOW_ACK_WAITS * ack_wait, partial(self._ack_now, slow), ids)

    def _settle(
        self,
        verb: str,
        messages: list[Message],
        call: Callable[[], int | None],
        span_s: float = 0.0,
        reason: str | None = None,
    ) -> None:
        ids = [int(m.id) for m in messages]  # type: ignore[call-overload]
        ds = self._settling(ids, verb) if verb != "renew" else []
        # the delivery each release or renew answers (what the handler holds: the checker's
        # own record, whatever the client sends)
        named = [m.attempt for m in messages] if verb in ("release", "renew") else []
        start = time.monotonic()
        try:
            count: int | None = call()
        except MsgtableError:
            count = None
        OrderLog.settled(ds)
        self.checker.settled(verb, ids, self.name, start, count, span_s, reason, named)

    def _late_ack(self, messages: list[Message], deadline: float) -> None:
        """The late ack: once another subscriber was sent one of these again and acked it
        (what the fault is for: an ack that finds some of its messages settled by someone
        else), or at ``deadline``, whichever comes first. A group that lags behind the
        producer sends fresh rows before due redeliveries, so the redelivery may take longer
        than LATE_BY_S."""
        ids = [int(m.id) for m in messages]  # type: ignore[call-overload]
        if not self._late_renewed:
            # the late handler first renews its (replaced) delivery: that must change no id
            # sent again since (the checker: late releases or renewals of a replaced one)
            self._late_renewed = True
            assert self.sub is not None
            wait = self.checker.ack_wait_s
            self._settle("renew", messages, partial(self.sub.renew, messages, wait), wait)
        if time.monotonic() < deadline and not self.checker.acked_any(ids):
            self.handler.at(0.5, partial(self._late_ack, messages, deadline), ids)
            return
        self._ack_now(messages, late=True)

    def _ack_now(self, messages: list[Message], late: bool = False) -> None:
        """One ack call of its own, waited for (its count kept for a late one)."""
        try:
            self._ack_waited(messages, late)
        finally:
            if late:
                self.late_pending = False

    def _ack_waited(self, messages: list[Message], late: bool) -> None:
        assert self.sub is not None
        ids = [int(m.id) for m in messages]  # type: ignore[call-overload]
        if not ids:
            return
        ds = self._settling(ids, "ack")
        start = time.monotonic()
        try:
            count = self.sub.ack(messages)
        except MsgtableError as exc:
            OrderLog.settled(ds)
            self.checker.ack_failed(ids, start)
            if late:
                self.late_log.append(f"{time.monotonic():.3f} late ack failed: {exc}")
            return
        OrderLog.settled(ds)
        self.checker.acked(ids, start)
        if late:
            self.checker.late_acks.append((count, len(ids)))
            self.late_log.append(f"{time.monotonic():.3f} late ack: {count} of {len(ids)}")

    def _ack(self, batch: list[Message]) -> None:
        """Queue the batch's ack; the stream is read on, never held up by an ack call (so a
        delivery's time is when it came off the wire); the ack counts once its call
        returned."""
        assert self.sub is not None
        ids = [int(m.id) for m in batch]  # type: ignore[call-overload]
        ds = self._settling(ids, "ack")
        start = time.monotonic()
        try:
            future = self.sub.ack_async(batch)
        except MsgtableError:  # the subscription is closed
            OrderLog.settled(ds)
            self.checker.ack_failed(ids, start)
            return

        def done(f: Future[None]) -> None:
            OrderLog.settled(ds)
            if f.exception() is None:
                self.checker.acked(ids, start)
            else:
                self.checker.ack_failed(ids, start)

        future.add_done_callback(done)

    def finish(self) -> None:
        self.stop_event.set()
        self.handler.stop()
        if self.sub is not None:
            try:
                self.sub.close()
            except MsgtableError:
                # a killed or stalled-out subscriber closed its client: an ack it had queued
                # failed as "the client is closed" (the checker was told: ack_failed)
                if not self.done.is_set() or not self.client.closed:
                    raise
        self.client.close()


class Producer(threading.Thread):
    """Inserts ids 1..total in transactions of `chunk` rows, riding out database restarts:
    a chunk whose commit is in doubt is inserted again with INSERT IGNORE. Each payload says
    its kind (kind_of); each row has its bucket (bucket_of), and with ``keyed`` (an ordered
    table) its key (key_of). Every group's checker is told."""

    def __init__(
        self,
        dsn: str,
        table: str,
        total: int,
        chunk: int,
        pace_s: float,
        checkers: Sequence[Checker],
        keyed: bool = False,
        traced: bool = False,
    ):
        super().__init__(name=f"producer-{table}", daemon=True)
        self.keyed = keyed
        self.traced = traced  # each row's traceparent: tracecheck.producer_traceparent
        self.db = sa.create_engine(dsn, pool_pre_ping=True)
        self.table, self.total, self.chunk, self.pace_s = table, total, chunk, pace_s
        self.checkers = checkers
        self.retries = 0
        self.done = threading.Event()

    def run(self) -> None:
        try:
            for start in range(1, self.total + 1, self.chunk):
                ids = list(range(start, min(start + self.chunk, self.total + 1)))
                if self.keyed:
                    rows = ",".join(
                        f"({i}, '{kind_of(i)}{i}', {bucket_of(i)}, '{key_of(i)}')" for i in ids
                    )
                    columns = f"id, message, bucket, {ORDER_KEY}"
                elif self.traced:
                    rows = ",".join(
                        f"({i}, '{kind_of(i)}{i}', {bucket_of(i)}, '{producer_traceparent(i)}')"
                        for i in ids
                    )
                    columns = "id, message, bucket, traceparent"
                else:
                    rows = ",".join(f"({i}, '{kind_of(i)}{i}', {bucket_of(i)})" for i in ids)
                    columns = "id, message, bucket"
                sql = f"insert ignore into {self.table}({columns}) values {rows}"
                while True:
                    try:
                        with self.db.begin() as conn:
                            conn.exec_driver_sql(sql)
                        break
                    except sa.exc.DBAPIError:
                        self.retries += 1
                        time.sleep(0.5)
                poison = [i for i in ids if kind_of(i) == "p"]
                for checker in self.checkers:
                    checker.insert(ids, poison)
                time.sleep(self.pace_s * random.uniform(0.5, 1.5))
        finally:
            self.done.set()
            self.db.dispose()
