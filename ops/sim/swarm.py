"""Swarm profiles: each seed draws its own fault kinds, outcome mix, operation weights,
budget, source size and retention setting (swarm testing: a run that never sees a fault
kind can reach states that a run full of it cannot).

Rules
- Pure: ``draw_profile`` takes the seed's ``random.Random`` and nothing else.
- Every profile enables at least one fault kind; unknown outcomes only for the writes
  (claim, process, skip, heartbeat).
- Five profiles in six never let Kafka's retention delete records mid-run (``expire``
  weight 0); the others do now and then, so an assign of a set may be refused for one
  partition (or gap-skip it with ``allow_retention_gap``).
- One profile in four has a 400 ms budget (delays and retry waits can exhaust it); one in
  four has retention gaps before the drain with ``allow_retention_gap``; one in ten has its
  topic recreated before the drain.
- Trace version 4: one profile in three has a handler with poison records and transient
  failures (``ops.sim.failures``; attempt-count faults are drawn as any kind); the ``lost``
  actor (weight 0 in one profile of three) and a process interleave that queues the next
  batch and loses the partitions (``lost_rate``).
- Trace version 5: one profile in three of those without handler failures runs lanes
  (``draw_lanes``: lanes, window, fold distance and the lane and fold fault kinds), drawn
  from a generator of its own so every other profile, and its trace, is what it was.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from fencing.memory.faults import FaultOutcome, Operation

__all__ = ["ACTOR_OPS", "KINDS", "LANE_KINDS", "LanesProfile", "Profile", "draw_lanes",
           "draw_profile"]

Kind = tuple[Operation, FaultOutcome]
Op, F = Operation, FaultOutcome
KINDS: tuple[Kind, ...] = (
    (Op.VALIDATE, F.ABORT), (Op.VALIDATE, F.COMMIT),
    (Op.CLAIM, F.ABORT), (Op.CLAIM, F.COMMIT), (Op.CLAIM, F.UNKNOWN_COMMITTED),
    (Op.CLAIM, F.UNKNOWN_ABORTED),
    (Op.OBSERVE, F.ABORT), (Op.OBSERVE, F.COMMIT),
    (Op.PROCESS, F.ABORT), (Op.PROCESS, F.COMMIT), (Op.PROCESS, F.UNKNOWN_COMMITTED),
    (Op.PROCESS, F.UNKNOWN_ABORTED),
    (Op.SKIP, F.ABORT), (Op.SKIP, F.UNKNOWN_COMMITTED), (Op.SKIP, F.UNKNOWN_ABORTED),
    (Op.JOURNAL, F.ABORT),
    (Op.HEARTBEAT, F.ABORT), (Op.HEARTBEAT, F.UNKNOWN_COMMITTED),
    (Op.HEARTBEAT, F.UNKNOWN_ABORTED),
    (Op.ATTEMPT, F.ABORT), (Op.ATTEMPT, F.UNKNOWN_COMMITTED), (Op.ATTEMPT, F.UNKNOWN_ABORTED),
    (Op.ATTEMPTS, F.ABORT),
)
LANE_KINDS: tuple[Kind, ...] = (
    (Op.LANE, F.ABORT), (Op.LANE, F.COMMIT), (Op.LANE, F.UNKNOWN_COMMITTED),
    (Op.LANE, F.UNKNOWN_ABORTED), (Op.FOLD, F.ABORT), (Op.FOLD, F.UNKNOWN_COMMITTED),
    (Op.FOLD, F.UNKNOWN_ABORTED),
)
ACTOR_OPS = {"assign": (Op.VALIDATE, Op.CLAIM, Op.OBSERVE, Op.SKIP, Op.JOURNAL, Op.ATTEMPTS),
             "seek": (Op.OBSERVE, Op.JOURNAL),
             "process": (Op.PROCESS, Op.OBSERVE, Op.JOURNAL, Op.ATTEMPT),
             "revoke": (Op.JOURNAL,), "heartbeat": (Op.HEARTBEAT,)}
_ACTORS = ("start", "process", "seek", "assign", "takeover", "revoke", "stop", "late",
           "heartbeat", "expire", "lost")
_INDEX = {actor: i for i, actor in enumerate(_ACTORS)}


@dataclass(frozen=True, slots=True)
class Profile:
    kinds: tuple[Kind, ...]
    fault_rate: float  # share of faultable steps that carry faults
    max_faults: int  # selectors per step (a burst adds consecutive calls)
    burst_rate: float  # a selector repeats on calls 1..2 or 1..3 (three-call exhaustion)
    delays: tuple[int, ...]  # logical delay choices in ms
    interleave_rate: float  # first claim/process call carries an interleave
    revoke_rate: float  # a process interleave revokes the partition meanwhile
    lost_rate: float  # a process interleave queues the next batch, then loses the partitions
    multi_rate: float  # an assign/revoke/takeover/process step takes a set of partitions
    weights: tuple[float, ...]  # per actor of _ACTORS
    revoke_first: float  # a takeover revokes the old holder first (else: a zombie remains)
    partitions: int
    records: int
    batch_max: int
    budget_ms: int
    retention: bool
    recreated: bool  # the topic is recreated before the drain (expected: BLOCKED)
    failures: bool  # poison and transient records (ops.sim.failures), one profile in three

    def weight(self, actor: str) -> float:
        return self.weights[_INDEX[actor]]

    def kinds_of(self, actor: str) -> tuple[Kind, ...]:
        """The profile's fault kinds an ``actor`` step can carry."""
        return tuple(k for k in self.kinds if k[0] in ACTOR_OPS[actor])


def draw_profile(rng: random.Random) -> Profile:
    """The swarm profile of one seed."""
    kinds = tuple(k for k in KINDS if rng.random() < 0.5) or (rng.choice(KINDS),)
    weights = (rng.choice((0.02, 0.05)), rng.uniform(0.3, 0.6), rng.uniform(0.1, 0.25),
               rng.uniform(0.05, 0.2), rng.uniform(0.02, 0.15), rng.uniform(0.03, 0.12),
               rng.uniform(0.0, 0.04), rng.uniform(0.0, 0.03), rng.uniform(0.02, 0.08),
               rng.choice((0.0, 0.0, 0.0, 0.0, 0.0, 0.04)), rng.choice((0.0, 0.02, 0.05)))
    return Profile(
        kinds=kinds, fault_rate=rng.choice((0.15, 0.3, 0.5)), max_faults=rng.randint(1, 4),
        burst_rate=rng.choice((0.0, 0.2, 0.4)),
        delays=rng.choice(((0,), (0, 0, 5, 50), (0, 50, 150, 250))),
        interleave_rate=rng.choice((0.0, 0.2, 0.5)), revoke_rate=rng.choice((0.0, 0.3, 0.6)),
        lost_rate=rng.choice((0.0, 0.3, 0.6)),
        multi_rate=rng.choice((0.0, 0.4, 0.8)), weights=weights,
        revoke_first=rng.choice((0.3, 0.7, 1.0)), partitions=rng.choice((1, 2, 2, 3)),
        records=rng.randint(16, 60), batch_max=rng.randint(1, 4),
        budget_ms=rng.choice((20_000, 20_000, 20_000, 400)), retention=rng.random() < 0.25,
        recreated=rng.random() < 0.1, failures=rng.random() < 1 / 3)


@dataclass(frozen=True, slots=True)
class LanesProfile:
    lanes: int
    window: int  # offsets above the effective frontier (``--lanes-window``)
    fold_every: int  # offsets the effective frontier runs ahead before a fold
    kinds: tuple[Kind, ...]  # lane and fold faults, on process steps


def draw_lanes(seed: int, klass: str, *, failures: bool) -> LanesProfile | None:
    """The lanes of a seed's profile (None: no lanes), from its own generator."""
    rng = random.Random(f"worker-schedule-v1/lanes/{seed}/{klass}")
    if failures or rng.random() >= 1 / 3:
        return None
    return LanesProfile(lanes=rng.choice((2, 3, 4, 8)), window=rng.choice((2, 5, 12, 10_000)),
                        fold_every=rng.choice((1, 3, 8)),
                        kinds=tuple(k for k in LANE_KINDS if rng.random() < 0.5))
