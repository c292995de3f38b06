"""The capture follower's writes in memory: msgtable.store.protocol.CaptureStore over an
InMemoryStore's tables, for unit tests of the follower, with CaptureSQL's rules
(msgtable.store.capture): one stored position, moved only from the one the writer last
wrote (else PositionMoved, nothing written), together with the events, each a row of its
capture table (an id of its own, due now, epoch 0). tests/integration/
test_capture_store_contract.py runs the same cases on both."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from msgtable.core.events import EVENT_COLUMNS
from msgtable.errors import DatabaseUnavailable
from msgtable.store.capture import PositionMoved

if TYPE_CHECKING:
    from msgtable.testing.memory import InMemoryStore


class InMemoryCapture:
    """The capture position and event writes of one InMemoryStore (``down`` is the
    store's; ``row_metadata`` what @@binlog_row_metadata says)."""

    def __init__(self, store: InMemoryStore, row_metadata: str = "FULL") -> None:
        self.store = store
        self.position: str | None = None
        self._row_metadata = row_metadata

    def _up(self) -> None:
        if self.store.down:
            raise DatabaseUnavailable("database unavailable: (2003) test outage")

    def row_metadata(self) -> str:
        self._up()
        return self._row_metadata

    def comment(self, table: str) -> str | None:
        self._up()
        d = self.store.definitions.get(table)
        return None if d is None else d.comment

    def start(self, position: str, now_ns: int) -> str:
        self._up()
        with self.store.lock:
            if self.position is None:
                self.position = position
            return self.position

    def stored(self) -> str | None:
        self._up()
        return self.position

    def write(
        self,
        events: Mapping[str, Sequence[tuple[Any, ...]]],
        old: str,
        new: str,
        now_ns: int,
    ) -> None:
        self._up()
        store = self.store
        with store.lock:
            if self.position != old:
                raise PositionMoved(f"the capture position is no longer {old}")
            for table in events:
                store._table(table)  # all or nothing: each table first
            for table, rows in events.items():
                written = store.rows[table]
                next_id = max((int(str(i)) for i in written), default=0) + 1
                for row in rows:
                    head = {"priority": 0, "time_next": now_ns, "epoch": 0}
                    written[next_id] = {
                        "id": next_id,
                        **head,
                        "time_acked": None,
                        "time_created": now_ns,
                        **dict(zip(EVENT_COLUMNS, row, strict=True)),
                    }
                    next_id += 1
            self.position = new

    def close(self) -> None:
        pass
