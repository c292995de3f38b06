"""Schedules in memory: msgtable.store.schedules.ScheduleStore over an InMemoryStore's tables,
for unit tests of the ticker and the component (the same rules as ScheduleSQL: a tick is the
message and the move of next_tick together, conditional on the next_tick read).

The schedules belong to the store (the database): every InMemorySchedules of one store sees
the same ones, as every server of a database does. Names are compared as the name column's
collation compares them (case-insensitive); the same cases run on ScheduleSQL
(tests/integration/test_schedule_store_contract.py), so the two cannot drift.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref

from msgtable.core.schedules import Schedule
from msgtable.core.tables import TableConfig
from msgtable.errors import DatabaseUnavailable, InvalidArgument
from msgtable.store.mysql import DUPLICATE_KEY, error_code
from msgtable.store.schedules import message_row
from msgtable.testing.memory import InMemoryStore


class _Held:
    """The schedules of one store, by their name's key (:func:`_key`)."""

    def __init__(self) -> None:
        self.rows: dict[str, Schedule] = {}
        self.lock = threading.Lock()


_HELD: weakref.WeakKeyDictionary[InMemoryStore, _Held] = weakref.WeakKeyDictionary()
_HELD_LOCK = threading.Lock()


def _key(name: str) -> str:
    """A name as a case-insensitive collation (utf8mb4_general_ci) compares and orders it."""
    return name.upper()


class InMemorySchedules:
    """The schedules of one InMemoryStore (``down`` is the store's)."""

    def __init__(self, store: InMemoryStore) -> None:
        self.store = store
        with _HELD_LOCK:
            self._held = _HELD.setdefault(store, _Held())
        self._lock = self._held.lock

    @property
    def rows(self) -> dict[str, Schedule]:
        """The store's schedules (by their name's key)."""
        return self._held.rows

    def _up(self) -> None:
        if self.store.down:
            raise DatabaseUnavailable("database unavailable: (2003) test outage")

    def schedules(self) -> list[Schedule]:
        self._up()
        with self._lock:
            return [self.rows[k] for k in sorted(self.rows)]

    def create(self, s: Schedule, now_ns: int) -> None:
        self._up()
        with self._lock:
            if _key(s.name) in self.rows:
                raise InvalidArgument(f"schedule {s.name!r} exists")
            # what a schedule has done is the store's to count: a new one has done nothing
            self.rows[_key(s.name)] = dataclasses.replace(
                s, last_tick_ns=None, last_enqueued_ns=None, ticks=0
            )

    def drop(self, name: str) -> bool:
        self._up()
        with self._lock:
            return self.rows.pop(_key(name), None) is not None

    def start(self, name: str, next_ns: int) -> bool:
        self._up()
        with self._lock:
            s = self.rows.get(_key(name))
            if s is None or s.next_tick_ns != 0:
                return False
            self.rows[_key(name)] = dataclasses.replace(s, next_tick_ns=next_ns)
            return True

    def tick(
        self, s: Schedule, cfg: TableConfig, enqueue: int | None, next_ns: int, now_ns: int
    ) -> bool:
        self._up()
        with self._lock:
            held = self.rows.get(_key(s.name))
            if held is None or held.next_tick_ns != s.next_tick_ns:
                return False
            n = 0
            if enqueue is not None:
                n = self._insert(s, cfg, enqueue, now_ns)
            self.rows[_key(s.name)] = dataclasses.replace(
                held,
                next_tick_ns=next_ns,
                last_tick_ns=enqueue if enqueue is not None else held.last_tick_ns,
                last_enqueued_ns=now_ns if enqueue is not None else held.last_enqueued_ns,
                ticks=held.ticks + n,
            )
            return True

    def _insert(self, s: Schedule, cfg: TableConfig, tick_ns: int, now_ns: int) -> int:
        """The tick's message: 1, or 0 when its id or its vt_dedup key is taken already."""
        row = message_row(s, cfg, tick_ns, now_ns)
        id_ = row.pop(cfg.id_column.name)
        if id_ in self.store.rows[cfg.name]:
            return 0
        try:
            self.store.insert(cfg.name, id_, **row)
        except Exception as exc:
            if error_code(exc) != DUPLICATE_KEY:
                raise
            return 0
        return 1
