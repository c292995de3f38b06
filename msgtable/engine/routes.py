"""Which due rows each filtered stream of a table may take: the rows by the set of the
connected streams' filters that pass them.

A stream with a filter (MessageStream.filter) takes only the rows its filter passes. Looking
for them among the due rows in the queue's order at each send, as far as a few batches, finds
none when more than that many rows it refuses come first: rows no stream passes (a NULL in
the filtered column passes neither ``X`` nor ``NOT (X)``) stay at the head of the queue, and
once they are a few batches long every stream behind them starves (issue 39). Here each due
row is tested once by each connected filter as it is queued (and by a new filter when a
stream subscribes), and kept in the heap of its **class**, the set of filters that pass it,
in the queue's order. A stream with a filter pops from the classes that include its filter
only, best first: it never looks at a row it would refuse, and a row some connected filter
passes goes to a stream of that filter with room, whatever waits before it.

Rows no connected filter passes (the empty class) wait: a stream without a filter (which
takes every row, from the table's one queue) may take them, or a stream that subscribes
later with a filter that passes them.

Only a table with a filtered stream connected has routes: the others queue and pop as
before and pay nothing. Heap entries are the queue's own (shared, never copied); an entry
whose row left the queue (sent, acked, re-keyed) is stale here as there, and is skipped, and
compacted away with the queue's. Not thread-safe: the table's manager guards it with its lock.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable

from msgtable.core.rows import CachedRow, Values

Accepts = Callable[[Values], bool]
Entry = tuple[int, int, int, CachedRow]  # (priority, time_next, seq, row): msgtable.engine.due's
Class = frozenset[Accepts]
NOBODY: Class = frozenset()


class Routes:
    """The classes of the due rows of one table by the filters that pass them (see the module
    docstring). ``queued`` is the queue's map of id to the live row (msgtable.engine.due)."""

    def __init__(self, queued: dict[Hashable, CachedRow]) -> None:
        self._queued = queued
        self._filters: dict[Accepts, int] = {}  # each connected filter, by how many streams
        self._classes: dict[Class, list[Entry]] = {}
        self._nobody: set[Hashable] = set()  # queued ids no connected filter passes

    @property
    def active(self) -> bool:
        return bool(self._filters)

    @property
    def stranded(self) -> int:
        """How many queued rows no connected filter passes."""
        return len(self._nobody)

    def connect(self, accepts: Accepts, entries: Iterable[Entry]) -> None:
        """A stream with filter ``accepts`` subscribed; ``entries``: the queue's due entries,
        classified when this is the first filter (the queue had no routes till now)."""
        if accepts in self._filters:
            self._filters[accepts] += 1
            return
        if not self._filters:
            self._classes = {NOBODY: [e for e in entries if self._live(e)]}
            self._nobody = {e[3].id for e in self._classes[NOBODY]}
        self._filters[accepts] = 1
        split: dict[Class, list[Entry]] = {}
        for cls, heap in self._classes.items():
            passed = cls | {accepts}
            for e in heap:
                if self._live(e):
                    split.setdefault(passed if accepts(e[3].values) else cls, []).append(e)
        for heap in split.values():
            heapq.heapify(heap)
        self._nobody.difference_update(e[3].id for e in split.get(frozenset({accepts}), ()))
        self._classes = split

    def disconnect(self, accepts: Accepts) -> None:
        """A stream with filter ``accepts`` left: its rows no other filter passes wait."""
        left = self._filters.get(accepts, 0) - 1
        if left > 0:
            self._filters[accepts] = left
            return
        self._filters.pop(accepts, None)
        if not self._filters:
            self._classes, self._nobody = {}, set()
            return
        merged: dict[Class, list[Entry]] = {}
        for cls, heap in self._classes.items():
            merged.setdefault(cls - {accepts}, []).extend(e for e in heap if self._live(e))
        for heap in merged.values():
            heapq.heapify(heap)
        self._nobody.update(e[3].id for e in merged.get(NOBODY, ()))
        self._classes = merged

    def push(self, entry: Entry) -> None:
        """A row is due (queued, or come due): into the heap of the filters that pass it."""
        values = entry[3].values
        cls = frozenset([a for a in self._filters if a(values)])
        heapq.heappush(self._classes.setdefault(cls, []), entry)
        if not cls:
            self._nobody.add(entry[3].id)

    def pop(self, accepts: Accepts, n: int) -> list[CachedRow]:
        """Up to ``n`` of the best due rows ``accepts`` passes, taken out of the queue's map
        (the caller marks them as sending)."""
        heaps = [h for cls, h in self._classes.items() if accepts in cls]
        out: list[CachedRow] = []
        queued = self._queued
        while len(out) < n:
            best: list[Entry] | None = None
            for h in heaps:
                while h and queued.get(h[0][3].id) is not h[0][3]:
                    heapq.heappop(h)  # stale: sent, acked or re-keyed meanwhile
                if h and (best is None or h[0] < best[0]):
                    best = h
            if best is None:
                break
            row = heapq.heappop(best)[3]
            del queued[row.id]
            out.append(row)
        return out

    def left(self, ids: Iterable[Hashable]) -> None:
        """These ids left the queue (popped, acked, deleted)."""
        if self._nobody:
            self._nobody.difference_update(ids)

    def clear(self) -> None:
        """The queue was emptied (the filters stay connected)."""
        self._classes = {}
        self._nobody = set()

    def entries(self) -> int:
        return sum(len(h) for h in self._classes.values())

    def compact(self) -> None:
        """Drop the stale entries (the queue's compaction)."""
        self._classes = {
            cls: live
            for cls, heap in self._classes.items()
            if (live := [e for e in heap if self._live(e)])
        }
        for heap in self._classes.values():
            heapq.heapify(heap)

    def _live(self, e: Entry) -> bool:
        return self._queued.get(e[3].id) is e[3]
