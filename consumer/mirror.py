"""The offset mirror (pure): Kafka's committed offset as a copy of the durable frontier.

Rules
- PostgreSQL's frontier positions the consumer; Kafka's committed offset only mirrors it for
  lag tools. Nothing here decides where the consumer reads.
- Per owned partition the mirror knows the durable frontier (from the assignment's seek and
  each committed batch) and what Kafka holds as far as this member knows: the offset read
  at assignment, then the offset of each successful commit, in the order the results
  arrive (None: no committed offset, or unknown).
- It is *in sync* while Kafka holds the durable frontier. Otherwise it is *behind since*
  the earliest time from which Kafka has neither held the frontier nor advanced; each
  successful commit restarts that clock. It *lags* once it has been behind for the bound:
  commits fail, or nobody commits (the stale offset the issue found).
- A failed commit is classified by its librdkafka error name into a bounded set of
  reasons; commits dropped because the partition went away are counted too.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace

from fencing.types import TopicPartition

__all__ = [
    "CommitFailure",
    "MirrorState",
    "assigned",
    "classify_commit_error",
    "confirmed",
    "durable_moved",
    "lagging",
    "needs_commit",
]


class CommitFailure(enum.Enum):
    """Why a Kafka commit of the frontier did not land (the metric's ``reason`` label)."""

    REJECTED = "rejected"  # the group refused it: this member's generation/epoch is stale
    UNAVAILABLE = "unavailable"  # no coordinator, transport error or timeout
    ERROR = "error"  # any other error Kafka or librdkafka returned
    LOST = "lost"  # dropped: the assignment was lost before Kafka had the frontier
    NOT_ASSIGNED = "not-assigned"  # dropped: queued for a partition no longer assigned


_REJECTED = frozenset({
    "ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID", "STALE_MEMBER_EPOCH", "REBALANCE_IN_PROGRESS",
    "FENCED_INSTANCE_ID", "FENCED_MEMBER_EPOCH", "_ASSIGNMENT_LOST", "_STATE",
})
_UNAVAILABLE = frozenset({
    "_TRANSPORT", "_TIMED_OUT", "_WAIT_COORD", "_ALL_BROKERS_DOWN", "_DESTROY",
    "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS",
    "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION",
})


def classify_commit_error(name: str) -> CommitFailure:
    """The reason for a failed commit from its librdkafka error name (``KafkaError.name()``)."""
    if name in _REJECTED:
        return CommitFailure.REJECTED
    if name in _UNAVAILABLE:
        return CommitFailure.UNAVAILABLE
    return CommitFailure.ERROR


@dataclass(frozen=True, slots=True)
class MirrorState:
    """One owned partition's mirror."""

    durable: int  # the durable frontier this member last learned
    kafka: int | None  # Kafka's committed offset as this member knows it (None: none/unknown)
    behind_since_s: float | None  # None while in sync (see Rules)

    @property
    def in_sync(self) -> bool:
        return self.kafka == self.durable


def assigned(*, durable: int, kafka: int | None, now_s: float) -> MirrorState:
    """The mirror of a freshly positioned partition; ``kafka`` as read (None: none/unknown)."""
    return MirrorState(durable, kafka, None if kafka == durable else now_s)


def durable_moved(state: MirrorState, frontier: int, now_s: float) -> MirrorState:
    """A batch committed in PostgreSQL: the frontier is now ``frontier``."""
    if frontier == state.kafka:
        return replace(state, durable=frontier, behind_since_s=None)
    since = state.behind_since_s if state.behind_since_s is not None else now_s
    return replace(state, durable=frontier, behind_since_s=since)


def confirmed(state: MirrorState, offset: int, now_s: float) -> MirrorState:
    """Kafka acknowledged a commit of ``offset``: it holds it now, so it advanced."""
    return MirrorState(state.durable, offset, None if offset == state.durable else now_s)


def needs_commit(state: MirrorState) -> bool:
    """Kafka does not (as far as this member knows) hold the durable frontier."""
    return not state.in_sync


def lagging(states: Mapping[TopicPartition, MirrorState], *, now_s: float,
            bound_s: float) -> frozenset[TopicPartition]:
    """The partitions whose mirror has been behind for ``bound_s`` or longer at ``now_s``."""
    return frozenset(tp for tp, s in states.items()
                     if s.behind_since_s is not None and now_s - s.behind_since_s >= bound_s)
