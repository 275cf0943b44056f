"""One plan per crash point: how worker A is armed, what brings it to the point, what the
cell checks beyond the common assertions.

Rules
- Every point of ``fencing.crashpoints.POINTS`` but ``FAILURE_ONLY`` has a plan (the
  ``reference`` family's rows, ``tests.crash.families``), plus ``zombie`` (the in-handler
  place with SIGSTOP instead of SIGKILL: ownership moves by session expiry while A is frozen,
  then A is continued and must write nothing). ``tests/crash/test_verdict.py`` pins that.
- ``Trigger.NONE``: A reaches the point on its own. ``JOIN``: once A committed something, the
  successor joins the group while A lives (the rebalance revokes from A). ``SIGTERM``: once A
  committed something, it is asked to stop. ``ZOMBIE``: the successor starts while A is
  frozen at the point; A is continued once the successor drained.
- ``three_node_cells()``: the column on the three-node cluster (the group's coordinator
  SIGKILLed at the crash point) for ``THREE_NODE_POINTS`` (reference family), rotating the
  protocol by point.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from fencing.crashpoints import POINTS

__all__ = ["FAILURE_ONLY", "PLANS", "PROTOCOLS", "THREE_NODE_POINTS", "CellPlan", "Trigger",
           "plan_for", "three_node_cells"]

PROTOCOLS = ("eager-range", "cooperative-sticky", "kip848-consumer")
#: points only a failing handler reaches: their plans are the ``failures`` family's
#: (``tests.crash.families``)
FAILURE_ONLY = frozenset({"after-attempt-count", "in-bisection-probe"})


class Trigger(enum.Enum):
    NONE = "none"
    JOIN = "join"
    SIGTERM = "sigterm"
    ZOMBIE = "zombie"


@dataclass(frozen=True, slots=True)
class CellPlan:
    """How one row of the matrix is driven."""

    point: str  # the row name
    arm: str  # FENCE_CRASH_AT
    signal_name: str = "KILL"
    trigger: Trigger = Trigger.NONE
    a_extra: tuple[str, ...] = ()  # extra `fencectl run` flags of A
    a_env: tuple[tuple[str, str], ...] = ()
    hold_commit_reply: bool = False  # A's PostgreSQL traffic through the proxy holding COMMIT
    retention_gap: bool = False  # records deleted below a pre-existing frontier of 0
    batch_state: str = ""  # "durable" / "not-durable": the marker's batch after A's death


_SLOW = ("--handler", "tests.integration.handlers:slow_handler")

PLANS: tuple[CellPlan, ...] = (
    CellPlan("after-validate", "after-validate"),
    CellPlan("after-claim", "after-claim"),
    CellPlan("after-seek", "after-seek"),
    CellPlan("in-handler", "in-handler@3", batch_state="not-durable"),
    CellPlan("commit-in-flight", "commit-in-flight", hold_commit_reply=True,
             batch_state="durable"),
    CellPlan("after-commit", "after-commit@3", batch_state="durable"),
    CellPlan("after-kafka-commit", "after-kafka-commit@2"),
    CellPlan("in-revoke", "in-revoke", trigger=Trigger.JOIN, a_extra=_SLOW,
             a_env=(("FENCE_TEST_BATCH_DELAY_S", "0.3"),)),
    CellPlan("in-gap-skip", "in-gap-skip", retention_gap=True),
    CellPlan("in-heartbeat", "in-heartbeat@6", a_extra=(*_SLOW, "--heartbeat-interval-s", "0.5"),
             a_env=(("FENCE_TEST_BATCH_DELAY_S", "0.2"),)),
    CellPlan("in-shutdown", "in-shutdown", trigger=Trigger.SIGTERM, a_extra=_SLOW,
             a_env=(("FENCE_TEST_BATCH_DELAY_S", "0.3"),)),
    # several batches in flight: A's frozen batch is idle in transaction (ended by
    # idle_in_transaction_session_timeout), a sibling may freeze mid extended-protocol
    # exchange ('active', ClientRead: no PostgreSQL 15 timeout ends it) -- B's claim ends
    # such a blocking session after unblock_after_s (fencing.postgres.store)
    CellPlan("zombie", "in-handler@3", signal_name="STOP", trigger=Trigger.ZOMBIE,
             a_extra=("--db-idle-in-transaction-timeout-s", "2"),
             batch_state="not-durable"),
)


def plan_for(point: str) -> CellPlan:
    for plan in PLANS:
        if plan.point == point:
            return plan
    raise KeyError(point)


#: the points of the three-node column: the claim, the COMMIT in flight, the Kafka commit
THREE_NODE_POINTS = ("after-claim", "commit-in-flight", "after-kafka-commit")


def three_node_cells() -> list[tuple[str, str]]:
    """Each three-node point under one protocol, rotating by point."""
    return [(p, PROTOCOLS[i % len(PROTOCOLS)]) for i, p in enumerate(THREE_NODE_POINTS)]



assert {p.arm.partition("@")[0] for p in PLANS} == set(POINTS) - FAILURE_ONLY, \
    "a point without a plan"
