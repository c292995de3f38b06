"""One endpoint's pusher: subscribe to its group in-process, POST each batch, settle it.

A pusher runs on every server for every endpoint definition, but subscribes only while its
engine sends (holds the lease) and the allow-list allows the URL. Its supervisor thread
(re)subscribes: at start, after the subscriber ended (the lease lost, the table reloaded),
and closes the subscriber when the lease goes. ``max_in_flight`` worker threads each take a
batch from the subscriber (its window is ``max_in_flight`` batches), POST it and settle it
through the engine's verbs (msgtable.features.push.outcome says which), so attempts, backoff, max
attempts, dead letters and order per key are the table's, as for a gRPC subscriber.

close(): stop taking batches, let POSTs in progress finish (or time out) and settle them,
close the subscriber (batches queued and not taken are due again), close the connections.
What a crash leaves unsettled comes back after its ack wait.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from msgtable.core.backoff import backoff_s, draw_jitter
from msgtable.core.rows import Batch
from msgtable.core.status import PushStatus
from msgtable.core.tables import TableConfig
from msgtable.core.words import counted
from msgtable.engine.subscriber import Subscriber
from msgtable.errors import MsgtableError
from msgtable.features.push.allow import AllowList, Target
from msgtable.features.push.body import BatchEncoder, headers, secret_bytes
from msgtable.features.push.endpoints import Endpoint, check
from msgtable.features.push.outcome import Outcome, Verdict, for_answer, for_failure
from msgtable.features.push.transport import Transport, failure_text
from msgtable.limits import MAX_SETTLE_DELAY_S

log = logging.getLogger("msgtable.features.push")

TAKE_S = 0.5  # a worker's wait for a batch, between looks at the stop flag
RESUBSCRIBE_S = 1.0  # the supervisor's look at the lease and the subscriber


class PushEngine(Protocol):
    """What a pusher needs of the engine (msgtable.engine.engine.MessageEngine)."""

    keyspace: str

    def sends(self, table: str) -> bool: ...

    def subscribe(
        self,
        name: str,
        keyspace: str = "",
        shard: str = "",
        key_range: tuple[bytes, bytes] = (b"", b""),
        max_in_flight: int = 0,
        subscription: str = "",
        filter: str = "",
    ) -> Subscriber: ...

    def ack(self, name: str, keyspace: str, ids: Any, subscription: str = "") -> int: ...

    def release(
        self,
        name: str,
        keyspace: str,
        ids: Any,
        delay_s: float,
        reason: str | None,
        subscription: str = "",
    ) -> int: ...

    def reject(
        self, name: str, keyspace: str, ids: Any, reason: str | None, subscription: str = ""
    ) -> int: ...


def webhook_id(table: str, subscription: str, first_id: object, attempt: int) -> str:
    """The ``webhook-id`` of a batch attempt: the same for the same first message and
    attempt (a batch a crash sent twice), safe in a header whatever the names and ids hold.
    A message's own idempotency key is its event ``id`` (msgtable.features.push.body)."""
    key = f"{table}\0{subscription}\0{first_id!r}\0{attempt}".encode()
    return "msg_" + hashlib.sha256(key).hexdigest()[:32]


class Pusher:
    """One endpoint's loop (see the module docstring)."""

    def __init__(
        self,
        engine: PushEngine,
        endpoint: Endpoint,
        config: Callable[[], TableConfig | None],
        allow: AllowList,
        *,
        ca_file: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.engine = engine
        self.endpoint = endpoint
        self._config = config
        self.allow = allow
        self.target: Target | None = None
        self._problem = ""
        self._key = b""
        try:
            self.target = check(endpoint)
            self._key = secret_bytes(endpoint.secret)
            self._problem = allow.url_problem(self.target)
            if self._problem:
                self._problem = f"not allowed: {self._problem}"
        except MsgtableError as exc:
            self._problem = f"not allowed: {exc}"
        self._ca_file = ca_file
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._sub: Subscriber | None = None
        self._transport: Transport | None = None
        self._threads: list[threading.Thread] = []
        self._in_flight = 0
        self.pushed = 0
        self.failed = 0
        self._last_error = ""
        self._last_ok = 0.0
        self._encoder: tuple[TableConfig, BatchEncoder] | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self) -> None:
        if self._threads or self._stop.is_set():
            return
        if self.target is not None and not self._problem:
            self._transport = Transport(
                self.target,
                self.allow,
                max_connections=self.endpoint.max_in_flight,
                timeout_s=self.endpoint.timeout_s,
                ca_file=self._ca_file,
            )
        name = f"msgtable-push-{self.endpoint.label}"
        self._threads = [threading.Thread(target=self._supervise, name=name, daemon=True)]
        if self._transport is not None:
            self._threads += [
                threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                for i in range(self.endpoint.max_in_flight)
            ]
        for t in self._threads:
            t.start()
        if self._problem:
            log.warning("push %s: %s (its messages wait)", self.endpoint.label, self._problem)

    def close(self) -> None:
        """Idempotent; waits for POSTs in progress (each at most its time-out)."""
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(self.endpoint.timeout_s + 10)
        self._drop_subscriber()
        if self._transport is not None:
            self._transport.close()

    def trigger(self) -> None:
        self._wake.set()

    # -- status ------------------------------------------------------------------------------
    def status(self) -> PushStatus:
        with self._lock:
            in_flight = self._in_flight
            sub = self._sub
            error = self._last_error
        if self._problem:
            state = self._problem
        elif error:
            state = f"failing: {error}"
        elif not self.engine.sends(self.endpoint.table):
            state = "idle: another server sends the table and pushes"
        elif sub is None:
            state = "starting"
        else:
            state = "pushing"
        return PushStatus(
            url=self.endpoint.url,
            state=state,
            in_flight=in_flight,
            pushed=self.pushed,
            failed=self.failed,
            max_in_flight=self.endpoint.max_in_flight,
            timeout_s=self.endpoint.timeout_s,
        )

    # -- the supervisor ----------------------------------------------------------------------
    def _supervise(self) -> None:
        ep = self.endpoint
        while not self._stop.is_set():
            if self._transport is not None and self.engine.sends(self.endpoint.table):
                if self._sub is None:
                    self._subscribe()
            elif self._sub is not None:
                self._drop_subscriber()
            self._wake.wait(RESUBSCRIBE_S)
            self._wake.clear()
        log.debug("push %s: supervisor stopped", ep.label)

    def _subscribe(self) -> None:
        ep = self.endpoint
        cfg = self._config()
        if cfg is None:
            return
        try:
            sub = self.engine.subscribe(
                ep.table,
                subscription=ep.subscription,
                max_in_flight=ep.max_in_flight * cfg.batch_size,
            )
        except MsgtableError as exc:
            with self._lock:
                self._last_error = f"cannot subscribe: {exc}"
            return
        with self._lock:
            self._sub = sub
            if self._last_error.startswith("cannot subscribe"):
                self._last_error = ""
        log.info("push %s: pushing to %s", ep.label, ep.url)

    def _drop_subscriber(self, which: Subscriber | None = None) -> None:
        with self._lock:
            sub = self._sub
            if sub is None or (which is not None and sub is not which):
                return
            self._sub = None
        sub.close()
        self._wake.set()

    # -- the workers -------------------------------------------------------------------------
    def _work(self) -> None:
        while not self._stop.is_set():
            sub = self._sub
            if sub is None:
                self._stop.wait(TAKE_S / 5)
                continue
            try:
                batch = sub.next_batch(TAKE_S)
            except MsgtableError:
                self._drop_subscriber(sub)
                continue
            if batch:
                try:
                    self._push(batch, sub)
                except Exception:  # a bug: said loudly; the batch comes back by its ack wait
                    log.exception("push %s: unexpected error pushing a batch", self.endpoint.label)
                    with self._lock:
                        self._last_error = "unexpected error (see the server log)"

    def _encoder_for(self, cfg: TableConfig, sub: Subscriber) -> BatchEncoder:
        cached = self._encoder
        if cached is None or cached[0] is not cfg:
            columns = [c.name for c in sub.fields]
            cached = (
                cfg,
                BatchEncoder(
                    self.engine.keyspace,
                    self.endpoint.table,
                    self.endpoint.subscription,
                    columns,
                    cfg.order_key,
                ),
            )
            self._encoder = cached
        return cached[1]

    def _push(self, batch: Batch, sub: Subscriber) -> None:
        ep = self.endpoint
        cfg = self._config()
        transport = self._transport
        if cfg is None or transport is None:
            return  # unsettled: due again after its ack wait
        attempts = [s + 1 for s in batch.sent_before] if batch.sent_before else [1] * len(batch)
        now = time.time()
        body = self._encoder_for(cfg, sub).body(batch, attempts, time.time_ns())
        msg_id = webhook_id(ep.table, ep.subscription, batch[0][0], max(attempts))
        with self._lock:
            self._in_flight += 1
        try:
            answer = transport.post(body, headers(self._key, msg_id, int(now), body))
            outcome = for_answer(
                answer.status, answer.body, answer.retry_after, answer.location, time.time()
            )
            refused = False
        except Exception as exc:
            text, refused = failure_text(exc)
            outcome = for_failure(text)
        finally:
            with self._lock:
                self._in_flight -= 1
        self._settle(batch, attempts, outcome, cfg, refused)

    def _settle(
        self,
        batch: Batch,
        attempts: list[int],
        outcome: Outcome,
        cfg: TableConfig,
        refused: bool,
    ) -> None:
        ep = self.endpoint
        ids = [values[0] for values in batch]
        ks = self.engine.keyspace
        try:
            if outcome.verdict is Verdict.ACK:
                self.engine.ack(ep.table, ks, ids, ep.subscription)
                with self._lock:
                    self.pushed += len(ids)
                    self._last_error = ""
                return
            with self._lock:
                self.failed += len(ids)
                self._last_error = ("not allowed: " if refused else "") + outcome.reason
            if outcome.verdict is Verdict.REJECT:
                dead = counted(len(ids), "message")
                log.warning("push %s: %s dead: %s", ep.label, dead, outcome.reason)
                self.engine.reject(ep.table, ks, ids, outcome.reason, ep.subscription)
                return
            by_attempt: dict[int, list[object]] = {}
            for rid, attempt in zip(ids, attempts, strict=True):
                by_attempt.setdefault(attempt, []).append(rid)
            for attempt, group in by_attempt.items():
                delay = outcome.delay_s
                if delay is None:
                    delay = backoff_s(
                        attempt - 1, cfg.min_backoff_s, cfg.max_backoff_s, draw_jitter(self._rng)
                    )
                delay = min(delay, MAX_SETTLE_DELAY_S)  # an unbounded backoff grows past it
                self.engine.release(ep.table, ks, group, delay, outcome.reason, ep.subscription)
            released = counted(len(ids), "message")
            log.info("push %s: %s released: %s", ep.label, released, outcome.reason)
        except MsgtableError as exc:  # the lease went, the database is away: ack wait
            log.warning(
                "push %s: cannot settle %s (%s): due again after their ack wait",
                ep.label,
                counted(len(ids), "message"),
                exc,
            )
