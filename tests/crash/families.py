"""The crash matrix's families: what the killed process runs, which points it reaches, and
the oracle that judges the outcome.

Rules
- A worker family (``reference``, ``sink``, ``failures``, ``uncertain``) is run by
  ``tests.crash.cell``: worker A runs with the family's flags and source, is killed at the
  point, B drains with the same flags; the common verdict (``tests.crash.verdict``) plus
  the family's oracle.
- A tool family (``replay``, ``reset``) is run by ``tests.crash.tool_cell``: a worker drains
  the family's source, the operator tool is killed at its point inside its transaction,
  then run again, and the family's oracle judges.
- Each family lists the points its own code reaches. The worker points that sit before any
  effect (validate, claim, seek, heartbeat, gap skip, revoke, shutdown) are the same code
  whatever the handler, and the ``reference`` family covers them; ``sink`` and
  ``failures`` take the points where their effects are written, committed or counted; so does
  ``uncertain``, the failures family's outcome-uncertain variant (its own handler).
- Oracles are pure functions of rows read back (``tests.crash.oracles``); the source and
  its expected outcome come from a fixed seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fencing.crashpoints import POINTS, TOOL_POINTS
from tests.crash.plans import PLANS, PROTOCOLS, CellPlan

__all__ = ["FAILURES", "FAMILIES", "LANES", "REFERENCE", "REPLAY", "RESET", "SINK", "UNCERTAIN",
           "Family",
           "all_cells", "ci_cells", "family_of"]


@dataclass(frozen=True, slots=True)
class Family:
    """One row group of the matrix."""

    name: str
    plans: tuple[CellPlan, ...]
    tool: str = ""  # "": worker A is armed; else the operator tool armed ("replay"/"reset")
    summary: str = ""
    ci_points: Sequence[str] = field(default=())  # the make-test cells; () means every plan

    def plan(self, point: str) -> CellPlan:
        for p in self.plans:
            if p.point == point:
                return p
        raise KeyError(f"{self.name}: {point}")


_FAILURE_POINTS = ("in-handler", "after-commit", "after-attempt-count", "in-bisection-probe")

REFERENCE = Family("reference", PLANS, summary="the reference handler over a conflict source "
                   "(stale and skipped revisions, duplicates, malformed records)")
SINK = Family(
    "sink",
    tuple(p for p in PLANS if p.point in ("in-handler", "commit-in-flight", "after-commit",
                                          "after-kafka-commit")),
    summary="the table sink (--sink table=... --sink-key id): upserts on a bigint key, "
            "tombstones, records the table refuses",
    ci_points=("commit-in-flight",))
FAILURES = Family(
    "failures",
    (*(p for p in PLANS if p.point in _FAILURE_POINTS[:2]),
     CellPlan("after-attempt-count", "after-attempt-count"),
     CellPlan("in-bisection-probe", "in-bisection-probe")),
    summary="a handler failing transiently once per partition and on one poison record per "
            "partition: retries, attempt counts, bisection, quarantine",
    ci_points=("after-attempt-count",))
UNCERTAIN = Family(
    "uncertain",
    tuple(p for p in PLANS if p.point in _FAILURE_POINTS[:2]),
    summary="an outcome-uncertain handler (an external call per record before its "
            "transaction): each batch preceded by its durable intent",
    ci_points=("in-handler",))
LANES = Family(
    "lanes",
    tuple(p for p in PLANS if p.point in ("after-claim", "after-seek", "in-handler",
                                          "commit-in-flight", "after-commit",
                                          "after-kafka-commit", "in-revoke", "in-shutdown",
                                          "zombie")),
    summary="the reference handler in 8 key-ordered lanes per partition (--lanes 8): lane "
            "transactions side by side under each partition's epoch, the completion set; "
            "every point a worker with lanes reaches (the failure path's, the gap-skip's "
            "and the tools' have families of their own)",
    ci_points=("in-handler",))
REPLAY = Family("replay", (CellPlan("in-replay", "in-replay"),), tool="replay",
                summary="fencectl quarantine replay of two poison records: one fixed by the "
                        "operator's handler, one still failing")
RESET = Family("reset", (CellPlan("in-reset", "in-reset"),), tool="reset",
               summary="fencectl reset frontier back on a drained partition with its owner "
                       "running")
FAMILIES = (REFERENCE, SINK, FAILURES, UNCERTAIN, LANES, REPLAY, RESET)


def family_of(name: str) -> Family:
    return next(f for f in FAMILIES if f.name == name)


def all_cells() -> list[tuple[str, str, str]]:
    """Every (family, point, protocol)."""
    return [(f.name, p.point, g) for f in FAMILIES for p in f.plans for g in PROTOCOLS]


def ci_cells() -> list[tuple[str, str, str]]:
    """``make test``: the reference family's every point under one protocol, rotating by
    point; one cell of every other family, its protocol rotating by family."""
    out = [("reference", p.point, PROTOCOLS[i % len(PROTOCOLS)])
           for i, p in enumerate(REFERENCE.plans)]
    for i, f in enumerate(FAMILIES[1:]):
        point = f.ci_points[0] if f.ci_points else f.plans[0].point
        out.append((f.name, point, PROTOCOLS[i % len(PROTOCOLS)]))
    return out


_REACHED = {p.arm.partition("@")[0] for f in FAMILIES for p in f.plans}
assert _REACHED >= set(POINTS), f"a point no family reaches: {set(POINTS) - _REACHED}"
assert _REACHED - set(POINTS) <= set(TOOL_POINTS), "a plan arms an unknown point"
