"""Lifecycle + Instruments over the in-memory store: metrics move by exactly what happened."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from consumer.lifecycle import Lifecycle
from consumer.observability.instruments import Instruments
from fencing.memory.faults import Fault, FaultOutcome, Operation
from fencing.memory.store import MemoryFenceStore
from fencing.store import BatchCall
from fencing.types import ACCEPT, Reject, SourceCheck, SourceFacts, SourceRecord, TopicPartition

TP = TopicPartition("orders", 0)


async def _no_wait(_s: float) -> None:
    return None


async def handler(_conn: Any, records: Sequence[SourceRecord]) -> list[Any]:
    return [Reject("odd") if r.offset % 2 else ACCEPT for r in records]


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    return {m.name: list(m.data.data_points) for rm in data.resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics}


def _sum(points: list[Any], **attrs: Any) -> float:
    return sum(p.value for p in points
               if all(p.attributes.get(k) == v for k, v in attrs.items()))


async def test_batches_rejects_unknown_outcomes_and_retries() -> None:
    reader = InMemoryMetricReader()
    inst = Instruments(MeterProvider(metric_readers=[reader]).get_meter("t"))
    store = MemoryFenceStore("g")
    lc = Lifecycle(store=store, lifetime_id="lt-1", clock=lambda: 0.0, wait=_no_wait,
                   instruments=inst)
    store.begin_attempt("assign")
    await lc.assign([SourceCheck(TP, SourceFacts("id", 0, 10))])
    assert await lc.seek(TP) == 0
    recs = [SourceRecord("orders", 0, o, None, b"v") for o in range(4)]
    store.begin_attempt("b1", [Fault(Operation.PROCESS, 1, FaultOutcome.ABORT),
                               Fault(Operation.PROCESS, 2, FaultOutcome.UNKNOWN_COMMITTED)])
    assert (await lc.process(BatchCall(TP, recs[:2], handler))).frontier == 2
    store.begin_attempt("b2")
    assert (await lc.process(BatchCall(TP, recs[2:], handler))).frontier == 4
    points = _points(reader)
    assert _sum(points["fence.records.processed"], partition=0) == 4
    assert _sum(points["fence.records.rejected"], partition=0) == 2
    assert _sum(points["fence.batches"], outcome="committed") == 2
    assert _sum(points["fence.unknown_outcomes"], operation="process",
                resolution="committed") == 1
    assert _sum(points["fence.retries"], operation="process") == 1


async def test_a_fenced_batch_counts_a_fence_and_no_records() -> None:
    reader = InMemoryMetricReader()
    inst = Instruments(MeterProvider(metric_readers=[reader]).get_meter("t"))
    store = MemoryFenceStore("g")
    old = Lifecycle(store=store, lifetime_id="lt-old", clock=lambda: 0.0, wait=_no_wait,
                    instruments=inst)
    new = Lifecycle(store=store, lifetime_id="lt-new", clock=lambda: 0.0, wait=_no_wait)
    check = SourceCheck(TP, SourceFacts("id", 0, 10))
    await old.assign([check])
    await new.assign([check])  # epoch 2: the old lifetime's token is stale
    recs = [SourceRecord("orders", 0, 0, None, b"v")]
    try:
        await old.process(BatchCall(TP, recs, handler))
    except Exception as exc:
        assert type(exc).__name__ in ("Fenced", "Retired")
    else:
        raise AssertionError("a stale token committed")
    points = _points(reader)
    assert _sum(points["fence.fences"], partition=0) == 1
    assert _sum(points["fence.batches"], outcome="Fenced") == 1
    assert "fence.records.processed" not in points or \
        _sum(points["fence.records.processed"]) == 0
