"""The engine's side of push endpoints: their definitions (set, drop), one Pusher per
definition kept in step with the database at each discovery, and their statuses.

MessageEngine has this as a mixin. A pusher subscribes only while the engine sends (holds
the lease): ``_push_wake`` after a gain or loss makes every pusher look at once.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from msgtable.core.clock import Clock
from msgtable.core.status import PushStatus
from msgtable.core.subscriptions import state_table_name
from msgtable.core.tables import TableConfig
from msgtable.errors import InvalidArgument, MsgtableError, TableNotFound
from msgtable.features.push.allow import AllowList
from msgtable.features.push.endpoints import (
    Endpoint,
    delete_endpoint,
    read_endpoints,
    write_endpoint,
)
from msgtable.features.push.pusher import PushEngine, Pusher

if TYPE_CHECKING:
    from msgtable.engine.manager import MessageManager

log = logging.getLogger("msgtable.engine.engine")


class Endpoints:
    """Push endpoints as the engine serves them (see the module docstring). The attributes
    are MessageEngine's."""

    store: Any
    clock: Clock
    _lock: threading.Lock
    _managers: dict[str, MessageManager]
    push_allow: AllowList
    push_ca_file: str | None
    _pushers: dict[tuple[str, str], Pusher]
    _push_lock: threading.Lock
    _push_closed: bool

    if TYPE_CHECKING:

        def _manager(
            self,
            name: str,
            keyspace: str,
            shard: str = "",
            key_range: tuple[bytes, bytes] = (b"", b""),
            subscription: str = "",
        ) -> MessageManager: ...

        def refresh(self) -> None: ...

        def _default_group(self, m: MessageManager) -> MessageManager: ...

    def _init_push(self, allow: AllowList | None, ca_file: str | None) -> None:
        self.push_allow = allow or AllowList()
        self.push_ca_file = ca_file
        self._pushers = {}
        self._push_lock = threading.Lock()
        self._push_closed = False

    def _sync_pushers(self) -> None:
        """Start, restart (a changed definition) and stop pushers to match the database."""
        if not hasattr(self.store, "_auto_cursor"):  # the in-memory store: none
            return
        try:
            defs = {(e.table, e.subscription): e for e in read_endpoints(self.store)}
        except MsgtableError as exc:
            log.warning("push endpoints: cannot read them: %s", exc)
            return
        with self._push_lock:
            if self._push_closed:
                return
            old = self._pushers
            stop = [p for k, p in old.items() if defs.get(k) != p.endpoint]
            keep = {k: p for k, p in old.items() if defs.get(k) == p.endpoint}
            engine: PushEngine = self  # type: ignore[assignment]
            start = [
                Pusher(
                    engine,
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

    def _push_config(self, ep: Endpoint) -> Any:
        key = state_table_name(ep.table, ep.subscription) if ep.subscription else ep.table

        def config() -> TableConfig | None:
            m = self._managers.get(key)
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

    def push_status(self, table: str, subscription: str) -> PushStatus | None:
        p = self._pushers.get((table, subscription))
        return p.status() if p is not None else None

    def set_endpoint(self, endpoint: Endpoint) -> None:
        """Define (or replace) the endpoint of a table's default group or subscription;
        InvalidArgument for a URL outside the allow-list (this server would not call it)."""
        if not hasattr(self.store, "_auto_cursor"):
            raise InvalidArgument("push endpoints need a MySQL-family database")
        problem = self.push_allow.url_problem(endpoint.check())
        if problem:  # refused here, not stored to wait: the caller learns it now
            raise InvalidArgument(
                f"the server will not call {endpoint.url}: {problem} "
                "(serve --push-allow lists what it may call)"
            )
        m = self._manager(endpoint.table, "", subscription=endpoint.subscription)  # it exists
        if not endpoint.subscription:
            self._default_group(m)  # vt_default_group=off: name a subscription
        write_endpoint(self.store, endpoint, self.clock.now_ns())
        log.info("push %s: endpoint set to %s", endpoint.label, endpoint.url)
        self.refresh()
        self._sync_pushers()

    def drop_endpoint(self, table: str, subscription: str = "") -> None:
        if not hasattr(self.store, "_auto_cursor"):
            raise InvalidArgument("push endpoints need a MySQL-family database")
        label = f"{table}/{subscription}" if subscription else table
        if not delete_endpoint(self.store, table, subscription):
            raise TableNotFound(f"no push endpoint for {label}")
        log.info("push %s: endpoint dropped", label)
        self._sync_pushers()
