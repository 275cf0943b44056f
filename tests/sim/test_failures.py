"""The handler-failure path in the simulator (trace version 4): poison records and
transient failures through the production ``FailureRun`` (durable attempt counts through
the faultable store path, bisection, the suspect window), and the family's oracle."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from ops.sim import dumps, parse
from ops.sim.trace import TraceError
from tests.sim.simkit import attempts, events, fault, head, make, puts, run, step


def failing(steps: list[Any], *, poison: tuple[tuple[int, int], ...] = ((0, 2),),
            transient: tuple[tuple[int, int, int], ...] = ((0, 1, 2),), drain: bool = True,
            offsets: tuple[int, ...] = (0, 1, 2, 3, 4, 5), batch_max: int = 4) -> Any:
    trace = make(puts(0, list(offsets)), steps, batch_max=batch_max, drain=drain)
    config = replace(trace.config, poison=poison, transient=transient)
    return parse(dumps(replace(trace, config=config)))


def test_poison_is_quarantined_once_and_a_transient_record_applied_once() -> None:
    report, sim = run(failing([*head(), step("process", 1, 0), step("process", 1, 0)]))
    assert report["status"] == "PASS", report["violations"]
    rows = [(q.offset, q.error_type) for q in sim.store.quarantine]
    assert rows == [(2, "PoisonRecord")]
    assert sim.store.token_of(sim.tp(0)).frontier == 6
    ops = [e["operation"] for e in events(report, 3)]
    assert ops.count("attempt") >= 2  # each transient retry counted durably first
    assert sim.failing.left[(0, 1)] == 0  # both transient failures happened
    tables = sim.store.tables()
    assert sum(len(rows) for rows in tables.values()) > 0


def test_a_lost_attempt_count_reply_retires_the_lifetime_and_a_successor_finishes() -> None:
    steps = [*head(), step("process", 1, 0, fault("attempt", 1, "unknown-committed"))]
    report, sim = run(failing(steps))
    assert report["status"] == "PASS", report["violations"]
    att = attempts(report)[3]
    assert att["result"] == "retired" and "OutcomeUnknown" in att["error"]
    assert [q.offset for q in sim.store.quarantine] == [2]  # by the drain, once


def test_an_unreadable_failure_mark_retires_the_assign_after_three_calls() -> None:
    steps = [step("start", 1), step("assign", 1, 0, *(fault("attempts", c, "abort")
                                                      for c in (1, 2, 3)))]
    report, _ = run(failing(steps))
    assert report["status"] == "PASS", report["violations"]
    assert attempts(report)[1]["result"] == "retired"
    assert [e["operation"] for e in events(report, 1)][-4:] == ["attempts"] * 3 + ["journal"]


def test_a_lifetime_stopped_in_flight_leaves_a_suspect_window_its_successor_honours() -> None:
    steps = [*head(), step("process", 1, 0, fault("process", 1, at="before", stop=True)),
             *head(2), step("process", 2, 0)]
    report, sim = run(failing(steps, poison=(), transient=((0, 5, 1),)))
    assert report["status"] == "PASS", report["violations"]
    alone = [e for e in events(report, 7) if e["operation"] == "attempt"]
    assert alone, "the successor counts each suspect record's attempt alone"
    assert sim.store.quarantine == []


def test_the_oracle_sees_a_poison_record_applied_and_a_healthy_one_quarantined(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from collections import Counter

    from ops.sim import failures

    def healthy(self: Any, poison: Any, transient: Any) -> None:  # the handler never fails
        self.poison, self.left = frozenset(), Counter()

    monkeypatch.setattr(failures.FailingHandler, "__init__", healthy)
    report, _ = run(failing([*head(), step("process", 1, 0)], drain=False,
                            offsets=(0, 1, 2, 3)))
    assert report["status"] == "ERROR"
    assert any("poison record 0@2 has 0 quarantine rows" in v for v in report["violations"])


def test_earlier_versions_reject_handler_failures() -> None:
    data = json.loads(dumps(failing([*head()])))
    assert data["config"]["poison"] == [[0, 2]]
    data["version"] = 3
    with pytest.raises(TraceError, match=r"config.poison: unknown field"):
        parse(json.dumps(data))
    data = json.loads(dumps(failing([*head()])))
    data["config"]["transient"] = [[0, 1, 3]]
    with pytest.raises(TraceError, match=r"fails 1 or 2 times"):
        parse(json.dumps(data))


def failure_scenarios(trace: Any, report: dict[str, Any]) -> list[str]:
    """The handler-failure scenarios one generated run reaches."""
    out = []
    if trace.config.poison or trace.config.transient:
        out.append("failing handler")
    for e in report["events"]:
        if e["operation"] == "attempt":
            out.append("attempt counted")
            if e["selected"] is not None:
                out.append(f"attempt fault {e['selected']}")
        if e["operation"] == "attempts" and e["selected"] is not None:
            out.append("marks read failed")
    return out


def test_generated_runs_reach_the_failure_path() -> None:
    from collections import Counter

    from ops.sim.reduce import failure_of
    from ops.sim.schedule import generate_and_run
    from tests.sim.simkit import quiet
    seen: Counter[str] = Counter()
    with quiet():
        for seed in range(1, 31):
            for klass in ("valid", "conflict"):
                trace, report = generate_and_run(seed, klass=klass)
                assert failure_of(report) is None, (seed, klass, report["violations"])
                seen.update(set(failure_scenarios(trace, report)))
    assert {"failing handler", "attempt counted", "marks read failed"} <= set(seen), seen
    assert any(k.startswith("attempt fault") for k in seen), seen
