"""Helpers for tests, msgtable's own and its users': an in-memory Store with MySQL's semantics
(:class:`InMemoryStore`, with each feature's store in memory beside it), and handles on
MySQL-family servers to test against (:class:`ServerHandle`: a throwaway local one is
msgtable.testing.devdb.LocalServer, one run by someone else :class:`ExternalServer`).

Modules:
    capture        The capture follower's writes in memory, for unit tests
    devdb          A throwaway local MySQL-family server
    endpoints      Push endpoints in memory, for unit tests
    memory         An in-memory Store with MySQL's semantics, for unit tests
    mysqld         Finding and preparing a MySQL-family server binary
    schedules      Schedules in memory, for unit tests
    servers        MySQL-family servers to test against
    subscriptions  Subscriptions in memory, for unit tests
    watchdog       The throwaway server's watchdog
"""

from __future__ import annotations

from msgtable.testing.memory import CURRENT_COLUMNS, InMemoryStore
from msgtable.testing.servers import ExternalServer, ServerHandle

__all__ = ["CURRENT_COLUMNS", "ExternalServer", "InMemoryStore", "ServerHandle"]
