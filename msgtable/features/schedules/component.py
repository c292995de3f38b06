"""Schedules as a component of the engine (msgtable.engine.components): the ticker
(msgtable.features.schedules.ticker) runs on the server that sends SCHEDULES, the placement's
unit of every schedule of the database, while some schedule exists; the verbs behind
``msgtable schedule create / list / drop`` and the admin rpcs CreateSchedule, ListSchedules and
DropSchedule; ListTables shows each table's schedules with their last and next tick.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from msgtable.core.assignment import SCHEDULES
from msgtable.core.schedules import (
    Missed,
    Schedule,
    check_cron,
    check_name,
    check_timezone,
    check_values,
    next_tick,
)
from msgtable.core.status import TableStatus
from msgtable.core.tables import TableConfig
from msgtable.engine.components import Discovery, Host
from msgtable.errors import InvalidArgument, TableNotFound, Unavailable
from msgtable.features.schedules.ticker import Ticker
from msgtable.store.schedules import ScheduleStore, check_columns

log = logging.getLogger(__name__)


class Schedules:
    """Schedules as the engine serves them (see the module docstring). ``store``: where the
    schedules are (None: not served)."""

    def __init__(self, host: Host, store: ScheduleStore | None) -> None:
        self.host = host
        self.store = store
        self._configs: Mapping[str, TableConfig] = {}
        self.listed: list[Schedule] = []  # as the last discovery (or verb) read them
        self._closed = False
        self.ticker: Ticker | None = None
        if store is not None:
            self.ticker = Ticker(
                store,
                self._configs_get,
                host.clock,
                lambda: self.host.sends(SCHEDULES),
                lambda table: self.host.binlog_insert(table),
                outage=host.store.outage,
            )

    def _configs_get(self, table: str) -> TableConfig | None:
        return self._configs.get(table)

    # -- the Component hooks -------------------------------------------------------------
    def reconcile(self, found: Discovery) -> None:
        self._configs = found.configs
        if self.store is not None:
            with contextlib.suppress(Unavailable):
                self.listed = self.store.schedules()
        self._run()

    def units(self) -> set[str]:
        return {SCHEDULES} if self.listed else set()

    def gained(self, unit: str) -> None:
        self._run()

    def lost(self, unit: str) -> None:
        if unit == SCHEDULES and self.ticker is not None:
            self.ticker.close()

    def statuses(self, listed: list[TableStatus]) -> list[TableStatus]:
        by_table: dict[str, list[Schedule]] = {}
        for s in self.listed:
            by_table.setdefault(s.table, []).append(s)
        if not by_table:
            return listed
        return [
            dataclasses.replace(s, schedules=tuple(by_table[s.name]))
            if s.name in by_table and not s.subscription
            else s
            for s in listed
        ]

    def close(self) -> None:
        self._closed = True
        if self.ticker is not None:
            self.ticker.close()

    def _run(self) -> None:
        """Tick while this server sends SCHEDULES and some schedule exists."""
        t = self.ticker
        if t is None:
            return
        if self.host.run_loops and self.listed and self.host.sends(SCHEDULES) and not self._closed:
            t.open()
            t.wake()
        elif t.running and not self.host.sends(SCHEDULES):
            t.close()

    # -- the verbs -----------------------------------------------------------------------
    def create_schedule(
        self,
        name: str,
        table: str,
        cron: str,
        values: Mapping[str, Any] | str = "{}",
        timezone: str = "UTC",
        missed: str = "skip",
    ) -> Schedule:
        """Define a schedule of ``table`` (every argument checked; InvalidArgument names
        what is wrong). Its first tick is the first time of ``cron`` after now."""
        store = self._need_store()
        name, cron, timezone = check_name(name), check_cron(cron), check_timezone(timezone)
        kept = check_values(values)
        how = Missed.parse(missed)
        cfg = self._configs.get(table)
        if cfg is None:
            self.host.refresh()
            cfg = self._configs.get(table)
        if cfg is None:
            raise TableNotFound(f"no message table {table!r}")
        check_columns(cfg, kept)
        now = self.host.clock.now_ns()
        s = Schedule(name, table, cron, timezone, kept, how, next_tick(cron, timezone, now))
        store.create(s, now)
        self.listed = store.schedules()
        log.info("schedule %s of table %s created: %r in %s", name, table, cron, timezone)
        self.host.refresh()  # the placement learns of SCHEDULES; this server may tick at once
        self._run()
        return s

    def list_schedules(self) -> list[Schedule]:
        if self.store is None:
            return []
        self.listed = self.store.schedules()
        return list(self.listed)

    def drop_schedule(self, name: str) -> bool:
        store = self._need_store()
        gone = store.drop(name)
        self.listed = store.schedules()
        if gone:
            log.info("schedule %s dropped", name)
        return gone

    def _need_store(self) -> ScheduleStore:
        if self.store is None:
            raise InvalidArgument("schedules need a MySQL-family database")
        return self.store
