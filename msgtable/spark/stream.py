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

Order per key. For an ordered table (``vt_order_key``, msgtable.engine.ordered) a micro-batch puts
all
the messages of one key in one partition, in the order they arrived: partition
``crc32(key) % n``, with n = the batch's messages / ``rowsPerPartition`` (default 5,000)
rounded up, so a sink that handles partitions in parallel still sees each key's messages in
order. Text keys are folded (case, accents, trailing spaces) before the hash, as the
database's ``_ci`` collations compare them: values the server may take for one key land
together. A NULL key is a key of its own (its message's id). Without the key among the
stream's ``columns``, a batch as the server sent it is the unit instead (a key's messages in
flight travel in one). Across micro-batches the server's rule holds: it sends a key's next
messages only after every one before them is settled, that is once the batch that carried
them is committed and acked. The same holds for a subscription of an ordered table (it
orders on its own). An unordered table's batch is cut into partitions of
``rowsPerPartition`` messages in arrival order.

Options of a subscription (msgtable.core.subscriptions). ``subscription``: the query consumes that
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
import unicodedata
import zlib
from collections import deque
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from msgtable.core.codec import Field, FieldType
from msgtable.core.tables import Column
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
    """``fields`` as a stream that asks for ``names`` gets them
    (msgtable.engine.subscriber.Projected:
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


def _order_key(client: Any, table: str, keyspace: str) -> str:
    """The stream's order key column as the server reports it ("" for an unordered table);
    a subscription of an ordered table orders on its own, by the same key."""
    for t in client.list_tables():
        if t.name == table and not t.subscription and (not keyspace or t.keyspace == keyspace):
            return t.config.order_key if t.config is not None else ""
    return ""


def partition_of(key: Hashable, n: int) -> int:
    """Which of ``n`` partitions a key's messages go to: the same in every process (Python's
    hash of text is salted per process), and the same for text values the database's ``_ci``
    collations take as one key ('A', 'a', 'á', 'a ')."""
    if isinstance(key, str):
        folded = unicodedata.normalize("NFKD", key.rstrip(" ").casefold())
        data = "".join(c for c in folded if not unicodedata.combining(c)).encode()
    elif isinstance(key, bytes):
        data = key
    else:
        data = repr(key).encode()
    return zlib.crc32(data) % n


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
        self.rows_per_partition = int_option(options, "rowsPerPartition", ROWS_PER_PARTITION)
        self._lock = threading.Lock()
        # (key, message): received, not in a batch yet; key None for an unordered table
        self._arrived: deque[tuple[Hashable, Any]] = deque()
        self._batches: dict[int, list[tuple[Hashable, Any]]] = {}  # planned, not committed
        self._ordered = False
        self._key_at: int | None = None  # the order key's place in a row (None: not there)
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
            order_key = _order_key(client, self.table, self.keyspace)
        except BaseException:
            if self._subscriber is not None:
                self._subscriber.close()
                self._subscriber = None
            client.close()
            raise
        self._client = client
        self._kinds = tuple(f.type for f in self._subscriber.fields)  # the stream's own
        names = [f.name for f in self._subscriber.fields]
        self._ordered = bool(order_key)
        self._key_at = names.index(order_key) if order_key in names else None
        self._thread = threading.Thread(target=self._receive, daemon=True, name="msgtable-stream")
        self._thread.start()

    def _receive(self) -> None:
        try:
            for n, batch in enumerate(self._subscriber.batches()):
                keyed = [(self._key(m, n), m) for m in batch]
                with self._lock:
                    self._arrived.extend(keyed)
        except BaseException as exc:  # the next latestOffset raises it in the query
            with self._lock:
                self._error = exc

    def _key(self, message: Any, batch: int) -> Hashable:
        """What keeps a message with the others of its key in one partition (module
        docstring): its order key (a NULL key: its id); the server's batch that carried it
        when the stream has no key column; None for an unordered table."""
        if not self._ordered:
            return None
        if self._key_at is None:
            return ("batch", batch)
        key = message.row[self._key_at]
        return ("id", message.id) if key is None else key

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
            keyed = [km for b in range(first, last + 1) for km in self._batches.get(b, [])]
        size = self.rows_per_partition
        if not self._ordered:
            rows = [self._row(m) for _, m in keyed]
            return [Delivered(rows[i : i + size]) for i in range(0, len(rows), size)]
        parts: list[list[tuple[Any, ...]]] = [[] for _ in range(-(-len(keyed) // size))]
        for key, m in keyed:  # in arrival order: each key's rows stay in it
            parts[partition_of(key, len(parts))].append(self._row(m))
        return [Delivered(rows) for rows in parts if rows]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, Delivered)
        yield from partition.rows

    def commit(self, end: dict[str, int]) -> None:
        with self._lock:
            done = sorted(b for b in self._batches if b <= end["batch"])
            messages = [m for b in done for _, m in self._batches.pop(b)]
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
