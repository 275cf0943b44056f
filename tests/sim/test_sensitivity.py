"""The simulator's checks are sensitive: each deliberately broken rule (monkeypatched for
one test only) turns a passing hand-written trace into ERROR with the expected violation."""

from __future__ import annotations

from typing import Any

import pytest

import consumer.decisions
import fencing.guarded
from fencing.memory.store import MemoryFenceStore
from fencing.resolution import Resolution
from tests.sim.simkit import fault, head, make, puts, run, step

REPLACED_BEFORE = [*head(), step("process", 1, 0, fault("process", 1, "commit", at="before",
                                                        replacement=2))]
UNKNOWN_ABORTED = [*head(), step("process", 1, 0, fault("process", 1, "unknown-aborted"))]
UNKNOWN_COMMITTED = [*head(), step("process", 1, 0, fault("process", 1, "unknown-committed")),
                     step("process", 1, 0)]
ZOMBIE_SEEK = [*head(), step("start", 2), step("assign", 2, 0), step("seek", 1, 0)]


def _no_fence(self: MemoryFenceStore, tp: Any, token: Any) -> Any:
    return self.rows[tp]


@pytest.mark.parametrize(("target", "name", "broken", "steps", "violation"), [
    (MemoryFenceStore, "_require", _no_fence, REPLACED_BEFORE, "stale token committed"),
    (fencing.guarded, "resolve_process", lambda **_: Resolution.COMMITTED, UNKNOWN_ABORTED,
     "lifetime 1 retains Token(epoch=1, frontier=2) for partition 0, durable "
     "Token(epoch=1, frontier=0)"),
    (fencing.guarded, "resolve_process", lambda **_: Resolution.NOT_COMMITTED,
     UNKNOWN_COMMITTED, "lifetime 1 was fenced under its own epoch 1"),
    (consumer.decisions, "seek_matches", lambda *_: True, ZOMBIE_SEEK,
     "seek by lifetime 1 returned 0 with token Token(epoch=1, frontier=0); durable "
     "Token(epoch=2, frontier=0)"),
])
def test_a_broken_rule_is_reported(monkeypatch: pytest.MonkeyPatch, target: Any, name: str,
                                   broken: Any, steps: Any, violation: str) -> None:
    trace = make(puts(0, [0, 1, 2]), steps, batch_max=2)
    healthy, _ = run(trace)
    assert healthy["violations"] == []
    monkeypatch.setattr(target, name, broken)
    report, _ = run(trace)
    assert report["status"] == "ERROR"
    assert any(violation in v for v in report["violations"]), report["violations"]
