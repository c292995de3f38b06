"""Schedules in memory: msgtable.store.schedules.ScheduleStore over an InMemoryStore's tables,
for unit tests of the ticker and the component (the same rules as ScheduleSQL: a tick is the
message and the move of next_tick together, conditional on the next_tick read)."""

from __future__ import annotations

import dataclasses
import threading

from msgtable.core.schedules import Schedule
from msgtable.core.tables import TableConfig
from msgtable.errors import DatabaseUnavailable, InvalidArgument
from msgtable.store.schedules import message_row
from msgtable.testing.memory import InMemoryStore


class InMemorySchedules:
    """The schedules of one InMemoryStore (``down`` is the store's)."""

    def __init__(self, store: InMemoryStore) -> None:
        self.store = store
        self.rows: dict[str, Schedule] = {}
        self._lock = threading.Lock()

    def schedules(self) -> list[Schedule]:
        if self.store.down:
            raise DatabaseUnavailable("database unavailable: (2003) test outage")
        with self._lock:
            return [self.rows[n] for n in sorted(self.rows)]

    def create(self, s: Schedule, now_ns: int) -> None:
        with self._lock:
            if s.name in self.rows:
                raise InvalidArgument(f"schedule {s.name!r} exists")
            self.rows[s.name] = s

    def drop(self, name: str) -> bool:
        with self._lock:
            return self.rows.pop(name, None) is not None

    def start(self, name: str, next_ns: int) -> bool:
        with self._lock:
            s = self.rows.get(name)
            if s is None or s.next_tick_ns != 0:
                return False
            self.rows[name] = dataclasses.replace(s, next_tick_ns=next_ns)
            return True

    def tick(
        self, s: Schedule, cfg: TableConfig, enqueue: int | None, next_ns: int, now_ns: int
    ) -> bool:
        with self._lock:
            held = self.rows.get(s.name)
            if held is None or held.next_tick_ns != s.next_tick_ns:
                return False
            n = 0
            if enqueue is not None:
                row = message_row(held, cfg, enqueue, now_ns)
                id_ = row.pop(cfg.id_column.name)
                if id_ not in self.store.rows[cfg.name]:
                    self.store.insert(cfg.name, id_, **row)
                    n = 1
            self.rows[s.name] = dataclasses.replace(
                held,
                next_tick_ns=next_ns,
                last_tick_ns=enqueue if enqueue is not None else held.last_tick_ns,
                last_enqueued_ns=now_ns if enqueue is not None else held.last_enqueued_ns,
                ticks=held.ticks + n,
            )
            return True
