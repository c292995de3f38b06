"""Table events as a component of the engine (msgtable.engine.components): the capture
follower (msgtable.features.capture.follower) runs on the server that sends CAPTURE, the
placement's unit of every capture table, while some capture table is loaded; ListTables
shows where each capture table's follower is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from msgtable.core.assignment import CAPTURE
from msgtable.core.status import TableStatus
from msgtable.engine.components import Discovery, Host
from msgtable.features.capture.follower import CaptureFollower, CaptureTarget
from msgtable.store.mysql import pymysql_args
from msgtable.store.protocol import Connections


class Capture:
    """Table events as the engine serves them (see the module docstring):
    msgtable.engine.components.CaptureComponent. ``store``: the database's connections the
    follower reads the binlog on and writes events through (None: no events are captured)."""

    def __init__(self, host: Host, store: Connections | None) -> None:
        self.host = host
        # read by the follower for every event: replaced whole, never changed
        self._targets: tuple[CaptureTarget, ...] = ()
        self._message_tables: frozenset[str] = frozenset()
        self._closed = False
        self.follower: CaptureFollower | None = None
        if store is not None:
            self.follower = CaptureFollower(
                pymysql_args(store.url),
                store.database,
                lambda: self._targets,
                exclude=lambda t: t in self._message_tables,
                written=self._written,
                outage=store.outage,
                timed=store.timed,
                store=store.capture_store(),
            )

    def reconcile(self, found: Discovery) -> None:
        self._targets = tuple(
            CaptureTarget(c.name, c.capture) for c in found.configs.values() if c.capture
        )
        self._message_tables = found.message_tables
        self._follow()

    def units(self) -> set[str]:
        return {CAPTURE} if self._targets else set()

    def gained(self, unit: str) -> None:
        self._follow()

    def lost(self, unit: str) -> None:
        if unit == CAPTURE and self.follower is not None:
            self.follower.close()

    def statuses(self, listed: list[TableStatus]) -> list[TableStatus]:
        return [self._with_capture(s) for s in listed]

    def close(self) -> None:
        self._closed = True
        if self.follower is not None:
            self.follower.close()

    def _follow(self) -> None:
        """Capture table events while this server sends them and some capture table is
        loaded."""
        if (
            self.follower is not None
            and self.host.run_loops
            and self.host.sends(CAPTURE)
            and self._targets
            and not self._closed
        ):
            self.follower.open()

    def _written(self, tables: Sequence[str]) -> None:
        for t in tables:
            self.host.binlog_insert(t)

    def _with_capture(self, s: TableStatus) -> TableStatus:
        """A capture table's status with its follower's (not its subscriptions': theirs are
        the subscriptions' own)."""
        if s.config is None or s.config.capture is None or s.subscription:
            return s
        f = self.follower
        if f is None:
            return dataclasses.replace(s, capture_problem="table events need a MySQL database")
        if f.disabled_because:
            return dataclasses.replace(s, capture_problem=f.disabled_because)
        if not self.host.sends(CAPTURE):
            sender = self.host.sender(CAPTURE)
            return dataclasses.replace(
                s,
                capture_problem="this server does not capture the table events: "
                + (f"the server at {sender} does" if sender else "no server does now"),
            )
        return dataclasses.replace(
            s,
            capture_position=f.position,
            capture_lag_s=f.lag_s if f.following.is_set() else None,
            capture_events=f.events,
            capture_problem="" if f.following.is_set() else "not following the binlog now",
        )
