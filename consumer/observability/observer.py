"""The worker's observability glue: worker events -> readiness, member heartbeats, metrics.

Long because one beat loop samples every live figure (lag, stalls, lanes, the offset
mirror) into the same three sinks (readiness, gauges, the member row), kept in one place.

Rules
- ``on_event(event)`` is the worker's ``on_event`` hook (typed events of
  ``consumer.events``, matched by type) and runs on the worker's loop. It never raises: an
  event the readiness machine refuses is logged and ignored.
- Event mapping: ``LifetimeStarted`` (startup checks passed, or a fresh lifetime after a
  retirement), ``RebalanceBegan`` (assign/revoke/lost), ``Assigned`` (positioned),
  ``Revoked`` (tokens cleared), ``Failed`` (the lifetime retires), ``StopRequested``,
  ``LifetimeEnded`` (final member row). Rebalance durations run from the beginning to
  ``Assigned``/``Revoked`` on the injected clock.
- ``run()`` is one background task: it beats the loop heartbeat every ``beat_s`` (a blocked
  loop stops the beats, so ``/healthz`` turns 503), writes member heartbeats when due and
  samples lag every ``lag_interval_s`` (Kafka high watermark minus the durable frontier).
- Each lifetime has its own member row; its final state is ``stopped`` after a clean end,
  ``retired`` after a failure.
- Stalls: at each lag sample, the owned partitions' lag and last progress (``progress``,
  the worker's fetch/commit times) go through
  ``consumer.observability.stall.StallTracker``; a change of the stalled set updates
  readiness (``/readyz`` names them), the ``fence.partitions.stalled`` gauge and the member
  row (``detail.stalled``, shown by ``fencectl status``), and each newly stalled partition
  is logged as a warning. Every event also sets the ``fence.partition.owned`` and
  ``fence.worker.ready``/``fence.worker.phase`` gauges from the readiness state. A
  partition running lanes reports its oldest busy lane's progress, so a lane holding its
  keys back stalls the partition (``consumer.lanes_run``).
- Lanes: every beat, the load of the partitions running lanes (``lanes``: busy lanes and
  the window used) goes to ``fence.lanes.busy``/``fence.lanes.window_used`` and, when the
  busy counts changed, to the member row (``detail.lanes_busy``).
- Offset mirror: every beat, the partitions whose Kafka committed offset has been behind
  the durable frontier for ``mirror_warn_s`` (``consumer.mirror.lagging``; ``mirror``, the
  worker's view) are logged as a warning once per episode (catching up is logged as info)
  and counted by the ``fence.partitions.mirror_lagging`` gauge.
- Spans: ``fence.shutdown`` runs from ``stopping`` to ``lifetime.end`` (exit code, what was
  still in flight past the bound); ``fence.retire`` marks a failure with its reason.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from opentelemetry import trace

from consumer import events as ev
from consumer.events import WorkerEvent
from consumer.mirror import MirrorState
from consumer.mirror import lagging as mirror_lagging
from consumer.observability.heartbeat import MemberHeartbeat, MemberState, state_for_phase
from consumer.observability.instruments import Instruments
from consumer.observability.otel_tracing import TRACER_NAME
from consumer.observability.readiness import (
    ChecksPassed,
    IllegalTransition,
    LoopHeartbeat,
    Phase,
    Positioned,
    ReadinessEvent,
    ReadinessHolder,
    RebalanceStarted,
    Restarted,
    Retired,
    StallChanged,
    Stopping,
)
from consumer.observability.readiness import (
    Revoked as ReadinessRevoked,
)
from consumer.observability.stall import PartitionSample, StallTracker
from fencing.types import SourceFacts, Token, TopicPartition

_tracer = trace.get_tracer(TRACER_NAME)

__all__ = ["WorkerObserver"]

log = logging.getLogger("fenceworker.observer")

LagFacts = Callable[[list[TopicPartition]], Mapping[TopicPartition, SourceFacts]]
Observe = Callable[[Sequence[TopicPartition]], Awaitable[Mapping[TopicPartition, Token | None]]]
Progress = Callable[[], Mapping[TopicPartition, float]]
Lanes = Callable[[], Mapping[TopicPartition, tuple[int, int]]]
Mirror = Callable[[], Mapping[TopicPartition, MirrorState]]


class WorkerObserver:
    """Owns readiness, the loop heartbeat, per-lifetime member heartbeats and lag sampling."""

    def __init__(
        self,
        *,
        instruments: Instruments,
        readiness: ReadinessHolder,
        loop_heartbeat: LoopHeartbeat,
        clock: Callable[[], float],
        heartbeat_factory: Callable[[str], MemberHeartbeat] | None = None,
        cooperative: bool = True,
        lag_facts: LagFacts | None = None,
        observe: Observe | None = None,
        beat_s: float = 1.0,
        lag_interval_s: float = 5.0,
        span_attrs: Mapping[str, str] | None = None,
        stall_timeout_s: float = 30.0,
        mirror_warn_s: float = 30.0,
    ) -> None:
        self.instruments = instruments
        self.readiness = readiness
        self.loop_heartbeat = loop_heartbeat
        self._clock = clock
        self._heartbeat_factory = heartbeat_factory
        self._cooperative = cooperative
        self._lag_facts = lag_facts
        self._observe = observe
        self._beat_s = beat_s
        self._lag_interval_s = lag_interval_s
        self._member: MemberHeartbeat | None = None
        self._final_writes: set[asyncio.Task[None]] = set()
        self._rebalance_started: dict[str, float] = {}
        self._last_lag_s: float | None = None
        self._span_attrs = dict(span_attrs or {})
        self._lifetime: str | None = None
        self._shutdown_span: trace.Span | None = None
        self._closed = asyncio.Event()
        self._wake = asyncio.Event()
        self._stalls = StallTracker(timeout_s=stall_timeout_s)
        self._lanes_busy: dict[str, int] = {}
        # the worker's last fetch/commit progress per owned partition (set once it exists)
        self.progress: Progress | None = None
        self.lanes: Lanes | None = None  # per partition running lanes: (busy, window used)
        # the worker's Kafka offset mirror per positioned partition (set once it exists)
        self.mirror: Mirror | None = None
        self._mirror_warn_s = mirror_warn_s
        self._mirror_lagging: frozenset[TopicPartition] = frozenset()

    # ---- events ------------------------------------------------------------------------------

    def on_event(self, event: WorkerEvent) -> None:
        try:
            self._on_event(event)
        except Exception:  # observability must never break the worker
            log.exception("observer: event %s", event)

    def _on_event(self, event: WorkerEvent) -> None:
        match event:
            case ev.LifetimeStarted(lifetime=lifetime):
                phase = self.readiness.state.phase
                self._apply(Restarted() if phase is Phase.RETIRED else ChecksPassed())
                self._lifetime = lifetime
                self._start_member(lifetime)
            case ev.RebalanceBegan(kind=kind, partitions=tps):
                self._rebalance_started[kind] = self._clock()
                self._apply(RebalanceStarted(kind))
                if kind == "lost":
                    self._rebalance_done("lost")
                    self._apply(ReadinessRevoked(frozenset(tps), settled=False))
                    self.instruments.clear_lag(tps)
            case ev.Assigned(partitions=tps):
                self._rebalance_done("assign")
                self._apply(Positioned(frozenset(tps)))
            case ev.Revoked(partitions=tps):
                self._rebalance_done("revoke")
                self._apply(ReadinessRevoked(frozenset(tps), settled=self._cooperative))
                self.instruments.clear_lag(tps)
            case ev.Failed(error=error, exit_code=exit_code):
                self.instruments.retired(reason=error)
                with _tracer.start_as_current_span("fence.retire", attributes=self._attrs(
                        **{"fence.outcome": error, "fence.exit_code": exit_code})):
                    pass
                self._apply(Retired(error))
                self.instruments.clear_lag()
            case ev.StopRequested():
                self._apply(Stopping())
                if self._shutdown_span is None:
                    self._shutdown_span = _tracer.start_span("fence.shutdown",
                                                             attributes=self._attrs())
            case ev.ShutdownTimedOut(in_flight=in_flight):
                if self._shutdown_span is not None:
                    self._shutdown_span.set_attribute("fence.in_flight",
                                                      [i.describe() for i in in_flight])
            case ev.LifetimeEnded(exit_code=exit_code):
                if self._shutdown_span is not None:
                    self._shutdown_span.set_attribute("fence.exit_code", exit_code)
                    self._shutdown_span.end()
                    self._shutdown_span = None
                self._end_member(failed=self.readiness.state.phase is Phase.RETIRED)
        self._sync_member_state()

    def _attrs(self, **extra: Any) -> dict[str, Any]:
        return {**self._span_attrs, "fence.lifetime": self._lifetime or "", **extra}

    def _apply(self, event: ReadinessEvent) -> None:
        try:
            self.readiness.apply(event)
        except IllegalTransition as exc:
            log.debug("readiness: %s", exc)

    def _rebalance_done(self, kind: str) -> None:
        started = self._rebalance_started.pop(kind, None)
        if started is not None:
            self.instruments.rebalance(kind=kind, duration_s=max(0.0, self._clock() - started))

    # ---- member rows -------------------------------------------------------------------------

    def _start_member(self, lifetime: str) -> None:
        if self._member is not None:
            self._end_member(failed=True)
        if self._heartbeat_factory is not None:
            self._member = self._heartbeat_factory(lifetime)

    def _end_member(self, *, failed: bool) -> None:
        member, self._member = self._member, None
        if member is None:
            return
        final = MemberState.RETIRED if failed else MemberState.STOPPED
        detail = {"reason": self.readiness.state.reason} if failed else {}
        task = asyncio.get_running_loop().create_task(member.close(final, **detail))
        self._final_writes.add(task)
        task.add_done_callback(self._final_writes.discard)

    def _sync_member_state(self) -> None:
        state = self.readiness.state
        self.instruments.set_stalled(state.stalled)
        self.instruments.set_owned(state.assigned)
        self.instruments.set_readiness(ready=state.ready, phase=state.phase)
        if self._member is not None:
            self._member.set_state(state_for_phase(state.phase),
                                   partitions=sorted(str(tp) for tp in state.assigned),
                                   stalled=sorted(str(tp) for tp in state.stalled),
                                   lanes_busy=dict(self._lanes_busy))
            self._wake.set()  # a changed state is written within min_gap_s, not a beat later

    @property
    def member(self) -> MemberHeartbeat | None:
        return self._member

    # ---- background --------------------------------------------------------------------------

    async def run(self) -> None:
        """Beat, heartbeat and sample lag until ``close``."""
        while not self._closed.is_set():
            self._wake.clear()
            self.loop_heartbeat.beat()
            timeout_s = self._beat_s
            member = self._member  # an event may end it while tick() awaits
            if member is not None:
                await member.tick()
                timeout_s = min(timeout_s, max(member.delay_s(), 0.01))
            await self._sample_lag()
            self._sample_lanes()
            self._check_mirror()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=timeout_s)
            except TimeoutError:
                pass

    async def _sample_lag(self) -> None:
        now = self._clock()
        if self._lag_facts is None or self._observe is None:
            return
        if self._last_lag_s is not None and now - self._last_lag_s < self._lag_interval_s:
            return
        self._last_lag_s = now
        owned = sorted(self.readiness.state.assigned)
        if not owned:
            return
        try:
            facts = await asyncio.to_thread(self._lag_facts, owned)
            durable = await self._observe(owned)
        except Exception as exc:  # Kafka or PostgreSQL did not answer: keep the last values
            log.debug("lag sample failed: %s", exc)
            return
        lags: dict[TopicPartition, int] = {}
        for tp in owned:
            token, fact = durable.get(tp), facts.get(tp)
            if token is not None and fact is not None and tp in self.readiness.state.assigned:
                self.instruments.set_lag(tp, high_watermark=fact.high_watermark,
                                         frontier=token.frontier)
                lags[tp] = max(0, fact.high_watermark - token.frontier)
        self._check_stalls(lags)

    def _sample_lanes(self) -> None:
        """The lanes' load into the gauges and, when it changed, the member row
        (``detail.lanes_busy``: busy lanes per partition, shown by ``fencectl status``)."""
        if self.lanes is None:
            return
        load = self.lanes()
        self.instruments.set_lanes(load)
        busy = {str(tp): b for tp, (b, _) in sorted(load.items())}
        if busy != self._lanes_busy:
            self._lanes_busy = busy
            if self._member is not None:
                self._member.set_state(state_for_phase(self.readiness.state.phase),
                                       lanes_busy=busy)

    def _check_stalls(self, lags: Mapping[TopicPartition, int]) -> None:
        if self.progress is None:
            return
        progress, now = self.progress(), self._clock()
        samples = {tp: PartitionSample(lag, progress[tp]) for tp, lag in lags.items()
                   if tp in progress}
        stalled = self._stalls.update(now, samples)
        before = self.readiness.state.stalled
        for tp in sorted(stalled - before):
            log.warning("partition %s stalled: lag %d and no fetch or commit progress for "
                        "%.0f s although owned and positioned (see /readyz, fencectl status)",
                        tp, lags[tp], self._stalls.idle_s(now, tp, progress[tp]))
        for tp in sorted(before - stalled):
            log.info("partition %s is making progress again", tp)
        if stalled != before:
            self._apply(StallChanged(stalled))
            self._sync_member_state()

    def _check_mirror(self) -> None:
        if self.mirror is None:
            return
        states, now = self.mirror(), self._clock()
        lagging = mirror_lagging(states, now_s=now, bound_s=self._mirror_warn_s)
        for tp in sorted(lagging - self._mirror_lagging):
            s = states[tp]
            log.warning("kafka offset of %s lags the durable frontier for %.0f s: Kafka has %s, "
                        "PostgreSQL %d (lag tools read a wrong lag; see "
                        "fence_kafka_commits_failed_total and this log)", tp,
                        now - (s.behind_since_s or now),
                        "no offset" if s.kafka is None else s.kafka, s.durable)
        for tp in sorted(self._mirror_lagging - lagging):
            if tp in states:
                log.info("kafka offset of %s caught up with the durable frontier", tp)
        self._mirror_lagging = lagging
        self.instruments.set_mirror_lagging(len(lagging))

    async def close(self, *, timeout_s: float = 3.0) -> None:
        """Stop ``run``, write the final member rows (bounded), mark the loop stopped."""
        self._closed.set()
        self._wake.set()
        self._end_member(failed=self.readiness.state.phase is Phase.RETIRED)
        if self._final_writes:
            await asyncio.wait(list(self._final_writes), timeout=timeout_s)
        self.loop_heartbeat.stop()
