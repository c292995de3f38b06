"""The Store Protocol: what the engine asks of a database (discovery, a message's life,
settlement, dead letters, an ordered table's reads, the backlog). Implementations:
msgtable.store.mysqlstore.MySQLStore (MySQL 8 and MariaDB 10.6+) and
msgtable.testing.memory.InMemoryStore; tests/integration/test_store_contract.py runs the same
cases on both.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Protocol

from msgtable.core.deadletters import DeadLetter, RedriveBatch
from msgtable.core.retry import Outage
from msgtable.core.rows import CachedRow, PolledRow, PollKey
from msgtable.core.tables import TableConfig
from msgtable.store.backlog import BacklogCounts
from msgtable.store.discovery import TableDefinition

# What a send hands its rows to, inside its transaction (a concurrent ack by DML waits for it).
Deliver = Callable[[list[CachedRow]], None]
# Which of a send's rows may go, given the ids the database found due and unchanged (an
# ordered table's: only whole keys, msgtable.engine.ordered.whole_keys); None: all of those.
Keep = Callable[[Sequence[CachedRow], Collection[Hashable]], list[CachedRow]]


class Store(Protocol):
    """What the engine asks of a database. Implementations: MySQLStore, InMemoryStore."""

    database: str
    outage: Outage  # whether the database answers (msgtable.core.retry)

    def discover(self) -> list[TableDefinition]: ...

    def poll(
        self,
        cfg: TableConfig,
        now_ns: int,
        limit: int,
        after: PollKey | None = None,
        created: bool = False,
        floor_ns: int | None = None,
    ) -> tuple[list[PolledRow], PollKey | None]: ...

    def poll_timed(self, cfg: TableConfig, now_ns: int, limit: int) -> list[PolledRow]:
        """Up to ``limit`` due, unacked rows given a time (time_next > 0: a redelivery, a
        release, a delayed message), best first, as ``poll`` reads them with ``created``:
        what a pass reaches only after every fresh row (msgtable.engine.manager's redelivery
        poll). [] for a 2018-layout table (a pass reads its rows in time order)."""
        ...

    def claim(
        self,
        cfg: TableConfig,
        batch: Sequence[CachedRow],
        now_ns: int,
        next_ns: Callable[[int], int],
        deliver: Deliver,
        keep: Keep | None = None,
    ) -> list[CachedRow]: ...

    def send(
        self,
        cfg: TableConfig,
        batch: Sequence[CachedRow],
        now_ns: int,
        deliver: Deliver,
        keep: Keep | None = None,
    ) -> list[CachedRow]: ...

    def postpone(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        epoch: int | None,
        sent_ns: int,
        next_ns: int,
    ) -> int: ...

    def ack(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        now_ns: int,
        first: Collection[Hashable] = (),
    ) -> int: ...

    def acked_ids(
        self, cfg: TableConfig, ids: Sequence[Hashable], now_ns: int
    ) -> set[Hashable]: ...

    def unacked_ids(self, cfg: TableConfig, ids: Sequence[Hashable]) -> set[Hashable]: ...

    def purge(self, cfg: TableConfig, cutoff_ns: int, limit: int) -> int: ...

    def expire_dedup(self, cfg: TableConfig, since_ns: int, cutoff_ns: int, limit: int) -> int:
        """Clear (to NULL) up to ``limit`` vt_dedup keys of rows created in [since_ns,
        cutoff_ns): after its window a key may be used again (msgtable.core.dedup)."""
        ...

    def release(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        next_ns: int,
        reason: str | None,
        first: Collection[Hashable] = (),
        attempts: Sequence[int] | None = None,
    ) -> int: ...

    def renew(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        now_ns: int,
        until_ns: int,
        reason: str | None,
        first: Collection[Hashable] = (),
        attempts: Sequence[int] | None = None,
    ) -> int: ...

    def bury(
        self,
        cfg: TableConfig,
        dead: TableConfig | None,
        ids: Sequence[Hashable],
        now_ns: int,
        reason: str | None,
        first: Collection[Hashable] = (),
        due_at_epoch: tuple[int | None] | None = None,
    ) -> list[Hashable]: ...

    def dead_letters(
        self, cfg: TableConfig, dead: TableConfig | None, after: Hashable | None, limit: int
    ) -> list[DeadLetter]: ...

    def count_dead(
        self, tables: Sequence[tuple[TableConfig, TableConfig | None]]
    ) -> dict[str, int]: ...

    def redrive(
        self,
        dead: TableConfig,
        target: TableConfig,
        ids: Sequence[Hashable] | None,
        after: Hashable | None,
        limit: int,
        now_ns: int,
    ) -> RedriveBatch: ...

    def order_keys(
        self, cfg: TableConfig, after: object | None, limit: int
    ) -> list[tuple[object, Hashable]]: ...

    def runs(self, cfg: TableConfig, keys: Sequence[object], per_key: int) -> list[PolledRow]: ...

    def unkeyed(
        self, cfg: TableConfig, now_ns: int, after: Hashable | None, limit: int
    ) -> list[PolledRow]: ...

    def backlog(self, cfgs: Sequence[TableConfig], now_ns: int) -> dict[str, BacklogCounts]: ...

    def close(self) -> None: ...
