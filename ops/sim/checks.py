"""Oracle checks of the simulator: committed state against the reference oracle's fold of
the processed source prefix, plus the fence's own invariants.

Rules (each failed rule is one violation string naming the place it was seen)
- ``fencing.reference.oracle.check`` at the durable frontiers: documents, outbox and
  quarantine equal the fold; outbox sequences/versions consistent; quarantine and
  progress agree.
- Committed intent never changes: an outbox or quarantine row, once committed, stays
  with the same value.
- A stale token never commits: every process/skip write carries the epoch of the latest
  claim of its partition and that claim's lifetime.
- A lifetime that was stopped or retired at an earlier check writes nothing but its
  ``retire`` journal row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fencing.memstore import MemoryFenceStore
from fencing.reference import oracle
from fencing.reference.snapshot import memory_store_state
from fencing.types import SourceRecord, TopicPartition

__all__ = ["Checker"]


class Checker:
    """Runs every rule against ``store``; collects violations (first ``limit``)."""

    def __init__(self, store: MemoryFenceStore, source: Sequence[SourceRecord],
                 *, dead: Callable[[], set[str]], limit: int = 20) -> None:
        self._store = store
        self._dead_now = dead
        self._limit = limit
        self.source: tuple[SourceRecord, ...] = tuple(source)
        self.violations: list[str] = []
        self._folds: dict[tuple[Any, ...], oracle.Expected] = {}
        self._outbox: dict[Any, Any] = {}
        self._quarantine: dict[Any, Any] = {}
        self._writes_seen = 0
        self._latest_claim: dict[TopicPartition, tuple[int | None, str | None]] = {}
        self._dead: set[str] = set()
        self.checks = 0

    def exclude(self, tp: TopicPartition, first: int, end: int) -> None:
        """Drop source records of ``tp`` in [first, end) (an accepted retention gap)."""
        self.source = tuple(r for r in self.source
                            if not (r.tp == tp and first <= r.offset < end))
        self._folds.clear()

    def _fail(self, place: str, problem: str) -> None:
        if len(self.violations) < self._limit:
            self.violations.append(f"{place}: {problem}")

    def check(self, place: str) -> None:
        self.checks += 1
        frontiers = {(tp.topic, tp.partition): row.frontier
                     for tp, row in sorted(self._store.rows.items())}
        actual = memory_store_state(self._store)
        key = tuple(sorted(frontiers.items()))
        expected = self._folds.get(key)
        if expected is None:
            expected = self._folds[key] = oracle.fold_prefix(self.source, frontiers)
        for problem in (*oracle.progress_problems(actual, frontiers),
                        *oracle.outbox_problems(actual), *oracle.diff(expected, actual)):
            self._fail(place, problem)
        for name, before, now in (("outbox", self._outbox, actual.outbox),
                                  ("quarantine", self._quarantine, actual.quarantine)):
            for k, v in before.items():
                if now.get(k) != v:
                    self._fail(place, f"committed {name} row {k} changed from {v} to "
                                      f"{now.get(k)}")
        self._outbox, self._quarantine = dict(actual.outbox), dict(actual.quarantine)
        self._check_writes(place)

    def _check_writes(self, place: str) -> None:
        writes = self._store.writes
        for w in writes[self._writes_seen:]:
            if w.lifetime in self._dead and w.kind != "journal":
                self._fail(place, f"lifetime {w.lifetime} wrote {w.kind} {w.tp} after it "
                                  "stopped or retired")
            if w.kind == "claim":
                self._latest_claim[w.tp] = (w.epoch, w.lifetime)
            elif w.kind in ("process", "skip"):
                latest = self._latest_claim.get(w.tp)
                if latest != (w.epoch, w.lifetime):
                    self._fail(place, f"stale token committed: {w.kind} {w.tp} by "
                                      f"{w.lifetime} at epoch {w.epoch}, latest claim {latest}")
        self._writes_seen = len(writes)
        self._dead = set(self._dead_now())
