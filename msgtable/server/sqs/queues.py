"""Queues: which table (or subscription) a queue is, its name and URL, and its attributes.

A queue is a message table's default group, named as the table (``orders``), or one of its
subscriptions, named ``TABLE/SUBSCRIPTION`` (``orders/billing``: msgtable's own label for
it, the one the auth file's rules name); an ordered table's (vt_order_key) queues are FIFO
queues, their names ending in ``.fifo`` (``order_events.fifo``). Its URL is
``http://HOST:PORT/KEYSPACE/NAME``: the address the client reached the API at, the keyspace in
the place of SQS's account, then the name. A GetQueueUrl or a URL that leaves out the
``.fifo`` of an ordered table's queue finds it too.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from msgtable.core.latency import LatencySnapshot
from msgtable.core.status import TableStatus
from msgtable.core.tables import TableConfig
from msgtable.server.sqs.messages import dedup_column
from msgtable.server.sqs.protocol import NO_QUEUE, SqsError

FIFO_SUFFIX = ".fifo"
REGION = "msgtable"  # the region an ARN names (msgtable has none)
CACHE_S = 1.0  # how long the list of queues is reused before the engine is asked again
REFRESH_GAP_S = 1.0  # at most one discovery per this for a name not known
# SQS's largest retention: msgtable keeps an unacked message until it is acked or dead
RETENTION_S = 1_209_600


@dataclass(frozen=True)
class Queue:
    keyspace: str
    table: str
    subscription: str
    config: TableConfig  # the table's, or the subscription's (its state table's)

    @property
    def fifo(self) -> bool:
        return bool(self.config.order_key)

    @property
    def label(self) -> str:
        """msgtable's name for it: the table, or table/subscription (auth rules)."""
        return f"{self.table}/{self.subscription}" if self.subscription else self.table

    @property
    def name(self) -> str:
        return self.label + (FIFO_SUFFIX if self.fifo else "")

    def url(self, host: str) -> str:
        return f"http://{host}/{self.keyspace}/{self.name}"

    def arn(self) -> str:
        return f"arn:aws:sqs:{REGION}:{self.keyspace}:{self.name}"


class Directory:
    """The queues of the engine's loaded tables and subscriptions, found by name or URL."""

    def __init__(
        self,
        keyspace: str,
        statuses: Callable[[], list[tuple[TableStatus, LatencySnapshot]]],
        refresh: Callable[[], None],
    ) -> None:
        self.keyspace = keyspace
        self._statuses = statuses
        self._refresh = refresh
        self._lock = threading.Lock()
        self._queues: dict[str, Queue] = {}
        self._read_at = -1e9
        self._refreshed_at = -1e9

    def queues(self) -> list[Queue]:
        return sorted(self._read().values(), key=lambda q: q.name)

    def find(self, name: str) -> Queue:
        """The queue named ``name``; QueueDoesNotExist if no loaded table or subscription is
        it (after one discovery, for a table created a moment ago)."""
        for attempt in range(2):
            q = _lookup(self._read(fresh=attempt > 0), name)
            if q is not None:
                return q
            if attempt == 0 and not self._refresh_once():
                break
        raise SqsError("QueueDoesNotExist", NO_QUEUE)

    def from_url(self, url: str) -> Queue:
        """The queue a QueueUrl names (its path: /KEYSPACE/NAME)."""
        path = unquote(urlsplit(url).path) if "://" in url else ""
        keyspace, _, name = path.lstrip("/").partition("/")
        if not name or keyspace != self.keyspace:
            raise SqsError("QueueDoesNotExist", NO_QUEUE)
        return self.find(name)

    def reload(self) -> None:
        """Discover the tables now and read them afresh (after this server's own DDL)."""
        self._refresh()
        self._read(fresh=True)

    def _read(self, fresh: bool = False) -> dict[str, Queue]:
        now = time.monotonic()
        with self._lock:
            if not fresh and now - self._read_at < CACHE_S:
                return self._queues
        queues: dict[str, Queue] = {}
        for status, _ in self._statuses():
            cfg = status.config
            if cfg is None or cfg.capture is not None:
                continue
            q = Queue(self.keyspace, status.name, status.subscription, cfg)
            queues[q.label] = q
        with self._lock:
            self._queues, self._read_at = queues, now
        return queues

    def _refresh_once(self) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._refreshed_at < REFRESH_GAP_S:
                return True  # another ask just read them: read what it found
            self._refreshed_at = now
        try:
            self._refresh()
        except Exception:  # the database away: the queues as last seen
            return False
        return True


def _lookup(queues: dict[str, Queue], name: str) -> Queue | None:
    q = queues.get(name)
    if q is None and name.endswith(FIFO_SUFFIX):
        q = queues.get(name[: -len(FIFO_SUFFIX)])
    return q


# -- attributes ----------------------------------------------------------------------------
ATTRIBUTE_NAMES = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "VisibilityTimeout",
    "MessageRetentionPeriod",
    "DelaySeconds",
    "ReceiveMessageWaitTimeSeconds",
    "MaximumMessageSize",
    "QueueArn",
    "RedrivePolicy",
    "FifoQueue",
    "ContentBasedDeduplication",
)


@dataclass(frozen=True)
class Counts:
    """What the engine counts of a queue now (None: not known)."""

    due: int | None
    scheduled: int | None
    in_flight: int


def attributes(
    q: Queue,
    names: Sequence[str],
    counts: Callable[[], Counts],
    max_bytes: int,
    dead_letter: Queue | None,
) -> dict[str, str]:
    """GetQueueAttributes' answer (InvalidAttributeName for a name SQS does not have)."""
    for n in names:
        if n != "All" and n not in ATTRIBUTE_NAMES and n not in _UNSUPPORTED:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {n}.")
    wanted = set(ATTRIBUTE_NAMES) if "All" in names else set(names)
    cfg = q.config
    out: dict[str, str] = {}
    if wanted & {n for n in ATTRIBUTE_NAMES if n.startswith("Approximate")}:
        c = counts()
        delayed = max(0, (c.scheduled or 0) - c.in_flight)
        values = {
            "ApproximateNumberOfMessages": c.due or 0,
            "ApproximateNumberOfMessagesNotVisible": c.in_flight,
            "ApproximateNumberOfMessagesDelayed": delayed,
        }
        out.update({k: str(v) for k, v in values.items() if k in wanted})
    plain: dict[str, Any] = {
        "VisibilityTimeout": round(cfg.ack_wait_s),
        "MessageRetentionPeriod": RETENTION_S,
        "DelaySeconds": 0,
        "ReceiveMessageWaitTimeSeconds": 0,
        "MaximumMessageSize": max_bytes,
        "QueueArn": q.arn(),
    }
    out.update({k: str(v) for k, v in plain.items() if k in wanted})
    if "RedrivePolicy" in wanted and cfg.max_attempts:
        policy: dict[str, Any] = {"maxReceiveCount": cfg.max_attempts}
        if dead_letter is not None:
            policy = {"deadLetterTargetArn": dead_letter.arn(), **policy}
        out["RedrivePolicy"] = json.dumps(policy)
    if q.fifo:
        if "FifoQueue" in wanted:
            out["FifoQueue"] = "true"
        if "ContentBasedDeduplication" in wanted:
            out["ContentBasedDeduplication"] = str(cfg.has_column(dedup_column(cfg))).lower()
    return out


# SQS's attributes msgtable has no value for: asked, they are left out of the answer
_UNSUPPORTED = frozenset(
    {
        "Policy",
        "CreatedTimestamp",
        "LastModifiedTimestamp",
        "KmsMasterKeyId",
        "KmsDataKeyReusePeriodSeconds",
        "SqsManagedSseEnabled",
        "DeduplicationScope",
        "FifoThroughputLimit",
        "RedriveAllowPolicy",
    }
)
