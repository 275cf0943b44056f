"""Pure decisions of the lifecycle: states and legal transitions, token compatibility,
seek checks, batch admission, failure classification and the call budget.

Rules
- A lifetime is LIVE; a failure moves it to RETIRING (the gate closes: no call does I/O
  any more) and, once its retire journal row is written, to RETIRED; ``stop`` moves LIVE or
  RETIRING to STOPPED. RETIRED and STOPPED are final. ``transition`` raises
  ``IllegalTransition`` and changes nothing for any other move; the state is the whole
  truth (there is no separate gate flag).
- A late call -- ``seek``/``process`` of a partition whose token was dropped (revoke, lost)
  or replaced before or while it waited -- raises ``Fenced`` without retiring
  (``late_call``).
- A claim reply is retained only when ``fencing.resolution.compatible_claim`` accepts it
  against the newest token known before the claim (retained or validated).
- ``seek``: the observed token must equal the retained one; anything else is a fence.
- A batch is submitted from the first record at or above the retained frontier; records
  below it are already durable under this lifetime's epoch and are dropped; a record of
  another partition or out of offset order is the caller's bug (``ValueError``).
- Failures: ``HandlerFailed`` (the handler raised; nothing applied) passes through without
  retiring: the worker retries, bisects or quarantines (``consumer.failure_run``).
  ``ResetByOperator`` (fenced by an operator's reset, not by another member) passes
  through too: the worker claims the partition again (``Lifecycle.reclaim``).
  ``Fenced`` and ``SourceRefused`` retire the lifetime and reach the caller as
  they are; ``StoreUnavailable``, ``OutcomeUnknown`` (including ``Unresolved``), an exhausted
  budget and any other error retire it and reach the caller as ``Retired``.
- After a batch's call failed, the worker drops the batch (the lifetime goes on) only when
  its partition was lost or revoked while the batch waited behind the partition's guard
  (``TokenDropped``: nothing was sent); anything else ends the lifetime, a store
  ``Fenced`` after a loss included (a newer owner committed: a zombie)
  (``after_batch_failure``; ``consumer.lifetime_run`` and the simulator both ask it).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from fencing.errors import (
    ConfigError,
    Fenced,
    HandlerFailed,
    ResetByOperator,
    Retired,
    SourceRefused,
    TokenDropped,
)
from fencing.resolution import compatible_claim
from fencing.types import (
    ACCEPT,
    Reject,
    SourceFacts,
    SourceRecord,
    Token,
    TopicPartition,
    Verdict,
)

__all__ = [
    "AUTO_OFFSET_RESETS",
    "LEGAL_TRANSITIONS",
    "BatchFailure",
    "FailureAction",
    "IllegalTransition",
    "LifetimeState",
    "after_batch_failure",
    "check_auto_offset_reset",
    "check_batch",
    "classify_failure",
    "deadline_passed",
    "initial_frontier",
    "late_call",
    "newest",
    "rejects",
    "retain_claim",
    "seek_matches",
    "submittable",
    "transition",
]

AUTO_OFFSET_RESETS = ("earliest", "latest")


class LifetimeState(enum.Enum):
    LIVE = "live"  # the gate is open: calls may do I/O
    RETIRING = "retiring"  # a failure closed the gate; the retire journal row may follow
    RETIRED = "retired"  # final: never writes again
    STOPPED = "stopped"  # final: stopped (SIGTERM, shutdown); never writes again


LEGAL_TRANSITIONS: dict[LifetimeState, frozenset[LifetimeState]] = {
    LifetimeState.LIVE: frozenset({LifetimeState.RETIRING, LifetimeState.STOPPED}),
    LifetimeState.RETIRING: frozenset({LifetimeState.RETIRED, LifetimeState.STOPPED}),
    LifetimeState.RETIRED: frozenset(),
    LifetimeState.STOPPED: frozenset(),
}


class IllegalTransition(ValueError):
    """A lifecycle state change outside ``LEGAL_TRANSITIONS`` (a bug in the caller)."""


def transition(state: LifetimeState, to: LifetimeState) -> LifetimeState:
    """Return ``to`` when the move is legal; raise ``IllegalTransition`` otherwise."""
    if to not in LEGAL_TRANSITIONS[state]:
        raise IllegalTransition(f"lifetime cannot move from {state.value} to {to.value}")
    return to


def late_call(held: Token | None, current: Token | None) -> bool:
    """True when a ``seek``/``process`` that started with token ``held`` (None: none) finds
    ``current`` is no longer that very token: a late call, fenced without retiring."""
    return held is None or current is not held


def check_auto_offset_reset(auto_offset_reset: str) -> None:
    """Raise ``ConfigError`` unless ``auto_offset_reset`` is one of ``AUTO_OFFSET_RESETS``."""
    if auto_offset_reset not in AUTO_OFFSET_RESETS:
        raise ConfigError(
            f"auto_offset_reset {auto_offset_reset!r}: expected one of {AUTO_OFFSET_RESETS}"
        )


def initial_frontier(facts: SourceFacts, auto_offset_reset: str) -> int:
    """Frontier of a partition row created by the first claim."""
    check_auto_offset_reset(auto_offset_reset)
    return facts.low_watermark if auto_offset_reset == "earliest" else facts.high_watermark


def newest(*tokens: Token | None) -> Token | None:
    """The token with the highest epoch (None when all are None)."""
    known = [t for t in tokens if t is not None]
    return max(known, key=lambda t: t.epoch) if known else None


def retain_claim(claimed: Token | None, known_before: Token | None) -> bool:
    """True when a claim reply may become this lifetime's token."""
    return claimed is not None and compatible_claim(claimed, known_before)


def seek_matches(retained: Token, observed: Token | None) -> bool:
    """True when a re-read under the retained token proves it is still ours and current."""
    return observed == retained


def check_batch(tp: TopicPartition, records: Sequence[SourceRecord]) -> None:
    """Raise ``ValueError`` (the caller's bug) unless ``records`` are of ``tp``, in order."""
    last, topic, partition = -1, tp.topic, tp.partition
    for rec in records:  # per record on the hot path: no TopicPartition built
        if rec.partition != partition or rec.topic != topic:
            raise ValueError(f"process {tp}: record of {rec.tp} in the batch")
        if rec.offset <= last:
            raise ValueError(f"process {tp}: offset {rec.offset} after {last} is out of order")
        last = rec.offset


def submittable(token: Token, records: Sequence[SourceRecord]) -> tuple[SourceRecord, ...]:
    """The records to submit under ``token``: those at or above its frontier, in order.

    ``records`` already passed ``check_batch`` (the lifecycle checks once, before any I/O)."""
    if not records or records[0].offset >= token.frontier:  # in order: nothing is durable
        return tuple(records)
    return tuple(rec for rec in records if rec.offset >= token.frontier)


def rejects(verdicts: Sequence[Verdict]) -> int:
    """How many of ``verdicts`` quarantine their record (all-accepted batches, the common
    case, cost one C-level count)."""
    if verdicts.count(ACCEPT) == len(verdicts):
        return 0
    return sum(isinstance(v, Reject) for v in verdicts)


class FailureAction(enum.Enum):
    RAISE_AS_IS = "raise-as-is"  # retire, then raise the error itself (Fenced, SourceRefused)
    RAISE_RETIRED = "raise-retired"  # retire, then raise Retired from the error
    PASS_THROUGH = "pass-through"  # already terminal (Retired): raise unchanged, no retirement


def classify_failure(exc: BaseException) -> FailureAction:
    """How the lifecycle treats an error raised by a guarded call."""
    if isinstance(exc, Retired | HandlerFailed | ResetByOperator):
        return FailureAction.PASS_THROUGH
    if isinstance(exc, Fenced | SourceRefused):
        return FailureAction.RAISE_AS_IS
    return FailureAction.RAISE_RETIRED  # StoreUnavailable, OutcomeUnknown, budget, any other


def deadline_passed(now_s: float, deadline_s: float) -> bool:
    """True once the injected clock has reached the call's deadline."""
    return now_s >= deadline_s


class BatchFailure(enum.Enum):
    DROP = "drop"  # never attempted: dropped like buffered records; the lifetime goes on
    END = "end"  # the lifetime ends (``consumer.exits`` maps the error to its exit code)


def after_batch_failure(exc: BaseException, *, closing: bool) -> BatchFailure:
    """What the worker does with a batch whose lifecycle call raised ``exc`` (``closing``:
    its partition was lost or revoked meanwhile)."""
    if closing and isinstance(exc, TokenDropped):
        return BatchFailure.DROP
    return BatchFailure.END
