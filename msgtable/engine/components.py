"""How a feature plugs into the engine: the one Protocol the engine calls, the host it sees.

The engine (msgtable.engine.engine) owns the managers, discovery and the placement. The
features (msgtable.features: subscriptions, push, capture) are components it calls, never
mixins on it, as google-cloud-pubsub's manager owns its leaser and dispatcher. Every
component has the same hooks, called in this order of the engine's life:

    reconcile(found)   after each discovery (outside the engine's locks): the tables as served
    units()            the placement's units it sends besides tables (capture: CAPTURE;
                       schedules: SCHEDULES)
    gained(unit)       this server now sends ``unit`` (its managers are started)
    lost(unit)         it no longer does (its managers are closed)
    statuses(listed)   ListTables' entries, with its fields (or entries of its own) added
    close()            the engine closes: components first, in the reverse order of making

Each feature also has a few verbs of its own, which the engine passes on for the servicer
and the metrics (SubscriptionsComponent, PushComponent, CaptureComponent,
SchedulesComponent). Subscriptions go
deeper: served by a MessageManager on their state table like any table, they are loaded onto
their tables at each discovery (``load``) and kept up after it (``upkeep``).

A component sees the engine through ``Host`` (the engine's managers, lookups and lease), and
is made by msgtable.features.assembly, the one place that wires the server's features.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from msgtable.core.clock import Clock
from msgtable.core.endpoints import Endpoint
from msgtable.core.schedules import Schedule
from msgtable.core.status import PushStatus, TableStatus
from msgtable.core.subscriptions import Subscription
from msgtable.core.tables import TableConfig
from msgtable.engine.manager import MessageManager
from msgtable.engine.tail import InsertKeys
from msgtable.store.mysqlstore import Store

if TYPE_CHECKING:
    from msgtable.engine.engine import MessageEngine


@dataclass(frozen=True)
class Discovery:
    """One discovery as the engine applied it."""

    # the message tables loaded, by name (with their subscriptions' fanout and holders)
    configs: Mapping[str, TableConfig] = field(default_factory=dict)
    # every message table and subscription state table, loaded or not
    message_tables: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Loaded:
    """The subscriptions one discovery loaded onto their tables."""

    # their state tables' configs, served by a manager each like a table's, by state table
    configs: Mapping[str, TableConfig] = field(default_factory=dict)
    errors: Mapping[str, str] = field(default_factory=dict)  # the others' errors, by label


class Host(Protocol):
    """What a component sees of the engine (msgtable.engine.engine.MessageEngine)."""

    keyspace: str

    @property
    def store(self) -> Store: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def run_loops(self) -> bool: ...

    def refresh(self) -> None: ...

    def list_tables(self) -> list[TableStatus]: ...

    def find(self, name: str, subscription: str = "") -> MessageManager: ...

    def default_group(self, m: MessageManager) -> MessageManager: ...

    def loaded(self, key: str) -> MessageManager | None: ...

    def managers(self) -> list[MessageManager]: ...

    def sends(self, unit: str) -> bool: ...

    def sender(self, unit: str) -> str: ...

    def may_send(self, unit: str) -> bool: ...

    def others_sent_before_ns(self, unit: str) -> int: ...

    def binlog_insert(self, table: str, rows: int = 0) -> None: ...


class Component(Protocol):
    """A feature the engine serves (see the module docstring for when each hook comes)."""

    def reconcile(self, found: Discovery) -> None: ...

    def units(self) -> set[str]: ...

    def gained(self, unit: str) -> None: ...

    def lost(self, unit: str) -> None: ...

    def statuses(self, listed: list[TableStatus]) -> list[TableStatus]: ...

    def close(self) -> None: ...


class SubscriptionsComponent(Component, Protocol):
    """Subscriptions (msgtable.features.subscriptions.registry)."""

    def load(self, configs: dict[str, TableConfig]) -> Loaded:
        """At each discovery, before the engine applies it: the subscriptions, loaded onto
        ``configs`` (their tables' configs get fanout and holders here)."""
        ...

    def upkeep(self) -> None:
        """After each periodic discovery: activity, expiry, lag against max_lag."""
        ...

    def inserted(self, table: str) -> None:
        """Rows came into ``table`` (the binlog said so, or a capture wrote them)."""
        ...

    def subscribing(self, state_table: str) -> None:
        """A subscriber comes to the subscription of ``state_table``."""
        ...

    def store_for(self, cfg: TableConfig) -> Store | None:
        """The store the manager of the state table ``cfg`` serves it through (a lazy
        subscription's); None: the engine's."""
        ...

    def state_acked(self, state_table: str, keys: InsertKeys | None) -> list[Hashable]:
        """Another client INSERTed rows into ``state_table`` (``keys``: theirs): the ids a
        lazy subscription's application acked by the upsert (settled: no time_next), now
        settled in its window; [] for any other table."""
        ...

    def cursor_flushes(self) -> dict[tuple[str, str], int]:
        """Each lazy subscription's cursor writes (flushes) here, by (table, subscription)."""
        ...

    def held_acks_written(self) -> dict[tuple[str, str], int]:
        """Each lazy subscription's acks written here as acked state rows behind a cursor
        held by a message never sent, by (table, subscription)."""
        ...

    def create_subscription(self, sub: Subscription, from_start: bool) -> int: ...

    def alter_subscription(self, table: str, name: str, **changes: Any) -> Subscription: ...

    def drop_subscription(self, table: str, name: str) -> None: ...


class PushComponent(Component, Protocol):
    """Push endpoints (msgtable.features.push.pushers)."""

    # msgtable.features.push.endpoints.Endpoint: the engine passes it on from the servicer
    def set_endpoint(self, endpoint: Endpoint) -> None: ...

    def drop_endpoint(self, table: str, subscription: str) -> None: ...

    def push_status(self, table: str, subscription: str) -> PushStatus | None: ...


class Follower(Protocol):
    """What is read of the table-events follower (msgtable.features.capture.follower)."""

    @property
    def following(self) -> threading.Event: ...

    @property
    def lag_s(self) -> float: ...


class CaptureComponent(Component, Protocol):
    """Table events (msgtable.features.capture.component)."""

    @property
    def follower(self) -> Follower | None: ...


class SchedulesComponent(Component, Protocol):
    """Schedules (msgtable.features.schedules.component)."""

    def create_schedule(
        self,
        name: str,
        table: str,
        cron: str,
        values: Mapping[str, Any] | str = "{}",
        timezone: str = "UTC",
        missed: str = "skip",
    ) -> Schedule: ...

    def list_schedules(self) -> list[Schedule]: ...

    def drop_schedule(self, name: str) -> bool: ...


@dataclass(frozen=True)
class Features:
    """The features an engine serves, each made with the engine as its host when the
    engine is (msgtable.features.assembly); None: not served."""

    subscriptions: Callable[[MessageEngine], SubscriptionsComponent] | None = None
    push: Callable[[MessageEngine], PushComponent] | None = None
    capture: Callable[[MessageEngine], CaptureComponent] | None = None
    schedules: Callable[[MessageEngine], SchedulesComponent] | None = None
