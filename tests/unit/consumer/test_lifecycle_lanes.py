"""Lanes in the lifecycle over MemoryFenceStore: side-by-side lane transactions under the
partition's epoch, revoke waiting for them, lost COMMIT replies resolved from the
completion set, folds, and a successor resuming from the set."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from consumer import LifetimeState
from consumer.observability.otel_tracing import OtelTracing
from fencing.errors import Fenced
from fencing.memory.faults import Fault, FaultOutcome, Operation
from fencing.memory.store import MemoryFenceStore
from fencing.store import BatchCall
from fencing.types import SourceRecord, Token
from tests.unit.consumer.test_lifecycle import TP, Clock, accept, check, held_accept, make, recs


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> MemoryFenceStore:
    return MemoryFenceStore("g", clock=clock, wait=clock.wait)


def effects(store: MemoryFenceStore) -> list[int]:
    return sorted(o for _, o in store.tables().get("effects", {}))


async def test_lanes_run_side_by_side_and_revoke_waits_for_them(store: MemoryFenceStore,
                                                               clock: Clock) -> None:
    lc = make(store, clock)
    await lc.assign([check(TP)])
    first = lc.completion(TP)
    assert first is not None and (first.base, first.spans, first.frontier) == (0, (), 0)
    slow, entered, release = held_accept()
    lane_a = asyncio.create_task(lc.process_lane(BatchCall(TP, recs(TP, 0, 2), slow),
                                                 [(0, 0), (2, 2)]))
    await entered.wait()
    await lc.process_lane(BatchCall(TP, recs(TP, 1), accept), [(1, 1)])  # beside lane A
    assert effects(store) == [1]
    revoke = asyncio.create_task(lc.revoke([TP]))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not revoke.done()  # lane A is still in flight
    release.set()
    await lane_a
    await revoke
    assert effects(store) == [0, 1, 2] and lc.token(TP) is None
    successor = make(store, clock, "L2")
    await successor.assign([check(TP)])
    got = successor.completion(TP)
    assert got is not None and got.frontier == 3 and got.epoch == 2


@pytest.mark.parametrize(("outcome", "calls"), [
    (FaultOutcome.UNKNOWN_COMMITTED, 1), (FaultOutcome.UNKNOWN_ABORTED, 2),
    (FaultOutcome.ABORT, 1)])  # refused before the handler ran, then retried
async def test_a_lost_lane_commit_reply_is_resolved_from_the_completion_set(
        store: MemoryFenceStore, clock: Clock, outcome: FaultOutcome, calls: int) -> None:
    lc = make(store, clock)
    await lc.assign([check(TP)])
    ran: list[int] = []

    async def counting(conn: Any, records: Sequence[SourceRecord]) -> list[Any]:
        ran.append(records[0].offset)
        return await accept(conn, records)

    store.begin_attempt("lost", [Fault(Operation.LANE, 1, outcome)])
    await lc.process_lane(BatchCall(TP, recs(TP, 3, 5), counting), [(0, 3), (4, 5)])
    assert len(ran) == calls and effects(store) == [3, 5]
    assert [e.applied for e in store.events if e.operation == "lane"].count(True) == 1
    assert lc.state is LifetimeState.LIVE


async def test_a_lane_of_a_fenced_lifetime_applies_nothing_and_retires(
        store: MemoryFenceStore, clock: Clock) -> None:
    lc = make(store, clock)
    await lc.assign([check(TP)])
    await make(store, clock, "L2").assign([check(TP)])
    with pytest.raises(Fenced):
        await lc.process_lane(BatchCall(TP, recs(TP, 0), accept), [(0, 0)])
    assert effects(store) == [] and lc.state is LifetimeState.RETIRED


async def test_fold_moves_the_frontier_and_a_successor_resumes_past_it(
        store: MemoryFenceStore, clock: Clock) -> None:
    lc = make(store, clock)
    await lc.assign([check(TP)])
    await lc.process_lane(BatchCall(TP, recs(TP, 0, 1), accept), [(0, 0), (1, 1)])
    await lc.process_lane(BatchCall(TP, recs(TP, 4), accept), [(3, 4)])
    assert await lc.fold(TP, to_frontier=2) == Token(1, 2) and lc.token(TP) == Token(1, 2)
    assert store.token_of(TP) == Token(1, 2)
    successor = make(store, clock, "L2")
    await successor.assign([check(TP)])
    got = successor.completion(TP)
    assert got is not None and (got.base, got.spans, got.frontier) == (2, ((3, 4),), 2)
    assert [o for o in range(6) if got.done(o)] == [0, 1, 3, 4]
    with pytest.raises(ValueError):  # below the frontier: the caller's bug, no I/O
        await successor.process_lane(BatchCall(TP, recs(TP, 1), accept), [(1, 1)])


async def test_each_lane_batch_is_a_process_span_of_its_own(store: MemoryFenceStore,
                                                            clock: Clock) -> None:
    """Two lanes' batches of one partition: two ``fence.process`` spans, each with its own
    offsets, the epoch and ``fence.lane``; the row's frontier (no fold yet) is not moved."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    lc = make(store, clock, tracing=OtelTracing(provider.get_tracer("fenceworker")))
    await lc.assign([check(TP)])
    await lc.process_lane(BatchCall(TP, recs(TP, 0, 2), accept), [(0, 0), (1, 2)])
    await lc.process_lane(BatchCall(TP, recs(TP, 1), accept), [(1, 1)])
    lanes = [dict(s.attributes or {}) for s in exporter.get_finished_spans()
             if s.name == "fence.process"]
    assert [(a["fence.first_offset"], a["fence.last_offset"], a["fence.lane"],
             a["fence.epoch"]) for a in lanes] == [(0, 2, True, 1), (1, 1, True, 1)]
    assert store.token_of(TP) == Token(1, 0)
