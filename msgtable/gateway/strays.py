"""Messages a shard sent that do not belong to it (msgtable.gateway.gateway): where to send their
acks.

A message belongs to the shard whose key range holds its id's keyspace id, and the gateway
sends each ack there. A row inserted into another shard by hand (not with ShardedEnqueue or
the Spark writer), or a table whose ids are not integers, would have its acks sent to the
wrong shard, or to none, and come back for ever. So the gateway checks each relayed batch's
ids against the shard that sent it and remembers the strays: an ack, release, reject or
renew of one goes to the shard that sent it. It says once a table and shard that it found
some. At most MAX_STRAYS are remembered (the oldest forgotten first: their acks then go by
the hash).
"""

from __future__ import annotations

import logging
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from msgtable.core import codec
from msgtable.core.keyspace import Keyspace
from msgtable.core.words import counted
from msgtable.errors import InvalidArgument

log = logging.getLogger("msgtable.gateway.gateway")

MAX_STRAYS = 100_000


class Strays:
    """The strays each table's shards sent, by (table, subscription, id)."""

    def __init__(self, keyspace: Keyspace, most: int = MAX_STRAYS) -> None:
        self._keyspace = keyspace
        self._most = most
        self._lock = threading.Lock()
        self._sent_by: OrderedDict[tuple[str, str, object], str] = OrderedDict()
        self._told: set[tuple[str, str]] = set()

    def check(self, table: str, subscription: str, shard: str, response: Any) -> None:
        """Note the ids of ``response`` (a relayed batch of ``shard``) that are not its own."""
        ids = [codec.decode_value(row.values[0]) for row in response.rows]
        try:
            owners = [s.name for s in self._keyspace.shards_of(ids)]  # type: ignore[arg-type]
        except (InvalidArgument, struct.error, TypeError, OverflowError):
            owners = [""] * len(ids)  # ids without a keyspace id: only the sender knows
        strays = [i for i, owner in zip(ids, owners, strict=True) if owner != shard]
        if not strays:
            return
        with self._lock:
            for i in strays:
                self._sent_by[(table, subscription, i)] = shard
                self._sent_by.move_to_end((table, subscription, i))
            while len(self._sent_by) > self._most:
                self._sent_by.popitem(last=False)
            first = (table, shard) not in self._told
            self._told.add((table, shard))
        if first:
            log.warning(
                "gateway: shard %s of keyspace %r sent %s of table %s that belong "
                "to other shards (e.g. id %r): their acks go back to it; enqueue with the "
                "keyspace's helpers (docs/how-to/keyspaces.md)",
                shard,
                self._keyspace.name,
                counted(len(strays), "message"),
                table,
                strays[0],
            )

    def shards(
        self, table: str, subscription: str, ids: Sequence[object], settled: bool
    ) -> list[str]:
        """The shard each id goes to: the one that sent it if it was a stray, else the one
        its hash names. ``settled``: an ack or reject, after which it is forgotten.
        InvalidArgument for an id that is neither."""
        with self._lock:
            known = [self._sent_by.get((table, subscription, i), "") for i in ids]
            if settled:
                for i, shard in zip(ids, known, strict=True):
                    if shard:
                        self._sent_by.pop((table, subscription, i), None)
        unknown = [i for i, shard in zip(ids, known, strict=True) if not shard]
        for i in unknown:
            if not isinstance(i, int) or isinstance(i, bool):
                raise InvalidArgument(
                    f"id {i!r} has no shard: ids of keyspace {self._keyspace.name!r} are integers"
                )
        hashed = iter(s.name for s in self._keyspace.shards_of(unknown))  # type: ignore[arg-type]
        return [shard or next(hashed) for shard in known]

    def __len__(self) -> int:
        with self._lock:
            return len(self._sent_by)
