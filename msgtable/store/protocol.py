"""The Store Protocols: what the engine and each feature ask of a database.

:class:`Store` is the engine's (discovery, a message's life, settlement, the backlog), with
dead letters' (:class:`DeadLetterStore`) and an ordered table's reads (:class:`OrderStore`).
Each feature's store is a Protocol of its own, which a Store offers as a capability (None: the
store has no such feature; the assembly point, msgtable.features.assembly, hands it to the
feature): :class:`SubscriptionStore`, :class:`EndpointStore`; and what only a MySQL-family
server has: connections of one's own for the lease and the binlog readers
(:class:`Connections`, whose capture follower writes through a :class:`CaptureStore`), and
its statements' counts (:class:`StatementStats`).

Implementations: msgtable.store.mysqlstore.MySQLStore (MySQL 8 and MariaDB 10.6+, composing
msgtable.store.subscriptions.SubscriptionSQL, msgtable.store.endpoints.EndpointSQL and
msgtable.store.capture.CaptureSQL) and msgtable.testing.memory.InMemoryStore (composing the
fakes of msgtable.testing); tests/integration/test_*store_contract.py run the same cases on
both.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from types import MappingProxyType
from typing import Any, Protocol

import sqlalchemy as sa

from msgtable.core.deadletters import DeadLetter, RedriveBatch
from msgtable.core.endpoints import Endpoint
from msgtable.core.filters import Filter
from msgtable.core.latency import LatencySnapshot
from msgtable.core.retry import Outage
from msgtable.core.rows import CachedRow, PolledRow, PollKey
from msgtable.core.subscriptions import (
    LoadedSubscription,
    StateRow,
    Subscription,
    SubscriptionState,
)
from msgtable.core.tables import Column, TableConfig
from msgtable.store.backlog import BacklogCounts
from msgtable.store.discovery import TableDefinition

# What a send hands its rows to, inside its transaction (a concurrent ack by DML waits for it).
Deliver = Callable[[list[CachedRow]], None]
# Which of a send's rows may go, given the ids the database found due and unchanged (an
# ordered table's: only whole keys, msgtable.engine.ordered.whole_keys); None: all of those.
Keep = Callable[[Sequence[CachedRow], Collection[Hashable]], list[CachedRow]]
# The rows an ack or settlement counts the send of (sent, their postpone not heard written):
# id -> the epoch that send read. A row counts only while it is still at that epoch: a
# postpone that committed while its answer was lost (a database link cut) counted it already.
Uncounted = Mapping[Hashable, int | None]
NONE_UNCOUNTED: Uncounted = MappingProxyType({})


class DeadLetterStore(Protocol):
    """Dead letters (msgtable.core.deadletters): bury, list, count, redrive."""

    def bury(
        self,
        cfg: TableConfig,
        dead: TableConfig | None,
        ids: Sequence[Hashable],
        now_ns: int,
        reason: str | None,
        first: Uncounted = NONE_UNCOUNTED,
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


class OrderStore(Protocol):
    """An ordered table's reads (msgtable.engine.ordered): its keys, each key's run, the
    rows of no key."""

    def order_keys(
        self, cfg: TableConfig, after: object | None, limit: int
    ) -> list[tuple[object, Hashable]]: ...

    def runs(self, cfg: TableConfig, keys: Sequence[object], per_key: int) -> list[PolledRow]: ...

    def unkeyed(
        self, cfg: TableConfig, now_ns: int, after: Hashable | None, limit: int
    ) -> list[PolledRow]: ...


class Store(DeadLetterStore, OrderStore, Protocol):
    """What the engine asks of a database. Implementations: MySQLStore, InMemoryStore.

    Its capabilities (each None where the store has no such feature) are decided once, where
    the server is assembled: never by asking a store what it is."""

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
        skip_keys: Sequence[Hashable] = (),
    ) -> tuple[list[PolledRow], PollKey | None]: ...

    def read_again(self, ids: Iterable[Hashable]) -> None:
        """The cache let these rows of ``poll``'s go before a subscriber got them (it filled
        up, its last subscriber left, a stream ended before it took them). A table's own
        store does nothing: they are still due, and the next pass from the head reads them;
        a lazy subscription's scan reads past what it read, so it must be told."""
        ...

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
        first: Uncounted = NONE_UNCOUNTED,
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
        first: Uncounted = NONE_UNCOUNTED,
        attempts: Sequence[int] | None = None,
    ) -> int: ...

    def renew(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        now_ns: int,
        until_ns: int,
        reason: str | None,
        first: Uncounted = NONE_UNCOUNTED,
        attempts: Sequence[int] | None = None,
        first_until_ns: int | None = None,
        exact: bool = False,
    ) -> int:
        """Keep sent, unacked rows not due again yet from falling due before ``until_ns``
        (``exact``: due at it, sooner or later); the ``first`` rows (sent, not postponed: the
        renew counts their send) are due at ``first_until_ns`` (default ``until_ns``)."""
        ...

    def backlog(self, cfgs: Sequence[TableConfig], now_ns: int) -> dict[str, BacklogCounts]: ...

    def close(self) -> None: ...

    @property
    def subscription_store(self) -> SubscriptionStore | None:
        """Subscriptions' definitions, state tables and fan-out."""
        ...

    @property
    def endpoint_store(self) -> EndpointStore | None:
        """Push endpoints' definitions."""
        ...

    def connections(self) -> Connections | None:
        """The database's own connections (a lease, the binlog readers): MySQL only."""
        ...

    def statement_stats(self) -> StatementStats | None:
        """Its statements' failures and latencies (msgtable.observe.metrics)."""
        ...


class SubscriptionStore(Protocol):
    """Subscriptions (msgtable.core.subscriptions; msgtable.features.subscriptions): the
    definitions, a state table per subscription (served by the Store like a table), the
    fan-out of new rows into them, lag and the clean-up of orphans."""

    def subscriptions(self) -> tuple[list[Subscription], dict[str, tuple[Column, ...]]]:
        """Every definition, and the columns of every state table (by name)."""
        ...

    def create_subscription(
        self, table: TableConfig, loaded: LoadedSubscription, from_start: bool, now_ns: int
    ) -> int:
        """The definition and state table (on a table's first: the rows before it seen by
        none); with ``from_start`` every retained unacked row the filter passes too (returns
        how many). InvalidArgument if it exists."""
        ...

    def alter_subscription(self, sub: Subscription) -> None:
        """Store ``sub``'s settings; TableNotFound if there is no such subscription."""
        ...

    def drop_subscription(self, table: str, name: str, state_table: str) -> None:
        """The definition and its state table gone; TableNotFound if there is none."""
        ...

    def set_subscription_state(
        self, sub: Subscription, state: SubscriptionState, now_ns: int
    ) -> None: ...

    def touch_subscriptions(self, subs: Sequence[Subscription], now_ns: int) -> None:
        """These have subscribers now (their expiry starts again)."""
        ...

    def subscription_lag(
        self, state_tables: Mapping[str, str], cap: int
    ) -> dict[str, tuple[int, int | None]]:
        """By state table (mapped to its message table): unsettled messages whose row is
        still there (up to ``cap``) and the oldest one's time_created; a state table that is
        gone is left out."""
        ...

    def delete_orphans(
        self, state_table: str, source: str, after: Hashable | None, limit: int
    ) -> tuple[int, Hashable | None]:
        """One step over ``limit`` unsettled state rows after ``after``: delete those whose
        message row is gone. How many, and where the next step starts (None: the end)."""
        ...

    def pending_fanout(self, table: str, cap: int) -> int:
        """Rows of ``table`` not handed to its subscriptions yet (up to ``cap``)."""
        ...

    def fanout(
        self,
        table: TableConfig,
        loaded: Mapping[str, LoadedSubscription],
        now_ns: int,
        limit: int,
    ) -> tuple[dict[str, int], set[str]]:
        """Hand up to ``limit`` unseen rows (by id) to the active subscriptions, at once:
        rows each got (key "": rows handed over), and the active ones ``loaded`` lacks (then
        nothing is handed over)."""
        ...

    # the cursor of a subscription over its table's fan-out sequence (issue 42, item 3:
    # msgtable/features/subscriptions/design.md (b); a lazy subscription is served from it)
    def subscription_cursor(self, table: str, name: str) -> int | None:
        """The subscription's cursor (None: it has none, made before cursors)."""
        ...

    def advance_cursor(self, table: str, name: str, old: int, new: int) -> bool:
        """Move it from ``old`` to ``new``; False (nothing changed): it was not at ``old``."""
        ...

    def restart_cursor(self, table: str, name: str) -> None:
        """Move it to its table's sequence's last number (what is handed over from now on)."""
        ...

    def unsent(
        self, table: TableConfig, loaded: LoadedSubscription, after: int, limit: int
    ) -> list[tuple[Hashable, int]]:
        """Ids and numbers of the rows numbered above ``after`` that its filter passes and
        that have no state row, in sequence order, up to ``limit``."""
        ...

    # a lazy subscription's (msgtable.features.subscriptions.lazy)
    def unsent_rows(
        self, table: TableConfig, cfg: TableConfig, flt: Filter | None, after: int, limit: int
    ) -> Sequence[PolledRow]:
        """unsent's rows as a poll of the state table ``cfg`` returns them (with each one's
        time_created), each with its number after that (last): a row as the database gave
        it, no tuple made per row."""
        ...

    def unsent_lag(
        self, table: TableConfig, loaded: LoadedSubscription, cap: int
    ) -> tuple[int, int | None]:
        """A lazy subscription's messages above its cursor that its filter passes and that
        have no state row (up to ``cap``), and the oldest one's time_created."""
        ...

    def table_indexes(self, table: str) -> list[tuple[str, ...]]:
        """The indexes of ``table``, each one's columns in order (a lazy subscription's
        filter is read through one: msgtable.core.subscriptions.filter_index_advice)."""
        ...

    def write_state_rows(
        self, cfg: TableConfig, rows: Sequence[StateRow], acked_ns: int | None = None
    ) -> int:
        """Write these state rows (id, priority, time_next, epoch, time_created); a row
        there already is kept (``acked_ns``: acked then, unless acked or dead). How many: 0
        when the store's fence kept them out (msgtable.store.mysqlstore.MySQLStore.fence_as)."""
        ...

    def written_of(self, cfg: TableConfig, ids: Sequence[Hashable]) -> set[Hashable]:
        """Which of ``ids`` have a state row in ``cfg``'s state table (a plain read)."""
        ...


class EndpointStore(Protocol):
    """Push endpoints' definitions (msgtable.features.push), one per (table, subscription)."""

    def endpoints(self) -> list[Endpoint]:
        """Every definition, by table and subscription."""
        ...

    def set_endpoint(self, ep: Endpoint, now_ns: int) -> None:
        """Define, or replace, ``ep``'s (table, subscription)'s endpoint."""
        ...

    def drop_endpoint(self, table: str, subscription: str) -> int:
        """How many definitions were dropped (0 or 1)."""
        ...


class CaptureStore(Protocol):
    """What the capture follower (msgtable.features.capture.follower) writes through: the
    stored binlog position and the events, moved and written together or not at all."""

    def row_metadata(self) -> str:
        """@@binlog_row_metadata ("" where the server has no such setting)."""
        ...

    def comment(self, table: str) -> str | None:
        """The table's COMMENT now (None: no such table now)."""
        ...

    def start(self, position: str, now_ns: int) -> str:
        """The stored position; ``position`` is stored first when there is none."""
        ...

    def stored(self) -> str | None: ...

    def write(
        self,
        events: Mapping[str, Sequence[tuple[Any, ...]]],
        old: str,
        new: str,
        now_ns: int,
    ) -> None:
        """Insert ``events`` (rows of EVENT_COLUMNS, by capture table) and move the position
        from ``old`` to ``new`` at once; msgtable.store.capture.PositionMoved (nothing
        written) when the stored position is not ``old``."""
        ...

    def close(self) -> None: ...


class Connections(Protocol):
    """A MySQL-family server's connections of one's own, besides the store's: the lease's
    (msgtable.engine.placement) and the binlog readers' (msgtable.engine.binlog,
    msgtable.features.capture)."""

    url: sa.URL
    database: str
    outage: Outage
    # sent rows whose postpone the fence kept out (fence_as), by message table
    postpones_fenced: dict[str, int]

    def timed(self, kind: str) -> AbstractContextManager[None]:
        """A statement on such a connection, timed as ``kind`` with the store's."""
        ...

    def capture_store(self) -> CaptureStore:
        """A connection of its own for the capture follower's writes."""
        ...

    def fence_as(self, holder: str) -> None:
        """Fence the store's writes on what a sender has in flight by the placement row
        naming ``holder`` (msgtable.store.mysqlstore.MySQLStore.fence_as)."""
        ...


class StatementStats(Protocol):
    """A store's statements, counted (msgtable.observe.metrics)."""

    database_errors: int

    def statement_latency_snapshot(self) -> dict[str, LatencySnapshot]: ...
