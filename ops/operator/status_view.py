"""Pure views for ``fencectl status``: partition lag, owners and source notes.

Rules
- Member availability is ``ops.operator.member_view``'s (observed or unavailable).
- Lag is ``high watermark - durable frontier``, where a partition run in lanes resumes from
  its completion set's oldest unfinished offset (``fencing.lanes``; the ``lanes`` entry);
  None when Kafka did not answer, never negative: a frontier above the high watermark is
  reported as a note instead (the topic was recreated or truncated). A frontier below the
  low watermark is a retention gap note; a topic id that differs from the recorded one is a
  recreated-topic note.
- Kafka's committed offset of the group (the offset mirror, advisory) is shown beside the
  frontier: *in-sync* when equal, *converging* while it differs but the frontier moved
  within the bound (``--offset-mirror-warn-s``; the row's ``updated_at`` is when the
  frontier last moved), *mismatch* (flagged with a note) when it differs longer than that,
  *unknown* when Kafka did not answer. No committed offset at all differs too.
- A partition whose frontier offset has a durable attempt count is *retrying* (attempt n of
  m, the next retry's time) or a *suspect* being tried alone; the quarantined records are
  counted per partition and by cause (``fencing.failures.quarantine_cause``: rejected,
  raised, killed the process, outcome unknown, too slow), so a killer tells from a victim.
- A partition whose owner is an operator (``fencectl reset`` wrote the row last) shows
  OWNER-STATE ``operator`` and a note: no member has claimed it since the reset. A running
  owner claims it again at its next heartbeat; without one, the next member assigned
  it starts from the new frontier. Its offset-mirror note names the reset.
- Completeness: the owner's member row names its handler's declaration
  (``detail.handler``); a ``best-effort`` partition's frontier counts records attempted,
  not effects applied: ``completeness`` is ``not-claimed`` and a note says so (``unknown``
  without a member row naming it).
- A partition is *stalled* while its owner is observed and lists it in its member row's
  ``detail.stalled`` (``consumer.observability.stall``); OWNER-STATE then reads
  ``observed/running/stalled`` and a note says so.
- Lanes: the ``lanes`` entry of a partition with spans above its frontier, or whose
  observed owner runs lanes for it, has ``busy`` (the owner's busy lanes from its member
  row's ``detail.lanes_busy``; None when not reported) beside the completion set's figures.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fencing.lanes import Completion
from fencing.types import SourceFacts, operator_owned
from ops.operator.member_view import MemberView

__all__ = [
    "KafkaCommitted",
    "MirrorView",
    "PartitionRow",
    "PartitionView",
    "classify_mirror",
    "view_partition",
]

DEFAULT_MIRROR_WARN_S = 30.0


@dataclass(frozen=True, slots=True)
class PartitionRow:
    """One ``partitions`` row as read."""

    group_id: str
    topic: str
    partition: int
    epoch: int
    frontier: int
    owner: str | None
    topic_id: str | None
    updated_at: datetime
    quarantined: int = 0  # quarantine rows of the partition (rejects and poison records)
    attempts: int | None = None  # durable attempt count at the frontier (None: not failing)
    max_attempts: int | None = None
    next_retry_at: datetime | None = None  # None: not backing off (a suspect attempt)
    last_error: str | None = None
    alone: int | None = None  # of the attempts, those of the record alone (deaths blamed)
    quarantine_causes: Mapping[str, int] = field(default_factory=dict)  # cause -> records
    lane_spans: tuple[tuple[int, int], ...] = ()  # lanes' spans above the frontier


class MirrorView(enum.Enum):
    """Kafka's committed offset compared with the durable frontier (see Rules)."""

    IN_SYNC = "in-sync"
    CONVERGING = "converging"
    MISMATCH = "mismatch"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class KafkaCommitted:
    """Kafka answered: the group's committed offset of a partition (None: none committed)."""

    offset: int | None


def classify_mirror(frontier: int, committed: KafkaCommitted | None, *, updated_at: datetime,
                    now: datetime, bound_s: float) -> MirrorView:
    """Pure: how Kafka's committed offset stands against the frontier at ``now``."""
    if committed is None:
        return MirrorView.UNKNOWN
    if committed.offset == frontier:
        return MirrorView.IN_SYNC
    age_s = (now - updated_at).total_seconds()
    return MirrorView.MISMATCH if age_s > bound_s else MirrorView.CONVERGING


def _mirror_note(row: PartitionRow, committed: int | None, *, now: datetime,
                 bound_s: float) -> str:
    kafka = "no committed offset" if committed is None else f"committed offset {committed}"
    age_s = max(0.0, (now - row.updated_at).total_seconds())
    if operator_owned(row.owner):
        return (f"offset mirror: Kafka has {kafka} for this group; the frontier is "
                f"{row.frontier} since {row.owner}'s reset {age_s:.0f} s ago, which Kafka "
                "does not know of: the member that claims the partition next commits it")
    return (f"offset mirror: Kafka has {kafka} for this group, the frontier is {row.frontier} "
            f"and last moved {age_s:.0f} s ago (> {bound_s:g} s): Kafka's lag tools show a "
            "wrong lag. The owner commits the frontier when it is assigned the partition; "
            "check its log and fence_kafka_commits_failed_total")


def _failure_notes(row: PartitionRow) -> list[str]:
    notes = []
    if row.attempts is not None:
        error = f" (last error: {row.last_error})" if row.last_error else ""
        if row.next_retry_at is not None:
            notes.append(f"retrying offset {row.frontier}: attempt {row.attempts} of "
                         f"{row.max_attempts}, next retry at {row.next_retry_at.isoformat()}"
                         f"{error}")
        else:
            notes.append(f"suspect offset {row.frontier}: tried alone {row.alone or 0} time(s) "
                         f"of {row.max_attempts} before quarantine (earlier attempts alone did "
                         f"not complete: process deaths?){error}")
    if row.quarantined:
        causes = ", ".join(f"{n} {_CAUSE_TEXT.get(c, c)}"
                           for c, n in sorted(row.quarantine_causes.items()))
        notes.append(f"{row.quarantined} record(s) quarantined"
                     + (f": {causes}" if causes else ""))
    return notes


_CAUSE_TEXT = {"killed-the-process": "killed the process", "outcome-unknown": "outcome unknown",
               "too-slow": "too slow"}


def _completeness(owner: MemberView | None) -> tuple[str | None, str]:
    """The owner's declared durability and whether its frontier claims completeness."""
    declared = None if owner is None else owner.detail.get("handler")
    durability = declared.get("durability") if isinstance(declared, Mapping) else None
    if not isinstance(durability, str):
        return None, "unknown"
    return durability, "not-claimed" if durability == "best-effort" else "claimed"


@dataclass(frozen=True, slots=True)
class PartitionView:
    row: PartitionRow
    high_watermark: int | None
    low_watermark: int | None
    lag: int | None
    # the owner's member availability ("unknown": no member row; "operator": a reset's)
    owner_availability: str | None
    owner_state: str | None  # the owner's current state (None unless observed)
    notes: tuple[str, ...]
    stalled: bool = False  # its owner (observed now) reports it stalled
    kafka_committed: int | None = None  # the group's committed offset in Kafka
    mirror: MirrorView = MirrorView.UNKNOWN
    durability: str | None = None  # the owner's handler's (None: not known)
    completeness: str = "unknown"  # claimed | not-claimed (best-effort) | unknown
    lanes_busy: int | None = None  # its observed owner's busy lanes for it (None: none)

    def as_dict(self) -> dict[str, Any]:
        r = self.row
        return {
            "group": r.group_id, "topic": r.topic, "partition": r.partition,
            "owner": r.owner, "owner_availability": self.owner_availability,
            "owner_state": self.owner_state, "epoch": r.epoch, "frontier": r.frontier,
            "low_watermark": self.low_watermark, "high_watermark": self.high_watermark,
            "lag": self.lag, "topic_id": r.topic_id, "updated_at": r.updated_at.isoformat(),
            "kafka_committed": self.kafka_committed, "kafka_mirror": self.mirror.value,
            "stalled": self.stalled, "notes": list(self.notes),
            "durability": self.durability, "completeness": self.completeness,
            "quarantined": r.quarantined, "quarantine_causes": dict(r.quarantine_causes),
            "lanes": None if not r.lane_spans and self.lanes_busy is None else {
                **_lanes(r), "busy": self.lanes_busy},
            "retrying": None if r.attempts is None else {
                "offset": r.frontier, "attempt": r.attempts, "max_attempts": r.max_attempts,
                "alone": r.alone, "next_retry_at": None if r.next_retry_at is None
                else r.next_retry_at.isoformat(), "last_error": r.last_error},
        }


def _lanes(row: PartitionRow) -> dict[str, int]:
    """The lanes' completion set of a partition: the oldest offset not applied yet (where a
    successor resumes; Kafka's committed offset), how far the highest applied one runs
    ahead of it (what ``--lanes-window`` bounds) and how many spans are applied above it."""
    done = Completion.of(row.frontier, row.lane_spans)
    return {"oldest_unfinished": done.frontier, "window_used": done.above,
            "spans_above": sum(1 for a, _ in done.spans if a > done.frontier)}


def view_partition(
    row: PartitionRow, *, facts: SourceFacts | None, members: Mapping[str, MemberView],
    source_note: str | None = None, committed: KafkaCommitted | None = None,
    now: datetime | None = None, mirror_warn_s: float = DEFAULT_MIRROR_WARN_S,
) -> PartitionView:
    """Pure: lag and notes of one partition from Kafka's facts (None: Kafka did not answer)
    and the group's committed offset (None: not known; ``now`` is the database clock)."""
    notes: list[str] = [] if source_note is None else [source_note]
    lag: int | None = None
    resume = Completion.of(row.frontier, row.lane_spans).frontier  # lanes: past the row's
    if row.lane_spans:
        lanes = _lanes(row)
        notes.append(f"lanes: every record below {resume} applied (a successor and Kafka "
                     f"resume there; the row keeps {row.frontier} until a fold); "
                     f"{lanes['window_used']} offsets applied ahead in "
                     f"{lanes['spans_above']} spans")
    if facts is not None:
        lag = max(0, facts.high_watermark - resume)
        if row.frontier > facts.high_watermark:
            notes.append(f"frontier {row.frontier} is above the high watermark "
                         f"{facts.high_watermark}: topic recreated or truncated?")
        if row.frontier < facts.low_watermark:
            notes.append(f"retention gap: records {row.frontier}..{facts.low_watermark - 1} "
                         "were deleted unprocessed")
        if row.topic_id is not None and facts.topic_id is not None \
                and row.topic_id != facts.topic_id:
            notes.append(f"recreated topic: Kafka topic id {facts.topic_id}, recorded "
                         f"{row.topic_id}")
    owner = members.get(row.owner) if row.owner is not None else None
    owner_state = None if owner is None else owner.state
    if operator_owned(row.owner) and now is not None:
        age_s = max(0.0, (now - row.updated_at).total_seconds())
        notes.append(f"reset by {row.owner} {age_s:.0f} s ago (epoch {row.epoch}, frontier "
                     f"{row.frontier}): a running member assigned this partition claims it again "
                     "at its next heartbeat and continues from the frontier; with no "
                     "member running, the next one assigned it starts there")
    stalled = (owner is not None and owner.state is not None
               and f"{row.topic}[{row.partition}]" in (owner.detail.get("stalled") or ()))
    busy = None if owner is None or owner.state is None else (
        owner.detail.get("lanes_busy") or {}).get(f"{row.topic}[{row.partition}]")
    if stalled:
        owner_state = f"{owner_state}/stalled"
        notes.append("stalled: its owner reports lag and no fetch or commit progress for "
                     "--stall-timeout-s (see the owner's /readyz and log)")
    notes += _failure_notes(row)
    durability, completeness = _completeness(owner)
    if completeness == "not-claimed":
        notes.append("best-effort handler: the frontier counts records attempted, not "
                     "effects applied (they may have been dropped); completeness is not "
                     "claimed")
    mirror = classify_mirror(resume, committed, updated_at=row.updated_at,
                             now=row.updated_at if now is None else now, bound_s=mirror_warn_s)
    if mirror is MirrorView.MISMATCH and committed is not None and now is not None:
        notes.append(_mirror_note(row, committed.offset, now=now, bound_s=mirror_warn_s))
    return PartitionView(
        row=row,
        high_watermark=None if facts is None else facts.high_watermark,
        low_watermark=None if facts is None else facts.low_watermark,
        lag=lag,
        owner_availability=None if row.owner is None else (
            "operator" if operator_owned(row.owner) else
            "unknown" if owner is None else owner.availability.value),
        owner_state=owner_state,
        stalled=stalled,
        notes=tuple(notes),
        kafka_committed=None if committed is None else committed.offset,
        mirror=mirror,
        durability=durability,
        completeness=completeness,
        lanes_busy=busy if isinstance(busy, int) else None,
    )
