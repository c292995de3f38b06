"""Enqueueing into a keyspace of shards: each message into the shard its id belongs to.

    shards = ShardedEnqueue(keyspace.load("keyspace.toml"))
    with shards.begin() as tx:
        tx.connection(order_id).execute(orders.insert(), {...})   # the shard of that key
        tx.enqueue("order_events", {"id": order_id, "message": "paid"}, delay_s=30)
    shards.close()

``begin()`` opens a transaction on each shard as it is first used and commits them when the
block ends, in shard order (all rolled back if the block raises). Within one shard it is one
transaction, as msgtable.enqueue's: the application's rows and its messages commit together.
Across shards the commit is **best effort**, as Vitess's default multi-shard commit: if a
later shard's commit fails, the earlier shards' are already committed (the error names the
shard, and which committed). Keep what must be atomic on one shard: give the message the id
of the row it belongs to, or an id that hashes beside it.

An id must be an integer 0 to 2**64 - 1 (its keyspace id is Vitess's ``hash``;
msgtable.core.keyspace).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from msgtable import enqueue as single
from msgtable.core.keyspace import Keyspace, Shard
from msgtable.errors import InvalidArgument, MsgtableError


class ShardedEnqueue:
    """A connection pool per shard of ``keyspace`` (``engine_kwargs`` go to each
    ``sqlalchemy.create_engine``); ``close()`` disposes of them."""

    def __init__(self, keyspace: Keyspace, **engine_kwargs: Any) -> None:
        self.keyspace = keyspace
        self.engines = {s.name: sa.create_engine(s.dsn, **engine_kwargs) for s in keyspace.shards}

    @contextlib.contextmanager
    def begin(self) -> Iterator[ShardedTransaction]:
        tx = ShardedTransaction(self)
        try:
            yield tx
        except BaseException:
            tx.rollback()
            raise
        tx.commit()

    def close(self) -> None:
        for engine in self.engines.values():
            engine.dispose()


class ShardedTransaction:
    """One transaction a shard, opened when first used (see the module docstring)."""

    def __init__(self, shards: ShardedEnqueue) -> None:
        self._shards = shards
        self._open: dict[str, tuple[sa.Connection, sa.RootTransaction]] = {}

    def connection(self, id_: int) -> sa.Connection:
        """The connection, in this transaction, of the shard that holds ``id_``."""
        return self._of(self._shards.keyspace.shard_of(_checked(id_)))

    def _of(self, shard: Shard) -> sa.Connection:
        entry = self._open.get(shard.name)
        if entry is None:
            conn = self._shards.engines[shard.name].connect()
            entry = self._open[shard.name] = (conn, conn.begin())
        return entry[0]

    def enqueue(self, table: str, values: Mapping[str, Any], **options: Any) -> int:
        """msgtable.enqueue.enqueue on the shard of ``values["id"]``."""
        return self.enqueue_many(table, [values], **options)

    def enqueue_many(self, table: str, rows: Sequence[Mapping[str, Any]], **options: Any) -> int:
        """msgtable.enqueue.enqueue_many, each row on the shard of its id (one multi-row
        INSERT a shard); returns how many rows were inserted."""
        keyspace = self._shards.keyspace
        ids = [_checked(row.get("id")) for row in rows]
        shards = keyspace.shards_of(ids)
        if rows:
            self._check_keys(table, rows, ids, shards, options.get("order_key"))
        groups: dict[str, tuple[Shard, list[Mapping[str, Any]]]] = {}
        for shard, row in zip(shards, rows, strict=True):
            groups.setdefault(shard.name, (shard, []))[1].append(row)
        return sum(
            single.enqueue_many(self._of(shard), table, part, **options)
            for shard, part in groups.values()
        )

    def _check_keys(
        self,
        table: str,
        rows: Sequence[Mapping[str, Any]],
        ids: Sequence[int],
        shards: Sequence[Shard],
        order_key: object,
    ) -> None:
        """Of an ordered table (vt_order_key): InvalidArgument unless each row's id lives in
        its key's shard, so that a key lives in one shard and its order holds."""
        keyspace = self._shards.keyspace
        # read where the rows go: a shard away elsewhere must not stop this enqueue
        column = single.order_key_column(self._of(shards[0]), table)
        if not column:
            return
        for row, id_, shard in zip(rows, ids, shards, strict=True):
            key = order_key if order_key is not None else row.get(column)
            if key is None:
                continue
            home = keyspace.shard_of_key(key)  # type: ignore[arg-type]
            if home is not shard:
                raise InvalidArgument(
                    f"id {id_} lives in shard {shard.name} and its key {key!r:.60} in shard "
                    f"{home.name}: a key's messages live in one shard, in id order (take ids "
                    "from Keyspace.id_for(key, at_least))"
                )

    def commit(self) -> None:
        """Commit each shard's transaction in shard order; MsgtableError naming the shard
        whose commit failed and the ones already committed (their rows stay)."""
        done: list[str] = []
        order = [s.name for s in self._shards.keyspace.shards if s.name in self._open]
        try:
            for name in order:
                _conn, tx = self._open[name]
                try:
                    tx.commit()
                except Exception as exc:
                    raise MsgtableError(
                        f"the commit on shard {name} of keyspace "
                        f"{self._shards.keyspace.name!r} failed ({exc.__class__.__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}); "
                        + (f"committed before it: {', '.join(done)}" if done else "none committed")
                    ) from exc
                done.append(name)
        finally:
            self.rollback()

    def rollback(self) -> None:
        """Roll back whatever is still open, and give the connections back."""
        for conn, tx in self._open.values():
            with contextlib.suppress(Exception):
                if tx.is_active:
                    tx.rollback()
            conn.close()
        self._open.clear()


def _checked(id_: object) -> int:
    if not isinstance(id_, int) or isinstance(id_, bool):
        raise InvalidArgument(
            f"id {id_!r} has no shard: a message of a keyspace needs an integer id"
        )
    return id_
