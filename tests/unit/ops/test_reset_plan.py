"""ops.operator.reset_plan:
every operator action bumps the epoch and refuses what does not apply."""

from __future__ import annotations

import pytest

from fencing.types import SourceFacts, TopicPartition
from ops.operator.reset_plan import (
    Action,
    Current,
    ResetRefused,
    check_operation_id,
    journal_detail,
    journal_prefix,
    operation_id,
    plan_reset,
)

TP = TopicPartition("orders", 1)
ROW = Current(TP, epoch=7, frontier=40, owner="lt-x", topic_id="id-old")


def test_frontier_moves_and_fences() -> None:
    plan = plan_reset(ROW, Action.FRONTIER, facts=SourceFacts("id-old", 0, 100), to_offset=10,
                      reason="replay after bug fix")
    assert (plan.old_epoch, plan.new_epoch, plan.new_frontier) == (7, 8, 10)
    assert plan.fenced_owner == "lt-x" and plan.journal_event == "reset"
    assert plan.new_topic_id == "id-old" and "replay after bug fix" in plan.detail
    assert plan_reset(ROW, Action.FRONTIER, facts=None, to_offset=500).new_frontier == 500


@pytest.mark.parametrize("to_offset", [None, -1, 101])
def test_frontier_refuses_bad_offsets(to_offset: int | None) -> None:
    with pytest.raises(ResetRefused):
        plan_reset(ROW, Action.FRONTIER, facts=SourceFacts("id-old", 0, 100), to_offset=to_offset)


def test_accept_gap_moves_to_the_low_watermark_only_when_there_is_a_gap() -> None:
    plan = plan_reset(ROW, Action.ACCEPT_GAP, facts=SourceFacts("id-old", 55, 100))
    assert (plan.new_frontier, plan.new_epoch, plan.journal_event) == (55, 8, "gap-skip")
    with pytest.raises(ResetRefused, match="no retention gap"):
        plan_reset(ROW, Action.ACCEPT_GAP, facts=SourceFacts("id-old", 40, 100))
    with pytest.raises(ResetRefused):
        plan_reset(ROW, Action.ACCEPT_GAP, facts=None)


@pytest.mark.parametrize(("where", "frontier"), [("earliest", 3), ("latest", 9), ("keep", 40)])
def test_adopt_topic_records_the_new_id(where: str, frontier: int) -> None:
    plan = plan_reset(ROW, Action.ADOPT_TOPIC, facts=SourceFacts("id-new", 3, 9),
                      adopt_frontier=where)
    assert (plan.new_topic_id, plan.new_frontier, plan.new_epoch) == ("id-new", frontier, 8)
    assert plan.journal_event == "adopt" and "id-old -> id-new" in plan.detail


def test_adopt_refuses_same_id_and_unknown_choice() -> None:
    with pytest.raises(ResetRefused, match="already"):
        plan_reset(ROW, Action.ADOPT_TOPIC, facts=SourceFacts("id-old", 0, 1))
    with pytest.raises(ResetRefused):
        plan_reset(ROW, Action.ADOPT_TOPIC, facts=SourceFacts("id-new", 0, 1),
                   adopt_frontier="middle")


def test_expect_epoch_guards_against_a_moved_partition() -> None:
    with pytest.raises(ResetRefused, match="moved"):
        plan_reset(ROW, Action.FRONTIER, facts=None, to_offset=1, expect_epoch=6)
    assert plan_reset(ROW, Action.FRONTIER, facts=None, to_offset=1, expect_epoch=7).new_epoch == 8


def test_the_operation_id_is_the_request_not_its_reason_or_expectation() -> None:
    def op(action: Action = Action.FRONTIER, group: str = "g", partition: int | None = 1,
           to_offset: int | None = 10, adopt_frontier: str | None = None) -> str:
        return operation_id(action, group=group, topic="orders", partition=partition,
                            to_offset=to_offset, adopt_frontier=adopt_frontier)

    first = op()
    assert first.startswith("reset-") and len(first) == len("reset-") + 12
    assert op() == first
    assert op(to_offset=11) != first
    assert op(partition=2) != first and op(partition=None) != first
    assert op(group="h") != first
    # what does not belong to an action does not change its id
    gap = op(Action.ACCEPT_GAP, to_offset=None)
    assert op(Action.ACCEPT_GAP, to_offset=5) == gap != first
    adopt = op(Action.ADOPT_TOPIC, adopt_frontier="earliest")
    assert op(Action.ADOPT_TOPIC, adopt_frontier="latest") != adopt


def test_operation_ids_given_by_the_operator_are_checked() -> None:
    assert check_operation_id("ticket-4711") == "ticket-4711"
    assert check_operation_id("INC.2026:01_a") == "INC.2026:01_a"
    for bad in ("", "-x", "a b", "a%", "x" * 65, "semi;colon"):
        with pytest.raises(ValueError, match="--operation-id"):
            check_operation_id(bad)


def test_the_journal_detail_starts_with_the_operation() -> None:
    detail = journal_detail("reset-abc", "frontier 5 -> 0: offsets 0..4 are processed again")
    assert detail.startswith(journal_prefix("reset-abc") + " frontier 5 -> 0")
    assert len(journal_detail("reset-abc", "x" * 5000)) == 1000
