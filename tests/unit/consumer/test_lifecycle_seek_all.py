"""``seek_all``: an assignment of any size is positioned with one read of the store."""

from __future__ import annotations

import pytest

from consumer import LifetimeState
from fencing.errors import Fenced
from fencing.memory.store import MemoryFenceStore
from fencing.types import Token, TopicPartition
from tests.unit.consumer.test_lifecycle import Clock, check, make

TPS = [TopicPartition("t", p) for p in range(64)]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> MemoryFenceStore:
    return MemoryFenceStore("g", clock=clock, wait=clock.wait)


async def test_sixty_four_partitions_are_positioned_with_one_observe(
        store: MemoryFenceStore, clock: Clock) -> None:
    lc = make(store, clock)
    await lc.assign([check(tp, low=tp.partition) for tp in TPS])
    before = len(store.events)
    assert await lc.seek_all(TPS) == {tp: tp.partition for tp in TPS}
    assert [e.operation for e in store.events[before:]] == ["observe"]
    assert all(store.token_of(tp) == Token(1, tp.partition) for tp in TPS)  # no new epoch


async def test_one_partition_claimed_by_someone_else_fences_the_whole_seek(
        store: MemoryFenceStore, clock: Clock) -> None:
    lc = make(store, clock)
    await lc.assign([check(tp) for tp in TPS[:4]])
    await make(store, clock, lifetime="L2").assign([check(TPS[2])])  # a newer epoch of t[2]
    with pytest.raises(Fenced, match=r"t\[2\]"):
        await lc.seek_all(TPS[:4])
    assert lc.state is LifetimeState.RETIRED and lc.token(TPS[0]) is None
    assert store.journal_rows[-1].event == "retire"
