"""Pure plans for ``fencectl reset``: the operator's recovery actions on fence rows.

Rules
- Every action bumps the partition's epoch by one, so the current owner's token no longer
  matches, and the owner becomes the operator (``operator:<user>@<host>``). A running owner
  finds out at its next commit or heartbeat and claims the partition again from the new
  frontier (``consumer.lifecycle.Lifecycle.reclaim``); it does not retire.
- The plan's ``detail`` says what it does in words (``frontier 5 -> 0: offsets 0..4 are
  processed again``); it is printed and journaled.
- ``frontier``: move the durable frontier to ``to_offset`` (backwards re-applies effects,
  forwards skips records; both are the operator's decision).
- ``accept-gap``: move a frontier that is below Kafka's low watermark up to it; refused when
  there is no gap.
- ``adopt-topic``: record Kafka's current topic id (the topic was recreated) and restart the
  frontier at the new topic's low watermark (``earliest``), high watermark (``latest``) or
  keep it (``keep``); refused when the ids already match.
- ``expect_epoch`` (optional) refuses the plan when the row moved since the operator looked.
- A refusal is ``ResetRefused`` with a message saying why; nothing is written.
- Every reset is one operation with an id (``operation_id``: by default a digest of the
  request -- action, group, topic, partition, target -- so running the same command again
  is the same operation; ``--operation-id`` names another). The id is journaled at the
  start of each partition's detail (``journal_detail``); a reset whose id the journal
  already holds for the group and topic is refused as applied (``ResetApplied``), never
  applied twice.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from dataclasses import dataclass

from fencing.errors import FenceError
from fencing.types import SourceFacts, TopicPartition
from ops.hints import fencectl

__all__ = [
    "Action",
    "Current",
    "Plan",
    "ResetApplied",
    "ResetRefused",
    "check_operation_id",
    "describe",
    "journal_detail",
    "journal_prefix",
    "operation_id",
    "plan_reset",
]

DETAIL_MAX = 1000
_OPERATION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")


class ResetRefused(FenceError):
    """The requested reset does not apply to the partition as it is now (the operator's call)."""


class ResetApplied(ResetRefused):
    """The operation is already in the journal: it was applied (a re-run is refused)."""


class Action(enum.Enum):
    FRONTIER = "frontier"
    ACCEPT_GAP = "accept-gap"
    ADOPT_TOPIC = "adopt-topic"


JOURNAL_EVENT = {Action.FRONTIER: "reset", Action.ACCEPT_GAP: "gap-skip",
                 Action.ADOPT_TOPIC: "adopt"}


@dataclass(frozen=True, slots=True)
class Current:
    """The locked partition row."""

    tp: TopicPartition
    epoch: int
    frontier: int
    owner: str | None
    topic_id: str | None


@dataclass(frozen=True, slots=True)
class Plan:
    tp: TopicPartition
    action: Action
    old_epoch: int
    new_epoch: int
    old_frontier: int
    new_frontier: int
    old_topic_id: str | None
    new_topic_id: str | None
    fenced_owner: str | None
    detail: str

    @property
    def journal_event(self) -> str:
        return JOURNAL_EVENT[self.action]

    def as_dict(self) -> dict[str, object]:
        return {"topic": self.tp.topic, "partition": self.tp.partition,
                "action": self.action.value, "epoch": [self.old_epoch, self.new_epoch],
                "frontier": [self.old_frontier, self.new_frontier],
                "topic_id": [self.old_topic_id, self.new_topic_id],
                "fenced_owner": self.fenced_owner, "detail": self.detail}


def operation_id(action: Action, *, group: str, topic: str, partition: int | None,
                 to_offset: int | None = None, adopt_frontier: str | None = None) -> str:
    """Pure: the default id of a reset, a digest of what it asks for (the same command is
    the same operation; ``--reason`` and ``--expect-epoch`` are not part of it)."""
    request = [action.value, group, topic, partition,
               to_offset if action is Action.FRONTIER else None,
               adopt_frontier if action is Action.ADOPT_TOPIC else None]
    digest = hashlib.sha256(json.dumps(request, separators=(",", ":")).encode()).hexdigest()
    return f"reset-{digest[:12]}"


def check_operation_id(text: str) -> str:
    """``text`` when it is a usable operation id; ``ValueError`` saying what is allowed."""
    if not _OPERATION_ID.match(text):
        raise ValueError(f"--operation-id {text!r}: use 1-64 letters, digits, '.', '_', ':' or "
                         "'-', starting with a letter or digit")
    return text


def journal_detail(operation: str, detail: str) -> str:
    """The journal row's detail: the operation id first, then what the plan does."""
    return f"{journal_prefix(operation)} {detail}"[:DETAIL_MAX]


def journal_prefix(operation: str) -> str:
    """What a journal row of ``operation`` starts with (``journal_detail``)."""
    return f"operation {operation}:"


def _moved(old: int, new: int) -> str:
    if new < old:
        return f"frontier {old} -> {new}: offsets {new}..{old - 1} are processed again"
    if new > old:
        return f"frontier {old} -> {new}: offsets {old}..{new - 1} are skipped"
    return f"frontier stays at {old}"


def describe(action: Action, old_frontier: int, new_frontier: int, old_topic_id: str | None,
             new_topic_id: str | None) -> str:
    """Pure: what a plan does, in words (printed and journaled)."""
    if action is Action.ACCEPT_GAP:
        return (f"accepts the retention gap: frontier {old_frontier} -> {new_frontier} "
                f"(offsets {old_frontier}..{new_frontier - 1} were deleted unprocessed)")
    if action is Action.ADOPT_TOPIC:
        return (f"adopts the recreated topic (id {old_topic_id} -> {new_topic_id}); "
                f"{_moved(old_frontier, new_frontier)}")
    return _moved(old_frontier, new_frontier)


def plan_reset(
    current: Current,
    action: Action,
    *,
    facts: SourceFacts | None,
    to_offset: int | None = None,
    adopt_frontier: str = "earliest",
    expect_epoch: int | None = None,
    reason: str = "",
) -> Plan:
    """The new row for ``action``; raises ``ResetRefused`` when it does not apply."""
    tp = current.tp
    if expect_epoch is not None and expect_epoch != current.epoch:
        raise ResetRefused(f"{tp}: epoch is {current.epoch}, not the expected {expect_epoch}: "
                           f"the partition moved; look again ({fencectl()} status)")
    new_frontier, new_topic_id = current.frontier, current.topic_id
    if action is Action.FRONTIER:
        if to_offset is None or to_offset < 0:
            raise ResetRefused(f"{tp}: --to-offset must be a non-negative offset")
        if facts is not None and to_offset > facts.high_watermark:
            raise ResetRefused(f"{tp}: offset {to_offset} is above the high watermark "
                               f"{facts.high_watermark}")
        new_frontier = to_offset
    elif action is Action.ACCEPT_GAP:
        if facts is None:
            raise ResetRefused(f"{tp}: Kafka's low watermark is needed to accept a gap")
        if current.frontier >= facts.low_watermark:
            raise ResetRefused(f"{tp}: no retention gap (frontier {current.frontier}, low "
                               f"watermark {facts.low_watermark})")
        new_frontier = facts.low_watermark
    else:
        if facts is None or facts.topic_id is None:
            raise ResetRefused(f"{tp}: Kafka's topic id is needed to adopt a recreated topic")
        if facts.topic_id == current.topic_id:
            raise ResetRefused(f"{tp}: topic id {facts.topic_id} is already the recorded one")
        new_topic_id = facts.topic_id
        choices = {"earliest": facts.low_watermark, "latest": facts.high_watermark,
                   "keep": current.frontier}
        if adopt_frontier not in choices:
            raise ResetRefused(f"--frontier {adopt_frontier!r}: use earliest, latest or keep")
        new_frontier = choices[adopt_frontier]
    detail = describe(action, current.frontier, new_frontier, current.topic_id, new_topic_id)
    if reason:
        detail += f"; reason: {reason}"
    return Plan(tp=tp, action=action, old_epoch=current.epoch, new_epoch=current.epoch + 1,
                old_frontier=current.frontier, new_frontier=new_frontier,
                old_topic_id=current.topic_id, new_topic_id=new_topic_id,
                fenced_owner=current.owner, detail=detail[:DETAIL_MAX])
