"""CreateQueue, DeleteQueue and PurgeQueue: DDL and bulk deletes in the user's database, so
only behind ``msgtable serve --sqs-manage`` (MSGTABLE_SQS_MANAGE; off by default), and with
``--auth`` only for a principal with the ``manage`` right on the queue.

Without the flag, CreateQueue answers an existing queue's URL (an SDK's "create if missing"
works on tables made by DDL) and otherwise, like DeleteQueue and PurgeQueue, an
UnsupportedOperation naming the flag.

* CreateQueue creates a message table (msgtable.store.sqsqueues: schema/current.sql's shape
  and the SQS API's columns), its COMMENT from the attributes: VisibilityTimeout ->
  vt_ack_wait, MessageRetentionPeriod -> vt_purge_after (how long an acked row is kept:
  msgtable keeps an unacked message until it is deleted or dead), RedrivePolicy's
  maxReceiveCount -> vt_max_attempts and its deadLetterTargetArn -> vt_dead_letter (a queue
  of this keyspace's); a name ending in ``.fifo`` (with FifoQueue "true", or none) -> an
  ordered table. DelaySeconds and ReceiveMessageWaitTimeSeconds only as 0 (msgtable has no
  queue-wide delay or wait: a request gives its own). An existing queue answers its URL when
  the attributes asked agree with it, else QueueNameExists, as SQS.
* DeleteQueue drops the table, unless it has subscriptions or is another queue's
  dead-letter queue (each named in the error: drop or change those first). A subscription's
  queue is not deleted here (``msgtable subscription drop``).
* PurgeQueue deletes the table's messages not acked yet. As SQS, one purge per queue per 60 s
  (per server): another within that answers PurgeQueueInProgress. Messages a server had
  already read into its cache may still be received once after it (SQS says the same of
  its own purge); deleting them then changes nothing. A table with subscriptions, or a
  subscription's queue, is not purged here.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from msgtable.errors import MsgtableError
from msgtable.server.auth import Authorizer
from msgtable.server.sqs.protocol import Params, SqsError, invalid, sqs_error
from msgtable.server.sqs.queues import FIFO_SUFFIX, Directory, Queue
from msgtable.store import sqsqueues

FLAG = "--sqs-manage"
PURGE_GAP_S = 60.0  # SQS's: one PurgeQueue per queue per minute
MIN_RETENTION_S, MAX_RETENTION_S = 60, 1_209_600
MAX_VISIBILITY_S = 43_200
MAX_RECEIVE_COUNT = 1000
ZERO_ONLY = ("DelaySeconds", "ReceiveMessageWaitTimeSeconds")
IGNORED = frozenset({"ContentBasedDeduplication", "FifoQueue"})  # checked, kept by the shape


def refused(action: str) -> SqsError:
    return SqsError(
        "UnsupportedOperation",
        f"{action} writes DDL or deletes in your database: msgtable serves it only with "
        f"msgtable serve {FLAG} (or MSGTABLE_SQS_MANAGE=1)",
    )


class Manager:
    """The three actions over ``tables`` (see the module docstring)."""

    def __init__(
        self,
        tables: sqsqueues.QueueTables | None,
        directory: Directory,
        reload: Callable[[], None],
        authorizer: Authorizer | None,
    ) -> None:
        self._tables = tables  # None: not enabled (no --sqs-manage)
        self.directory = directory
        self._reload = reload
        self.authorizer = authorizer
        self._lock = threading.Lock()
        self._purged: dict[str, float] = {}  # queue label -> when its last purge began

    def _allowed(self, principal: str, label: str) -> None:
        if self.authorizer is not None and not self.authorizer.allows(principal, "manage", label):
            raise SqsError("AccessDenied", f"{principal} may not manage queue {label:.100}", 403)

    # -- CreateQueue ---------------------------------------------------------------------
    def create(self, p: Params, principal: str) -> Queue:
        name = p.text("QueueName", required=True)
        attrs = {k: _text(k, v) for k, v in p.mapping("Attributes").items()}
        fifo = name.endswith(FIFO_SUFFIX)
        table = name[: -len(FIFO_SUFFIX)] if fifo else name
        if attrs.get("FifoQueue", "true" if fifo else "false").lower() != str(fifo).lower():
            raise invalid(
                "The name of a FIFO queue can only include alphanumeric characters, hyphens, "
                "or underscores, must end with .fifo suffix."
            )
        try:
            existing = self.directory.find(name)
        except SqsError:
            existing = None
        if existing is not None:
            self._allowed(principal, existing.label)
            self._check_same(existing, attrs, fifo)
            return existing
        tables = self._enabled("CreateQueue")
        self._allowed(principal, table)
        fields = self._fields(attrs)
        try:
            sqsqueues.check_name(table)
        except ValueError:
            raise invalid(
                f"Value {name[:90]} for parameter QueueName is invalid. Reason: a queue msgtable "
                "creates is a table: letters, digits and underscores, at most 64 (and .fifo)."
            ) from None
        try:
            _run(f"create table {table}", lambda: tables.create(table, fields, fifo))
        except SqsError as exc:
            if exc.code != "QueueNameExists":
                raise
            # another CreateQueue of the same name won the race: the same queue is its answer
            self._reload()
            try:
                existing = self.directory.find(name)
            except SqsError:
                raise exc from None  # a table of that name that is not a message table
            self._check_same(existing, attrs, fifo)
            return existing
        self._reload()
        return self.directory.find(name)

    def _fields(self, attrs: Mapping[str, str]) -> dict[str, str]:
        """The COMMENT's fields the attributes ask for (InvalidAttributeValue otherwise)."""
        fields: dict[str, str] = {}
        for key, value in attrs.items():
            if key == "VisibilityTimeout":
                fields["vt_ack_wait"] = str(_number(key, value, 1, MAX_VISIBILITY_S))
            elif key == "MessageRetentionPeriod":
                seconds = _number(key, value, MIN_RETENTION_S, MAX_RETENTION_S)
                fields["vt_purge_after"] = str(seconds)
            elif key == "RedrivePolicy":
                fields.update(self._redrive(value))
            elif key in ZERO_ONLY:
                _number(key, value, 0, 0)
            elif key not in IGNORED:
                raise SqsError(
                    "InvalidAttributeName",
                    f"Unknown Attribute {key[:80]}: msgtable creates a queue with "
                    "VisibilityTimeout, MessageRetentionPeriod, RedrivePolicy, FifoQueue and "
                    "ContentBasedDeduplication (DelaySeconds and ReceiveMessageWaitTimeSeconds "
                    "only as 0)",
                )
        return fields

    def _redrive(self, value: str) -> dict[str, str]:
        try:
            policy = json.loads(value)
        except ValueError:
            raise _bad_attribute("RedrivePolicy", value) from None
        if not isinstance(policy, dict):
            raise _bad_attribute("RedrivePolicy", value)
        count = policy.get("maxReceiveCount")
        if isinstance(count, str) and count.isdigit():
            count = int(count)
        if not isinstance(count, int) or not 1 <= count <= MAX_RECEIVE_COUNT:
            raise _bad_attribute("RedrivePolicy", value)
        out = {"vt_max_attempts": str(count)}
        arn = policy.get("deadLetterTargetArn")
        if arn is not None:
            parts = str(arn).split(":")
            if len(parts) != 6 or parts[4] != self.directory.keyspace:
                raise _bad_attribute("RedrivePolicy", value)
            try:
                dead = self.directory.find(parts[5])
            except SqsError:
                raise invalid(
                    f"Value {value[:200]} for parameter RedrivePolicy is invalid. Reason: "
                    "Dead-letter target does not exist."
                ) from None
            if dead.subscription:
                raise _bad_attribute("RedrivePolicy", value)
            out["vt_dead_letter"] = dead.table
        return out

    def _check_same(self, q: Queue, attrs: Mapping[str, str], fifo: bool) -> None:
        """QueueNameExists when the attributes asked (or the kind) differ from the queue's."""
        cfg = q.config
        visibility = attrs.get("VisibilityTimeout")
        differs = fifo != q.fifo or (
            visibility is not None and visibility != str(round(cfg.ack_wait_s))
        )
        if "RedrivePolicy" in attrs:
            try:
                asked = json.loads(attrs["RedrivePolicy"]).get("maxReceiveCount")
            except (ValueError, AttributeError):
                asked = None
            differs = differs or str(asked) != str(cfg.max_attempts)
        if differs:
            raise SqsError(
                "QueueNameExists",
                f"A queue already exists with the same name and a different value for "
                f"attribute(s) of {q.name}",
            )

    # -- DeleteQueue, PurgeQueue ---------------------------------------------------------
    def delete(self, q: Queue, principal: str) -> None:
        tables = self._enabled("DeleteQueue")
        self._allowed(principal, q.label)
        self._whole_table(q, "DeleteQueue")
        users = [o.name for o in self.directory.queues() if o.config.dead_letter == q.table]
        if users:
            raise SqsError(
                "UnsupportedOperation",
                f"queue {q.name} is the dead-letter queue of {', '.join(users)}: change their "
                "RedrivePolicy (vt_dead_letter) first",
            )
        _run(f"drop table {q.table}", lambda: tables.drop(q.table))
        self._reload()

    def purge(self, q: Queue, principal: str, now: float | None = None) -> None:
        tables = self._enabled("PurgeQueue")
        self._allowed(principal, q.label)
        self._whole_table(q, "PurgeQueue")
        now = time.monotonic() if now is None else now
        with self._lock:
            last = self._purged.get(q.label)
            if last is not None and now - last < PURGE_GAP_S:
                raise SqsError(
                    "PurgeQueueInProgress",
                    f"Only one PurgeQueue operation on {q.name} is allowed every 60 seconds.",
                )
            self._purged[q.label] = now
        _run(f"purge table {q.table}", lambda: tables.purge(q.table))

    def _whole_table(self, q: Queue, action: str) -> None:
        if q.subscription:
            raise SqsError(
                "UnsupportedOperation",
                f"queue {q.name} is a subscription of table {q.table}: {action} takes a "
                "table's queue (msgtable subscription drop removes a subscription)",
            )
        subs = [o.name for o in self.directory.queues() if o.table == q.table and o.subscription]
        if subs:
            raise SqsError(
                "UnsupportedOperation",
                f"table {q.table} has subscriptions ({', '.join(subs)}): {action} would take "
                "their messages too; drop them first (msgtable subscription drop)",
            )

    def _enabled(self, action: str) -> sqsqueues.QueueTables:
        if self._tables is None:
            raise refused(action)
        return self._tables


def _run(what: str, call: Callable[[], Any]) -> None:
    """``call``; the store's errors as SQS's (QueueNameExists for a table already there)."""
    try:
        call()
    except sqsqueues.QueueTableExists as exc:
        raise SqsError("QueueNameExists", str(exc)) from None
    except MsgtableError as exc:
        raise sqs_error(exc) from None


def _text(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise _bad_attribute(key, value)
    return value


def _number(key: str, value: str, low: int, high: int) -> int:
    if not value.isdigit() or not low <= int(value) <= high:
        raise _bad_attribute(key, value)
    return int(value)


def _bad_attribute(key: str, value: object) -> SqsError:
    return SqsError(
        "InvalidAttributeValue", f"Invalid value for the parameter {key:.80}: {value!s:.200}"
    )
