"""Trace version 2: sets of partitions in one lifecycle call, journal/skip faults, the
revoke interleave; version 1 traces still read, without the version 2 additions."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from consumer.decisions import LifetimeState
from ops.sim import dumps, parse
from ops.sim.trace import Step, TraceError
from tests.sim.simkit import attempts, events, fault, head, make, puts, run, step

TWO = (0, 1)


def _v1(data: dict[str, Any]) -> str:
    data["version"] = 1
    return json.dumps(data)


def test_a_version_1_trace_round_trips_and_rejects_version_2_fields() -> None:
    trace = make(puts(0, [0]), [*head()])
    v1 = replace(trace, version=1)
    assert parse(dumps(v1)) == v1 and dumps(parse(dumps(v1))) == dumps(v1)
    data = json.loads(dumps(make(puts(0, [0]), [step("start", 1), Step("assign", 1, TWO)],
                                 partitions=2)))
    with pytest.raises(TraceError, match=r"steps\[1\].partition: a list is only for"):
        parse(_v1(data))
    data = json.loads(dumps(make(puts(0, [0]), [*head(), step("revoke", 1, 0, fault(
        "journal", 1, "abort"))])))
    with pytest.raises(TraceError, match=r"steps\[3\].faults\[0\].operation: 'journal'"):
        parse(_v1(data))
    data = json.loads(dumps(make(puts(0, [0]), [*head(), step("process", 1, 0, fault(
        "process", 1, at="before", revoke=True))])))
    with pytest.raises(TraceError, match=r"interleave.revoke: unknown field"):
        parse(_v1(data))
    data["version"] = 6
    with pytest.raises(TraceError, match=r"trace\.version: 6 is not supported"):
        parse(json.dumps(data))


def test_worker_id_0_is_accepted() -> None:
    report, sim = run(make(puts(0, [0]), [*head(0), step("process", 0, 0)], drain=True))
    assert report["status"] == "PASS", report["violations"]
    assert sim.store.token_of(sim.tp(0)).frontier == 1


def test_one_claim_for_a_set_and_an_unknown_outcome_of_that_claim() -> None:
    records = puts(0, [0, 1]) + puts(1, [0]) + puts(2, [0])
    steps = [step("start", 1), Step("assign", 1, (0, 1, 2), (fault("claim", 1,
                                                                   "unknown-aborted"),))]
    report, sim = run(make(records, steps, partitions=3, drain=True))
    assert report["status"] == "PASS", report["violations"]
    ev = [(e["operation"], e["call"], e["observed"]) for e in events(report, 1)]
    assert ev == [("validate", 1, "ok"), ("claim", 1, "outcome-unknown"),
                  ("observe", 1, "ok"), ("claim", 2, "ok"), ("attempts", 1, "ok")]
    assert events(report, 1)[-1]["installed"] == {f"sim[{p}]": [1, 0] for p in range(3)}
    assert attempts(report)[1]["result"] == "ok"  # all three retained from the fresh claim
    assert sim.store.token_of(sim.tp(0)).frontier == 2
    drain_assign = next(a for a in attempts(report) if a["fair_recovery"]
                        and a["actor"] == "assign")
    assert drain_assign["partition"] == [0, 1, 2]  # drain claims the whole set in one call


def test_a_replacement_takes_over_a_set() -> None:
    records = puts(0, [0]) + puts(1, [0])
    steps = [step("start", 1), Step("assign", 1, TWO, (fault(
        "claim", 1, at="after", stop=True, replacement=2),))]
    report, sim = run(make(records, steps, partitions=2))
    assert attempts(report)[1]["replacements"] == [
        {"lifetime": 2, "partition": [0, 1], "result": "ok"}]
    assert [sim.lifecycles[2].token(sim.tp(p)).epoch for p in TWO] == [2, 2]
    assert sim.lifecycles[1].state is LifetimeState.STOPPED


def test_a_revoke_interleaved_with_a_batch_waits_for_it() -> None:
    steps = [*head(), step("process", 1, 0, fault("process", 1, at="before", revoke=True))]
    report, sim = run(make(puts(0, [0, 1]), steps, drain=True))
    assert report["status"] == "PASS", report["violations"]
    assert attempts(report)[3]["result"] == "ok"
    kinds = [(w.kind, w.event) for w in sim.store.writes if w.lifetime == "1"]
    assert kinds == [("claim", ""), ("process", ""), ("journal", "release")]
    assert sim.lifecycles[1].token(sim.tp(0)) is None


def test_a_failed_release_journal_is_best_effort() -> None:
    steps = [*head(), step("revoke", 1, 0, fault("journal", 1, "abort"))]
    report, sim = run(make(puts(0, [0]), steps, drain=True))
    assert report["status"] == "PASS", report["violations"]
    assert [(e["operation"], e["observed"]) for e in events(report, 3)] == [
        ("journal", "not-committed")]
    assert attempts(report)[3]["result"] == "ok"
    assert [j.event for j in sim.store.journal_rows if j.lifetime == "1"] == ["claim"]


def test_a_replacement_never_reached_is_unstarted() -> None:
    steps = [*head(), step("process", 1, 0, fault("process", 2, at="before", replacement=2)),
             step("process", 2, 0)]
    report, _ = run(make(puts(0, [0]), steps))
    assert attempts(report)[4]["result"] == "unstarted"


def test_a_topic_recreated_before_the_drain_blocks_it_and_is_version_2_only() -> None:
    trace = make(puts(0, [0, 1]), [*head(), step("process", 1, 0)], drain=True)
    recreated = replace(trace, config=replace(trace.config,
                                              topic_recreated_before_drain=True))
    assert parse(dumps(recreated)) == recreated
    report, _ = run(recreated)
    assert report["status"] == "BLOCKED"
    assert any("RecreatedTopic" in d for d in report["diagnostics"])
    assert "topic_recreated_before_drain" not in dumps(trace)  # v1 digests unchanged
    data = json.loads(dumps(recreated))
    with pytest.raises(TraceError, match=r"config\.topic_recreated_before_drain: unknown"):
        parse(_v1(data))
