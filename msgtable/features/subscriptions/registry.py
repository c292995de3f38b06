"""Subscriptions as a component of the engine (msgtable.engine.components): loading them onto
their tables at each discovery, one fan-out loop per table that has some, their upkeep
(activity, expiry, lag against max_lag), their definitions (create, alter, drop) and their
statuses.

A subscription is served by a MessageManager on its state table like any table: the engine
keeps one map of managers for both, and this registry reaches them through its Host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import weakref
from collections.abc import Hashable, Mapping
from typing import Any, cast

from msgtable.core.status import TableStatus
from msgtable.core.subscriptions import (
    FANOUT_COLUMN,
    STATE_COLUMNS,
    LoadedSubscription,
    Subscription,
    SubscriptionState,
    check_settings,
    filter_index_advice,
    holding,
    load_subscription,
    merge_limits,
    order_columns,
    state_table_name,
)
from msgtable.core.tables import Column, TableConfig
from msgtable.engine.components import Discovery, Host, Loaded
from msgtable.engine.tail import InsertKeys
from msgtable.errors import (
    InvalidArgument,
    MsgtableError,
    TableLoadError,
    TableNotFound,
    Unavailable,
)
from msgtable.features.subscriptions.fanout import Fanout
from msgtable.features.subscriptions.lazy import LazyCounts, LazyStore
from msgtable.limits import LAG_CAP, ORPHAN_STEP_ROWS
from msgtable.store.protocol import Store, SubscriptionStore

log = logging.getLogger("msgtable.engine.engine")


class Registry:
    """The subscriptions of one database, as the engine serves them (see the module
    docstring): msgtable.engine.components.SubscriptionsComponent. ``store``: where the
    subscriptions are (None: a store without subscriptions, whose tables have none)."""

    def __init__(self, host: Host, store: SubscriptionStore | None) -> None:
        self.host = host
        self._store = store
        # loaded ones by state table (replaced whole at each discovery), the fan-out loops by
        # table, lags by state table, why some do not hold their table's purge, and where
        # each state table's clean-up of orphans goes on
        self._subs: dict[str, LoadedSubscription] = {}
        self._fanouts: dict[str, Fanout] = {}
        self._lag: dict[str, tuple[int, int | None]] = {}
        self._not_holding: dict[str, str] = {}
        self._orphan_pass: dict[str, Hashable | None] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._lazy: weakref.WeakSet[LazyStore] = weakref.WeakSet()  # lazy subscriptions' stores
        self._lazy_now: dict[str, LazyStore] = {}  # by state table: its manager's now
        self._lazy_counts: dict[str, LazyCounts] = {}  # by state table: the process's

    # -- msgtable.engine.components.Component ----------------------------------------------
    def reconcile(self, found: Discovery) -> None:
        """One fan-out loop for each table with subscriptions."""
        fan_tables = {cfg.name for cfg in found.configs.values() if cfg.fanout}
        with self._lock:
            if self._closed:
                return
            gone = [f for t, f in self._fanouts.items() if t not in fan_tables]
            self._fanouts = {t: f for t, f in self._fanouts.items() if t in fan_tables}
            new = [self._new_fanout(t) for t in fan_tables - self._fanouts.keys()]
        for f in gone:
            f.close()
        if self.host.run_loops:
            for f in new:
                f.open()

    def units(self) -> set[str]:
        return set()  # a subscription goes with its table

    def gained(self, unit: str) -> None:
        self.inserted(unit)  # what the last sender left unseen goes out now

    def lost(self, unit: str) -> None:
        """Each loop stops handing rows over by itself (may_send); a lazy subscription's
        store moves its cursor over what was acked since its last poll."""
        for lazy in list(self._lazy):
            if lazy.source == unit:
                lazy.let_go()

    def statuses(self, listed: list[TableStatus]) -> list[TableStatus]:
        """Tables with subscriptions say how many rows they have not handed over yet, and
        each subscription has an entry of its own."""
        return [self._with_unseen(s) for s in listed] + self._subscription_statuses()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            fanouts, self._fanouts = list(self._fanouts.values()), {}
        for f in fanouts:
            f.close()
        for lazy in list(self._lazy):
            lazy.let_go()

    # -- msgtable.engine.components.SubscriptionsComponent ---------------------------------
    def inserted(self, table: str) -> None:
        f = self._fanouts.get(table)
        if f is not None:
            f.trigger()

    def subscribing(self, state_table: str) -> None:
        """A subscriber of an expired subscription makes it active again."""
        ls = self._subs.get(state_table)
        if ls is None or ls.sub.state is not SubscriptionState.EXPIRED:
            return
        log.warning("subscription %s: a subscriber came; active again", ls.sub.label)
        store = self._need()
        store.set_subscription_state(ls.sub, SubscriptionState.ACTIVE, self.host.clock.now_ns())
        if ls.sub.lazy:  # it gets what is handed over from now on, as an eager one
            store.restart_cursor(ls.sub.table, ls.sub.name)
            for lazy in list(self._lazy):
                if lazy.state_table == state_table:
                    lazy.reset()
        self.host.refresh()

    def load(self, configs: dict[str, TableConfig]) -> Loaded:
        """The subscriptions of the database, loaded onto their tables' configs (which get
        fanout and holders here), and those that failed to load (by label)."""
        if self._store is None:  # a store without subscriptions: no table has any
            return Loaded()
        defs, state_columns = self._store.subscriptions()
        loaded: dict[str, LoadedSubscription] = {}
        errors: dict[str, str] = {}
        by_table: dict[str, list[Subscription]] = {}
        for sub in defs:
            by_table.setdefault(sub.table, []).append(sub)
        not_holding: dict[str, str] = {}
        for table, subs in by_table.items():
            cfg = configs.get(table)
            if cfg is None:
                for sub in subs:
                    errors[sub.label] = f"subscription {sub.label}: table {table} is not loaded"
                continue
            holders = []
            cursored = []  # of those, the lazy ones: their cursors hold the purge too
            for sub in subs:
                held, why = holding(sub, self._lag.get(sub.state_table, (0, None))[0])
                if held:
                    holders.append(sub.state_table)
                    if sub.lazy:
                        cursored.append(sub.name)
                else:
                    not_holding[sub.state_table] = why
            configs[table] = dataclasses.replace(
                cfg,
                fanout=True,
                holders=tuple(sorted(holders)),
                cursored=tuple(sorted(cursored)),
            )
            for sub in subs:
                try:
                    ls = load_subscription(configs[table], sub, state_columns.get(sub.state_table))
                except (TableLoadError, InvalidArgument) as exc:
                    errors[sub.label] = str(exc)
                    continue
                loaded[ls.config.name] = ls
        self._hold(not_holding, loaded)
        self._subs = loaded
        return Loaded({n: ls.config for n, ls in loaded.items()}, errors)

    def _hold(self, not_holding: dict[str, str], loaded: dict[str, LoadedSubscription]) -> None:
        """Say which subscriptions no longer hold their table's purge (by state table), and
        clean up after the rows purged meanwhile."""
        for name, why in not_holding.items():
            if self._not_holding.get(name) != why:
                log.warning(
                    "subscription %s no longer holds its table's purge: %s",
                    loaded[name].sub.label if name in loaded else name,
                    why,
                )
        self._not_holding = not_holding
        for name in not_holding:  # its rows may be purged now: clean up after them
            self._orphan_pass.setdefault(name, None)

    def store_for(self, cfg: TableConfig) -> Store | None:
        """The store a lazy subscription's manager serves its state table through
        (msgtable.features.subscriptions.lazy; None: the database's own, as for any)."""
        ls = self._subs.get(cfg.name)
        if not cfg.source or ls is None or not ls.sub.lazy or self._store is None:
            return None
        host, source, name = self.host, cfg.source, cfg.name

        def table() -> TableConfig | None:
            m = host.loaded(source)
            return None if m is None else m.config

        lazy = LazyStore(
            host.store,
            self._store,
            table,
            lambda: self._subs.get(name),
            host.clock,
            name,
            lambda: host.may_send(source),
            lambda: host.others_sent_before_ns(source),
            self._lazy_counts.setdefault(name, LazyCounts()),
        )
        self._lazy.add(lazy)
        self._lazy_now[name] = lazy
        return cast("Store", lazy)

    def cursor_flushes(self) -> dict[tuple[str, str], int]:
        return {k: v.cursor_writes for k, v in self._lazy_stores().items()}

    def held_acks_written(self) -> dict[tuple[str, str], int]:
        return {k: v.acks_written for k, v in self._lazy_stores().items()}

    def _lazy_stores(self) -> dict[tuple[str, str], LazyStore]:
        subs, now = self._subs, dict(self._lazy_now)
        return {
            (ls.sub.table, ls.sub.name): now[n]
            for n, ls in list(subs.items())
            if n in now and ls.sub.lazy
        }

    def state_acked(self, state_table: str, keys: InsertKeys | None) -> list[Hashable]:
        """The upsert-acks (rows with no time_next) another client INSERTed into a lazy
        subscription's state table: held in its window from now on (its send stops)."""
        stores = [lazy for lazy in list(self._lazy) if lazy.state_table == state_table]
        rows = None if not stores or keys is None else keys()
        if not rows:
            return []
        acked = [rid for _, time_next, rid in rows if time_next is None]
        for lazy in stores:
            lazy.acked_by_dml(acked)
        return acked

    def _new_fanout(self, table: str) -> Fanout:
        last: list[TableConfig] = []
        host = self.host

        def config() -> TableConfig:
            m = host.loaded(table)
            if m is not None:
                last[:] = [m.config]
            elif not last:
                raise TableNotFound(f"message table {table!r} not loaded")
            return last[0]

        def subscriptions() -> dict[str, LoadedSubscription]:
            return {ls.sub.name: ls for ls in self._subs.values() if ls.sub.table == table}

        def handed(names: list[str]) -> None:
            for n in names:
                m = host.loaded(state_table_name(table, n))
                if m is not None:
                    m.binlog_insert()

        def unknown(names: set[str]) -> None:
            with contextlib.suppress(Unavailable):
                host.refresh()

        fan = Fanout(
            self._need(),
            config,
            subscriptions,
            host.clock,
            lambda: host.may_send(table),
            handed,
            unknown,
            outage=host.store.outage,
        )
        self._fanouts[table] = fan
        return fan

    def upkeep(self) -> None:
        """Each discovery: subscriptions with subscribers are active now; those without for
        longer than their expire_after expire; the lag of those with a max_lag is counted."""
        store = self._store
        if store is None:
            return
        now = self.host.clock.now_ns()
        loaded = list(self._subs.values())
        busy = {
            m.config.name for m in self.host.managers() if m.config.source and m.has_subscribers
        }
        store.touch_subscriptions([ls.sub for ls in loaded if ls.config.name in busy], now)
        changed = False
        for ls in loaded:
            if ls.config.name not in busy and ls.sub.expired_at(now):
                log.warning(
                    "subscription %s expired: no subscriber for %gs; it gets no new messages "
                    "and no longer holds its table's purge until someone subscribes again",
                    ls.sub.label,
                    ls.sub.expire_after_s,
                )
                store.set_subscription_state(ls.sub, SubscriptionState.EXPIRED, now)
                changed = True
        self._clean_orphans({ls.config.name: ls.config.source for ls in loaded})
        limited = {ls.config.name: ls for ls in loaded if ls.sub.max_lag is not None}
        if limited:
            old = {n: self._lag.get(n, (0, None))[0] for n in limited}
            self._lag.update(self._lags(limited))
            for ls in loaded:
                n, lim = ls.config.name, ls.sub.max_lag
                if lim is not None and (old[n] > lim) != (self._lag.get(n, (0, None))[0] > lim):
                    changed = True
        if changed:
            self.host.refresh()

    def _lags(
        self, subs: Mapping[str, LoadedSubscription], unsent: dict[str, int] | None = None
    ) -> dict[str, tuple[int, int | None]]:
        """By state table: unsettled messages (up to LAG_CAP) and the oldest one's
        time_created; a lazy subscription's also those above its cursor never sent (alone
        in ``unsent`` too, when given)."""
        store = self._need()
        lags = store.subscription_lag({n: ls.config.source for n, ls in subs.items()}, LAG_CAP)
        for name, ls in subs.items():
            table = self.host.loaded(ls.sub.table)
            if not ls.sub.lazy or name not in lags or table is None:
                continue
            n, oldest = lags[name]
            more, first = store.unsent_lag(table.config, ls, LAG_CAP)
            if unsent is not None:
                unsent[name] = more
            known = [t for t in (oldest, first) if t is not None]
            lags[name] = (min(LAG_CAP, n + more), min(known) if known else None)
        return lags

    def _need(self) -> SubscriptionStore:
        """The store's subscriptions; InvalidArgument on a store without them."""
        if self._store is None:
            raise InvalidArgument("subscriptions need a MySQL-family database")
        return self._store

    def _clean_orphans(self, sources: dict[str, str]) -> None:
        """One bounded step for each state table that may hold rows whose message row is
        gone: a subscription not holding its table (the purge does not wait for it), and one
        that held again, until a whole pass is done after that."""
        store = self._need()
        for name, after in list(self._orphan_pass.items()):
            source = sources.get(name)
            if source is None:  # dropped, or not loaded
                self._orphan_pass.pop(name, None)
                continue
            deleted, nxt = store.delete_orphans(name, source, after, ORPHAN_STEP_ROWS)
            if deleted:
                log.info(
                    "subscription state %s: %d rows of messages purged meanwhile removed",
                    name,
                    deleted,
                )
            if nxt is None and name not in self._not_holding:
                self._orphan_pass.pop(name, None)  # a whole pass since it holds again
            else:
                self._orphan_pass[name] = nxt

    def create_subscription(self, sub: Subscription, from_start: bool = False) -> int:
        """Create a subscription of a loaded message table; with ``from_start`` it gets every
        retained unacked message too (returns how many). The table is read again first (a
        column added since the last discovery, a table made anew under the same name), then
        filter, projection and settings are checked: nothing is written for a bad one."""
        store = self._need()
        now = self.host.clock.now_ns()
        sub = dataclasses.replace(sub, time_created_ns=now, limits=merge_limits((), sub.limits))
        sub = check_settings(sub)
        self.host.refresh()
        table = self.host.find(sub.table).config
        if table.source:
            raise InvalidArgument(
                f"{sub.table} is a subscription's state table, not a message table"
            )
        ls = self._check_subscription(table, sub)
        n = store.create_subscription(table, ls, from_start, self.host.clock.now_ns())
        log.info("subscription %s created%s", sub.label, f" with {n:,} messages" if n else "")
        self.host.refresh()
        f = self._fanouts.get(sub.table)
        if f is not None:
            f.trigger()
        return n

    def _check_subscription(self, table: TableConfig, sub: Subscription) -> LoadedSubscription:
        """``sub`` loaded on ``table`` as it will be once created, or InvalidArgument."""
        cols = table.columns
        if not table.has_column(FANOUT_COLUMN):
            cols = (*cols, Column(FANOUT_COLUMN, "bigint", "bigint"))
        probe = dataclasses.replace(table, columns=cols)
        # as created: an ordered table's state table copies its key (and order) column
        state = (*(Column(c, "bigint", "bigint") for c in STATE_COLUMNS), *order_columns(table))
        try:
            return load_subscription(probe, sub, state)
        except TableLoadError as exc:
            raise InvalidArgument(str(exc)) from None

    def alter_subscription(self, table: str, name: str, **changes: Any) -> Subscription:
        """Change a subscription's settings (filter, columns, ack_wait_s, max_attempts,
        max_lag, expire_after_s; None clears one; limits: those named change, "" puts one
        back to the table's): live at the next discovery, which this runs now. A new filter
        applies to messages handed over from then on."""
        store = self._need()
        current = self._definition(table, name)
        if "limits" in changes:
            changes = {**changes, "limits": merge_limits(current.limits, changes["limits"])}
        sub = check_settings(dataclasses.replace(current, **changes))
        if "expire_after_s" in changes:  # a new expiry starts from now
            sub = dataclasses.replace(sub, state=SubscriptionState.ACTIVE)
        self._check_subscription(self.host.find(table).config, sub)
        store.alter_subscription(sub)
        log.info("subscription %s altered", sub.label)
        self.host.refresh()
        return sub

    def drop_subscription(self, table: str, name: str) -> None:
        """Drop a subscription and its state table; its subscribers end (NOT_FOUND)."""
        self._need().drop_subscription(table, name, state_table_name(table, name))
        log.info("subscription %s/%s dropped", table, name)
        self.host.refresh()

    def _definition(self, table: str, name: str) -> Subscription:
        for sub in self._need().subscriptions()[0]:
            if sub.table == table and sub.name == name:
                return sub
        raise TableNotFound(f"subscription {table}/{name} not found")

    def _subscription_statuses(self) -> list[TableStatus]:
        """An entry for each loaded subscription (the engine lists those that failed)."""
        subs, not_holding = self._subs, self._not_holding
        if not subs or self._store is None:
            return []
        unsent: dict[str, int] = {}
        try:
            lag = self._lags(subs, unsent)
        except MsgtableError:
            lag = {}
        out = []
        keyspace = self.host.keyspace
        by_name = {m.config.name: m for m in self.host.managers() if m.config.source}
        advice = self._filter_advice(subs)
        for name, ls in subs.items():
            m = by_name.get(name)
            n, oldest = lag.get(name, (None, None))
            fields: dict[str, Any] = dict(
                name=ls.sub.table,
                subscription=ls.sub.name,
                state=ls.sub.state.value,
                filter=ls.sub.filter,
                lag=n,
                oldest_ns=oldest,
                holding=name not in not_holding,
                not_holding=not_holding.get(name, ""),
                max_lag=ls.sub.max_lag,
                expire_after_s=ls.sub.expire_after_s,
                state_rows=ls.sub.state_rows,
                cursor_lag=unsent.get(name),
                advice=advice.get(name, ""),
            )
            if m is None:
                out.append(
                    TableStatus(keyspace=keyspace, config=ls.config, load_error=None, **fields)
                )
            else:
                out.append(dataclasses.replace(m.status(keyspace), **fields))
        return out

    def _filter_advice(self, subs: Mapping[str, LoadedSubscription]) -> dict[str, str]:
        """By state table: what a lazy subscription's filter lacks to read its matches
        alone (msgtable.core.subscriptions.filter_index_advice); its table's indexes read
        once a call, and only for such subscriptions."""
        store = self._need()
        indexes: dict[str, list[tuple[str, ...]]] = {}
        out: dict[str, str] = {}
        for name, ls in subs.items():
            if not ls.sub.lazy or ls.filter is None:
                continue
            table = ls.sub.table
            loaded = self.host.loaded(table)
            if loaded is None:
                continue
            try:
                if table not in indexes:
                    indexes[table] = store.table_indexes(table)
            except MsgtableError:
                continue
            out[name] = filter_index_advice(loaded.config, ls.filter, indexes[table])
        return out

    def _with_unseen(self, status: TableStatus) -> TableStatus:
        """A table with subscriptions: how many of its rows they have not been handed yet."""
        store = self._store
        if store is None or status.config is None or not status.config.fanout:
            return status
        try:
            unseen = store.pending_fanout(status.name, LAG_CAP)
        except MsgtableError:
            return status
        return dataclasses.replace(status, unseen=unseen)
