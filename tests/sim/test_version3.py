"""Trace version 3: stop in flight during a seek and during validate, several batches of one
lifetime in flight with an eager revoke of them all, the heartbeat boundary, and Kafka's
retention refusing one partition of three mid-run. Each scenario runs clean, and the oracle
flags it when the production rule it exercises is broken (patched in process)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from consumer.decisions import LifetimeState
from fencing.memory.store import MemoryFenceStore
from ops.sim import dumps, parse
from ops.sim.mutants import MUTANTS, Mutant, patched
from ops.sim.reduce import failure_of
from ops.sim.schedule import generate_and_run
from ops.sim.trace import Step, TraceError
from tests.sim.simkit import attempts, events, fault, head, make, puts, quiet, run, step

ALL = (0, 1, 2)
THREE = puts(0, [0, 1]) + puts(1, [0, 1, 2, 3]) + puts(2, [0])


def _stop_during_seek() -> list[Step]:
    return [*head(), step("process", 1, 0),
            step("seek", 1, 0, fault("observe", 1, at="before", stop=True))]


def test_stop_in_flight_during_seek() -> None:
    report, sim = run(make(puts(0, [0, 1, 2]), _stop_during_seek(), drain=True))
    assert report["status"] == "PASS", report["violations"]
    seek = attempts(report)[4]
    assert (seek["actor"], seek["result"]) == ("seek", "retired")
    assert seek["interleaves"][0]["operation"] == "observe" and seek["interleaves"][0]["stop"]
    assert [(e["operation"], e["observed"]) for e in events(report, 4)] == [
        ("observe", "cancelled")]
    assert sim.lifecycles[1].state is LifetimeState.STOPPED
    assert sim.lifecycles[1].token(sim.tp(0)) is None
    assert not any(w.lifetime == "1" for w in sim.store.writes[2:])  # nothing after it


def test_stop_in_flight_during_validate() -> None:
    steps = [step("start", 1),
             Step("assign", 1, ALL, (fault("validate", 1, at="before", stop=True),))]
    report, sim = run(make(THREE, steps, partitions=3, drain=True))
    assert report["status"] == "PASS", report["violations"]
    assign = attempts(report)[1]
    assert (assign["result"], assign["interleaves"][0]["operation"]) == ("retired", "validate")
    assert [(e["operation"], e["observed"]) for e in events(report, 1)] == [
        ("validate", "cancelled")]
    assert not any(w.lifetime == "1" for w in sim.store.writes)  # it never claimed


def _mutant(name: str) -> Mutant:
    (mutant,) = [m for m in MUTANTS if m.name == name]
    return mutant


def test_a_stop_that_does_not_interrupt_is_flagged() -> None:
    with patched(_mutant("stop-without-cancel").patches()):
        report, _ = run(make(puts(0, [0, 1, 2]), _stop_during_seek()))
    assert any("stopped in flight ended ok" in v for v in report["violations"]), report[
        "violations"]


def _revoke_all() -> list[Step]:
    """Three batches in flight; the revoke of all three starts while the first is about to
    commit, and the other two are slow (one resolves a lost reply, one retries a rollback)."""
    return [step("start", 1), Step("assign", 1, ALL), *(step("seek", 1, p) for p in ALL),
            Step("process", 1, ALL, (fault("process", 1, at="before", revoke=True),
                                     fault("process", 2, "unknown-aborted"),
                                     fault("process", 3, "abort")))]


def test_eager_revoke_all_waits_for_several_batches_in_flight() -> None:
    report, sim = run(make(THREE, _revoke_all(), partitions=3, drain=True, batch_max=2))
    assert report["status"] == "PASS", report["violations"]
    batch = attempts(report)[5]
    assert batch["batches"] == {"0": "ok", "1": "ok", "2": "ok"}
    assert batch["interleaves"][0]["revoke"] is True
    kinds = [(w.kind, w.tp.partition) for w in sim.store.writes if w.lifetime == "1"]
    processed = [i for i, (k, _) in enumerate(kinds) if k == "process"]
    released = [i for i, (k, _) in enumerate(kinds) if k == "journal"]
    assert len(processed) == 3 and len(released) == 3
    assert max(processed) < min(released)  # the revoke waited for all three guards
    assert sorted({e["partition"] for e in events(report, 5) if e["operation"] == "process"}
                  ) == [0, 1, 2]
    assert [e["observed"] for e in events(report, 5) if e["operation"] == "process"].count(
        "ok") == 3  # and the two slow ones recovered (a lost reply, a rollback)


def test_a_revoke_that_does_not_wait_for_the_batches_is_flagged() -> None:
    with patched(_mutant("revoke-no-wait").patches()):
        report, _ = run(make(THREE, _revoke_all(), partitions=3, batch_max=2))
    assert any("after it released the partition" in v for v in report["violations"]), report[
        "violations"]


def _heartbeats() -> list[Step]:
    return [*head(), step("heartbeat", 1),
            step("heartbeat", 1, None, fault("heartbeat", 1, "abort")),
            step("heartbeat", 1, None, fault("heartbeat", 1, "unknown-committed")),
            step("heartbeat", 1, None, fault("heartbeat", 1, "unknown-aborted")),
            step("process", 1, 0), step("stop", 1), step("heartbeat", 1), step("heartbeat", 1)]


def test_heartbeat_faults_never_touch_the_fence_or_the_lifetime() -> None:
    with quiet():
        report, sim = run(make(puts(0, [0, 1]), _heartbeats(), drain=True))
    assert report["status"] == "PASS", report["violations"]
    assert [a["result"] for a in attempts(report)[3:7]] == [
        "ok", "not-committed", "outcome-unknown", "outcome-unknown"]
    assert [(e["applied"], e["observed"]) for i in range(3, 7) for e in events(report, i)] == [
        (True, "ok"), (False, "not-committed"), (True, "outcome-unknown"),
        (False, "outcome-unknown")]
    assert attempts(report)[7]["result"] == "ok"  # the lifetime lived through them all
    assert [a["result"] for a in attempts(report)[9:11]] == ["ok", "closed"]
    row = sim.store.members["1"]
    assert row.state == "stopped" and round(row.last_seen_s * 1e6) == events(report, 9)[0][
        "t_us"]


def test_a_heartbeat_that_touches_the_fence_is_flagged() -> None:
    real = MemoryFenceStore.heartbeat

    async def heartbeat(self: MemoryFenceStore, **kwargs: Any) -> None:
        await real(self, **kwargs)
        for tp, r in list(self.rows.items()):  # e.g. a member upsert that also touches rows
            self.rows[tp] = replace(r, updated_s=r.updated_s + 1)

    with quiet(), patched([(MemoryFenceStore, "heartbeat", heartbeat)]):
        report, _ = run(make(puts(0, [0, 1]), _heartbeats()))
    assert any("heartbeat of lifetime 1 changed fence state" in v
               for v in report["violations"]), report["violations"]


def _expire_one_of_three() -> list[Step]:
    return [step("start", 1), Step("assign", 1, ALL), *(step("seek", 1, p) for p in ALL),
            step("process", 1, 1), Step("expire", 0, 1, offset=3), Step("revoke", 1, ALL),
            step("start", 2), Step("assign", 2, ALL)]


def test_retention_refuses_one_partition_of_three_mid_run() -> None:
    report, sim = run(make(THREE, _expire_one_of_three(), partitions=3, drain=True,
                           batch_max=1))
    assign = attempts(report)[9]
    assert (assign["result"], assign["error"].split(":")[0]) == ("refused", "RetentionGap")
    assert "sim[1]: durable frontier 1 is below the low watermark 3" in assign["error"]
    assert [e["operation"] for e in events(report, 9)] == ["validate"]  # no claim at all
    assert not any(w.kind == "claim" and w.lifetime == "2" for w in sim.store.writes)
    assert sim.lifecycles[2].state is LifetimeState.RETIRED
    # the drain is refused the same way: BLOCKED, the outcome an operator must settle
    assert report["status"] == "BLOCKED" and report["violations"] == []
    assert failure_of(report) is None


def test_an_accepted_gap_mid_run_is_skipped_and_excluded() -> None:
    report, sim = run(make(THREE, _expire_one_of_three(), partitions=3, drain=True,
                           batch_max=1, allow_gap=True))
    assert report["status"] == "PASS_WITH_EXCLUSIONS", report["violations"]
    assert report["excluded_records"] == 2
    assert [e["operation"] for e in events(report, 9)] == ["validate", "claim", "skip",
                                                              "attempts"]
    assert [j.detail for j in sim.store.journal_rows if j.event == "gap-skip"] == [
        "retention-gap: 1..3"]


def test_an_assign_that_ignores_the_gap_is_flagged() -> None:
    with patched(_mutant("gap-unrefused").patches()):
        report, _ = run(make(THREE, _expire_one_of_three(), partitions=3, batch_max=1))
    assert any("succeeded although their records were deleted" in v
               for v in report["violations"]), report["violations"]


def test_version_3_choices_are_refused_in_version_2() -> None:
    trace = make(THREE, _expire_one_of_three(), partitions=3)
    assert parse(dumps(trace)) == trace
    data = json.loads(dumps(trace))
    data["version"] = 2
    with pytest.raises(TraceError, match=r"steps\[6\].actor: unknown actor 'expire'"):
        parse(json.dumps(data))
    data = json.loads(dumps(make(THREE, _revoke_all(), partitions=3)))
    data["version"] = 2
    with pytest.raises(TraceError, match=r"steps\[5\].partition: a list is only for"):
        parse(json.dumps(data))
    data = json.loads(dumps(make(puts(0, [0, 1, 2]), _stop_during_seek())))
    data["version"] = 2
    with pytest.raises(TraceError, match=r"interleave on observe needs version 3"):
        parse(json.dumps(data))


def test_generated_runs_reach_every_version_3_scenario() -> None:
    seen: set[str] = set()
    with quiet():
        for seed in range(1, 49):
            for klass in ("valid", "conflict"):
                _, report = generate_and_run(seed, klass=klass)
                assert failure_of(report) is None, (seed, klass, report["violations"])
                for a in report["attempts"]:
                    multi = isinstance(a["partition"], list) and len(a["partition"]) > 1
                    if a["actor"] == "assign" and a["result"] == "refused" and multi:
                        seen.add("refused one of a set")
                    if a["actor"] == "process" and multi:
                        seen.add("several batches in flight")
                        if any(i.get("revoke") is True for i in a["interleaves"]):
                            seen.add("revoke-all waits on several guards")
                    if a["actor"] == "heartbeat" and a["result"] != "ok":
                        seen.add("failed heartbeat")
                    for i in a["interleaves"]:
                        if i.get("stop") and i.get("operation") in ("validate", "observe"):
                            seen.add(f"stop during {i['operation']} of {a['actor']}")
    assert seen >= {"refused one of a set", "several batches in flight",
                    "revoke-all waits on several guards", "failed heartbeat",
                    "stop during observe of seek", "stop during validate of assign"}, seen


def test_a_version_2_trace_still_replays_as_it_did() -> None:
    steps = [step("start", 1), Step("assign", 1, ALL, (fault("claim", 1, "unknown-aborted"),)),
             *(step("seek", 1, p) for p in ALL), step("process", 1, 1),
             Step("revoke", 1, (0, 1), (fault("journal", 1, "abort"),))]
    v3 = parse(dumps(replace(make(THREE, steps, partitions=3, drain=True), version=3)))
    v2 = parse(dumps(replace(v3, version=2)))
    assert v2.version == 2 and dumps(v2) == dumps(replace(v3, version=2))
    report2, _ = run(v2)
    report3, _ = run(v3)
    assert report2["status"] == report3["status"] == "PASS", report2["violations"]
    assert [a["result"] for a in attempts(report2)] == [a["result"] for a in attempts(report3)]
