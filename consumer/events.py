"""Typed, frozen events the worker reports to its observer (``consumer.observability``).

Each event is a value the observer matches on by type; partitions stay ``TopicPartition``s.
``str(event)`` is the worker's log line for it (``assigned {'partitions': ['t[0]']}``), a
format operators and tests search for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from consumer.batching import InFlight
from fencing.types import TopicPartition

__all__ = [
    "Assigned",
    "Failed",
    "LifetimeEnded",
    "LifetimeStarted",
    "RebalanceBegan",
    "Revoked",
    "ShutdownTimedOut",
    "StopRequested",
    "WorkerEvent",
]


def _names(tps: frozenset[TopicPartition] | tuple[TopicPartition, ...]) -> list[str]:
    return [str(tp) for tp in tps]


@dataclass(frozen=True, slots=True)
class LifetimeStarted:
    """A lifetime began (the first, or a fresh one after a retirement)."""

    lifetime: str

    def __str__(self) -> str:
        return f"lifetime.start {{'lifetime': {self.lifetime!r}}}"


@dataclass(frozen=True, slots=True)
class RebalanceBegan:
    """An assign, revoke or lost callback began for ``partitions`` (in callback order)."""

    kind: Literal["assign", "revoke", "lost"]
    partitions: tuple[TopicPartition, ...]

    def __str__(self) -> str:
        return f"{self.kind} {{'partitions': {_names(self.partitions)}}}"


@dataclass(frozen=True, slots=True)
class Assigned:
    """``partitions`` are claimed and the consumer is positioned on them (may be empty)."""

    partitions: tuple[TopicPartition, ...]

    def __str__(self) -> str:
        return f"assigned {{'partitions': {_names(self.partitions)}}}"


@dataclass(frozen=True, slots=True)
class Revoked:
    """The revoke callback finished: in-flight batches ended, tokens cleared."""

    partitions: tuple[TopicPartition, ...]

    def __str__(self) -> str:
        return f"revoked {{'partitions': {_names(self.partitions)}}}"


@dataclass(frozen=True, slots=True)
class Failed:
    """The first failure of a lifetime: it ends with ``exit_code``."""

    error: str
    exit_code: int

    def __str__(self) -> str:
        return f"failed {{'error': {self.error!r}, 'exit_code': {self.exit_code}}}"


@dataclass(frozen=True, slots=True)
class StopRequested:
    """SIGTERM/SIGINT: the worker finishes in-flight batches within the bound."""

    def __str__(self) -> str:
        return "stopping {}"


@dataclass(frozen=True, slots=True)
class ShutdownTimedOut:
    """In-flight batches outlived the shutdown bound: they are abandoned (exit 6)."""

    in_flight: tuple[InFlight, ...] = field(default_factory=tuple)

    def __str__(self) -> str:
        return f"shutdown.timeout {{'in_flight': {[i.describe() for i in self.in_flight]}}}"


@dataclass(frozen=True, slots=True)
class LifetimeEnded:
    lifetime: str
    exit_code: int

    def __str__(self) -> str:
        return f"lifetime.end {{'lifetime': {self.lifetime!r}, 'exit_code': {self.exit_code}}}"


WorkerEvent = (LifetimeStarted | RebalanceBegan | Assigned | Revoked | Failed | StopRequested
               | ShutdownTimedOut | LifetimeEnded)
