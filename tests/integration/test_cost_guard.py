"""The cost guard (issue 42, DESIGN.md principle 9): what the server does for 1,000 messages
from send to ack, counted, never timed, against budgets kept in cost_budget.json: through the
default group of a plain table, and through a subscription (the fan-out's hand-over, then its
poll, send and ack).

The engine runs without its loops (each step driven here, one thread, a fake clock), against
the real database, so every count is the same on every run: the statements and round trips
the store sends (each execute, each commit), and the Python function calls made in msgtable's
own modules (a profiler that counts, no clock). A change that adds per-message work fails
with the numbers before and after; raising a budget is a reviewed commit that says why.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import msgtable
from msgtable.core.clock import FakeClock
from msgtable.core.subscriptions import Subscription, state_table_name
from msgtable.core.tables import current_layout_ddl
from msgtable.engine.engine import MessageEngine
from msgtable.features.assembly import assemble
from msgtable.features.subscriptions.registry import Registry
from msgtable.store import dbpool
from msgtable.store.mysqlstore import MySQLStore

from .helpers import comment

BUDGET_FILE = Path(__file__).with_name("cost_budget.json")
MESSAGES = 1_000
BATCH = 100
PACKAGE_DIR = str(Path(msgtable.__file__).parent)
PROTO_DIR = str(Path(msgtable.__file__).parent / "proto")


class Counts:
    """What one run did: statements (executes), round trips (executes and commits or
    rollbacks) and function calls in msgtable's modules, by module."""

    def __init__(self) -> None:
        self.statements = 0
        self.round_trips = 0
        self.calls: Counter[str] = Counter()

    def figures(self) -> dict[str, int]:
        return {
            "statements": self.statements,
            "round_trips": self.round_trips,
            "calls": sum(self.calls.values()),
        }


class _Cursor:
    def __init__(self, cursor: Any, counts: Counts) -> None:
        self._cursor, self._counts = cursor, counts

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        self._counts.statements += 1
        self._counts.round_trips += 1
        return self._cursor.execute(*args, **kwargs)

    def executemany(self, *args: Any, **kwargs: Any) -> Any:
        self._counts.statements += 1
        self._counts.round_trips += 1
        return self._cursor.executemany(*args, **kwargs)

    def __enter__(self) -> _Cursor:
        self._cursor.__enter__()
        return self

    def __exit__(self, *exc: object) -> Any:
        return self._cursor.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor)


class _Connection:
    def __init__(self, conn: Any, counts: Counts) -> None:
        self._conn, self._counts = conn, counts

    def cursor(self, *args: Any, **kwargs: Any) -> _Cursor:
        return _Cursor(self._conn.cursor(*args, **kwargs), self._counts)

    def commit(self) -> Any:
        self._counts.round_trips += 1
        return self._conn.commit()

    def rollback(self) -> Any:
        self._counts.round_trips += 1
        return self._conn.rollback()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@contextlib.contextmanager
def counted(monkeypatch: pytest.MonkeyPatch, counts: Counts) -> Iterator[None]:
    """Count the store's statements (every pool connection it takes) and msgtable's calls
    on this thread while the block runs."""
    take = dbpool.ConnectionPool.connection

    @contextlib.contextmanager
    def connection(pool: dbpool.ConnectionPool) -> Iterator[Any]:
        with take(pool) as conn:
            yield _Connection(conn, counts)

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_code.co_filename
            if name.startswith(PACKAGE_DIR) and not name.startswith(PROTO_DIR):
                counts.calls[name[len(PACKAGE_DIR) + 1 :]] += 1

    monkeypatch.setattr(dbpool.ConnectionPool, "connection", connection)
    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)
        monkeypatch.setattr(dbpool.ConnectionPool, "connection", take)


@pytest.fixture
def engine(db_dsn: str, sql: Any) -> Iterator[MessageEngine]:
    sql.execute(current_layout_ddl("q", comment(vt_batch_size=BATCH, vt_cache_size=10_000)))
    rows = ", ".join(f"({i}, 'm{i}')" for i in range(1, MESSAGES + 1))
    sql.execute(f"insert into q(id, message) values {rows}")
    store = MySQLStore.from_dsn(db_dsn)
    e = assemble(store, clock=FakeClock(time.time_ns()), run_loops=False, capture=False)
    e.refresh()
    try:
        yield e
    finally:
        e.close()


@pytest.fixture(params=["eager"])
def subscribed(db_dsn: str, sql: Any, request: Any) -> Iterator[MessageEngine]:
    """A table whose only group is one subscription (vt_default_group=off), created before
    its 1,000 messages are inserted (``state_rows`` as the parameter says)."""
    settings = comment(vt_batch_size=BATCH, vt_cache_size=10_000, vt_default_group="off")
    sql.execute(current_layout_ddl("q", settings))
    store = MySQLStore.from_dsn(db_dsn)
    e = assemble(store, clock=FakeClock(time.time_ns()), run_loops=False, capture=False)
    e.refresh()
    try:
        e.create_subscription(Subscription("q", "s", state_rows=request.param))
        rows = ", ".join(f"({i}, 'm{i}')" for i in range(1, MESSAGES + 1))
        sql.execute(f"insert into q(id, message) values {rows}")
        yield e
    finally:
        e.close()


def deliver_and_ack(engine: MessageEngine, table: str, subscription: str = "") -> int:
    """Poll, send and ack until every message of ``table`` was acked (the default group, or
    ``subscription``; one subscriber with a window of a batch); returns how many were
    acked."""
    m = engine._managers[state_table_name(table, subscription) if subscription else table]
    sub = m.subscribe(max_in_flight=BATCH)
    acked = 0
    try:
        while acked < MESSAGES:
            m.poll_once()
            if not m.send_once():
                break
            batch = sub.next_batch(0)
            acked += engine.ack(table, "", [values[0] for values in batch], subscription)
    finally:
        sub.close()
    return acked


def judged(name: str, counts: Counts, flavour: str = "mariadb") -> None:
    """``counts`` against the budget of ``name`` (its figures for the server's flavour where
    it has its own: MySQL cannot time out one statement's lock wait, so the fan-out reads its
    counter row with NOWAIT first, one statement and round trip more a batch)."""
    budget = json.loads(BUDGET_FILE.read_text())[name]
    budgets = {**budget, **budget.get(flavour, {})}
    figures = counts.figures()
    over = {k: (budgets[k], v) for k, v in figures.items() if v > budgets[k]}
    top = ", ".join(f"{mod} {n}" for mod, n in counts.calls.most_common(8))
    assert not over, (
        f"{name}: over budget for {MESSAGES} messages (budget, now): {over}; all figures "
        f"now {figures}; the calls by module: {top}. Take the per-message work back out, "
        f"or raise the budget in {BUDGET_FILE.name} in a commit that says why."
    )


def test_the_default_group_stays_within_its_budget(engine, monkeypatch, flavour):
    counts = Counts()
    with counted(monkeypatch, counts):
        acked = deliver_and_ack(engine, "q")
    assert acked == MESSAGES
    print(f"cost of {MESSAGES} messages, default group: {counts.figures()}")
    judged("default_group", counts, flavour)


def test_a_subscription_stays_within_its_budget(subscribed, monkeypatch, flavour):
    """1,000 messages through a subscription: the fan-out's hand-over (its loop's step,
    driven here), then the same poll, send and ack as the default group's."""
    registry = subscribed._subscriptions
    assert isinstance(registry, Registry)
    counts = Counts()
    with counted(monkeypatch, counts):
        handed = registry._fanouts["q"].fanout_once()
        acked = deliver_and_ack(subscribed, "q", "s")
    assert handed == acked == MESSAGES
    print(f"cost of {MESSAGES} messages, a subscription: {counts.figures()}")
    judged("subscription", counts, flavour)


@pytest.mark.parametrize("subscribed", ["lazy"], indirect=True)
def test_a_lazy_subscription_stays_within_its_budget(subscribed, monkeypatch, flavour):
    """The same through a subscription created with state_rows=lazy
    (msgtable.features.subscriptions.lazy): the fan-out numbers the rows and writes no state
    row; the poll reads them from the message table behind the cursor; the acks write
    nothing but the cursor, at the next poll."""
    registry = subscribed._subscriptions
    assert isinstance(registry, Registry)
    counts = Counts()
    with counted(monkeypatch, counts):
        handed = registry._fanouts["q"].fanout_once()
        acked = deliver_and_ack(subscribed, "q", "s")
    assert handed == acked == MESSAGES
    print(f"cost of {MESSAGES} messages, a lazy subscription: {counts.figures()}")
    judged("lazy_subscription", counts, flavour)
