"""The worker's ports: what it needs of the Kafka thread and of the source facts, and its
per-partition state (kept apart so ``consumer.worker`` stays one concept)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol

from consumer.batching import InFlight, PartitionBuffer
from consumer.mirror import MirrorState
from fencing.types import SourceFacts, TopicPartition

__all__ = ["FactsPort", "KafkaPort", "Partition"]


class KafkaPort(Protocol):
    """What the worker needs of ``consumer.adapter.KafkaThread`` (a fake in unit tests)."""

    def start(self) -> None: ...
    def pause(self, tp: TopicPartition) -> None: ...
    def resume(self, tp: TopicPartition) -> None: ...
    def commit(self, tp: TopicPartition, frontier: int) -> None: ...
    def mirror(self) -> dict[TopicPartition, MirrorState]: ...
    def freeze_mirror(self) -> None: ...
    def stop_fetching(self) -> None: ...
    def close(self) -> Any: ...  # a concurrent.futures.Future


class FactsPort(Protocol):
    def facts(self, tps: list[TopicPartition]) -> dict[TopicPartition, SourceFacts]: ...


@dataclass(slots=True)
class Partition:
    """One owned partition on the loop side: its buffer, runner task and in-flight batch."""

    tp: TopicPartition
    buffer: PartitionBuffer
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    closing: bool = False
    inflight: InFlight | None = None
    task: asyncio.Task[None] | None = None
    progress_s: float = 0.0  # clock time of the last fetch into the buffer or commit
