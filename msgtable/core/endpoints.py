"""Push endpoints, the pure part: one definition per (table, subscription) that is pushed
('' is the table's default group), its limits and their defaults. Where they are kept:
msgtable.store.protocol.EndpointStore; how they are called: msgtable.features.push.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from msgtable.errors import InvalidArgument

DEFAULT_MAX_IN_FLIGHT = 4
MAX_MAX_IN_FLIGHT = 64
DEFAULT_TIMEOUT_S = 10.0
MAX_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Endpoint:
    """One push endpoint's definition. ``secret`` is kept out of ``repr``."""

    table: str
    subscription: str  # '': the table's default group
    url: str
    secret: str = field(repr=False)
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def label(self) -> str:
        return f"{self.table}/{self.subscription}" if self.subscription else self.table

    def check_limits(self) -> None:
        """InvalidArgument naming the limit a definition is outside of."""
        if not 1 <= self.max_in_flight <= MAX_MAX_IN_FLIGHT:
            raise InvalidArgument(
                f"max in flight must be 1 to {MAX_MAX_IN_FLIGHT}, not {self.max_in_flight}"
            )
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise InvalidArgument(
                f"the time-out must be more than 0 and at most {MAX_TIMEOUT_S:g}s, "
                f"not {self.timeout_s:g}"
            )
