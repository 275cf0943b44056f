"""The crash-cell verdict as a table of cases (pure; no services), and the plan and report
shapes the matrix relies on."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fencing.crashpoints import POINTS, TOOL_POINTS
from tests.crash.cell import CellResult
from tests.crash.facts import (
    AuditRow,
    CellFacts,
    JournalRow,
    Marker,
    MemberRow,
    PartitionRow,
    QuarantineRow,
)
from tests.crash.families import FAMILIES, REFERENCE, all_cells, ci_cells
from tests.crash.plans import FAILURE_ONLY, PLANS, PROTOCOLS, plan_for
from tests.crash.report import distribution, render
from tests.crash.verdict import judge

T = 1000.0  # A's marker
A, B = "lt-a", "lt-b"


def _facts(**over: object) -> CellFacts:
    base = CellFacts(
        markers=(Marker("after-commit", 3, 11, T, "KILL",
                        {"partition": "t[0]", "epoch": 1, "batch_end": 80}),),
        a_pid=11, b_pid=22, a_exit=-9, a_stopped_at_marker=False, b_exit=0,
        at_death=(PartitionRow(0, 1, 80, A), PartitionRow(1, 1, 40, A)),
        final=(PartitionRow(0, 2, 100, B), PartitionRow(1, 2, 100, B)),
        high_watermarks={0: 100, 1: 100},
        audit=(AuditRow(0, 1, 40, 80, A, T - 1), AuditRow(0, 2, 80, 80, B, T + 1),
               AuditRow(1, 2, 40, 40, B, T + 1), AuditRow(0, 2, 80, 100, B, T + 2.5),
               AuditRow(1, 2, 40, 100, B, T + 3)),
        journal=(JournalRow(0, "claim", 1, A, T - 5), JournalRow(1, "claim", 1, A, T - 5),
                 JournalRow(0, "claim", 2, B, T + 1), JournalRow(1, "claim", 2, B, T + 1)),
        quarantine=(QuarantineRow(0, 5, 1, T - 2), QuarantineRow(0, 90, 2, T + 2.5)),
        members=(MemberRow(A, 11, "running", T - 0.5), MemberRow(B, 22, "stopped", T + 9)),
    )
    return replace(base, **over)  # type: ignore[arg-type]


def test_a_clean_cell_passes_with_its_recovery_time() -> None:
    v = judge(plan_for("after-commit"), _facts())
    assert v.passed, v.problems
    assert v.recovery_s == pytest.approx(2.5) and v.a_lifetimes == (A,)


@pytest.mark.parametrize(("over", "problem"), [
    ({"markers": ()}, "never fired"),
    ({"a_exit": 3}, "expected -9"),
    ({"b_exit": 1}, "successor B ended with 1"),
    ({"oracle_problems": ("documents differ",)}, "oracle: documents differ"),
    ({"final": (PartitionRow(0, 2, 100, B), PartitionRow(1, 2, 99, B))},
     "frontier 99, high watermark 100"),
    ({"audit": (AuditRow(0, 1, 80, 90, A, T + 0.1),)}, "A wrote after its marker"),
    ({"quarantine": (QuarantineRow(0, 85, 1, T + 0.1),)}, "quarantine 0@85"),
    ({"members": (MemberRow(A, 11, "stopped", T + 0.2), MemberRow(B, 22, "stopped", T + 9))},
     "member heartbeat"),
    ({"at_death": (PartitionRow(0, 1, 40, A), PartitionRow(1, 1, 40, A))}, "not durable"),
])
def test_each_broken_rule_is_a_problem(over: dict[str, object], problem: str) -> None:
    v = judge(plan_for("after-commit"), _facts(**over))
    assert any(problem in p for p in v.problems), v.problems


def test_a_heartbeat_in_flight_at_the_kill_is_bookkeeping() -> None:
    """The member row's time is the server's start of the upsert: a heartbeat sent before
    the SIGKILL may start after the marker (the ``stopping`` row at ``in-shutdown``)."""
    members = (MemberRow(A, 11, "stopping", T + 0.02), MemberRow(B, 22, "stopped", T + 9))
    v = judge(plan_for("after-commit"), _facts(members=members))
    assert v.passed, v.problems
    assert v.bookkeeping == (f"member row {A} state stopping in flight at the kill",)


def test_claims_must_strictly_increase() -> None:
    journal = (JournalRow(0, "claim", 2, A, T - 5), JournalRow(0, "claim", 2, B, T + 1),
               JournalRow(1, "claim", 2, B, T + 1))
    v = judge(plan_for("after-validate"), _facts(
        journal=journal, markers=(Marker("after-validate", 1, 11, T, "KILL", {}),)))
    assert any("not strictly increasing" in p for p in v.problems), v.problems


def test_the_continued_zombie_may_only_write_its_own_bookkeeping() -> None:
    zombie = plan_for("zombie")
    marker = Marker("in-handler", 3, 11, T, "STOP",
                    {"partition": "t[0]", "epoch": 1, "frontier": 80, "batch_end": 120})
    facts = _facts(markers=(marker,), a_exit=3, a_stopped_at_marker=True,
                   members=(MemberRow(A, 11, "retired", T + 20), MemberRow(B, 22, "stopped",
                                                                           T + 30)))
    v = judge(zombie, facts)
    assert v.passed, v.problems
    assert v.bookkeeping == (f"member row {A} state retired",)
    late_claim = (*facts.journal, JournalRow(0, "claim", 3, A, T + 21))
    assert any("journal claim" in p for p in judge(zombie, replace(
        facts, journal=late_claim)).problems)
    assert any("was not frozen" in p for p in judge(zombie, replace(
        facts, a_stopped_at_marker=False)).problems)


def test_every_point_has_a_family_and_ci_rotates_protocols() -> None:
    reached = {p.arm.partition("@")[0] for f in FAMILIES for p in f.plans}
    assert reached == set(POINTS) | {"in-replay", "in-reset"}
    assert {"in-replay", "in-reset"} <= set(TOOL_POINTS)
    assert {p.arm.partition("@")[0] for p in PLANS} == set(POINTS) - FAILURE_ONLY
    assert len(all_cells()) == sum(len(f.plans) for f in FAMILIES) * 3
    ci = ci_cells()
    reference = [(p, g) for f, p, g in ci if f == REFERENCE.name]
    assert [p for p, _ in reference] == [p.point for p in PLANS]
    assert {g for _, g in reference} == set(PROTOCOLS)
    others = [(f, g) for f, _p, g in ci if f != REFERENCE.name]  # one cell per other family
    assert [f for f, _ in others] == [f.name for f in FAMILIES[1:]]
    assert {g for _, g in others} == set(PROTOCOLS)


def test_render_and_distribution() -> None:
    results = [CellResult("after-claim", "eager-range", True, 2.0, ()),
               CellResult("after-claim", "kip848-consumer", True, 6.0, ()),
               CellResult("zombie", "eager-range", False, None, ("boom",), kept="x"),
               CellResult("in-reset", "cooperative-sticky", True, None, (), family="reset")]
    text = render(results)
    assert "| reference | after-claim | PASS 2.0s | - | PASS 6.0s |" in text
    assert "| reference | zombie | FAIL | - | - |" in text
    assert "FAIL reference zombie x eager-range (kept x): boom" in text
    assert "| reset | in-reset | - | PASS | - |" in text
    assert distribution(results) == {"count": 2, "min": 2.0, "median": 4.0, "p90": 6.0,
                                     "max": 6.0}


def _lane_marker(point: str, first: int, last: int) -> Marker:
    return Marker(point, 3, 11, T, "KILL", {"partition": "t[0]", "epoch": 1, "lane": True,
                                            "first_offset": first, "last_offset": last,
                                            "frontier": 40, "batch_end": last + 1})


@pytest.mark.parametrize(("point", "spans", "problem"), [
    ("after-commit", ((50, 52), (60, 61)), None),  # the lane's 52..61: both in spans
    ("after-commit", ((50, 52),), "is not durable"),
    ("in-handler", ((50, 51),), None),  # neither 52 nor 61 done
    ("in-handler", ((52, 52),), "should not be durable"),
    ("in-handler", ((60, 61),), "should not be durable"),
])
def test_a_lane_batch_is_judged_by_the_completion_set(point: str,
                                                      spans: tuple[tuple[int, int], ...],
                                                      problem: str | None) -> None:
    """A lanes family marker (``lane``): durable means its first and last records are in
    the completion set at A's death, not the partition row's frontier."""
    facts = _facts(markers=(_lane_marker(point, 52, 61),), lanes_at_death={0: (40, spans)})
    problems = [p for p in judge(plan_for(point), facts).problems if "lane batch" in p]
    assert (problems == []) if problem is None else (problem in problems[0]), problems
