"""Fault selectors of the in-memory store (used by unit tests and the simulator).

Rules
- A ``Fault`` selects one call: ``operation`` and ``call`` (the n-th call of that operation
  within one attempt, from 1). ``outcome`` is what the store should do at the effect point:
  ``commit`` (normal), ``abort`` (NotCommitted for mutations, ReadFailed for reads),
  ``unknown-committed`` (apply, then raise OutcomeUnknown) or ``unknown-aborted`` (do not
  apply, raise OutcomeUnknown); the unknown outcomes exist only for claim, process, skip,
  heartbeat, attempt (the attempt-count upsert), lane and fold; ``journal`` can only be aborted
  (NotCommitted: the row is not written); ``attempts`` (the failure marks read at a claim)
  is a read.
- ``delay_ms`` is logical time spent before the call, through the store's wait function.
- ``interleave`` asks the driver to run other work ``before`` or ``after`` the atomic effect:
  ``stop`` the calling lifetime, start ``replacement`` lifetime N, and/or ``revoke`` the
  calling lifetime's partitions concurrently (the revoke must wait for the in-flight calls).
  Claim, process and lane have both points; the reads (validate, observe) only ``before``
  (a stop or a takeover while the read is in flight).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Fault", "FaultOutcome", "Interleave", "InterleavePoint", "Operation"]


class Operation(enum.Enum):
    VALIDATE = "validate"
    CLAIM = "claim"
    OBSERVE = "observe"
    PROCESS = "process"
    SKIP = "skip"  # gap-skip: moves the frontier under the token
    JOURNAL = "journal"  # release / retire rows (best effort)
    HEARTBEAT = "heartbeat"  # the member row (status only; never guards data)
    ATTEMPT = "attempt"  # the attempt-count upsert of one record (handler failures)
    ATTEMPTS = "attempts"  # the read of the failure marks at a claim
    LANE = "lane"  # one lane's transaction (``--lanes``)
    FOLD = "fold"  # the lanes' contiguous prefix moved into the frontier (``--lanes``)

    @property
    def mutating(self) -> bool:
        """Writes whose reply can be lost (unknown outcomes are possible)."""
        return self in (Operation.CLAIM, Operation.PROCESS, Operation.SKIP, Operation.HEARTBEAT,
                        Operation.ATTEMPT, Operation.LANE, Operation.FOLD)

    @property
    def interleavable(self) -> bool:
        return self in (Operation.CLAIM, Operation.PROCESS, Operation.VALIDATE,
                        Operation.OBSERVE, Operation.LANE)

    @property
    def has_after_point(self) -> bool:
        """Only the atomic writes have a point after their effect."""
        return self in (Operation.CLAIM, Operation.PROCESS, Operation.LANE)


class FaultOutcome(enum.Enum):
    COMMIT = "commit"
    ABORT = "abort"
    UNKNOWN_COMMITTED = "unknown-committed"
    UNKNOWN_ABORTED = "unknown-aborted"

    @property
    def unknown(self) -> bool:
        return self in (FaultOutcome.UNKNOWN_COMMITTED, FaultOutcome.UNKNOWN_ABORTED)


@dataclass(frozen=True, slots=True)
class Interleave:
    """Work the driver runs at ``at`` ("before" | "after") the effect of the selected call."""

    at: str
    stop: bool = False
    replacement: int | None = None
    revoke: bool = False  # the calling lifetime revokes the partition meanwhile (concurrently)
    lost: bool = False  # the next batch queues behind the guard, then the assignment is lost

    def __post_init__(self) -> None:
        if self.at not in ("before", "after"):
            raise ValueError(f"interleave.at must be 'before' or 'after', not {self.at!r}")
        if not self.stop and self.replacement is None and not self.revoke and not self.lost:
            raise ValueError("interleave needs stop: true, a replacement, revoke: true and/or "
                             "lost: true")


@dataclass(frozen=True, slots=True)
class Fault:
    """One selected fault; see the module Rules."""

    operation: Operation
    call: int
    outcome: FaultOutcome = FaultOutcome.COMMIT
    delay_ms: int = 0
    interleave: Interleave | None = None

    def __post_init__(self) -> None:
        if self.call < 1:
            raise ValueError(f"fault call must be >= 1, not {self.call}")
        if self.delay_ms < 0:
            raise ValueError(f"fault delay_ms must be >= 0, not {self.delay_ms}")
        if self.outcome.unknown and not self.operation.mutating:
            raise ValueError(
                f"outcome {self.outcome.value} is only for claim, process, skip, "
                f"heartbeat and attempt, not {self.operation.value}"
            )
        if self.interleave is not None and not self.operation.interleavable:
            raise ValueError(
                f"interleave is only for validate, claim, observe and process, not "
                f"{self.operation.value}"
            )
        if (self.interleave is not None and self.interleave.at == "after"
                and not self.operation.has_after_point):
            raise ValueError(f"interleave at 'after' is only for claim and process, not "
                             f"{self.operation.value} (a read has no effect to follow)")


@dataclass(frozen=True, slots=True)
class InterleavePoint:
    """Passed to the store's ``interleave_hook``: which call, where, and its fault (if any)."""

    operation: Operation
    call: int
    at: str
    fault: Fault | None
    attempt: str
    partition: int | None = None  # the call's partition (process), None for a set's call
