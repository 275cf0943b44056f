"""Pure decisions about tokens, unknown outcomes ("Resolving unknown outcomes" in
docs/ARCHITECTURE.md), source validation and batches; both stores use them.

Rules
- Unknown process commit, re-read ``observed``:
  same epoch and frontier == batch end  -> COMMITTED (advance the local frontier);
  same epoch and the original frontier  -> NOT_COMMITTED (retry the same batch);
  anything else (other epoch, other frontier, no row) -> FENCED (the lifetime retires).
- Unknown lane commit (``fencing.lanes``), re-read ``observed`` (the completion set): no row
  or another epoch -> FENCED; every record of the lane's batch done -> COMMITTED; none done ->
  NOT_COMMITTED (retry the same batch); some done -> None (one transaction cannot do that).
- A claim's reply is compatible only when the epoch is positive and the frontier is
  not negative; reading an epoch never proves this caller installed it.
- ``decide_validation``: no row -> ok; a recorded topic id other than Kafka's ->
  ``RecreatedTopic``; a durable frontier below the low watermark -> ``RetentionGap``, or
  ok with ``gap_skipped_to`` when the check allows it.
- ``batch_end``: a batch is non-empty, of one partition, with offsets strictly increasing
  from the frontier; its end is the last offset + 1.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from fencing.errors import RecreatedTopic, RetentionGap
from fencing.lanes import Completion
from fencing.types import SourceCheck, SourceRecord, Token, TopicPartition, Validation

__all__ = ["Resolution", "batch_end", "compatible_claim", "decide_validation", "resolve_lane",
           "resolve_process"]


class Resolution(enum.Enum):
    COMMITTED = "committed"
    NOT_COMMITTED = "not-committed"
    FENCED = "fenced"


def resolve_process(*, sent: Token, batch_end: int, observed: Token | None) -> Resolution:
    """Classify an unknown process commit from the re-read token."""
    if batch_end <= sent.frontier:
        raise ValueError(f"batch end {batch_end} must be above the sent frontier {sent.frontier}")
    if observed is None or observed.epoch != sent.epoch:
        return Resolution.FENCED
    if observed.frontier == batch_end:
        return Resolution.COMMITTED
    if observed.frontier == sent.frontier:
        return Resolution.NOT_COMMITTED
    return Resolution.FENCED


def resolve_lane(*, sent: Token, offsets: Sequence[int],
                 observed: Completion | None) -> Resolution | None:
    """Classify an unknown lane commit from the re-read completion set (see the Rules)."""
    if not offsets:
        raise ValueError("a lane batch has at least one record")
    if observed is None or observed.epoch != sent.epoch:
        return Resolution.FENCED
    done = [observed.done(o) for o in offsets]
    if all(done):
        return Resolution.COMMITTED
    if not any(done):
        return Resolution.NOT_COMMITTED
    return None


def compatible_claim(claimed: Token, previous: Token | None) -> bool:
    """True when a claim's reply can be retained: a fresh epoch above any previous one."""
    if claimed.epoch < 1 or claimed.frontier < 0:
        return False
    return previous is None or claimed.epoch > previous.epoch


def decide_validation(check: SourceCheck, row: tuple[int, int, str | None] | None) -> Validation:
    """Validate one partition from its durable row ``(epoch, frontier, topic_id)``, or None."""
    if row is None:
        return Validation(check.tp)
    epoch, frontier, topic_id = row
    durable = Token(epoch, frontier)
    facts = check.facts
    if topic_id is not None and facts.topic_id is not None and topic_id != facts.topic_id:
        return Validation(check.tp, RecreatedTopic(
            f"{check.tp}: topic id is {facts.topic_id}, the fence recorded {topic_id}: the "
            "topic was recreated; choose where it restarts with `fencectl reset adopt-topic`"),
            durable)
    if frontier < facts.low_watermark:
        if check.allow_retention_gap:
            return Validation(check.tp, None, durable, gap_skipped_to=facts.low_watermark)
        return Validation(check.tp, RetentionGap(
            f"{check.tp}: durable frontier {frontier} is below the low watermark "
            f"{facts.low_watermark}: {facts.low_watermark - frontier} records were deleted "
            "unprocessed; re-produce them, or accept the loss with `fencectl reset accept-gap` "
            "(or run with --allow-retention-gap)"), durable)
    return Validation(check.tp, None, durable)


def batch_end(tp: TopicPartition, token: Token, records: Sequence[SourceRecord]) -> int:
    """The frontier after ``records``: last offset + 1. Raises ``ValueError`` for an empty
    batch, a record of another partition, or offsets not strictly above the frontier."""
    if not records:
        raise ValueError(f"process {tp}: empty batch")
    prev = token.frontier - 1
    topic, partition = tp.topic, tp.partition
    for r in records:  # hot path: no TopicPartition per record
        if r.offset <= prev or r.partition != partition or r.topic != topic:
            raise ValueError(f"process {tp}: record {r.tp}@{r.offset} out of order or below "
                             f"the frontier {token.frontier}")
        prev = r.offset
    return prev + 1
