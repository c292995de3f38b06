"""Push endpoints as a component of the engine (msgtable.engine.components): their
definitions (set, drop), one Pusher per definition kept in step with the database after each
discovery, and their statuses.

A pusher subscribes only while the engine sends (holds the lease): a gain or a loss makes
every pusher look at once.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Protocol

from msgtable.core.status import PushStatus, TableStatus
from msgtable.core.subscriptions import state_table_name
from msgtable.core.tables import TableConfig
from msgtable.engine.components import Discovery, Host
from msgtable.errors import InvalidArgument, MsgtableError, TableNotFound
from msgtable.features.push.allow import AllowList
from msgtable.features.push.endpoints import Endpoint, check
from msgtable.features.push.pusher import PushEngine, Pusher
from msgtable.store.protocol import EndpointStore

log = logging.getLogger("msgtable.engine.engine")


class PushHost(Host, PushEngine, Protocol):
    """What the pushers see of the engine: a component's host, streamed from like a client."""


class Pushers:
    """Push endpoints as the engine serves them (see the module docstring):
    msgtable.engine.components.PushComponent. ``endpoints``: where the definitions are (None:
    a store without push endpoints); ``allow``: the URLs endpoints may have (None: none);
    ``ca_file``: the CAs their certificates are checked against (None: the system's)."""

    def __init__(
        self,
        host: PushHost,
        endpoints: EndpointStore | None,
        allow: AllowList | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.host = host
        self._endpoints = endpoints
        self.push_allow = allow or AllowList()
        self.push_ca_file = ca_file
        self._pushers: dict[tuple[str, str], Pusher] = {}
        self._push_lock = threading.Lock()
        self._push_closed = False

    # -- msgtable.engine.components.Component ----------------------------------------------
    def reconcile(self, found: Discovery) -> None:
        self._sync_pushers()

    def units(self) -> set[str]:
        return set()

    def gained(self, unit: str) -> None:
        self._wake_pushers()

    def lost(self, unit: str) -> None:
        self._wake_pushers()

    def statuses(self, listed: list[TableStatus]) -> list[TableStatus]:
        return [
            dataclasses.replace(s, push=self.push_status(s.name, s.subscription)) for s in listed
        ]

    def close(self) -> None:
        """Every pusher, side by side: the POSTs they have in progress get settled."""
        self._close_pushers()

    # -- the pushers -----------------------------------------------------------------------
    def _sync_pushers(self) -> None:
        """Start, restart (a changed definition) and stop pushers to match the database."""
        if self._endpoints is None:
            return
        try:
            defs = {(e.table, e.subscription): e for e in self._endpoints.endpoints()}
        except MsgtableError as exc:
            log.warning("push endpoints: cannot read them: %s", exc)
            return
        with self._push_lock:
            if self._push_closed:
                return
            old = self._pushers
            stop = [p for k, p in old.items() if defs.get(k) != p.endpoint]
            keep = {k: p for k, p in old.items() if defs.get(k) == p.endpoint}
            start = [
                Pusher(
                    self.host,
                    e,
                    self._push_config(e),
                    self.push_allow,
                    ca_file=self.push_ca_file,
                )
                for k, e in defs.items()
                if k not in keep
            ]
            self._pushers = {
                **keep,
                **{(p.endpoint.table, p.endpoint.subscription): p for p in start},
            }
        for p in stop:
            p.close()
        for p in start:
            p.open()

    def _push_config(self, ep: Endpoint) -> Callable[[], TableConfig | None]:
        key = state_table_name(ep.table, ep.subscription) if ep.subscription else ep.table
        host = self.host

        def config() -> TableConfig | None:
            m = host.loaded(key)
            return m.config if m is not None else None

        return config

    def _wake_pushers(self) -> None:
        with self._push_lock:
            pushers = list(self._pushers.values())
        for p in pushers:
            p.trigger()

    def _close_pushers(self) -> None:
        with self._push_lock:
            self._push_closed = True
            pushers, self._pushers = list(self._pushers.values()), {}
        threads = [threading.Thread(target=p.close, daemon=True) for p in pushers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _store(self) -> EndpointStore:
        if self._endpoints is None:
            raise InvalidArgument("push endpoints need a MySQL-family database")
        return self._endpoints

    def push_status(self, table: str, subscription: str) -> PushStatus | None:
        p = self._pushers.get((table, subscription))
        return p.status() if p is not None else None

    def set_endpoint(self, endpoint: Endpoint) -> None:
        """Define (or replace) the endpoint of a table's default group or subscription;
        InvalidArgument for a URL outside the allow-list (this server would not call it)."""
        endpoints = self._store()
        problem = self.push_allow.url_problem(check(endpoint))
        if problem:  # refused here, not stored to wait: the caller learns it now
            raise InvalidArgument(
                f"the server will not call {endpoint.url}: {problem} "
                "(serve --push-allow lists what it may call)"
            )
        m = self.host.find(endpoint.table, endpoint.subscription)  # it exists
        if not endpoint.subscription:
            self.host.default_group(m)  # vt_default_group=off: name a subscription
        endpoints.set_endpoint(endpoint, self.host.clock.now_ns())
        log.info("push %s: endpoint set to %s", endpoint.label, endpoint.url)
        self.host.refresh()
        self._sync_pushers()

    def drop_endpoint(self, table: str, subscription: str = "") -> None:
        endpoints = self._store()
        label = f"{table}/{subscription}" if subscription else table
        if not endpoints.drop_endpoint(table, subscription):
            raise TableNotFound(f"no push endpoint for {label}")
        log.info("push %s: endpoint dropped", label)
        self._sync_pushers()
