"""The specification's statuses and words, as simulator traces: ERROR over BLOCKED, stop and
replacement together, a drain that does not advance is BLOCKED, and the document ledger's
correction and withdrawal under faults."""

from __future__ import annotations

import json
from typing import Any

import pytest

import ops.sim.runner
from consumer.decisions import LifetimeState
from fencing.memory.store import MemoryFenceStore
from ops.sim.report import Status, final_status
from tests.sim.simkit import attempts, fault, head, make, puts, rec, run, step


def _raising_handler(conn: Any, records: Any) -> Any:
    raise RuntimeError("handler bug")


def test_a_drain_that_does_not_advance_is_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops.sim.runner, "memory_ref_handler", _raising_handler)
    report, _ = run(make(puts(0, [0, 1]), [*head()], drain=True))
    assert report["status"] == "BLOCKED", report["violations"]
    assert any("did not advance durable progress" in d for d in report["diagnostics"])


def test_error_outranks_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert final_status(violations=1, drain=True, blocked=True, complete=False,
                        excluded=0) is Status.ERROR

    def no_fence(self: MemoryFenceStore, tp: Any, token: Any) -> Any:
        return self.rows[tp]

    monkeypatch.setattr(MemoryFenceStore, "_require", no_fence)  # stale tokens commit
    steps = [*head(), step("process", 1, 0, fault("process", 1, at="before", replacement=2))]
    report, _ = run(make(puts(0, [0, 1, 2]), steps, batch_max=1, drain=True, lows=(3,)))
    assert report["status"] == "ERROR"
    assert any("stale token committed" in v for v in report["violations"])


def test_stop_and_replacement_together() -> None:
    steps = [*head(), step("process", 1, 0, fault("process", 1, "unknown-committed",
                                                  at="after", stop=True, replacement=2)),
             step("process", 2, 0)]
    report, sim = run(make(puts(0, [0, 1, 2]), steps, batch_max=1, drain=True))
    assert report["status"] == "PASS", report["violations"]
    att = attempts(report)[3]
    assert att["result"] == "retired" and att["interleaves"][0]["stop"] is True
    assert att["replacements"] == [{"lifetime": 2, "partition": 0, "result": "ok"}]
    assert sim.lifecycles[1].state is LifetimeState.STOPPED
    assert [w.kind for w in sim.store.writes if w.lifetime == "1"] == ["claim", "process"]


def test_ledger_correction_and_withdrawal_under_faults() -> None:
    records = [rec(0, 0, "doc"), rec(0, 1, "doc", "correct", rev=2, body="fixed"),
               rec(0, 3, "doc", "withdraw", rev=3),
               rec(0, 4, "doc", "correct", rev=4, body="too late")]  # rejected: withdrawn
    steps = [*head(), step("process", 1, 0, fault("process", 1, "unknown-aborted")),
             step("process", 1, 0, fault("process", 1, "unknown-committed",
                                         at="after", replacement=2)),
             step("process", 2, 0)]
    report, sim = run(make(records, steps, batch_max=2, klass="conflict", drain=True))
    assert report["status"] == "PASS", report["violations"]
    assert [(q.offset, q.reason.split(":")[0]) for q in sim.store.quarantine] == [
        (4, "withdrawn-document")]
    assert sim.store.token_of(sim.tp(0)).frontier == 5


def _stopped_in_flight(tmp_path: Any = None) -> Any:
    """The whole source in one batch whose COMMIT applies, then the lifetime is stopped
    before the reply: complete, no drain, nobody follows the interrupted call up."""
    steps = [*head(), step("process", 1, 0, fault("process", 1, at="after", stop=True))]
    return make(puts(0, [0, 1]), steps, drain=False)


def test_a_complete_run_without_drain_stopped_in_flight_is_pass_with_exclusions() -> None:
    report, sim = run(_stopped_in_flight())
    assert report["boundary"] == {"0": {"frontier": 2, "epoch": 1, "end": 2}}
    assert report["status"] == "PASS_WITH_EXCLUSIONS", report["violations"]
    assert report["lifetimes"] == [{
        "lifetime": "1", "state": "stopped", "reason": sim.lifecycles[1].retired_reason,
        "ended_in_flight": {"attempt": 3, "actor": "process", "partitions": [0],
                            "followed_up_by": None}}]
    assert any("lifetime 1 ended stopped with a call in flight (attempt 3, process)" in d
               for d in report["diagnostics"])


def test_a_run_without_drain_retired_in_flight_is_pass_with_exclusions() -> None:
    # the lost COMMIT reply is re-read as committed (complete), then the re-read's observe
    # is refused three times: the lifetime retires inside its call
    steps = [*head(), step("process", 1, 0, fault("process", 1, "unknown-committed"),
                           *(fault("observe", c, "abort") for c in (1, 2, 3)))]
    report, _ = run(make(puts(0, [0, 1]), steps, drain=False))
    assert report["boundary"]["0"]["frontier"] == 2
    assert report["lifetimes"][0]["state"] == "retired"
    assert report["lifetimes"][0]["ended_in_flight"]["actor"] == "process"
    assert report["status"] == "PASS_WITH_EXCLUSIONS", report["violations"]


def test_a_stop_between_calls_or_a_successor_that_goes_on_stays_pass() -> None:
    between = make(puts(0, [0, 1]), [*head(), step("process", 1, 0), step("stop", 1)])
    report, _ = run(between)
    assert report["status"] == "PASS", report["diagnostics"]
    assert report["lifetimes"] == [{"lifetime": "1", "state": "stopped",
                                    "reason": report["lifetimes"][0]["reason"],
                                    "ended_in_flight": None}]
    taken_over = make(puts(0, [0, 1, 2]), [*head(), step("process", 1, 0, fault(
        "process", 1, at="after", stop=True, replacement=2)), step("process", 2, 0)],
        batch_max=2)
    report, _ = run(taken_over)
    assert report["status"] == "PASS", report["diagnostics"]
    assert report["lifetimes"][0]["ended_in_flight"]["followed_up_by"] == "2"


def test_the_cli_exits_1_for_pass_with_exclusions(tmp_path: Any, capsys: Any) -> None:
    from ops.sim import dumps
    from tests.sim.test_replay import cli
    trace, out = tmp_path / "t.json", tmp_path / "r.json"
    trace.write_text(dumps(_stopped_in_flight()))
    assert cli(["--replay", str(trace), "--report", str(out)]) == 1
    assert json.loads(out.read_text())["status"] == "PASS_WITH_EXCLUSIONS"
