"""Trace version 5: key-ordered lanes in the simulator (``ops.sim.lanes``); the per-key order
and exactly-once oracles (``ops.sim.checks``); earlier versions reject the additions."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ops.sim import dumps, parse
from ops.sim.reduce import failure_of
from ops.sim.schedule import generate_and_run, make_trace
from ops.sim.trace import TraceError
from tests.sim.simkit import fault, make, quiet, rec, run, step


def _keyed() -> list[Any]:
    """Two documents interleaved in one partition: a at 0, 3, 6 (lane 1 of 2); d at 1, 4, 7
    (lane 0); gaps at 2 and 5, as compaction leaves."""
    return [rec(0, 0, "a", rev=1), rec(0, 1, "d", rev=1), rec(0, 3, "a", rev=2),
            rec(0, 4, "d", rev=2), rec(0, 6, "a", rev=3), rec(0, 7, "d", rev=3)]


def _lane_writes(sim: Any) -> list[tuple[int, int]]:
    return [sp for w in sim.store.writes if w.kind == "lane" for sp in w.spans]


def _applied_once(sim: Any, offsets: list[int]) -> None:
    ends = [last for _, last in _lane_writes(sim)]
    assert sorted(ends) == offsets, ends  # every record applied by a lane, none twice


def test_a_lanes_trace_round_trips_and_earlier_versions_reject_it() -> None:
    trace = make(_keyed(), [step("start", 1), step("assign", 1), step("seek", 1),
                            step("process", 1, 0, fault("lane", 1, "unknown-committed"),
                                 fault("fold", 1, "abort"))],
                 lanes=2, lanes_window=4, fold_every=2)
    text = dumps(trace)
    assert parse(text) == trace and dumps(parse(text)) == text
    data = json.loads(text)
    assert data["version"] == 5
    assert data["config"]["lanes"] == 2 and data["config"]["lanes_window"] == 4
    data["version"] = 4
    with pytest.raises(TraceError, match=r"config\.(lanes|lanes_window|fold_every): unknown"):
        parse(json.dumps(data))
    without = make(_keyed(), [step("start", 1), step("assign", 1), step("seek", 1),
                              step("process", 1, 0, fault("lane", 1, "abort"))])
    data = json.loads(dumps(without))
    data["version"] = 4
    with pytest.raises(TraceError, match=r"'lane' is not a choice for a process step "
                                         r"in version 4"):
        parse(json.dumps(data))
    assert "lanes" not in data["config"]  # a config without lanes is written as before


def test_a_lanes_config_rejects_poison_and_a_window_without_lanes() -> None:
    data = json.loads(dumps(make(_keyed(), [step("start", 1)], lanes=2)))
    data["config"]["poison"] = [[0, 1]]
    with pytest.raises(TraceError, match="a lanes config has no poison"):
        parse(json.dumps(data))
    data = json.loads(dumps(make(_keyed(), [step("start", 1)])))
    data["version"] = 5
    data["config"]["lanes_window"] = 3
    with pytest.raises(TraceError, match=r"config\.lanes: missing field"):
        parse(json.dumps(data))


def test_lanes_apply_each_key_in_order_and_a_successor_skips_what_they_applied() -> None:
    """Lifetime 1's lane of a commits while its lane of d fails three times (a rollback
    each: lane calls 1, 3 and 4) and retires it; lifetime 2 claims, seeks to the frontier
    (0: nothing folded) and skips a's records the completion set holds; the drain finishes
    the rest, once each."""
    with quiet():
        trace = make(_keyed(), [
            step("start", 1), step("assign", 1), step("seek", 1),
            step("process", 1, 0, fault("lane", 1, "abort"), fault("lane", 3, "abort"),
                 fault("lane", 4, "abort")),
            step("start", 2), step("assign", 2), step("seek", 2), step("process", 2)],
            lanes=2, batch_max=3, drain=True)
        report, sim = run(trace)
    assert report["status"] == "PASS", report["violations"]
    first = report["attempts"][3]
    assert first["result"] == "retired" and any(x.endswith("ok") for x in first["lanes"]), first
    assert _lane_writes(sim)[0] == (0, 0)  # a's lane committed its first record
    successor = report["attempts"][7]
    assert successor["lanes"] and all(x.startswith("0/0 ") and x.endswith(" ok")
                                      for x in successor["lanes"]), successor  # a's skipped
    _applied_once(sim, [0, 1, 3, 4, 6, 7])
    assert sim.store.token_of(sim.tp(0)).frontier == 8  # folded to the end


def test_a_lost_commit_reply_of_a_lane_is_resolved_from_the_completion_set() -> None:
    """Both outcomes of a lost COMMIT reply on a lane: committed (its spans are in the set:
    the lifetime goes on) and not (none of them: it sends the batch again)."""
    for outcome in ("unknown-committed", "unknown-aborted"):
        with quiet():
            trace = make(_keyed(), [
                step("start", 1), step("assign", 1), step("seek", 1),
                step("process", 1, 0, fault("lane", 1, outcome)), step("process", 1)],
                lanes=2, batch_max=2, drain=True)
            report, sim = run(trace)
        assert report["status"] == "PASS", (outcome, report["violations"])
        assert report["attempts"][3]["result"] == "ok", report["attempts"][3]
        _applied_once(sim, [0, 1, 3, 4, 6, 7])


def test_a_replacement_during_a_lane_fences_it_and_resumes_from_the_set() -> None:
    """A takeover lands after one lane's commit (its spans durable) and before the other's
    store call: the second lane is fenced, the zombie retires, the replacement's lanes skip
    the first lane's records."""
    with quiet():
        trace = make(_keyed(), [
            step("start", 1), step("assign", 1), step("seek", 1),
            step("process", 1, 0, fault("lane", 2, at="before", replacement=2)),
            step("process", 2), step("process", 2)], lanes=2, batch_max=2, drain=True)
        report, sim = run(trace)
    assert report["status"] == "PASS", report["violations"]
    taken = report["attempts"][3]
    assert taken["replacements"] and taken["result"] == "fenced", taken
    _applied_once(sim, [0, 1, 3, 4, 6, 7])


def test_the_window_holds_dispatch_back_until_the_frontier_moves() -> None:
    """A window of 2 offsets: records at or past the effective frontier + 2 wait in the
    dispatcher; nothing is dropped and every record is applied once."""
    with quiet():
        trace = make(_keyed(), [step("start", 1), step("assign", 1), step("seek", 1),
                                step("process", 1), step("process", 1)],
                     lanes=2, batch_max=4, lanes_window=2, drain=True)
        report, sim = run(trace)
    assert report["status"] == "PASS", report["violations"]
    first = report["attempts"][3]["lanes"]
    assert sorted(first) == ["0/0 1..1 ok", "0/1 0..0 ok"], first  # 3 waits for the window
    _applied_once(sim, [0, 1, 3, 4, 6, 7])


def version_5_scenarios(report: dict[str, Any]) -> list[str]:
    """The version 5 scenarios one generated run reaches."""
    out = []
    for e in report["events"]:
        if e["operation"] in ("lane", "fold") and e["selected"] is not None:
            out.append(f"{e['operation']} {e['selected']}")
    for a in report["attempts"]:
        for il in a["interleaves"]:
            if il.get("operation") == "lane":
                out.append("interleave on a lane" + (" (revoke)" if il.get("revoke") else ""))
        for lane in a.get("lanes", ()):
            out.append("lane " + lane.rsplit(" ", 1)[1])
    return out


def test_generated_lanes_runs_pass_and_reach_every_version_5_scenario() -> None:
    seen: set[str] = set()
    lanes_runs = 0
    with quiet():
        for seed in range(1, 41):
            for klass in ("valid", "conflict"):
                trace, report = generate_and_run(seed, klass=klass)
                assert trace.version == (5 if trace.config.lanes > 1 else 4)
                if trace.config.lanes == 1:
                    continue
                lanes_runs += 1
                assert failure_of(report) is None, (seed, klass, report["violations"])
                seen.update(version_5_scenarios(report))
    assert lanes_runs >= 10, lanes_runs
    assert seen >= {"lane unknown-committed", "lane unknown-aborted", "lane abort",
                    "fold abort", "fold unknown-committed", "fold unknown-aborted",
                    "interleave on a lane", "interleave on a lane (revoke)", "lane ok",
                    "lane failed", "lane dropped"}, seen


def test_a_generated_trace_without_lanes_is_the_version_4_trace_it_was() -> None:
    trace = make_trace(1, klass="valid")
    assert trace.config.lanes == 1 and trace.version == 4
    assert "lanes" not in json.loads(dumps(trace))["config"]
