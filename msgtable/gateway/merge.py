"""One MessageStream of a keyspace: the shards' streams merged (what msgtable.gateway.gateway
serves).

Each shard's stream is a client stream to that shard's servers (msgtable.client.stream): it
follows its table's sender and opens again by itself while the shard is away, for ever, so a
shard whose database or servers are down stops only its own messages; the others flow, and
its messages come again when it is back. A reader thread a shard puts its batches into one
queue; the gateway's stream takes them in the order they came. Nothing is ordered across
shards (as in Vitess); within a shard, the shard's own order holds.

Each shard's server bounds its stream by a window: the keyspace stream's ``max_in_flight``
is shared out evenly, each shard at least 1 (README: Keyspaces of shards). A shard whose
table is missing or whose columns differ from the others' ends the whole stream with an
error naming the shard: a misdescribed keyspace is not served half.

A limit (``max_messages``) holds for the keyspace stream as a whole: each shard's stream asks
for the same limit (any shard may hold all the messages), the merged stream hands out no more
than the limit, and what the shards sent past it is released back to its shard at once,
naming each delivery (msgtable.client.requests.UNHANDED_REASON), instead of waiting out its
ack wait.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent import futures

import grpc

from msgtable.client import requests
from msgtable.client.router import Router
from msgtable.client.stream import Stream
from msgtable.core import codec
from msgtable.core.keyspace import Shard
from msgtable.core.rows import Batch, RelayedBatch
from msgtable.core.tables import Column
from msgtable.core.words import counted
from msgtable.errors import MsgtableError, TableLoadError, Unavailable
from msgtable.limits import DEFAULT_MAX_IN_FLIGHT
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb

log = logging.getLogger("msgtable.gateway.gateway")

# A FieldType's stand-in information_schema data_type, so that a relayed column encodes the
# way the shard's server encoded it (msgtable.core.codec.field_type)
_DATA_TYPES = {
    codec.FieldType.INT: "bigint",
    codec.FieldType.UINT: "bigint",
    codec.FieldType.FLOAT: "double",
    codec.FieldType.DECIMAL: "decimal",
    codec.FieldType.TEXT: "varchar",
    codec.FieldType.BYTES: "varbinary",
    codec.FieldType.JSON: "json",
    codec.FieldType.DATETIME: "datetime",
    codec.FieldType.TIMESTAMP: "timestamp",
    codec.FieldType.DATE: "date",
    codec.FieldType.TIME: "time",
}


def relayed_columns(fields: Sequence[pb.Field]) -> tuple[Column, ...]:
    """The columns a shard's first response describes, as the gateway sends them on."""
    out = []
    for f in fields:
        kind = codec.to_field_type(f.type)
        column_type = f.column_type
        if kind is codec.FieldType.UINT and "unsigned" not in column_type.lower():
            column_type = f"{column_type} unsigned".strip()
        out.append(Column(f.name, _DATA_TYPES.get(kind, ""), column_type))
    return tuple(out)


def shard_error(keyspace: str, shard: str, error: BaseException | None) -> MsgtableError:
    """``error`` of a shard's as a gateway answers it: its class (Unavailable for what is not
    a MsgtableError), its message naming the shard."""
    text = f"shard {shard} of keyspace {keyspace!r}: {error}"
    if isinstance(error, MsgtableError):
        try:
            return type(error)(text)
        except TypeError:  # a class that takes more than a message
            return MsgtableError(text)
    return Unavailable(text)


def window_share(max_in_flight: int, shards: int) -> int:
    """Each shard's window of a keyspace stream of ``max_in_flight`` (0: the default)."""
    return max(1, math.ceil((max_in_flight or DEFAULT_MAX_IN_FLIGHT) / shards))


class _Ended:
    """What a shard's reader puts last: why it stopped (None: closed)."""

    __slots__ = ("error",)

    def __init__(self, error: MsgtableError | None) -> None:
        self.error = error


class MergedSubscriber:
    """A keyspace stream (see the module docstring); the server's Subscriber protocol."""

    def __init__(
        self,
        keyspace: str,
        shards: Sequence[Shard],
        routers: dict[str, Router],
        request: pb.MessageStreamRequest,
        first_timeout_s: float | None,
        on_relay: Callable[[str, pb.MessageStreamResponse], None] | None = None,
    ) -> None:
        """``on_relay(shard, response)``: each batch as it is handed out
        (msgtable.gateway.strays)."""
        self._keyspace = keyspace
        self._on_relay = on_relay
        self._name = request.name
        self._queue: queue.SimpleQueue[tuple[str, pb.MessageStreamResponse] | _Ended] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._closed = False
        self._ended: MsgtableError | None = None
        self._columns: tuple[Column, ...] | None = None
        self._first_from = ""
        self._decoder: codec.RowDecoder | None = None
        self.ack_wait_s = 0.0
        self._request = request
        self._routers = routers
        self._left = request.max_messages or None  # to hand out in all (None: no limit)
        share = window_share(request.max_in_flight, len(shards))
        self._streams: dict[str, Stream] = {}
        for s in shards:
            shard_request = pb.MessageStreamRequest()
            shard_request.CopyFrom(request)
            shard_request.keyspace, shard_request.shard = keyspace, s.name
            shard_request.ClearField("key_range")
            shard_request.max_in_flight = share
            self._streams[s.name] = Stream(
                routers[s.name],
                shard_request,
                first_timeout_s=first_timeout_s,
                retry=True,
                retry_for_s=None,
                on_open=self._check_fields(s.name),
            )
        self._open_all(first_timeout_s)

    # -- opening ------------------------------------------------------------------------------
    def _open_all(self, first_timeout_s: float | None) -> None:
        """Open every shard's stream at once; return when each answered, or when at least one
        did and ``first_timeout_s`` passed (the rest join when they open). An error that does
        not pass (the table missing on a shard, other columns) fails it, naming the shard."""
        pool = futures.ThreadPoolExecutor(len(self._streams), "msgtable-merge-open")
        opening = {pool.submit(st.open): name for name, st in self._streams.items()}
        pool.shutdown(wait=False)
        done, waiting = futures.wait(opening, first_timeout_s)
        try:
            for f in done:
                if f.exception() is not None:
                    raise self._named(opening[f], f.exception())
            if not any(f.result() is not None for f in done):
                raise Unavailable(
                    f"no shard of keyspace {self._keyspace!r} answered for table "
                    f"{self._name!r} within {first_timeout_s}s"
                )
        except BaseException:
            self.close()
            raise
        for f, name in opening.items():
            still_opening = f if f in waiting else None  # it reads once it opened
            threading.Thread(
                target=self._read,
                args=(name, self._streams[name], still_opening),
                daemon=True,
                name=f"merge-{name}",
            ).start()
        if waiting:
            late = ", ".join(sorted(opening[f] for f in waiting))
            log.warning(
                "gateway: stream of %s: shards %s of keyspace %r did not answer yet; "
                "their messages come when they do",
                self._name,
                late,
                self._keyspace,
            )

    def _named(self, shard: str, error: BaseException | None) -> MsgtableError:
        return shard_error(self._keyspace, shard, error)

    def _check_fields(self, shard: str) -> Callable[[pb.MessageStreamResponse], None]:
        def adopt(first: pb.MessageStreamResponse) -> None:
            columns = relayed_columns(first.fields)
            with self._lock:
                if self._columns is None:
                    self._columns, self._first_from = columns, shard
                    self._decoder = codec.RowDecoder(
                        [codec.to_field_type(f.type) for f in first.fields]
                    )
                    self.ack_wait_s = first.ack_wait_s
                    return
                if columns != self._columns:
                    raise TableLoadError(
                        f"table {self._name!r} has other columns on shard {shard} than on "
                        f"shard {self._first_from}: "
                        f"{[c.name for c in columns]} against {[c.name for c in self._columns]}"
                    )

        return adopt

    # -- reading ------------------------------------------------------------------------------
    def _read(self, shard: str, stream: Stream, opening: futures.Future[object] | None) -> None:
        try:
            if opening is not None and opening.result() is None:
                return self._queue.put(_Ended(None))
            while (response := stream.next()) is not None:
                if response.rows:
                    self._queue.put((shard, response))
            self._queue.put(_Ended(None))
        except Exception as exc:
            if not self._closed:
                self._queue.put(_Ended(self._named(shard, exc)))

    @property
    def fields(self) -> tuple[Column, ...]:
        assert self._columns is not None
        return self._columns

    def next_batch(self, timeout_s: float | None = None) -> Batch:
        """The next shard batch; an empty one on timeout; raises what ended the stream."""
        if self._ended is not None:
            raise self._ended
        try:
            item = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return Batch([])
        if isinstance(item, _Ended):
            if item.error is None:
                if self._closed:
                    raise Unavailable("subscription closed")
                return Batch([])
            self.end(item.error)
            raise item.error
        shard, response = item
        if self._left is not None:
            response = self._within_limit(shard, response)
            if not response.rows:
                return Batch([])
        if self._on_relay is not None:
            self._on_relay(shard, response)
        assert self._decoder is not None
        return RelayedBatch(response, self._decoder.decode)  # relayed as is: no re-encoding

    def _within_limit(
        self, shard: str, response: pb.MessageStreamResponse
    ) -> pb.MessageStreamResponse:
        """``response`` cut to what the stream's limit leaves; the rest released to its
        shard (one try: its ack wait is the net, as a closing subscriber's release)."""
        assert self._left is not None
        rows = response.rows
        if len(rows) <= self._left:
            self._left -= len(rows)
            return response
        kept, over = rows[: self._left], rows[self._left :]
        self._left = 0
        request = self._request
        release = requests.release_request(
            request.name,
            [r.values[0] for r in over],
            0.0,
            requests.UNHANDED_REASON,
            request.keyspace,
            request.subscription,
            [r.sent_before + 1 for r in over],
        )
        stream = self._streams[shard]
        try:
            self._routers[shard].invoke(
                stream.target,
                "MessageRelease",
                release,
                timeout=requests.UNHANDED_RELEASE_TIMEOUT_S,
            )
        except (MsgtableError, grpc.RpcError) as exc:
            log.warning(
                "gateway: stream of %s: %s of shard %s past its limit come again "
                "after their ack wait (their release failed: %s)",
                self._name,
                counted(len(over), "message"),
                shard,
                exc,
            )
        cut = pb.MessageStreamResponse(sent_ns=response.sent_ns)
        cut.rows.extend(kept)
        return cut

    def end(self, error: MsgtableError) -> None:
        """End the stream with ``error`` (the server shuts down): the shards' streams stop."""
        with self._lock:
            if self._ended is None:
                self._ended = error
        self._queue.put(_Ended(error))
        self._cancel()

    def close(self) -> None:
        """The client went away: every shard's stream ends (their servers resend what was
        sent and not acked after its ack wait)."""
        self._closed = True
        self._cancel()
        self._queue.put(_Ended(None))

    def _cancel(self) -> None:
        for stream in self._streams.values():
            stream.cancel()
