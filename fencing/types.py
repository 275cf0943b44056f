"""Frozen values shared by the store, the lifecycle, the worker and the simulator."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from fencing.errors import SourceRefused

__all__ = [
    "ACCEPT",
    "OPERATOR_OWNER_PREFIX",
    "Accept",
    "ClaimRequest",
    "Outcome",
    "Reject",
    "SourceCheck",
    "SourceFacts",
    "SourceRecord",
    "Token",
    "TopicPartition",
    "Validation",
    "Verdict",
    "operator_owned",
]

#: The ``owner`` of a partition row an operator's ``fencectl reset`` wrote:
#: ``operator:<user>@<host>``; a worker lifetime's id never starts with it.
OPERATOR_OWNER_PREFIX = "operator:"


def operator_owned(owner: str | None) -> bool:
    """True when ``owner`` (a partition row's) is an operator, not a worker lifetime."""
    return owner is not None and owner.startswith(OPERATOR_OWNER_PREFIX)


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """A Kafka partition; the store's rows are keyed by (store.group_id, topic, partition)."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


@dataclass(frozen=True, slots=True)
class Token:
    """A fencing token: the epoch this lifetime installed and the next offset it expects."""

    epoch: int
    frontier: int


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One Kafka record as the handler sees it; a batch holds records of one partition, in
    offset order."""

    topic: str
    """The topic it was read from."""
    partition: int
    """Its partition."""
    offset: int
    """Its Kafka offset."""
    key: bytes | None
    """The key's bytes as produced; None without a key."""
    value: bytes | None
    """The value's bytes as produced; None for a tombstone."""
    headers: tuple[tuple[str, bytes | None], ...] = ()
    """The record's headers, (name, value) in order; a name may repeat."""
    timestamp_ms: int | None = None
    """Kafka's record timestamp (CreateTime or LogAppendTime), milliseconds since the epoch;
    None when the record has none."""

    @property
    def tp(self) -> TopicPartition:
        """Its topic and partition."""
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class Accept:
    """The record's effect was applied in the transaction."""


@dataclass(frozen=True, slots=True)
class Reject:
    """Quarantine the record with ``reason`` in the transaction that advances the frontier.

    The worker fills the ``error_*`` fields when it quarantines a poison record (the
    handler's exception type, message and a digest of its traceback)."""

    reason: str
    error_type: str | None = None
    error_message: str | None = None
    traceback_digest: str | None = None


Verdict = Accept | Reject
"""What a handler returns for each record, in order: ``ACCEPT`` or ``Reject(reason)``."""
ACCEPT = Accept()
"""The verdict of a record whose effect was applied (the one ``Accept`` value)."""


@dataclass(frozen=True, slots=True)
class SourceFacts:
    """What Kafka says about a partition now (topic identity and watermarks)."""

    topic_id: str | None
    low_watermark: int
    high_watermark: int


@dataclass(frozen=True, slots=True)
class SourceCheck:
    """Input of ``validate``: a partition and Kafka's current facts about it."""

    tp: TopicPartition
    facts: SourceFacts
    allow_retention_gap: bool = False


@dataclass(frozen=True, slots=True)
class Validation:
    """Reply of ``validate`` for one partition: ok (refusal is None) or a typed refusal."""

    tp: TopicPartition
    refusal: SourceRefused | None = field(default=None, compare=False)
    durable: Token | None = None
    gap_skipped_to: int | None = None

    @property
    def ok(self) -> bool:
        return self.refusal is None


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """Input of ``claim``: the partition, its frontier if new, and the topic id to record."""

    tp: TopicPartition
    initial_frontier: int
    topic_id: str | None = None


class Outcome(enum.Enum):
    """How a mutating store call ended (docs/ARCHITECTURE.md: commit-outcome classification)."""

    COMMITTED = "committed"
    NOT_COMMITTED = "not-committed"
    UNKNOWN = "outcome-unknown"
    FENCED = "fenced"
