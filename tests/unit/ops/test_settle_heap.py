"""``settle_heap``: what ``fencectl run`` does to the collector right before it consumes."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from ops.worker.startup import GC_YOUNG_THRESHOLD, settle_heap


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_gc")
def test_settle_heap_freezes_start_up_state_and_raises_only_the_young_threshold() -> None:
    _young, middle, old = gc.get_threshold()
    start_up_state = [{"config": i} for i in range(1000)]  # tracked containers
    garbage: list[object] = []
    garbage.append(garbage)  # a cycle: collected by the settle, never frozen
    del garbage
    settle_heap()
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, middle, old)
    assert gc.get_freeze_count() >= len(start_up_state)
    assert not any(g for g in gc.get_objects() if isinstance(g, list) and g and g[0] is g)


@pytest.mark.usefixtures("restored_gc")
def test_cycles_made_after_settling_are_still_collected() -> None:
    settle_heap(young_threshold=50)

    class Node:
        pass
    node = Node()
    node.me = node  # type: ignore[attr-defined]
    ref = weakref.ref(node)
    del node
    # net allocations past the young threshold trigger a collection
    kept: list[list[int]] = [[] for _ in range(100)]
    assert ref() is None
    assert len(kept) == 100
