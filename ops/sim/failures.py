"""The handler-failure path in the simulator (trace version 4): a reference handler with
poison records and transient failures, run through the production ``FailureRun``
(retries with durable attempt counts, bisection, the suspect window with the alone gate),
and the oracle of that family.

Rules
- The config's ``poison`` records (partition, offset) make the handler raise
  ``PoisonRecord`` every time it is given them; a ``transient`` record (partition, offset,
  n) makes it raise a ``Transient`` the first n times in the whole run (the world's
  failure, not a lifetime's). The generator keeps the run's transient failures at two at
  most: a batch's retries are counted at one key (its first offset), so more failures of
  several records in one batch could exhaust ``POLICY``'s four attempts, after which a
  record is treated as poison by design; with two, a transient record is applied, never
  quarantined, unless deaths quarantine it (below).
- Each lifetime is one worker process: its own ``FailureRun`` and ``AloneGate``, the
  policy ``POLICY``, the backoff's randomness seeded from the trace's seed and lifetime;
  the suspect window is the config's ``batch_max`` (``--batch-max-records``). A process
  step of a failing config goes through ``FailureRun.submit``; its waits raise
  ``RetryInterrupted`` once the lifetime left LIVE or dropped the partition (reported
  ``interrupted``, not a failure).
- Oracle, checked with the fold at every check: a quarantine row with an ``error_type``
  (written by the failure path) is for a poison record, or for a record whose attempts
  alone never completed (``killed-the-process``: the lifetimes that ran it died, which
  the run's stops can cause); any other is a violation. Poison records and such killers
  are left out of the fold (never applied); every other record below the frontier must
  be in it exactly once (the fold comparison). Each poison record below its partition's
  durable frontier has exactly one quarantine row, and none at or above it; one given up
  by a gap-skip (never delivered) has none.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from consumer.alone_gate import AloneGate
from consumer.failure_run import FailureRun
from consumer.lifecycle import Lifecycle
from fencing.errors import Transient
from fencing.failures import RetryPolicy, quarantine_cause
from fencing.handler import Declaration
from fencing.memory.rows import QuarantineRow
from fencing.types import SourceRecord, Verdict
from ops.reference.memory import memory_ref_handler
from ops.reference.oracle import Expected

__all__ = ["POLICY", "FailingHandler", "PoisonRecord", "Ranges", "Timed", "failure_rows",
           "failure_run", "quarantine_problems"]

POLICY = RetryPolicy(initial_ms=100, max_ms=800, retry_max_attempts=4, max_attempts=3)


class Ranges:
    """Offsets given up per partition ([first, end) ranges): gap-skips, accepted gaps."""

    def __init__(self) -> None:
        self._ranges: list[tuple[int, int, int]] = []

    def add(self, partition: int, first: int, end: int) -> None:
        self._ranges.append((partition, first, end))

    def __contains__(self, record: object) -> bool:
        if not isinstance(record, tuple):
            return False
        partition, offset = record
        return any(q == partition and a <= offset < b for q, a, b in self._ranges)


class PoisonRecord(Exception):
    """The handler's failure on a poison record (every time)."""


class FailingHandler:
    """The reference handler, failing on the config's poison and transient records."""

    def __init__(self, poison: Sequence[tuple[int, int]],
                 transient: Sequence[tuple[int, int, int]]) -> None:
        self.poison = frozenset(poison)
        self.left = Counter({(p, off): n for p, off, n in transient})

    async def __call__(self, conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
        for r in records:
            if (r.partition, r.offset) in self.poison:
                raise PoisonRecord(f"poison record {r.partition}@{r.offset}")
            if self.left[(r.partition, r.offset)] > 0:
                self.left[(r.partition, r.offset)] -= 1
                raise Transient(f"transient failure of {r.partition}@{r.offset}")
        return await memory_ref_handler(conn, records)


class Timed:
    """The lifecycle as ``FailureRun`` sees it: each guarded call it makes first tells
    ``began`` (the simulator's budget check measures a store call from its lifecycle
    call's start, and one submit makes several)."""

    _CALLS = ("process", "record_attempt")

    def __init__(self, lc: Lifecycle, began: Callable[[], None]) -> None:
        self._lc = lc
        self._began = began

    def __getattr__(self, name: str) -> Any:
        got = getattr(self._lc, name)
        if name not in self._CALLS:
            return got

        async def call(*args: Any, **kwargs: Any) -> Any:
            self._began()
            return await got(*args, **kwargs)
        return call


def failure_run(lc: Any, handler: FailingHandler, *, seed: int, worker: int,
                clock: Any, wait: Any, window: int) -> FailureRun:
    """One lifetime's failure handling (module Rules)."""
    return FailureRun(lifecycle=lc, handler=handler, declaration=Declaration(), policy=POLICY,
                      rng=random.Random(f"sim-failures/{seed}/{worker}"), clock=clock,
                      wait=wait, suspect_window=window, gate=AloneGate())


def quarantine_problems(rows: Sequence[QuarantineRow], poison: frozenset[tuple[int, int]],
                        frontiers: Mapping[int, int], gone: Ranges | None = None
                        ) -> tuple[list[str], set[tuple[int, int]]]:
    """(violations, killers): the failure path's quarantine rows against the poison set
    (module Rules); ``killers`` are the non-poison records quarantined as process killers,
    to leave out of the fold."""
    problems: list[str] = []
    killers: set[tuple[int, int]] = set()
    mine = Counter((q.tp.partition, q.offset) for q in rows if q.error_type is not None)
    for q in rows:
        if q.error_type is None or (q.tp.partition, q.offset) in poison:
            continue
        if quarantine_cause(q.error_type) == "killed-the-process":
            killers.add((q.tp.partition, q.offset))
        else:
            problems.append(f"record {q.tp.partition}@{q.offset} is no poison record but was "
                            f"quarantined ({q.error_type}: {q.reason[:80]})")
    for p, off in sorted(poison):
        below = off < frontiers.get(p, 0) and (gone is None or (p, off) not in gone)
        n = mine[(p, off)]
        if (below and n != 1) or (not below and n):
            problems.append(f"poison record {p}@{off} has {n} quarantine rows with the durable "
                            f"frontier at {frontiers.get(p, 0)} (expected "
                            f"{1 if below else 0})")
    return problems, killers


def failure_rows(checker: Any, place: str, actual: Expected,
                 frontiers: Mapping[tuple[str, int], int]) -> Expected:
    """Check the failure path's quarantine rows (``quarantine_problems``), leave killers
    out of ``checker``'s fold, and return ``actual`` without those rows (the fold has none:
    their records are left out of it)."""
    rows = checker._store.quarantine
    problems, killers = quarantine_problems(
        rows, checker.poison, {p: f for (_, p), f in frontiers.items()}, checker.gone)
    for problem in problems:
        checker.fail(place, problem)
    checker.leave_out(killers)
    drop = {(q.tp.topic, q.tp.partition, q.offset) for q in rows if q.error_type is not None}
    if not drop:
        return actual
    return replace(actual, quarantine={k: v for k, v in actual.quarantine.items()
                                       if k not in drop})
