"""consumer.observability.observer:
worker events drive readiness, member rows and rebalance metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from consumer import events as ev
from consumer.observability.heartbeat import MemberHeartbeat, MemberIdentity
from consumer.observability.instruments import Instruments
from consumer.observability.observer import WorkerObserver
from consumer.observability.readiness import LoopHeartbeat, Phase, ReadinessHolder
from fencing.types import SourceFacts, Token, TopicPartition
from tests.polling import until_async

A, B = TopicPartition("orders.v1", 0), TopicPartition("orders.v1", 1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Rows:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, dict[str, Any]]] = []

    async def heartbeat(self, *, lifetime: str, member_id: str | None, host: str, pid: int,
                        state: str, detail: Mapping[str, Any] | None = None) -> None:
        self.rows.append((lifetime, state, dict(detail or {})))


def _make(*, cooperative: bool = False
          ) -> tuple[WorkerObserver, Clock, Rows, InMemoryMetricReader]:
    clock, rows, reader = Clock(), Rows(), InMemoryMetricReader()
    inst = Instruments(MeterProvider(metric_readers=[reader]).get_meter("t"))

    def facts(tps: list[TopicPartition]) -> dict[TopicPartition, SourceFacts]:
        return {tp: SourceFacts("id", 0, 100) for tp in tps}

    async def observe(tps: Sequence[TopicPartition]) -> dict[TopicPartition, Token | None]:
        return {tp: Token(1, 60 + tp.partition) for tp in tps}

    obs = WorkerObserver(
        instruments=inst, readiness=ReadinessHolder(),
        loop_heartbeat=LoopHeartbeat(clock=clock, bound_s=5), clock=clock,
        heartbeat_factory=lambda lt: MemberHeartbeat(
            store=rows, identity=MemberIdentity(lt, "h", 1), clock=clock, min_gap_s=0),
        cooperative=cooperative, lag_facts=facts, observe=observe)
    return obs, clock, rows, reader


def test_events_keep_partitions_typed_and_log_in_the_searchable_format() -> None:
    """No round trip through strings: events carry ``TopicPartition``s; ``str`` is the log
    line operators and tests search for."""
    event = ev.Assigned((A, B))
    assert event.partitions == (A, B) and isinstance(event.partitions[0], TopicPartition)
    assert str(event) == f"assigned {{'partitions': ['{A}', '{B}']}}"
    assert str(ev.RebalanceBegan("lost", (A,))) == f"lost {{'partitions': ['{A}']}}"
    assert str(ev.LifetimeStarted("lt-1")) == "lifetime.start {'lifetime': 'lt-1'}"


async def test_event_sequence_of_one_eager_lifetime() -> None:
    obs, clock, rows, reader = _make()
    assert obs.readiness.state.phase is Phase.STARTING
    obs.on_event(ev.LifetimeStarted("lt-1"))
    assert obs.readiness.state.phase is Phase.WAITING
    obs.on_event(ev.RebalanceBegan("assign", (A, B)))
    assert not obs.readiness.state.ready
    clock.now += 0.25
    obs.on_event(ev.Assigned((A, B)))
    assert obs.readiness.state.ready
    await obs._sample_lag()
    assert obs.instruments.lag() == {A: 40, B: 39}
    assert obs.member is not None
    await obs.member.tick()
    obs.on_event(ev.RebalanceBegan("revoke", (A, B)))
    obs.on_event(ev.Revoked((A, B)))
    assert not obs.readiness.state.ready  # eager: an assign follows
    assert obs.instruments.lag() == {}
    obs.on_event(ev.RebalanceBegan("assign", (B,)))
    obs.on_event(ev.Assigned((B,)))
    assert obs.readiness.state.ready and obs.readiness.state.assigned == {B}
    assert not await obs.member.tick()  # same state as the last row, interval not passed
    obs.on_event(ev.StopRequested())
    obs.on_event(ev.LifetimeEnded("lt-1", 0))
    await obs.close()
    assert [(lt, st) for lt, st, _ in rows.rows] == [
        ("lt-1", "running"), ("lt-1", "stopped")]
    data = reader.get_metrics_data()
    assert data is not None
    names = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics
             for m in sm.metrics}
    (point,) = [p for p in names["fence.rebalance.duration"].data.data_points
                if p.attributes["kind"] == "assign" and p.count == 2]
    assert point.sum == 0.25
    assert not obs.loop_heartbeat.healthy()


async def test_failure_retires_and_a_fresh_lifetime_gets_its_own_row() -> None:
    obs, _clock, rows, _reader = _make(cooperative=True)
    obs.on_event(ev.LifetimeStarted("lt-1"))
    obs.on_event(ev.RebalanceBegan("assign", (A,)))
    obs.on_event(ev.Assigned((A,)))
    obs.on_event(ev.Failed("Fenced", 3))
    assert obs.readiness.state.phase is Phase.RETIRED
    obs.on_event(ev.Assigned((A,)))  # illegal now: ignored, not raised
    obs.on_event(ev.LifetimeEnded("lt-1", 3))
    obs.on_event(ev.LifetimeStarted("lt-2"))
    assert obs.readiness.state.phase is Phase.WAITING
    await obs.close()
    await asyncio.sleep(0)
    by_lt = {(lt, st) for lt, st, _ in rows.rows}
    assert ("lt-1", "retired") in by_lt and ("lt-2", "stopped") in by_lt
    retired = next(d for lt, st, d in rows.rows if st == "retired")
    assert "Fenced" in retired["reason"]


async def test_run_beats_until_closed() -> None:
    obs, clock, _rows, _reader = _make()
    obs._beat_s = 0.01
    beats: list[float] = []
    beat = obs.loop_heartbeat.beat

    def counting_beat() -> None:
        beats.append(clock.now)
        beat()

    obs.loop_heartbeat.beat = counting_beat  # type: ignore[method-assign]
    task = asyncio.create_task(obs.run())
    for _ in range(3):  # each beat keeps it healthy while the clock moves on
        seen = len(beats)
        clock.now += 100
        def beaten(seen: int = seen) -> bool:
            return len(beats) > seen

        await until_async(beaten, what="the next beat")
        assert obs.loop_heartbeat.healthy()
    await obs.close()
    await asyncio.wait_for(task, 1)
    after = len(beats)
    clock.now += 100
    await asyncio.sleep(0.05)
    assert len(beats) == after and not obs.loop_heartbeat.healthy()  # stopped: no more beats


def _gauges(reader: InMemoryMetricReader) -> tuple[int, dict[int, int], str]:
    data = reader.get_metrics_data()
    assert data is not None
    got: dict[str, list[Any]] = {m.name: list(m.data.data_points)
                                 for rm in data.resource_metrics
                                 for sm in rm.scope_metrics for m in sm.metrics}
    (ready,) = got["fence.worker.ready"]
    (phase,) = [p.attributes["phase"] for p in got["fence.worker.phase"] if p.value == 1]
    return int(ready.value), {p.attributes["partition"]: int(p.value)
                              for p in got.get("fence.partition.owned", [])}, phase


async def test_events_drive_the_ready_phase_and_ownership_gauges() -> None:
    obs, _clock, _rows, reader = _make(cooperative=True)
    assert _gauges(reader) == (0, {}, "starting")
    obs.on_event(ev.LifetimeStarted("lt-1"))
    assert _gauges(reader) == (0, {}, "waiting")
    obs.on_event(ev.RebalanceBegan("assign", (A, B)))
    assert _gauges(reader) == (0, {}, "rebalancing")
    obs.on_event(ev.Assigned((A, B)))
    assert _gauges(reader) == (1, {0: 1, 1: 1}, "ready")
    obs.on_event(ev.RebalanceBegan("revoke", (B,)))
    assert _gauges(reader) == (0, {0: 1, 1: 1}, "rebalancing")  # B still owned
    obs.on_event(ev.Revoked((B,)))
    assert _gauges(reader) == (1, {0: 1, 1: 0}, "ready")
    obs.on_event(ev.Failed("Fenced", 3))
    assert _gauges(reader) == (0, {0: 0, 1: 0}, "retired")
    await obs.close()
