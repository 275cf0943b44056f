"""Reducer regression test with a transparent synthetic failure predicate (production code
is not broken): "the trace still has a process step of lifetime 1 that selects a
process fault, and still stops lifetime 1"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ops.sim import dumps, make_trace, parse
from ops.sim.reduce import failure_of, reduce_trace, save_failure
from ops.sim.trace import Trace


def synthetic(trace: Trace) -> str | None:
    faulty = any(s.actor == "process" and s.worker == 1 and
                 any(f.operation.value == "process" for f in s.faults) for s in trace.steps)
    stops = any(s.actor == "stop" and s.worker == 1 for s in trace.steps)
    return "synthetic: lifetime 1 processed with a process fault and stopped" if (
        faulty and stops) else None


def _failing_seed() -> Trace:
    for seed in range(1, 400):
        trace = make_trace(seed, klass="conflict")
        if synthetic(trace):
            return trace
    raise AssertionError("no seed satisfies the synthetic predicate")


def test_reducer_shrinks_to_a_valid_fixed_point(tmp_path: Path, monkeypatch: Any) -> None:
    original = _failing_seed()
    reduced = reduce_trace(original, synthetic)
    assert synthetic(reduced) == synthetic(original)
    assert parse(dumps(reduced)) == reduced  # still a valid trace (lifetime dependencies)
    assert len(reduced.steps) < len(original.steps)
    # minimal: start of 1, whatever the kept steps need, one faulty process, one stop
    actors = [(s.actor, s.worker) for s in reduced.steps]
    assert actors[0] == ("start", 1) and ("stop", 1) in actors
    assert sum(len(s.faults) for s in reduced.steps) == 1
    assert reduce_trace(reduced, synthetic) == reduced  # fixed point
    monkeypatch.setenv("FENCE_ARTIFACT_DIR", str(tmp_path))
    commands = save_failure(original, synthetic, "worker-seed-x", cli=".venv/bin/fencectl")
    assert commands == [f".venv/bin/fencectl sim-worker --replay {tmp_path}/failures/"
                        "worker-seed-x.json",
                        f".venv/bin/fencectl sim-worker --replay {tmp_path}/failures/"
                        "worker-seed-x-reduced.json"]
    assert parse((tmp_path / "failures" / "worker-seed-x.json").read_text()) == original
    assert parse((tmp_path / "failures" / "worker-seed-x-reduced.json").read_text()) == reduced


def test_the_original_trace_is_saved_before_reduction_starts(tmp_path: Path,
                                                             monkeypatch: Any) -> None:
    original = _failing_seed()
    monkeypatch.setenv("FENCE_ARTIFACT_DIR", str(tmp_path))

    def crashing(trace: Trace) -> str | None:
        if trace != original:
            raise RuntimeError("the predicate crashed mid-reduction")
        return "failing"

    with pytest.raises(RuntimeError):
        save_failure(original, crashing, "worker-seed-y")
    assert parse((tmp_path / "failures" / "worker-seed-y.json").read_text()) == original
    assert not (tmp_path / "failures" / "worker-seed-y-reduced.json").exists()


def test_reducer_refuses_a_passing_trace() -> None:
    with pytest.raises(ValueError):
        reduce_trace(make_trace(1), lambda _t: None)


def _report(status: str, violation: str, *, allow_gap: bool = False) -> dict[str, Any]:
    return {"status": status, "violations": [violation] if violation else [],
            "diagnostics": [], "allow_retention_gap": allow_gap}


def test_failure_string_drops_the_place_and_keeps_every_number() -> None:
    report = _report("ERROR", "attempt 7 end: stale token committed: x at epoch 12")
    assert failure_of(report) == "ERROR: stale token committed: x at epoch 12"
    other = _report("ERROR", "attempt 7 end: stale token committed: x at epoch 13")
    assert failure_of(other) != failure_of(report)  # another epoch is another failure
    assert failure_of(_report("PASS", "")) is None


def test_pass_with_exclusions_is_expected_only_when_gaps_are_accepted() -> None:
    assert failure_of(_report("PASS_WITH_EXCLUSIONS", "", allow_gap=True)) is None
    assert failure_of(_report("PASS_WITH_EXCLUSIONS", "")) == "PASS_WITH_EXCLUSIONS: "
