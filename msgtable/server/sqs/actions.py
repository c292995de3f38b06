"""The SQS actions over the engine: each takes a request's parameters and answers SQS's JSON.

Which right of the auth file (msgtable.server.auth) each needs, on the queue's table (or
``table/subscription``): SendMessage(Batch) ``send``; ReceiveMessage ``subscribe``;
DeleteMessage(Batch) and ChangeMessageVisibility(Batch) ``ack``; GetQueueUrl and
GetQueueAttributes any right on the queue; ListQueues lists the queues the caller has any
right on; CreateQueue, DeleteQueue and PurgeQueue ``manage`` (and ``msgtable serve
--sqs-manage``: msgtable.server.sqs.manage).

Visibility: a message received is in flight for the table's vt_ack_wait (the queue's
VisibilityTimeout) from its send; a receive's VisibilityTimeout renews it to that many
seconds from now, 0 releases it at once (msgtable.core.settlement: the delivery counts as an
attempt, as an SQS receive does). ChangeMessageVisibility is a renew, or a release with 0.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from msgtable.core.latency import LatencySnapshot
from msgtable.core.status import TableStatus
from msgtable.engine.subscriber import Subscriber
from msgtable.errors import MsgtableError
from msgtable.server.auth import Authorizer
from msgtable.server.sqs import handles, messages
from msgtable.server.sqs.consumer import IN_FLIGHT_LIMIT, Consumer, Puller, Received
from msgtable.server.sqs.digest import md5_of_attributes, md5_of_body
from msgtable.server.sqs.forward import Elsewhere
from msgtable.server.sqs.handles import Deliveries, Handle
from msgtable.server.sqs.manage import Manager
from msgtable.server.sqs.protocol import Params, SqsError, invalid, sqs_error
from msgtable.server.sqs.queues import Counts, Directory, Queue, attributes
from msgtable.server.sqs.sender import Sender
from msgtable.store.backlog import Backlog
from msgtable.store.sqsqueues import QueueTables

DEFAULT_MAX_MESSAGE_BYTES = 262_144  # SQS's default, 256 KiB
MAX_DELAY_S = 900
MAX_VISIBILITY_S = 43_200
MAX_WAIT_S = 20
# A message received more than this after its send (kept from a batch) is renewed at its
# hand-out, so its visibility counts from the receive
RENEW_AFTER_NS = 1_000_000_000
RIGHTS = {
    "SendMessage": "send",
    "SendMessageBatch": "send",
    "ReceiveMessage": "subscribe",
    "DeleteMessage": "ack",
    "DeleteMessageBatch": "ack",
    "ChangeMessageVisibility": "ack",
    "ChangeMessageVisibilityBatch": "ack",
    "CreateQueue": "manage",
    "DeleteQueue": "manage",
    "PurgeQueue": "manage",
}
ANY_RIGHT = ("list", "subscribe", "ack", "send", "manage", "redrive")


class Engine(Protocol):
    """What the SQS API needs of the engine (msgtable.engine.engine.MessageEngine)."""

    keyspace: str

    def subscribe(
        self,
        name: str,
        keyspace: str = "",
        shard: str = "",
        key_range: tuple[bytes, bytes] = (b"", b""),
        max_in_flight: int = 0,
        subscription: str = "",
        filter: str = "",
        max_messages: int = 0,
    ) -> Subscriber: ...

    def ack(
        self, name: str, keyspace: str, ids: Sequence[object], subscription: str = ""
    ) -> int: ...

    def release(
        self,
        name: str,
        keyspace: str,
        ids: Sequence[object],
        delay_s: float,
        reason: str | None,
        subscription: str = "",
        attempts: Sequence[int] = (),
    ) -> int: ...

    def renew(
        self,
        name: str,
        keyspace: str,
        ids: Sequence[object],
        extend_s: float,
        reason: str | None,
        subscription: str = "",
        attempts: Sequence[int] = (),
        exact: bool = False,
    ) -> int: ...

    def live_statuses(self) -> list[tuple[TableStatus, LatencySnapshot]]: ...

    def refresh(self) -> None: ...

    def service_of_sender(self, table: str, service: str) -> str: ...

    def backlog(self, max_age_s: float = ..., wait_s: float | None = None) -> list[Backlog]: ...

    def binlog_insert(self, table: str, rows: int = 0) -> None: ...


@dataclass(frozen=True)
class Caller:
    """Who calls, and the address it reached the API at (its queue URLs name it)."""

    principal: str
    host: str
    forwarded: bool = False  # forwarded by another server (msgtable.server.sqs.forward)


class Actions:
    """Every action of the API (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        sender: Sender,
        authorizer: Authorizer | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        in_flight_limit: int = IN_FLIGHT_LIMIT,
        tables: QueueTables | None = None,
    ) -> None:
        self.engine = engine
        self.sender = sender
        self.authorizer = authorizer
        self.max_message_bytes = max_message_bytes
        self.in_flight_limit = in_flight_limit
        self.directory = Directory(engine.keyspace, engine.live_statuses, engine.refresh)
        # CreateQueue, DeleteQueue, PurgeQueue (tables: None without --sqs-manage)
        self.manager = Manager(tables, self.directory, self.directory.reload, authorizer)
        self.consumer = Consumer()
        self.deliveries = Deliveries()
        self._lock = threading.Lock()
        self.handlers: dict[str, Callable[[Params, Caller], dict[str, Any]]] = {
            "GetQueueUrl": self.get_queue_url,
            "ListQueues": self.list_queues,
            "GetQueueAttributes": self.get_queue_attributes,
            "SendMessage": self.send_message,
            "SendMessageBatch": self.send_message_batch,
            "ReceiveMessage": self.receive_message,
            "DeleteMessage": self.delete_message,
            "DeleteMessageBatch": self.delete_message_batch,
            "ChangeMessageVisibility": self.change_message_visibility,
            "ChangeMessageVisibilityBatch": self.change_message_visibility_batch,
            "PurgeQueue": self.purge_queue,
            "CreateQueue": self.create_queue,
            "DeleteQueue": self.delete_queue,
        }

    def open(self) -> None:
        self.consumer.open()

    def close(self) -> None:
        self.consumer.close()

    # -- rights --------------------------------------------------------------------------
    def _allowed(self, caller: Caller, action: str, q: Queue) -> None:
        if self.authorizer is None:
            return
        right = RIGHTS.get(action)
        if right is not None:
            ok = self.authorizer.allows(caller.principal, right, q.label)
        else:
            ok = self._any_right(caller.principal, q)
        if not ok:
            raise SqsError(
                "AccessDenied", f"{caller.principal} may not {right or 'use'} queue {q.name}", 403
            )

    def _any_right(self, principal: str, q: Queue) -> bool:
        a = self.authorizer
        return a is None or any(a.allows(principal, r, q.label) for r in ANY_RIGHT)

    def _queue(self, p: Params, caller: Caller, action: str) -> Queue:
        q = self.directory.from_url(p.text("QueueUrl", required=True))
        self._allowed(caller, action, q)
        return q

    def _sent_here(self, p: Params, caller: Caller, action: str) -> Queue:
        """The queue of a receive or a settle: Elsewhere when another server sends its
        table (the call goes to that server's API, msgtable.server.sqs.forward)."""
        q = self._queue(p, caller, action)
        if not caller.forwarded:
            address = self.engine.service_of_sender(q.table, "sqs")
            if address:
                raise Elsewhere(address, q.table)
        return q

    # -- queues --------------------------------------------------------------------------
    def get_queue_url(self, p: Params, caller: Caller) -> dict[str, Any]:
        owner = p.text("QueueOwnerAWSAccountId")
        if owner and owner != self.engine.keyspace:
            raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
        q = self.directory.find(p.text("QueueName", required=True))
        self._allowed(caller, "GetQueueUrl", q)
        return {"QueueUrl": q.url(caller.host)}

    def list_queues(self, p: Params, caller: Caller) -> dict[str, Any]:
        prefix = p.text("QueueNamePrefix")
        most = p.integer("MaxResults", 1, 1000)
        after = p.text("NextToken")
        names = [
            q
            for q in self.directory.queues()
            if q.name.startswith(prefix) and q.name > after and self._any_right(caller.principal, q)
        ]
        out: dict[str, Any] = {}
        if most is not None and len(names) > most:
            names = names[:most]
            out["NextToken"] = names[-1].name
        if names:
            out["QueueUrls"] = [q.url(caller.host) for q in names]
        return out

    def get_queue_attributes(self, p: Params, caller: Caller) -> dict[str, Any]:
        q = self._queue(p, caller, "GetQueueAttributes")
        names = p.strings("AttributeNames") or ["All"]
        dead = None
        if q.config.dead_letter:
            try:
                dead = self.directory.find(q.config.dead_letter)
            except SqsError:
                dead = None
        found = attributes(q, names, lambda: self._counts(q), self.max_message_bytes, dead)
        return {"Attributes": found} if found else {}

    def _counts(self, q: Queue) -> Counts:
        in_flight = 0
        for s, _ in self.engine.live_statuses():
            if s.name == q.table and s.subscription == q.subscription:
                in_flight = s.in_flight
        for b in self.engine.backlog(max_age_s=1.0, wait_s=2.0):
            if b.table == q.table and b.subscription == q.subscription:
                return Counts(b.due, b.scheduled, in_flight)
        return Counts(None, None, in_flight)

    def create_queue(self, p: Params, caller: Caller) -> dict[str, Any]:
        return {"QueueUrl": self.manager.create(p, caller.principal).url(caller.host)}

    def delete_queue(self, p: Params, caller: Caller) -> dict[str, Any]:
        q = self.directory.from_url(p.text("QueueUrl", required=True))
        self.manager.delete(q, caller.principal)
        return {}

    def purge_queue(self, p: Params, caller: Caller) -> dict[str, Any]:
        q = self.directory.from_url(p.text("QueueUrl", required=True))
        self.manager.purge(q, caller.principal)
        return {}

    # -- sending -------------------------------------------------------------------------
    def _outgoing(self, p: Params, q: Queue) -> messages.Outgoing:
        raw = p.raw.get("MessageBody")
        if raw is None:
            raise SqsError(
                "MissingParameter", "The request must contain the parameter MessageBody."
            )
        body = p.text("MessageBody")
        if not body:
            raise invalid("The request must contain a non-empty MessageBody.")
        messages.check_body(body)
        attrs = messages.check_attributes(p.mapping("MessageAttributes"))
        size = messages.size_of(body, attrs)
        if size > self.max_message_bytes:
            raise invalid(
                "One or more parameters are invalid. Reason: Message must be shorter than "
                f"{self.max_message_bytes} bytes."
            )
        delay = p.integer("DelaySeconds", 0, MAX_DELAY_S, 0) or 0
        group = p.text("MessageGroupId") or None
        dedup = p.text("MessageDeduplicationId") or None
        for name, value in (("MessageGroupId", group), ("MessageDeduplicationId", dedup)):
            if value is not None and (
                len(value) > 128 or not value.isprintable() or not value.isascii()
            ):
                raise invalid(f"Value {value[:130]} for parameter {name} is invalid.")
        if q.fifo and group is None:
            raise SqsError(
                "MissingParameter", "The request must contain the parameter MessageGroupId."
            )
        if not q.fifo:
            group = None  # a standard queue's group id is kept nowhere (no order key)
        shape = messages.shape_of(q.config)
        if not shape.has_dedup:
            dedup = None
        elif dedup is None and q.fifo:
            dedup = hashlib.sha256(body.encode()).hexdigest()  # content-based
        return messages.Outgoing(body, attrs, delay, group, dedup)

    def _sent(self, out: messages.Outgoing, rid: Hashable) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "MessageId": messages.message_id(rid),
            "MD5OfMessageBody": md5_of_body(out.body),
        }
        if out.attributes:
            answer["MD5OfMessageAttributes"] = md5_of_attributes(out.attributes)
        if out.group_id is not None:
            answer["SequenceNumber"] = messages.message_id(rid)
        return answer

    def _sending_queue(self, p: Params, caller: Caller, action: str) -> Queue:
        q = self._queue(p, caller, action)
        if q.subscription:
            raise SqsError(
                "UnsupportedOperation",
                f"queue {q.name} is a subscription of table {q.table}: send to the queue "
                f"{q.table} (every subscription of the table gets its messages)",
            )
        return q

    def send_message(self, p: Params, caller: Caller) -> dict[str, Any]:
        q = self._sending_queue(p, caller, "SendMessage")
        out = self._outgoing(p, q)
        (rid,) = self._send(q, [out])
        return self._sent(out, rid)

    def send_message_batch(self, p: Params, caller: Caller) -> dict[str, Any]:
        q = self._sending_queue(p, caller, "SendMessageBatch")
        entries = p.entries()
        ok: list[tuple[str, messages.Outgoing]] = []
        failed: list[dict[str, Any]] = []
        total = 0
        for e in entries:
            try:
                out = self._outgoing(e, q)
            except SqsError as exc:
                failed.append(_failure(e, exc))
                continue
            total += messages.size_of(out.body, out.attributes)
            ok.append((e.text("Id"), out))
        if total > self.max_message_bytes:
            raise SqsError(
                "BatchRequestTooLong",
                f"Batch requests cannot be longer than {self.max_message_bytes} bytes. You have "
                f"sent {total} bytes.",
            )
        successful = []
        if ok:
            try:
                ids = self._send(q, [out for _, out in ok])
            except SqsError as exc:
                if exc.status >= 500:
                    raise
                failed += [_failure_of(i, exc) for i, _ in ok]
            else:
                successful = [
                    {"Id": i, **self._sent(out, rid)} for (i, out), rid in zip(ok, ids, strict=True)
                ]
        return {"Successful": successful, "Failed": failed}

    def _send(self, q: Queue, out: list[messages.Outgoing]) -> list[Hashable]:
        try:
            return self.sender.send(q, out)
        except MsgtableError as exc:
            raise sqs_error(exc) from None

    # -- receiving -----------------------------------------------------------------------
    def receive_message(self, p: Params, caller: Caller) -> dict[str, Any]:
        q = self._sent_here(p, caller, "ReceiveMessage")
        most = p.integer("MaxNumberOfMessages", 1, 10, 1) or 1
        wait = p.integer("WaitTimeSeconds", 0, MAX_WAIT_S, 0) or 0
        visibility = p.integer("VisibilityTimeout", 0, MAX_VISIBILITY_S)
        system = [*p.strings("AttributeNames"), *p.strings("MessageSystemAttributeNames")]
        wanted = p.strings("MessageAttributeNames")
        try:
            got = self.consumer.receive(q.label, lambda: self._puller(q), most, wait)
        except MsgtableError as exc:
            raise sqs_error(exc) from None
        if not got:
            return {}
        deadline = self._visible(q, got, visibility)
        now_ms = time.time_ns() // 1_000_000
        shape = messages.shape_of(q.config)
        tag = handles.tag_of(q.label)
        return {
            "Messages": [
                self._message(q, shape, tag, r, deadline(r), now_ms, system, wanted, caller)
                for r in got
            ]
        }

    def _puller(self, q: Queue) -> Puller:
        engine = self.engine

        def subscribe() -> Any:
            return engine.subscribe(
                q.table,
                engine.keyspace,
                max_in_flight=self.in_flight_limit,
                subscription=q.subscription,
            )

        return Puller(subscribe, lambda: q.config.ack_wait_s)

    def _visible(
        self, q: Queue, got: list[Received], visibility: int | None
    ) -> Callable[[Received], int]:
        """Renew or release what a receive took as its VisibilityTimeout asks (or as a kept
        message's age needs); when each one's visibility ends (unix ns)."""
        now = time.time_ns()
        ack_wait_ns = round(q.config.ack_wait_s * 1e9)
        ids = [r.values[0] for r in got]
        attempts = [r.attempt for r in got]
        try:
            if visibility == 0:
                self.engine.release(q.table, q.keyspace, ids, 0.0, None, q.subscription, attempts)
                return lambda r: now
            stale = any(now - r.sent_ns > RENEW_AFTER_NS for r in got)
            if visibility is None and not stale:
                return lambda r: r.sent_ns + ack_wait_ns
            extend_s = float(visibility) if visibility is not None else q.config.ack_wait_s
            self.engine.renew(  # SQS's visibility counts from now, sooner or later: exact
                q.table, q.keyspace, ids, extend_s, None, q.subscription, attempts, exact=True
            )
        except MsgtableError as exc:
            raise sqs_error(exc) from None
        until = now + round(extend_s * 1e9)
        return lambda r: until

    def _message(
        self,
        q: Queue,
        shape: messages.Shape,
        tag: bytes,
        r: Received,
        deadline_ns: int,
        now_ms: int,
        system: Sequence[str],
        wanted: Sequence[str],
        caller: Caller,
    ) -> dict[str, Any]:
        rid = r.values[0]
        h = Handle(tag, handles.new_nonce(), r.attempt, rid)
        first_ms = self.deliveries.handed(h, deadline_ns, now_ms)
        body = shape.body(r.values)
        msg: dict[str, Any] = {
            "MessageId": messages.message_id(rid),
            "ReceiptHandle": h.encode(),
            "MD5OfBody": md5_of_body(body),
            "Body": body,
        }
        if system:
            sent_ms = messages.sent_ms_of(rid) or first_ms
            values: dict[str, Any] = {
                "SenderId": caller.principal or "anonymous",
                "SentTimestamp": sent_ms,
                "ApproximateReceiveCount": r.attempt,
                "ApproximateFirstReceiveTimestamp": first_ms,
                "MessageGroupId": shape.group_id(r.values),
                "MessageDeduplicationId": shape.dedup_id(r.values),
                "SequenceNumber": messages.message_id(rid) if q.fifo else None,
            }
            everything = "All" in system
            msg["Attributes"] = {
                k: str(v)
                for k, v in values.items()
                if v is not None and (everything or k in system)
            }
        attrs = shape.attributes(r.values, wanted)
        if attrs:
            msg["MessageAttributes"] = messages.wire(attrs)
            msg["MD5OfMessageAttributes"] = md5_of_attributes(attrs)
        return msg

    # -- settling ------------------------------------------------------------------------
    def delete_message(self, p: Params, caller: Caller) -> dict[str, Any]:
        q = self._sent_here(p, caller, "DeleteMessage")
        h = handles.decode(p.text("ReceiptHandle", required=True), handles.tag_of(q.label))
        self._delete(q, [h])
        return {}

    def delete_message_batch(self, p: Params, caller: Caller) -> dict[str, Any]:
        q = self._sent_here(p, caller, "DeleteMessageBatch")
        tag = handles.tag_of(q.label)
        good: list[tuple[str, Handle]] = []
        failed = []
        for e in p.entries():
            try:
                good.append(
                    (e.text("Id"), handles.decode(e.text("ReceiptHandle", required=True), tag))
                )
            except SqsError as exc:
                failed.append(_failure(e, exc))
        if good:
            self._delete(q, [h for _, h in good])
        return {"Successful": [{"Id": i} for i, _ in good], "Failed": failed}

    def _delete(self, q: Queue, hs: list[Handle]) -> None:
        """Ack the deliveries the handles name that are current (module handles)."""
        now = time.time_ns()
        current, unknown = [], []
        for h in hs:
            state = self.deliveries.state(h, now)
            if state == "current":
                current.append(h)
            elif state == "unknown":
                unknown.append(h)
        try:
            for h in unknown:  # the table decides: still this delivery?
                if self.engine.renew(
                    q.table, q.keyspace, [h.id], 0.0, None, q.subscription, [h.attempt]
                ):
                    current.append(h)
            if current:
                self.engine.ack(
                    q.table, q.keyspace, _unique([h.id for h in current]), q.subscription
                )
        except MsgtableError as exc:
            raise sqs_error(exc) from None
        for h in current:
            self.deliveries.forget(h)

    def change_message_visibility(self, p: Params, caller: Caller) -> dict[str, Any]:
        q = self._sent_here(p, caller, "ChangeMessageVisibility")
        h = handles.decode(p.text("ReceiptHandle", required=True), handles.tag_of(q.label))
        seconds = p.integer("VisibilityTimeout", 0, MAX_VISIBILITY_S)
        if seconds is None:
            raise SqsError(
                "MissingParameter", "The request must contain the parameter VisibilityTimeout."
            )
        self._change(q, h, seconds)
        return {}

    def change_message_visibility_batch(self, p: Params, caller: Caller) -> dict[str, Any]:
        q = self._sent_here(p, caller, "ChangeMessageVisibilityBatch")
        tag = handles.tag_of(q.label)
        successful, failed = [], []
        for e in p.entries():
            try:
                h = handles.decode(e.text("ReceiptHandle", required=True), tag)
                seconds = e.integer("VisibilityTimeout", 0, MAX_VISIBILITY_S)
                if seconds is None:
                    raise SqsError(
                        "MissingParameter",
                        "The request must contain the parameter VisibilityTimeout.",
                    )
                self._change(q, h, seconds)
            except SqsError as exc:
                if exc.status >= 500:
                    raise
                failed.append(_failure(e, exc))
            else:
                successful.append({"Id": e.text("Id")})
        return {"Successful": successful, "Failed": failed}

    def _change(self, q: Queue, h: Handle, seconds: int) -> None:
        now = time.time_ns()
        if self.deliveries.state(h, now) == "stale":
            raise _not_in_flight()
        try:
            if seconds == 0:
                n = self.engine.release(
                    q.table, q.keyspace, [h.id], 0.0, None, q.subscription, [h.attempt]
                )
            else:
                n = self.engine.renew(
                    q.table,
                    q.keyspace,
                    [h.id],
                    float(seconds),
                    None,
                    q.subscription,
                    [h.attempt],
                    exact=True,
                )
        except MsgtableError as exc:
            raise sqs_error(exc) from None
        if not n:
            raise _not_in_flight()
        # a release ends the delivery but keeps its record: the next one's first receive
        self.deliveries.extend(h, now + seconds * 1_000_000_000)


def _not_in_flight() -> SqsError:
    return SqsError("MessageNotInflight", "The specified message isn't in flight.")


def _failure(e: Params, exc: SqsError) -> dict[str, Any]:
    return _failure_of(e.text("Id"), exc)


def _failure_of(entry_id: str, exc: SqsError) -> dict[str, Any]:
    return {
        "Id": entry_id,
        "SenderFault": exc.status < 500,
        "Code": exc.code,
        "Message": exc.message,
    }


def _unique(ids: list[Hashable]) -> list[Hashable]:
    return list(dict.fromkeys(ids))
