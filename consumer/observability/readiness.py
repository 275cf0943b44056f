"""Readiness and liveness of one worker process, as pure state plus a thread-safe holder.

Rules (readiness)
- Ready only when: the startup checks passed (schema version), at least one assignment
  callback completed, no rebalance is in progress, every assigned partition is claimed
  and positioned, no assigned partition is stalled (``consumer.observability.stall``), and
  the process is neither retired nor stopping.
- ``StallChanged(tps)`` replaces the stalled set (kept within the assignment); it is legal
  in every phase and changes nothing once retired or stopping.
- ``RebalanceStarted`` begins a rebalance; ``Positioned(tps)`` ends it with ``tps`` claimed and
  positioned (added to the assignment); ``Revoked(tps)`` drops ``tps`` and ends the rebalance
  only when ``settled`` (incremental protocols; an eager revoke is always followed by an
  assign).
- ``Retired`` and ``Stopping`` are terminal; ``Restarted`` (a fresh lifetime after retirement)
  goes back to waiting for an assignment with the startup checks still passed.
- An event that is illegal in the current phase raises ``IllegalTransition`` and leaves the
  state unchanged.

Rules (liveness)
- Healthy while the loop beats: the last beat is at most ``bound_s`` old on the injected
  clock. Construction counts as a beat (startup grace); ``stop()`` makes it unhealthy.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from fencing.types import TopicPartition

__all__ = [
    "ChecksPassed",
    "IllegalTransition",
    "LoopHeartbeat",
    "Phase",
    "Positioned",
    "ReadinessEvent",
    "ReadinessHolder",
    "ReadinessState",
    "RebalanceStarted",
    "Restarted",
    "Retired",
    "Revoked",
    "StallChanged",
    "Stopping",
    "step",
]


class Phase(enum.Enum):
    STARTING = "starting"  # startup checks not passed yet
    WAITING = "waiting"  # checks passed; no assignment positioned yet
    REBALANCING = "rebalancing"  # a rebalance callback runs or an eager revoke awaits its assign
    READY = "ready"  # the current assignment is claimed and positioned
    RETIRED = "retired"  # the lifetime retired: it never writes again
    STOPPING = "stopping"  # shutdown began


class IllegalTransition(Exception):
    """An event arrived in a phase where it cannot happen (the caller's bug)."""


@dataclass(frozen=True, slots=True)
class ChecksPassed:
    """Schema version and configuration checks passed at startup."""


@dataclass(frozen=True, slots=True)
class RebalanceStarted:
    """A rebalance callback (assign, revoke, lost) began."""

    kind: str = "assign"


@dataclass(frozen=True, slots=True)
class Positioned:
    """The assign callback finished: ``tps`` are claimed and the consumer is positioned."""

    tps: frozenset[TopicPartition] = frozenset()


@dataclass(frozen=True, slots=True)
class Revoked:
    """The revoke/lost callback finished for ``tps``; ``settled``: no assign follows."""

    tps: frozenset[TopicPartition] = frozenset()
    settled: bool = False


@dataclass(frozen=True, slots=True)
class Retired:
    """The lifetime retired (fenced, unresolved outcome, refused source)."""

    reason: str = ""


@dataclass(frozen=True, slots=True)
class Stopping:
    """Shutdown began (signal or fatal error)."""


@dataclass(frozen=True, slots=True)
class Restarted:
    """A fresh lifetime replaces a retired one in the same process."""


@dataclass(frozen=True, slots=True)
class StallChanged:
    """The set of stalled partitions changed (empty: none is stalled)."""

    tps: frozenset[TopicPartition] = frozenset()


ReadinessEvent = (
    ChecksPassed | RebalanceStarted | Positioned | Revoked | Retired | Stopping | Restarted
    | StallChanged
)


@dataclass(frozen=True, slots=True)
class ReadinessState:
    phase: Phase = Phase.STARTING
    assigned: frozenset[TopicPartition] = field(default_factory=frozenset)
    reason: str = ""
    stalled: frozenset[TopicPartition] = field(default_factory=frozenset)

    @property
    def ready(self) -> bool:
        return self.phase is Phase.READY and not self.stalled

    def as_dict(self) -> dict[str, object]:
        reason = self.reason
        if self.stalled and not reason:
            reason = ("stalled (lag and no fetch or commit progress): "
                      + ", ".join(sorted(str(tp) for tp in self.stalled)))
        return {
            "ready": self.ready,
            "phase": self.phase.value,
            "assigned": sorted(str(tp) for tp in self.assigned),
            "stalled": sorted(str(tp) for tp in self.stalled),
            "reason": reason,
        }


_LIVE = (Phase.WAITING, Phase.REBALANCING, Phase.READY)
_TERMINAL = (Phase.RETIRED, Phase.STOPPING)


def step(state: ReadinessState, event: ReadinessEvent) -> ReadinessState:
    """Pure transition; raises ``IllegalTransition`` for an event the phase does not allow."""
    phase = state.phase
    match event:
        case StallChanged(tps=tps):
            if phase in _TERMINAL:
                return state
            return replace(state, stalled=tps & state.assigned)
        case Stopping():
            if phase is Phase.RETIRED:
                return state
            return replace(state, phase=Phase.STOPPING, reason="stopping", stalled=frozenset())
        case Retired(reason=reason):
            return replace(state, phase=Phase.RETIRED, assigned=frozenset(), stalled=frozenset(),
                           reason=f"retired: {reason}" if reason else "retired")
        case ChecksPassed() if phase is Phase.STARTING:
            return replace(state, phase=Phase.WAITING, reason="waiting for an assignment")
        case Restarted() if phase is Phase.RETIRED:
            return ReadinessState(phase=Phase.WAITING, reason="waiting for an assignment")
        case RebalanceStarted(kind=kind) if phase in _LIVE:
            return replace(state, phase=Phase.REBALANCING, reason=f"rebalance ({kind})")
        case Positioned(tps=tps) if phase in _LIVE:
            return replace(state, phase=Phase.READY, assigned=state.assigned | tps, reason="")
        case Revoked(tps=tps, settled=settled) if phase in _LIVE:
            remaining = state.assigned - tps
            stalled = state.stalled - tps
            if settled and phase is not Phase.WAITING:
                return replace(state, phase=Phase.READY, assigned=remaining, reason="",
                               stalled=stalled)
            return replace(state, assigned=remaining, stalled=stalled)
    raise IllegalTransition(f"{type(event).__name__} in phase {phase.value}")


class ReadinessHolder:
    """Thread-safe current readiness; the worker applies events, the HTTP thread reads."""

    def __init__(self, state: ReadinessState | None = None) -> None:
        self._lock = threading.Lock()
        self._state = state if state is not None else ReadinessState()

    def apply(self, event: ReadinessEvent) -> ReadinessState:
        """Apply ``event``; raises ``IllegalTransition`` and keeps the state when illegal."""
        with self._lock:
            self._state = step(self._state, event)
            return self._state

    def apply_all(self, events: Iterable[ReadinessEvent]) -> ReadinessState:
        for event in events:
            self.apply(event)
        return self.state

    @property
    def state(self) -> ReadinessState:
        with self._lock:
            return self._state


class LoopHeartbeat:
    """Liveness of the process loop: healthy while beats are at most ``bound_s`` apart."""

    def __init__(self, *, clock: Callable[[], float], bound_s: float = 30.0) -> None:
        if bound_s <= 0:
            raise ValueError("bound_s must be positive")
        self._clock = clock
        self.bound_s = bound_s
        self._lock = threading.Lock()
        self._last = clock()
        self._stopped = False

    def beat(self) -> None:
        """The loop made progress (called once per poll iteration)."""
        with self._lock:
            self._last = self._clock()

    def stop(self) -> None:
        """The loop ended; the process is no longer healthy."""
        with self._lock:
            self._stopped = True

    def age_s(self) -> float:
        with self._lock:
            return max(0.0, self._clock() - self._last)

    def healthy(self) -> bool:
        with self._lock:
            return not self._stopped and self._clock() - self._last <= self.bound_s

    def as_dict(self) -> dict[str, object]:
        return {"healthy": self.healthy(), "loop_age_s": round(self.age_s(), 3),
                "bound_s": self.bound_s, "stopped": self._stopped}
