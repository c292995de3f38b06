"""msgtable.server.heap: the server's startup heap is frozen once, and what it allocates
afterwards is collected as before."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from msgtable.server import heap


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()


def test_settle_freezes_the_objects_alive_now_so_no_collection_scans_them_again():
    kept = Node()
    assert any(o is kept for o in gc.get_objects()), "a new object is not tracked"
    frozen = heap.settle()
    # a frozen object another thread lets go of leaves the permanent generation: the count
    # read after settle() returned may be lower (never higher: nothing froze since)
    assert 0 < gc.get_freeze_count() <= frozen
    assert not any(o is kept for o in gc.get_objects()), "an object alive then was not frozen"


def test_a_cycle_made_after_settle_is_still_collected():
    heap.settle()
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None, "a reference cycle made after settle() was not collected"
