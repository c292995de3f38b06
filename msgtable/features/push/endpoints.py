"""A push endpoint's definition checked before it is stored or called: its URL
(msgtable.features.push.allow), its secret (msgtable.features.push.body) and its limits. What
an endpoint is: msgtable.core.endpoints (re-exported here); its SQL:
msgtable.store.endpoints.
"""

from __future__ import annotations

from msgtable.core.endpoints import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_TIMEOUT_S,
    MAX_MAX_IN_FLIGHT,
    MAX_TIMEOUT_S,
    Endpoint,
)
from msgtable.features.push.allow import Target, parse_target
from msgtable.features.push.body import secret_bytes

__all__ = [
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_TIMEOUT_S",
    "MAX_MAX_IN_FLIGHT",
    "MAX_TIMEOUT_S",
    "Endpoint",
    "check",
]


def check(ep: Endpoint) -> Target:
    """``ep``'s URL checked (the secret, limits too); InvalidArgument naming the problem."""
    target = parse_target(ep.url)
    secret_bytes(ep.secret)
    ep.check_limits()
    return target
