"""The worker's ports: what it needs of the Kafka thread, of the source facts and of the
lifecycle, and its per-partition state (kept apart so ``consumer.worker`` and
``consumer.lifetime_run`` stay one concept each)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from consumer.batching import InFlight, PartitionBuffer
from consumer.decisions import LifetimeState
from consumer.mirror import MirrorState
from fencing.failures import Attempts
from fencing.lanes import Completion, Span
from fencing.store import BatchCall
from fencing.types import SourceCheck, SourceFacts, Token, TopicPartition

__all__ = ["FactsPort", "KafkaPort", "LifecyclePort", "Partition"]


class KafkaPort(Protocol):
    """What the worker needs of ``consumer.kafka.adapter.KafkaThread`` (a fake in unit tests)."""

    def start(self) -> None: ...
    def pause(self, tp: TopicPartition) -> None: ...
    def resume(self, tp: TopicPartition) -> None: ...
    def commit(self, tp: TopicPartition, frontier: int) -> None: ...
    def reposition(self, tp: TopicPartition, offset: int,
                   then: Callable[[bool | BaseException], None]) -> None: ...
    def mirror(self) -> dict[TopicPartition, MirrorState]: ...
    def freeze_mirror(self) -> None: ...
    def stop_fetching(self) -> None: ...
    def close(self) -> Any: ...  # a concurrent.futures.Future


class LifecyclePort(Protocol):
    """What a lifetime's run needs of ``consumer.lifecycle.Lifecycle``."""

    @property
    def state(self) -> LifetimeState: ...

    async def assign(self, checks: Sequence[SourceCheck]) -> Mapping[TopicPartition, Token]: ...
    async def seek(self, tp: TopicPartition) -> int: ...
    async def seek_all(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]: ...
    async def process(self, call: BatchCall) -> Token: ...
    async def record_attempt(self, tp: TopicPartition, *, offset: int, max_attempts: int,
                             error: str | None, next_retry_in_s: float | None,
                             at_least: int = ..., alone: bool = ...) -> Attempts: ...
    def take_failure_marks(self, tp: TopicPartition) -> Attempts | None: ...
    def completion(self, tp: TopicPartition) -> Completion | None: ...
    def run_lanes(self, tp: TopicPartition, span_of: Mapping[int, Span] | None) -> None: ...
    async def fold(self, tp: TopicPartition, *, to_frontier: int) -> Token: ...
    async def reclaim(self, check: SourceCheck) -> Token | None: ...
    def suspect_window(self, tp: TopicPartition, open_: bool) -> None: ...
    async def revoke(self, tps: Sequence[TopicPartition]) -> None: ...
    def lost(self, tps: Sequence[TopicPartition]) -> None: ...
    def stop(self) -> None: ...
    def token(self, tp: TopicPartition) -> Token | None: ...


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
    #: the runner waits out its batch's linger: a delivery wakes it only once the batch is
    #: full (the linger's timer, a close or a stop wake it too)
    lingering: bool = False
    #: the batches of its lanes in flight (``--lanes``), by lane
    lanes_inflight: dict[int, InFlight] = field(default_factory=dict)
    #: per busy lane (records queued or in flight): the clock time it last made progress
    #: (a settled batch), or became busy; an idle lane is absent (``consumer.lanes_run``)
    lanes_since: dict[int, float] = field(default_factory=dict)
    #: its lanes' load now: (busy lanes, offsets dispatched past the effective frontier);
    #: None when the partition runs no lanes
    lane_load: Callable[[], tuple[int, int]] | None = None
