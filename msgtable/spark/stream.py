"""``spark.readStream.format("msgtable")``: a streaming query that consumes a message table as
one more subscriber, and acks a message only once the micro-batch that carried it is
committed.

How it works. The reader runs on the driver (in Spark's long-lived Python process for the
query's source) and subscribes to the table over gRPC (``server``, default MSGTABLE_SERVER or
127.0.0.1:50051) like any worker, so the server's round-robin and ack waits apply: no message is
in flight to it and to another subscriber at once. A thread reads the subscriber; each
``latestOffset`` turns what arrived into the next micro-batch (at most
``maxMessagesPerBatch``, default 10,000; offsets are {"batch": N}); ``partitions`` hands the
batch's rows to the executors inside its partitions; ``commit`` (Spark calls it once the
batch's sink has committed) acks the batch's messages with MessageAck.

Spark calls ``commit(N)`` only when it plans batch N+1. So that the last batch is not left
unacked while no new message comes, the reader then offers one empty batch: a batch is acked
at most one trigger after its sink committed, even on an idle stream. What is still unacked
when the query stops or fails (the batch being written, the last batch of a stopped query)
comes back after the table's ``vt_ack_wait``, to this query when it restarts or to another
subscriber: delivery is at least once, and a sink that must not see a message twice should
write idempotently (by ``id``). Choose a ``vt_ack_wait`` longer than a micro-batch takes; a
batch replayed after a restart holds no messages (those it had come back after their ack wait).

Options of a subscription (msgtable.subscriptions). ``subscription``: the query consumes that
subscription (consumer group) of the table instead of its default group: it gets the
subscription's messages (those its filter matched), and its acks settle them in the
subscription's state table only; the frame has the subscription's columns (its projection).
``columns`` (``id,kind,amount``): only these of the message columns, ``id`` always first,
as the stream's schema and rows (the server projects them). An unknown table, subscription
or column fails at ``load()`` in one line.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from msgtable.codec import Field, FieldType
from msgtable.errors import InvalidArgument, TableLoadError, TableNotFound
from msgtable.limits import MAX_ACK_IDS
from msgtable.spark.options import (
    columns_option,
    int_option,
    server_option,
    subscription_option,
    table_option,
)
from msgtable.spark.schema import spark_schema
from msgtable.tables import Column

log = logging.getLogger("msgtable.spark")

DEFAULT_MAX_MESSAGES = 10_000
ROWS_PER_PARTITION = 5_000
_TEXT_TIMES = {FieldType.DATETIME, FieldType.TIMESTAMP}


def _columns(options: Mapping[str, str]) -> tuple[tuple[Column, ...], tuple[FieldType, ...]]:
    """The message columns the stream gets (id first), as the server reports them: of the
    table's default group, or of ``subscription``, narrowed to ``columns``."""
    from msgtable.client import Client

    name, sub = table_option(options), subscription_option(options)
    keyspace = options.get("keyspace", "")
    with Client(server_option(options)) as client:
        tables = [t for t in client.list_tables() if not keyspace or t.keyspace == keyspace]
    # a table's subscriptions are listed under its name too: the table is the entry without one
    info = next((t for t in tables if t.name == name and not t.subscription), None)
    if info is None:
        raise TableNotFound(f"the server serves no message table {name!r}")
    label = name
    if sub:
        label = f"{name}/{sub}"
        info = next((t for t in tables if t.name == name and t.subscription == sub), None)
        if info is None:
            raise TableNotFound(f"message table {name} has no subscription {sub!r}")
    if info.config is None:
        what = "subscription" if sub else "message table"
        raise TableLoadError(f"{what} {label} failed to load: {info.load_error}")
    fields = _projected(info.config.message_columns, columns_option(options), label)
    columns = tuple(
        Column(f.name, f.column_type.split("(")[0].split()[0].lower(), f.column_type)
        for f in fields
    )
    return columns, tuple(f.type for f in fields)


def _projected(fields: Sequence[Field], names: Sequence[str], label: str) -> tuple[Field, ...]:
    """``fields`` as a stream that asks for ``names`` gets them (msgtable.subscriber.Projected:
    the id first, then the others in the order named), or InvalidArgument naming the column."""
    if not names:
        return tuple(fields)
    by_name = {f.name: f for f in fields}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise InvalidArgument(
            f"{label}: unknown column {unknown[0]!r} in columns "
            f"(message columns: {', '.join(by_name)})"
        )
    if len(set(names)) != len(names):
        raise InvalidArgument(f"{label}: a column is named twice in columns")
    first = fields[0]
    return (first, *(by_name[n] for n in names if n != first.name))


def stream_schema(options: Mapping[str, str]) -> str:
    return spark_schema(_columns(options)[0])


@dataclass
class Delivered(InputPartition):
    """Rows of one micro-batch, carried to an executor."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)


class MsgtableStreamReader(DataSourceStreamReader):
    """The driver's side of a streaming query on a message table (see the module docstring)."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.__setstate__({"options": dict(options)})

    def __getstate__(self) -> dict[str, Any]:
        """Spark ships the reader to its Python workers: the options, not the connection."""
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """From the options alone: no subscriber yet, nothing received, nothing planned."""
        self.options = options = state["options"]
        self.table = table_option(options)
        self.subscription = subscription_option(options)
        self.columns = columns_option(options)
        self.keyspace = options.get("keyspace", "")
        self.max_messages = int_option(options, "maxMessagesPerBatch", DEFAULT_MAX_MESSAGES)
        self.window = int_option(options, "maxInFlight", 2 * self.max_messages)
        self._lock = threading.Lock()
        self._arrived: deque[Any] = deque()  # messages received, not in a batch yet
        self._batches: dict[int, list[Any]] = {}  # planned, not committed: batch -> messages
        self._last = -1  # the last batch planned
        self._error: BaseException | None = None
        self._client: Any = None
        self._subscriber: Any = None
        self._thread: threading.Thread | None = None
        self._kinds: tuple[FieldType, ...] = ()

    # -- the subscriber ------------------------------------------------------------------
    def _start(self) -> None:
        if self._thread is not None:
            return
        from msgtable.client import Client

        client = Client(server_option(self.options), timeout_s=30)
        try:
            self._subscriber = client.subscribe(  # the server's NOT_FOUND: TableNotFound
                self.table,
                self.keyspace,
                max_in_flight=self.window,
                subscription=self.subscription,
                columns=self.columns,
            )
        except BaseException:
            client.close()
            raise
        self._client = client
        self._kinds = tuple(f.type for f in self._subscriber.fields)  # the stream's own
        self._thread = threading.Thread(target=self._receive, daemon=True, name="msgtable-stream")
        self._thread.start()

    def _receive(self) -> None:
        try:
            for batch in self._subscriber.batches():
                with self._lock:
                    self._arrived.extend(batch)
        except BaseException as exc:  # the next latestOffset raises it in the query
            with self._lock:
                self._error = exc

    def _row(self, message: Any) -> tuple[Any, ...]:
        out = []
        for kind, value in zip(self._kinds, message.row, strict=True):
            if value is not None and kind in _TEXT_TIMES and isinstance(value, str):
                value = datetime.fromisoformat(value)
            elif value is not None and kind is FieldType.DATE and isinstance(value, str):
                value = date.fromisoformat(value)
            out.append(value)
        return tuple(out)

    # -- Spark's calls -------------------------------------------------------------------
    def initialOffset(self) -> dict[str, int]:
        return {"batch": -1}

    def latestOffset(self) -> dict[str, int]:  # type: ignore[override]  # the 4.0 form
        self._start()
        with self._lock:
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            take = min(len(self._arrived), self.max_messages)
            messages = [self._arrived.popleft() for _ in range(take)]
            last_had_messages = bool(self._batches.get(self._last))
            if messages or last_had_messages:
                # an empty batch after one with messages: Spark then commits that one
                self._last += 1
                self._batches[self._last] = messages
            return {"batch": self._last}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        first, last = start["batch"] + 1, end["batch"]
        with self._lock:
            if last > self._last:  # a restarted query replays a batch planned before
                self._last = last
            messages = [m for b in range(first, last + 1) for m in self._batches.get(b, [])]
        rows = [self._row(m) for m in messages]
        return [
            Delivered(rows[i : i + ROWS_PER_PARTITION])
            for i in range(0, len(rows), ROWS_PER_PARTITION)
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, Delivered)
        yield from partition.rows

    def commit(self, end: dict[str, int]) -> None:
        with self._lock:
            done = sorted(b for b in self._batches if b <= end["batch"])
            messages = [m for b in done for m in self._batches.pop(b)]
        if messages and self._client is not None:
            ids = [m.id for m in messages]
            for i in range(0, len(ids), MAX_ACK_IDS):  # the most one MessageAck takes
                chunk = ids[i : i + MAX_ACK_IDS]
                self._client.ack(self.table, chunk, self.keyspace, subscription=self.subscription)

    def stop(self) -> None:
        """The query ended: what is not acked comes back after its ack wait."""
        subscriber, client = self._subscriber, self._client
        self._subscriber = self._client = None
        if subscriber is not None:
            subscriber.close()
        if client is not None:
            client.close()
