"""The tool families' verdict (``tests.crash.tool_cell.judge_tool``) as cases: pure, no
services."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.crash.tool_cell import (
    PARTITIONS,
    RECORDS,
    REPLAY_POISON,
    RESET_TO,
    ToolFacts,
    judge_tool,
)

FIXED, BAD = REPLAY_POISON
HW = {p: RECORDS for p in range(PARTITIONS)}
ONCE = {(p, o): 1 for p in range(PARTITIONS) for o in range(RECORDS)}


def _replay(**over: object) -> ToolFacts:
    before = {k: n for k, n in ONCE.items() if k not in REPLAY_POISON}
    base = ToolFacts(
        markers=1, marker_point="in-replay", tool_exits=(-9, 1, 1), outputs=("", "", ""),
        w_exit=0, frontiers=HW, high_watermarks=HW, applied_at_death=before,
        applied={**before, FIXED: 1},
        quarantine_at_death={FIXED: ("quarantined", 0, "ValueError: x"),
                             BAD: ("quarantined", 0, "ValueError: y")},
        quarantine={FIXED: ("replayed", 1, "ValueError: x"),
                    BAD: ("quarantined", 2, "ValueError: y")},
        replay_journal=(f"offset={FIXED[1]} applied: ok", f"offset={BAD[1]} failed: y",
                        f"offset={BAD[1]} failed: y"))
    return replace(base, **over)  # type: ignore[arg-type]


def _reset(**over: object) -> ToolFacts:
    again = {k: n + (k[0] == 0 and k[1] >= RESET_TO) for k, n in ONCE.items()}
    base = ToolFacts(
        markers=1, marker_point="in-reset", tool_exits=(-9, 0, 1),
        outputs=("", "applied", "refused: already applied"), w_exit=0, frontiers=HW,
        high_watermarks=HW, applied_at_death=ONCE, applied=again, operation_rows_at_death=0,
        operation_rows=1, moves_back={0: 1})
    return replace(base, **over)  # type: ignore[arg-type]


def test_clean_tool_cells_pass() -> None:
    assert judge_tool("replay", _replay()) == []
    assert judge_tool("reset", _reset()) == []


@pytest.mark.parametrize(("over", "problem"), [
    ({"markers": 0, "marker_point": None}, "markers"),
    ({"tool_exits": (-9, 0, 1)}, "tool exits"),
    ({"applied": {**_replay().applied, FIXED: 2}}, "wrong number of times"),
    ({"applied_at_death": {**_replay().applied_at_death, FIXED: 1}}, "at the tool's death"),
    ({"quarantine": {FIXED: ("replayed", 2, "x"), BAD: ("quarantined", 2, "ValueError")}},
     "replayed once"),
    ({"quarantine": {FIXED: ("replayed", 1, "x"), BAD: ("replayed", 1, "ValueError")}},
     "still failing"),
    ({"replay_journal": (f"offset={FIXED[1]} applied: ok",) * 2}, "journal rows"),
    ({"w_exit": 3}, "worker W ended with 3"),
])
def test_each_broken_replay_rule_is_a_problem(over: dict[str, object], problem: str) -> None:
    assert any(problem in p for p in judge_tool("replay", _replay(**over)))


@pytest.mark.parametrize(("over", "problem"), [
    ({"operation_rows": 2}, "2 journal rows of the operation"),
    ({"operation_rows_at_death": 1}, "not committed"),
    ({"moves_back": {0: 2}}, "moved back"),
    ({"applied": ONCE}, "wrong number of times"),
    ({"outputs": ("", "applied", "refused: the partition moved")}, "already applied"),
    ({"frontiers": {**HW, 0: RESET_TO}}, "frontiers"),
])
def test_each_broken_reset_rule_is_a_problem(over: dict[str, object], problem: str) -> None:
    assert any(problem in p for p in judge_tool("reset", _reset(**over)))
