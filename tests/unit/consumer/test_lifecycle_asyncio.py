"""Real asyncio concurrency, bounded: stop() while the lifecycle mutex protects a claim (or a
seek) blocked in store I/O. stop returns at once; the blocked call finishes or is cancelled;
no later call writes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from consumer import Lifecycle, LifetimeState
from fencing.errors import Retired
from fencing.memory.faults import InterleavePoint, Operation
from fencing.memory.store import MemoryFenceStore
from fencing.store import BatchCall
from fencing.types import SourceCheck, SourceFacts, SourceRecord, TopicPartition, Verdict

TP = TopicPartition("t", 0)
CHECK = SourceCheck(TP, SourceFacts("id", 0, 10))
BOUND_S = 2.0


def blocking_store(op: Operation, at: str) -> tuple[MemoryFenceStore, asyncio.Event,
                                                    asyncio.Event]:
    store = MemoryFenceStore("g")
    entered, release = asyncio.Event(), asyncio.Event()

    async def hook(point: InterleavePoint) -> None:
        if point.operation is op and point.at == at and not entered.is_set():
            entered.set()
            await release.wait()  # blocked I/O

    store.interleave_hook = hook
    return store, entered, release


def lifecycle(store: MemoryFenceStore) -> Lifecycle:
    loop = asyncio.get_running_loop()
    return Lifecycle(store=store, lifetime_id="L1", clock=loop.time, wait=asyncio.sleep)


async def _no_later_writes(lc: Lifecycle, store: MemoryFenceStore, release: asyncio.Event
                           ) -> None:
    writes = list(store.writes)
    release.set()  # the blocked I/O could now continue if it were still running
    await asyncio.sleep(0.01)
    for call in (lc.assign([CHECK]), lc.seek(TP), lc.revoke([TP]),
                 lc.process(BatchCall(TP, [SourceRecord("t", 0, 0, b"k", b"v")], _never))):
        with pytest.raises(Retired):
            await asyncio.wait_for(call, BOUND_S)
    assert store.writes == writes


async def _never(conn: object, records: Sequence[SourceRecord]) -> list[Verdict]:
    raise AssertionError("a stopped lifetime ran the handler")


@pytest.mark.parametrize(("at", "claim_writes"), [("before", 0), ("after", 1)])
async def test_stop_while_the_mutex_protects_a_blocked_claim(at: str, claim_writes: int) -> None:
    store, entered, release = blocking_store(Operation.CLAIM, at)
    lc = lifecycle(store)
    assign = asyncio.ensure_future(lc.assign([CHECK]))
    await asyncio.wait_for(entered.wait(), BOUND_S)
    assert lc._mutex.locked()
    lc.stop()  # returns at once: no mutex, no I/O
    assert lc.state is LifetimeState.STOPPED
    with pytest.raises(Retired, match="stopped"):
        await asyncio.wait_for(assign, BOUND_S)
    assert not lc._mutex.locked()
    assert [w.kind for w in store.writes] == ["claim"] * claim_writes
    assert store.events[-1].observed == "cancelled"
    assert store.events[-1].applied is (claim_writes == 1)
    await _no_later_writes(lc, store, release)


async def test_stop_while_a_seek_is_blocked_in_observe() -> None:
    store, entered, release = blocking_store(Operation.OBSERVE, "before")
    lc = lifecycle(store)
    await lc.assign([CHECK])
    seek = asyncio.ensure_future(lc.seek(TP))
    await asyncio.wait_for(entered.wait(), BOUND_S)
    lc.stop()
    with pytest.raises(Retired):
        await asyncio.wait_for(seek, BOUND_S)
    assert [w.kind for w in store.writes] == ["claim"]
    await _no_later_writes(lc, store, release)


async def test_cancelling_the_caller_retires_the_lifetime() -> None:
    store, entered, release = blocking_store(Operation.CLAIM, "before")
    lc = lifecycle(store)
    assign = asyncio.ensure_future(lc.assign([CHECK]))
    await asyncio.wait_for(entered.wait(), BOUND_S)
    assign.cancel()
    with pytest.raises(asyncio.CancelledError):
        await assign
    assert lc.state is LifetimeState.RETIRED and store.writes == []
    await _no_later_writes(lc, store, release)


async def test_real_time_budget_bounds_blocked_io() -> None:
    store, _entered, release = blocking_store(Operation.CLAIM, "before")
    loop = asyncio.get_running_loop()
    lc = Lifecycle(store=store, lifetime_id="L1", clock=loop.time, wait=asyncio.sleep,
                   budget_s=0.05)
    with pytest.raises(Retired, match="budget"):
        await asyncio.wait_for(lc.assign([CHECK]), BOUND_S)
    assert lc.state is LifetimeState.RETIRED and store.writes == []
    await _no_later_writes(lc, store, release)


async def test_retire_settles_the_guards_it_saw_when_another_is_added_meanwhile() -> None:
    """The retire path waits for the other partitions' batches; a guard added by another
    call before that wait starts must not break it (it raised RuntimeError: the wait read
    the guards dict lazily)."""
    lc = lifecycle(MemoryFenceStore("g"))
    lc._guards[TP] = asyncio.Lock()
    settling = asyncio.ensure_future(lc._gate.settle_others(None))
    await asyncio.sleep(0)  # the wait is set up, not yet started
    lc._guards[TopicPartition("t", 1)] = asyncio.Lock()
    await asyncio.wait_for(settling, BOUND_S)
