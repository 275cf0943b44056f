"""Stall detection (pure): an owned, positioned partition with lag that makes no progress.

Rules (docs/ARCHITECTURE.md, "Liveness")
- Progress is records fetched into the partition's buffer or a batch committed; the worker
  reports the time of the last one per owned partition (``progress_s``, its clock).
- Lag comes from samples (Kafka's high watermark minus the durable frontier). A partition's
  stall clock starts at the later of its last progress and the first sample that showed lag
  since lag was last 0 -- so a partition that was idle at its end and just received new
  records is not stalled before it had ``timeout_s`` to fetch them.
- It is stalled once its stall clock is ``timeout_s`` old; progress or a sample without lag
  ends the stall. Partitions no longer owned are forgotten.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fencing.types import TopicPartition

__all__ = ["PartitionSample", "StallTracker"]


@dataclass(frozen=True, slots=True)
class PartitionSample:
    """One owned partition at one lag sample."""

    lag: int
    progress_s: float  # the worker's clock at its last fetch or commit progress


class StallTracker:
    """Remembers when each partition's lag was first seen; answers which are stalled."""

    def __init__(self, *, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.timeout_s = timeout_s
        self._lag_since: dict[TopicPartition, float] = {}

    def update(self, now_s: float,
               samples: Mapping[TopicPartition, PartitionSample]) -> frozenset[TopicPartition]:
        """The stalled partitions among ``samples`` at ``now_s``; forgets the others."""
        for tp in list(self._lag_since):
            if tp not in samples or samples[tp].lag <= 0:
                del self._lag_since[tp]
        stalled = set()
        for tp, sample in samples.items():
            if sample.lag <= 0:
                continue
            since = self._lag_since.setdefault(tp, now_s)
            if now_s - max(since, sample.progress_s) >= self.timeout_s:
                stalled.add(tp)
        return frozenset(stalled)

    def idle_s(self, now_s: float, tp: TopicPartition, progress_s: float) -> float:
        """Seconds the stall clock of ``tp`` has run (0 when it has no lag)."""
        since = self._lag_since.get(tp)
        return 0.0 if since is None else max(0.0, now_s - max(since, progress_s))
