"""Stall detection: the pure tracker and its effect on readiness (no services)."""

from __future__ import annotations

from consumer.observability.readiness import (
    ChecksPassed,
    Phase,
    Positioned,
    ReadinessState,
    Retired,
    Revoked,
    StallChanged,
    step,
)
from consumer.observability.stall import PartitionSample, StallTracker
from fencing.types import TopicPartition

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


def test_lag_without_progress_for_the_timeout_is_a_stall() -> None:
    tr = StallTracker(timeout_s=30)
    assert tr.update(100, {TP0: PartitionSample(lag=5, progress_s=50)}) == frozenset()
    assert tr.update(129, {TP0: PartitionSample(lag=5, progress_s=50)}) == frozenset()
    assert tr.update(130, {TP0: PartitionSample(lag=5, progress_s=50)}) == {TP0}
    assert tr.idle_s(130, TP0, 50) == 30


def test_progress_or_no_lag_ends_the_stall() -> None:
    tr = StallTracker(timeout_s=10)
    tr.update(0, {TP0: PartitionSample(5, 0), TP1: PartitionSample(5, 0)})
    assert tr.update(10, {TP0: PartitionSample(5, 0), TP1: PartitionSample(5, 0)}) == {TP0, TP1}
    assert tr.update(11, {TP0: PartitionSample(5, 10.5), TP1: PartitionSample(0, 0)}) == set()
    # lag seen again on TP1: its clock starts afresh, not at its old progress
    assert tr.update(12, {TP0: PartitionSample(5, 10.5), TP1: PartitionSample(3, 0)}) == set()
    assert tr.update(22, {TP0: PartitionSample(5, 10.5), TP1: PartitionSample(3, 0)}) == {TP0, TP1}


def test_partition_idle_at_its_end_is_not_stalled_when_records_arrive() -> None:
    tr = StallTracker(timeout_s=30)
    assert tr.update(1000, {TP0: PartitionSample(lag=0, progress_s=0)}) == set()
    assert tr.update(1005, {TP0: PartitionSample(lag=7, progress_s=0)}) == set()
    assert tr.update(1034, {TP0: PartitionSample(lag=7, progress_s=0)}) == set()
    assert tr.update(1035, {TP0: PartitionSample(lag=7, progress_s=0)}) == {TP0}


def test_unowned_partitions_are_forgotten() -> None:
    tr = StallTracker(timeout_s=1)
    tr.update(0, {TP0: PartitionSample(5, 0)})
    assert tr.update(5, {}) == set()
    assert tr.update(5.5, {TP0: PartitionSample(5, 0)}) == set()  # clock restarted at 5.5


def _ready(*tps: TopicPartition) -> ReadinessState:
    state = step(ReadinessState(), ChecksPassed())
    return step(state, Positioned(frozenset(tps)))


def test_a_stalled_partition_makes_the_worker_unready_naming_it() -> None:
    state = step(_ready(TP0, TP1), StallChanged(frozenset({TP1})))
    assert state.phase is Phase.READY and not state.ready
    body = state.as_dict()
    assert body["stalled"] == ["t[1]"] and "t[1]" in str(body["reason"])
    assert step(state, StallChanged(frozenset())).ready


def test_stalled_set_stays_within_the_assignment() -> None:
    state = step(_ready(TP0), StallChanged(frozenset({TP0, TP1})))
    assert state.stalled == {TP0}
    state = step(state, Revoked(frozenset({TP0}), settled=True))
    assert state.stalled == frozenset() and state.ready
    retired = step(step(_ready(TP0), StallChanged(frozenset({TP0}))), Retired("x"))
    assert retired.stalled == frozenset()
    assert step(retired, StallChanged(frozenset({TP0}))) == retired
