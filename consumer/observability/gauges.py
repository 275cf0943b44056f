"""The worker's observable gauges: what its state is now, read at collection time.

Rules
- Each gauge reads the last value a setter stored, under one lock (the collection runs on
  the exporter's thread): ``fence.partition.lag`` (``set_lag``/``clear_lag``: a partition
  whose lag is cleared disappears from the next scrape; a best-effort handler's is labelled
  ``completeness=not-claimed``, ``declare``), ``fence.handler.declaration``,
  ``fence.partitions.stalled``, ``fence.partition.owned`` (1 owned, 0 known but not owned:
  ``max by (group, topic, partition)`` over the members is 0 exactly when no live member
  owns it), ``fence.worker.ready``, ``fence.worker.phase``,
  ``fence.partitions.mirror_lagging``, and per partition running lanes ``fence.lanes.busy``
  and ``fence.lanes.window_used`` (``set_lanes``: a partition no longer running lanes
  disappears from the next scrape).
- ``consumer.observability.instruments.Instruments`` is these gauges plus the counters and
  histograms; callers use it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from consumer.observability.readiness import Phase
from fencing.handler import Declaration
from fencing.types import TopicPartition

__all__ = ["Gauges", "tp_attrs"]


def tp_attrs(tp: TopicPartition) -> dict[str, str | int]:
    """The ``topic`` and ``partition`` labels of ``tp``."""
    return {"topic": tp.topic, "partition": tp.partition}


class Gauges:
    """The state gauges of one worker process; ``group_id`` is its consumer group."""

    def __init__(self, m: Meter, *, group_id: str = "") -> None:
        self._group = group_id
        self._lock = threading.Lock()
        self._lag: dict[TopicPartition, int] = {}
        m.create_observable_gauge(
            "fence.partition.lag", callbacks=[self._observe_lag], unit="{record}",
            description="Kafka high watermark minus the durable frontier, per owned partition; "
                        "completeness=not-claimed for a best-effort handler (records below "
                        "the frontier were attempted, their effects may have been dropped)")
        self._declared: dict[str, str] | None = None
        m.create_observable_gauge(
            "fence.handler.declaration", callbacks=[self._observe_declaration],
            unit="{handler}",
            description="1, labelled with the handler's durability, effects, on_failure and "
                        "whether its frontier claims completeness (not for best-effort)")
        self._stalled: frozenset[TopicPartition] = frozenset()
        m.create_observable_gauge(
            "fence.partitions.stalled", callbacks=[self._observe_stalled], unit="{partition}",
            description="Owned partitions with lag and no fetch or commit progress for "
                        "--stall-timeout-s")
        self._known: set[TopicPartition] = set()
        self._owned: frozenset[TopicPartition] = frozenset()
        m.create_observable_gauge(
            "fence.partition.owned", callbacks=[self._observe_owned],
            description="1 for a partition this process owns (claimed and positioned), 0 for "
                        "a partition of its topics it does not own")
        self._ready, self._phase = False, Phase.STARTING
        m.create_observable_gauge(
            "fence.worker.ready", callbacks=[self._observe_ready],
            description="1 while the worker is ready (/readyz answers 200), else 0")
        m.create_observable_gauge(
            "fence.worker.phase", callbacks=[self._observe_phase],
            description="1 for the readiness phase the worker is in, 0 for the others")
        self._mirror_lagging = 0
        m.create_observable_gauge(
            "fence.partitions.mirror_lagging", callbacks=[self._observe_mirror],
            unit="{partition}",
            description="Owned partitions whose Kafka committed offset has lagged the durable "
                        "frontier for --offset-mirror-warn-s")

        self._lanes: dict[TopicPartition, tuple[int, int]] = {}
        m.create_observable_gauge(
            "fence.lanes.busy", callbacks=[self._observe_lanes_busy], unit="{lane}",
            description="Lanes with records queued or in flight, per partition running lanes "
                        "(--lanes)")
        m.create_observable_gauge(
            "fence.lanes.window_used", callbacks=[self._observe_lanes_window],
            unit="{offset}",
            description="Offsets dispatched to lanes past the oldest unfinished one, per "
                        "partition running lanes (at most --lanes-window)")

    def set_lanes(self, load: Mapping[TopicPartition, tuple[int, int]]) -> None:
        """The partitions running lanes now: (busy lanes, window used) each."""
        with self._lock:
            self._lanes = dict(load)

    def _observe_lanes_busy(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            load = sorted(self._lanes.items())
        return [Observation(busy, {"group": self._group, **tp_attrs(tp)})
                for tp, (busy, _) in load]

    def _observe_lanes_window(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            load = sorted(self._lanes.items())
        return [Observation(used, {"group": self._group, **tp_attrs(tp)})
                for tp, (_, used) in load]

    def set_lag(self, tp: TopicPartition, *, high_watermark: int, frontier: int) -> None:
        """Record lag = max(0, high watermark - durable frontier) for an owned partition."""
        with self._lock:
            self._lag[tp] = max(0, high_watermark - frontier)

    def clear_lag(self, tps: Iterable[TopicPartition] | None = None) -> None:
        """Forget lag for ``tps`` (all partitions when None): they are no longer owned."""
        with self._lock:
            if tps is None:
                self._lag.clear()
            else:
                for tp in tps:
                    self._lag.pop(tp, None)

    def lag(self) -> dict[TopicPartition, int]:
        """A snapshot of the current lag values."""
        with self._lock:
            return dict(self._lag)

    def set_stalled(self, tps: frozenset[TopicPartition]) -> None:
        """The partitions currently stalled (``consumer.observability.stall``)."""
        with self._lock:
            self._stalled = tps

    def set_owned(self, tps: frozenset[TopicPartition]) -> None:
        """The partitions this process owns now (claimed and positioned)."""
        with self._lock:
            self._owned = tps
            self._known.update(tps)

    def set_readiness(self, *, ready: bool, phase: Phase) -> None:
        """Whether the worker is ready, and its phase (``consumer.observability.readiness``)."""
        with self._lock:
            self._ready, self._phase = ready, phase

    def set_mirror_lagging(self, count: int) -> None:
        """How many owned partitions' Kafka offsets lag past the bound (``consumer.mirror``)."""
        with self._lock:
            self._mirror_lagging = count

    def _observe_stalled(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            return [Observation(len(self._stalled))]

    def _observe_owned(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            owned, known = self._owned, sorted(self._known)
        return [Observation(int(tp in owned), {"group": self._group, **tp_attrs(tp)})
                for tp in known]

    def _observe_ready(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            return [Observation(int(self._ready))]

    def _observe_phase(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            current = self._phase
        return [Observation(int(phase is current), {"phase": phase.value}) for phase in Phase]

    def _observe_mirror(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            return [Observation(self._mirror_lagging)]

    def declare(self, declaration: Declaration) -> None:
        """The handler's declaration: exported as ``fence.handler.declaration``, and a
        best-effort handler's lag is labelled ``completeness=not-claimed``."""
        with self._lock:
            self._declared = {**declaration.as_dict(), "completeness": "claimed"
                              if declaration.claims_completeness else "not-claimed"}

    def _observe_declaration(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            declared = self._declared
        return [] if declared is None else [Observation(1, declared)]

    def _observe_lag(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            declared = self._declared
        extra = {} if declared is None else {"completeness": declared["completeness"]}
        return [Observation(v, {"group": self._group, **tp_attrs(tp), **extra})
                for tp, v in sorted(self.lag().items())]
