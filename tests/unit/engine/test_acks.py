from __future__ import annotations

import itertools
import threading

import pytest

from msgtable.engine.acks import AckCombiner
from msgtable.errors import Unavailable


class FakeTable:
    """Rows by id -> ack timestamp; the first statement blocks until released."""

    def __init__(self, unacked: set[int]) -> None:
        self.acked_at: dict[int, int | None] = dict.fromkeys(unacked)
        self.statements: list[list[int]] = []
        self.release = threading.Event()
        self.entered = threading.Event()
        self.fail: Exception | None = None
        self.clock = itertools.count(1)

    def ack(self, ids: list[int], now: int) -> int:
        self.statements.append(list(ids))
        self.entered.set()
        self.release.wait(5)
        if self.fail:
            raise self.fail
        n = 0
        for i in ids:
            if i in self.acked_at and self.acked_at[i] is None:
                self.acked_at[i] = now
                n += 1
        return n

    def acked(self, ids: list[int], now: int) -> set[int]:
        return {i for i in ids if self.acked_at.get(i) == now}

    def combiner(self) -> AckCombiner:
        return AckCombiner(self.ack, self.acked, lambda: next(self.clock))


def run_concurrently(combiner: AckCombiner, table: FakeTable, calls: list[list[int]]):
    results: dict[int, object] = {}

    def call(k: int) -> None:
        try:
            results[k] = combiner.ack(calls[k])
        except Exception as exc:
            results[k] = exc

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert table.entered.wait(5)  # the first statement runs; the others queue behind it
    rest = [threading.Thread(target=call, args=(k,)) for k in range(1, len(calls))]
    for t in rest:
        t.start()
    while len(combiner._pending) < len(rest):
        threading.Event().wait(0.01)
    table.release.set()
    for t in [first, *rest]:
        t.join(5)
    return [results[k] for k in range(len(calls))]


def test_acks_waiting_together_share_one_statement_with_exact_counts():
    table = FakeTable(set(range(10)))
    counts = run_concurrently(table.combiner(), table, [[0, 1], [2, 3, 4], [5], [6, 7]])
    assert counts == [2, 3, 1, 2]
    assert table.statements == [[0, 1], [2, 3, 4, 5, 6, 7]]


def test_ids_already_acked_or_named_twice_are_counted_once():
    table = FakeTable({0, 1, 2, 3})
    table.acked_at[3] = 99  # acked before, by DML
    counts = run_concurrently(table.combiner(), table, [[0], [1, 2], [2, 3, 42]])
    assert counts == [1, 2, 0]


def test_a_failed_statement_fails_every_caller_in_it():
    table = FakeTable({0, 1, 2})
    table.fail = Unavailable("database unavailable: (2013) lost")
    results = run_concurrently(table.combiner(), table, [[0], [1], [2]])
    assert all(isinstance(r, Unavailable) for r in results)
    assert len({id(r) for r in results}) == 3  # each caller raises its own exception


def test_a_lone_ack_is_one_statement():
    table = FakeTable({5})
    table.release.set()
    assert table.combiner().ack([5]) == 1
    assert table.statements == [[5]]


@pytest.mark.parametrize("n", [1, 7])
def test_many_threads_never_lose_or_double_an_ack(n: int):
    table = FakeTable(set(range(2000)))
    table.release.set()
    combiner = table.combiner()
    counts: list[int] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        for lo in range(k * 10, 2000, n * 10):
            c = combiner.ack(list(range(lo, lo + 10)))
            with lock:
                counts.append(c)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sum(counts) == 2000 and all(v is not None for v in table.acked_at.values())
