"""Lifecycle over MemoryFenceStore with a logical clock: the lifecycle rules, one by one."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from consumer import Lifecycle, LifetimeState
from consumer.observability.otel_tracing import OtelTracing
from fencing.errors import ConfigError, Fenced, RetentionGap, Retired, TokenDropped
from fencing.memory.faults import Fault, FaultOutcome, InterleavePoint, Operation
from fencing.memory.store import MemoryFenceStore
from fencing.store import BatchCall, HandlerFn
from fencing.types import ACCEPT, SourceCheck, SourceFacts, SourceRecord, Token, TopicPartition

TP = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now_s

    async def wait(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now_s += seconds
        await asyncio.sleep(0)


def check(tp: TopicPartition = TP, low: int = 0, high: int = 10, topic_id: str = "id",
          ) -> SourceCheck:
    return SourceCheck(tp, SourceFacts(topic_id, low, high))


def recs(tp: TopicPartition, *offsets: int) -> list[SourceRecord]:
    return [SourceRecord(tp.topic, tp.partition, o, b"k", b"v") for o in offsets]


async def accept(conn: Any, records: Sequence[SourceRecord]) -> list[Any]:
    conn.table("effects").update({(r.partition, r.offset): r.value for r in records})
    return [ACCEPT] * len(records)


def make(store: MemoryFenceStore, clock: Clock, lifetime: str = "L1", **kw: Any) -> Lifecycle:
    return Lifecycle(store=store, lifetime_id=lifetime, clock=clock, wait=clock.wait, **kw)


def held_accept() -> tuple[HandlerFn, asyncio.Event, asyncio.Event]:
    """A handler that sets ``entered``, waits for ``release``, then accepts."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(conn: Any, records: Sequence[SourceRecord]) -> list[Any]:
        entered.set()
        await release.wait()
        return await accept(conn, records)

    return slow, entered, release


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> MemoryFenceStore:
    return MemoryFenceStore("g", clock=clock, wait=clock.wait)


async def test_assign_claims_once_for_all_partitions_and_seek_installs_no_epoch(
        store: MemoryFenceStore, clock: Clock) -> None:
    lc = make(store, clock)
    held = await lc.assign([check(TP, low=2), check(TP1, low=0)])
    assert held == {TP: Token(1, 2), TP1: Token(1, 0)} and lc.token(TP) == Token(1, 2)
    # the failure marks are read once for the set, after the claim
    assert [e.operation for e in store.events] == ["validate", "claim", "attempts"]
    assert await lc.seek(TP) == 2
    assert store.token_of(TP) == Token(1, 2)  # no new epoch
    assert [j.event for j in store.journal_rows] == ["claim", "claim"]


async def test_auto_offset_reset_latest_and_invalid(store: MemoryFenceStore, clock: Clock
                                                    ) -> None:
    lc = make(store, clock, auto_offset_reset="latest")
    assert (await lc.assign([check(low=2, high=8)]))[TP] == Token(1, 8)
    with pytest.raises(ConfigError):
        make(store, clock, auto_offset_reset="nope")


async def test_process_advances_and_drops_already_durable_records(
        store: MemoryFenceStore, clock: Clock) -> None:
    lc = make(store, clock)
    await lc.assign([check()])
    assert await lc.process(BatchCall(TP, recs(TP, 0, 1, 4), accept)) == Token(1, 5)
    events = len(store.events)
    assert await lc.process(BatchCall(TP, recs(TP, 3, 4),
                                      accept)) == Token(1, 5)  # nothing new: no I/O
    assert len(store.events) == events
    assert await lc.process(BatchCall(TP, recs(TP, 4, 6), accept)) == Token(1, 7)
    with pytest.raises(ValueError):
        await lc.process(BatchCall(TP, recs(TP1, 7), accept))
    assert lc.state is LifetimeState.LIVE


async def test_refused_source_retires_before_raising(store: MemoryFenceStore, clock: Clock
                                                     ) -> None:
    old = make(store, clock, "L0")
    await old.assign([check()])
    lc = make(store, clock)
    with pytest.raises(RetentionGap):
        await lc.assign([check(low=5)])
    assert lc.state is LifetimeState.RETIRED and "RetentionGap" in (lc.retired_reason or "")
    events = len(store.events)
    for call in (lc.seek(TP), lc.assign([check()]), lc.process(BatchCall(TP, recs(TP, 0), accept)),
                 lc.revoke([TP])):
        with pytest.raises(Retired):
            await call
    assert len(store.events) == events  # rejected without I/O


async def test_allow_retention_gap_skips_under_the_new_token_and_journals(
        store: MemoryFenceStore, clock: Clock) -> None:
    await make(store, clock, "L0").assign([check()])
    lc = make(store, clock, allow_retention_gap=True)
    assert (await lc.assign([check(low=5)]))[TP] == Token(2, 5)
    assert store.token_of(TP) == Token(2, 5)
    assert [(j.event, j.lifetime) for j in store.journal_rows][-1] == ("gap-skip", "L1")


async def test_seek_after_a_newer_claim_is_fenced_and_retires(
        store: MemoryFenceStore, clock: Clock) -> None:
    lc = make(store, clock)
    await lc.assign([check()])
    await make(store, clock, "L2").assign([check()])
    with pytest.raises(Fenced):
        await lc.seek(TP)
    assert lc.state is LifetimeState.RETIRED and lc.token(TP) is None
    assert store.writes[-1].kind == "journal" and store.journal_rows[-1].event == "retire"


async def test_late_seek_and_process_after_revoke_or_lost_are_fenced_without_io(
        store: MemoryFenceStore, clock: Clock) -> None:
    lc = make(store, clock)
    await lc.assign([check(TP), check(TP1)])
    await lc.revoke([TP])
    lc.lost([TP1])
    events = len(store.events)
    for call in (lc.seek(TP), lc.process(BatchCall(TP, recs(TP, 0), accept)), lc.seek(TP1)):
        with pytest.raises(Fenced):
            await call
    assert len(store.events) == events and lc.state is LifetimeState.LIVE
    assert [(j.event, j.epoch) for j in store.journal_rows][-1] == ("release", 1)


async def test_stop_is_final_and_does_no_io(store: MemoryFenceStore, clock: Clock) -> None:
    lc = make(store, clock)
    await lc.assign([check()])
    writes = len(store.writes)
    lc.stop()
    lc.stop()
    assert lc.state is LifetimeState.STOPPED and lc.retired_reason == "stopped"
    assert lc.token(TP) is None
    with pytest.raises(Retired):
        await lc.process(BatchCall(TP, recs(TP, 0), accept))
    with pytest.raises(Retired):
        lc.lost([TP])
    assert len(store.writes) == writes


async def test_budget_exhaustion_retires_without_journal(store: MemoryFenceStore, clock: Clock
                                                         ) -> None:
    lc = make(store, clock, budget_s=0.25)
    await lc.assign([check()])
    store.begin_attempt("p", [Fault(Operation.PROCESS, n, FaultOutcome.ABORT) for n in (1, 2)])
    with pytest.raises(Retired) as info:
        await lc.process(BatchCall(TP, recs(TP, 0), accept))
    assert "BudgetExceeded" in repr(info.value.__cause__)
    assert clock.waits == [0.1, 0.2]
    assert [e.call for e in store.events if e.operation == "process"] == [1, 2]
    assert store.writes[-1].kind == "claim"  # no retire journal: the store looked unresponsive


async def test_budget_starts_before_waiting_for_the_mutex(store: MemoryFenceStore, clock: Clock
                                                          ) -> None:
    lc = make(store, clock)
    await lc.assign([check(TP), check(TP1)])
    gate = asyncio.Event()

    async def hook(point: InterleavePoint) -> None:
        if point.operation is Operation.OBSERVE:
            await gate.wait()

    store.interleave_hook = hook
    seek = asyncio.ensure_future(lc.seek(TP))  # holds the mutex, blocked in observe
    await asyncio.sleep(0.01)
    late = asyncio.ensure_future(lc.seek(TP1))  # budget starts now, at t = 0
    await asyncio.sleep(0.01)
    clock.now_s = 25.0  # the mutex wait took 25 s of the 20 s budget
    gate.set()
    assert await seek == 0
    with pytest.raises(Retired) as info:
        await late
    assert "BudgetExceeded" in repr(info.value.__cause__)
    assert [e.operation for e in store.events].count("observe") == 1


async def test_partitions_proceed_concurrently_and_revoke_waits_for_in_flight_work(
        store: MemoryFenceStore, clock: Clock) -> None:
    lc = make(store, clock)
    await lc.assign([check(TP), check(TP1)])
    slow, entered, release = held_accept()

    p0 = asyncio.ensure_future(lc.process(BatchCall(TP, recs(TP, 0, 1), slow)))
    await entered.wait()
    assert await lc.process(BatchCall(TP1, recs(TP1, 0),
                                      accept)) == Token(1, 1)  # not blocked by TP
    revoke = asyncio.ensure_future(lc.revoke([TP]))
    await asyncio.sleep(0.01)
    assert not revoke.done() and lc.token(TP) == Token(1, 0)
    release.set()
    assert await p0 == Token(1, 2)
    await revoke
    assert lc.token(TP) is None and store.token_of(TP) == Token(1, 2)


async def test_lost_during_in_flight_process_never_reinstalls_the_token(
        store: MemoryFenceStore, clock: Clock) -> None:
    lc = make(store, clock)
    await lc.assign([check()])
    slow, entered, release = held_accept()

    p0 = asyncio.ensure_future(lc.process(BatchCall(TP, recs(TP, 0), slow)))
    await entered.wait()
    lc.lost([TP])
    release.set()
    assert await p0 == Token(1, 1)
    assert lc.token(TP) is None


async def test_a_process_queued_behind_the_guard_when_lost_is_token_dropped_without_io(
        store: MemoryFenceStore, clock: Clock) -> None:
    """The batch behind the in-flight one never runs: ``TokenDropped`` (a ``Fenced`` that
    says nothing was sent), the lifetime stays live (the worker drops the batch)."""
    lc = make(store, clock)
    await lc.assign([check()])
    slow, entered, release = held_accept()
    p0 = asyncio.ensure_future(lc.process(BatchCall(TP, recs(TP, 0), slow)))
    await entered.wait()
    p1 = asyncio.ensure_future(lc.process(BatchCall(TP, recs(TP, 1),
                                                    accept)))  # waits for the guard
    await asyncio.sleep(0.01)
    lc.lost([TP])
    release.set()
    assert await p0 == Token(1, 1)
    writes = len(store.writes)
    with pytest.raises(TokenDropped, match="token dropped while waiting for the guard"):
        await p1
    assert len(store.writes) == writes and lc.state is LifetimeState.LIVE


async def test_failure_retires_before_the_mutex_is_released(store: MemoryFenceStore,
                                                             clock: Clock) -> None:
    lc = make(store, clock)
    await lc.assign([check(TP)])
    await make(store, clock, "L2").assign([check(TP)])  # lc is now a zombie on TP
    gate = asyncio.Event()

    async def hook(point: InterleavePoint) -> None:
        if point.operation is Operation.OBSERVE:
            await gate.wait()

    store.interleave_hook = hook
    seek = asyncio.ensure_future(lc.seek(TP))
    await asyncio.sleep(0.01)
    queued = asyncio.ensure_future(lc.assign([check(TP1)]))  # waits for the mutex
    await asyncio.sleep(0.01)
    gate.set()
    with pytest.raises(Fenced):
        await seek
    with pytest.raises(Retired):
        await queued
    assert store.token_of(TP1) is None  # the queued assign did no I/O
    # the queued assign made no call: the seek's observe, then only lc's retire journal row
    assert [e.operation for e in store.events][-2:] == ["observe", "journal"]
    assert store.journal_rows[-1].event == "retire"


async def test_spans_carry_messaging_and_fence_attributes(
        store: MemoryFenceStore, clock: Clock) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    lc = make(store, clock, tracing=OtelTracing(provider.get_tracer("fenceworker")))
    await lc.assign([check()])
    await lc.seek(TP)
    await lc.process(BatchCall(TP, recs(TP, 0, 3), accept))
    await lc.revoke([TP])
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"fence.assign", "fence.validate", "fence.claim", "fence.seek",
                          "fence.observe", "fence.process", "fence.revoke"}
    proc = spans["fence.process"].attributes
    assert proc is not None
    assert dict(proc) | {} == {
        "messaging.system": "kafka", "messaging.consumer.group.name": "g",
        "fence.lifetime": "L1", "messaging.destination.name": "t",
        "messaging.destination.partition.id": "0", "messaging.kafka.offset": 0,
        "fence.first_offset": 0, "fence.last_offset": 3, "fence.epoch": 1,
        "fence.frontier": 4, "messaging.batch.message_count": 2, "fence.outcome": "ok",
        "messaging.operation.name": "process", "messaging.operation.type": "process"}
    assert spans["fence.assign"].attributes["fence.epoch"] == 1  # type: ignore[index]
    assert spans["fence.claim"].parent.span_id == (  # type: ignore[union-attr]
        spans["fence.assign"].context.span_id)


async def test_seek_and_assign_wait_for_in_flight_work_instead_of_self_fencing(
        store: MemoryFenceStore, clock: Clock) -> None:
    lc = make(store, clock)
    await lc.assign([check()])
    slow, entered, release = held_accept()

    p0 = asyncio.ensure_future(lc.process(BatchCall(TP, recs(TP, 0, 1), slow)))
    await entered.wait()
    seek = asyncio.ensure_future(lc.seek(TP))
    await asyncio.sleep(0.01)
    assert not seek.done()
    release.set()
    assert await p0 == Token(1, 2)
    assert await seek == 2 and lc.state is LifetimeState.LIVE
    entered.clear()
    release.clear()
    p1 = asyncio.ensure_future(lc.process(BatchCall(TP, recs(TP, 2), slow)))
    await entered.wait()
    again = asyncio.ensure_future(lc.assign([check()]))
    await asyncio.sleep(0.01)
    release.set()
    assert await p1 == Token(1, 3)  # not fenced by its own re-claim
    assert (await again)[TP] == Token(2, 3)


async def test_retirement_is_a_write_barrier_for_other_partitions(
        store: MemoryFenceStore, clock: Clock) -> None:
    """Item 10 of the liveness issue: TP1's handler is still running when TP is fenced and
    the lifetime retires; TP1's batch then rolls back instead of committing, and the retire
    journal row is written only after it settled (the lifetime's last write)."""
    lc = make(store, clock)
    await lc.assign([check(TP), check(TP1)])
    slow, entered, release = held_accept()
    p1 = asyncio.ensure_future(lc.process(BatchCall(TP1, recs(TP1, 0, 1), slow)))
    await entered.wait()
    await make(store, clock, "L2").assign([check(TP)])  # a newer owner of TP
    p0 = asyncio.ensure_future(lc.process(BatchCall(TP, recs(TP, 0), accept)))
    await asyncio.sleep(0.01)
    assert not p0.done()  # the retirement waits for TP1's batch before journaling
    assert lc.state is LifetimeState.RETIRING  # the gate is closed; the journal row pending
    with pytest.raises(Retired):
        await lc.process(BatchCall(TP1, recs(TP1, 2), accept))  # no new call starts while retiring
    release.set()
    with pytest.raises(Fenced):
        await p0
    with pytest.raises(Retired):
        await p1
    assert lc.state is LifetimeState.RETIRED and "Fenced" in (lc.retired_reason or "")
    assert store.token_of(TP1) == Token(1, 0)  # rolled back: nothing of TP1 committed
    assert (TP1.partition, 0) not in store.tables().get("effects", {})
    mine = [w for w in store.writes if w.lifetime == "L1"]
    assert mine[-1].kind == "journal"  # the retire row is the lifetime's last write
    assert [j.event for j in store.journal_rows if j.lifetime == "L1"][-1] == "retire"
