"""Push endpoints in memory: msgtable.store.protocol.EndpointStore beside an InMemoryStore,
for unit tests of the pushers (EndpointSQL's rules: one definition per (table, subscription),
a new one replaces it; listed by table, then subscription).
tests/integration/test_endpoint_store_contract.py runs the same cases on both."""

from __future__ import annotations

from typing import TYPE_CHECKING

from msgtable.core.endpoints import Endpoint
from msgtable.errors import DatabaseUnavailable

if TYPE_CHECKING:
    from msgtable.testing.memory import InMemoryStore


class InMemoryEndpoints:
    """The push endpoints of one InMemoryStore (``down`` is the store's)."""

    def __init__(self, store: InMemoryStore) -> None:
        self.store = store
        self.rows: dict[tuple[str, str], Endpoint] = {}

    def _up(self) -> None:
        if self.store.down:
            raise DatabaseUnavailable("database unavailable: (2003) test outage")

    def endpoints(self) -> list[Endpoint]:
        self._up()
        with self.store.lock:
            return [self.rows[k] for k in sorted(self.rows)]

    def set_endpoint(self, ep: Endpoint, now_ns: int) -> None:
        self._up()
        with self.store.lock:
            self.rows[(ep.table, ep.subscription)] = ep

    def drop_endpoint(self, table: str, subscription: str) -> int:
        self._up()
        with self.store.lock:
            return 0 if self.rows.pop((table, subscription), None) is None else 1
