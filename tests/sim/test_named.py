"""Named simulator scenarios (issue 4): each drives the production Lifecycle through the
in-memory store with a hand-written trace and asserts the observable outcome."""

from __future__ import annotations

from consumer import LifetimeState
from fencing.types import TopicPartition
from tests.sim.simkit import attempts, events, fault, head, make, puts, rec, run, step

TP = TopicPartition("sim", 0)


def _writes(sim, lifetime: str, kinds=("claim", "process", "skip")):
    return [w for w in sim.store.writes if w.lifetime == lifetime and w.kind in kinds]


# -- unknown outcomes -----------------------------------------------------------------------
def test_process_unknown_committed_resolves_by_observe_without_a_second_call() -> None:
    report, sim = run(make(puts(0, [0, 1]), [*head(), step("process", 1, 0, fault(
        "process", 1, "unknown-committed"))]))
    assert report["status"] == "PASS", report["violations"]
    ev = [(e["operation"], e["call"], e["selected"], e["applied"], e["observed"])
          for e in events(report, 3)]
    assert ev == [("process", 1, "unknown-committed", True, "outcome-unknown"),
                  ("observe", 1, None, False, "ok")]
    assert attempts(report)[3]["result"] == "ok"
    assert sim.lifecycles[1].token(TP) == sim.store.token_of(TP)
    assert sim.store.token_of(TP).frontier == 2
    assert len(_writes(sim, "1", ("process",))) == 1


def test_process_unknown_aborted_retries_the_same_batch_once() -> None:
    report, sim = run(make(puts(0, [0, 1]), [*head(), step("process", 1, 0, fault(
        "process", 1, "unknown-aborted"))]))
    assert report["status"] == "PASS", report["violations"]
    ev = [(e["operation"], e["call"], e["applied"], e["observed"], e["t_us"])
          for e in events(report, 3)]
    assert ev == [("process", 1, False, "outcome-unknown", 0), ("observe", 1, False, "ok", 0),
                  ("process", 2, True, "ok", 100_000)]
    assert sim.store.token_of(TP).frontier == 2
    assert len(_writes(sim, "1", ("process",))) == 1


def test_claim_unknown_committed_claims_afresh_and_never_adopts_the_read_epoch() -> None:
    report, sim = run(make(puts(0, [0]), [step("start", 1), step("assign", 1, 0, fault(
        "claim", 1, "unknown-committed"))]))
    ev = [(e["operation"], e["call"], e["applied"], e["observed"]) for e in events(report, 1)]
    assert ev == [("validate", 1, False, "ok"), ("claim", 1, True, "outcome-unknown"),
                  ("observe", 1, False, "ok"), ("claim", 2, True, "ok"),
                  ("attempts", 1, False, "ok")]
    assert sim.lifecycles[1].token(TP).epoch == 2 == sim.store.token_of(TP).epoch
    assert [j.event for j in sim.store.journal_rows] == ["claim", "claim"]


def test_claim_unknown_aborted_claims_again_and_installs_epoch_one() -> None:
    report, sim = run(make(puts(0, [0]), [step("start", 1), step("assign", 1, 0, fault(
        "claim", 1, "unknown-aborted"))]))
    ev = [(e["operation"], e["call"], e["applied"]) for e in events(report, 1)]
    assert ev == [("validate", 1, False), ("claim", 1, False), ("observe", 1, False),
                  ("claim", 2, True), ("attempts", 1, False)]
    assert sim.lifecycles[1].token(TP).epoch == 1 == sim.store.token_of(TP).epoch


# -- both epoch orders ----------------------------------------------------------------------
def test_replacement_before_the_effect_fences_the_old_token_without_committing() -> None:
    report, sim = run(make(puts(0, [0, 1]), [*head(), step("process", 1, 0, fault(
        "process", 1, "commit", at="before", replacement=2)), step("process", 2, 0)]))
    assert report["status"] == "PASS", report["violations"]
    old = attempts(report)[3]
    assert old["result"] == "fenced" and old["replacements"] == [
        {"lifetime": 2, "partition": 0, "result": "ok"}]
    selected = [e for e in events(report, 3) if e["lifetime"] == "1"]
    assert [(e["operation"], e["selected"], e["applied"], e["observed"]) for e in selected] == [
        ("process", "commit", False, "fenced"), ("journal", None, True, "ok")]  # retire row
    assert sim.lifecycles[1].state is LifetimeState.RETIRED
    assert _writes(sim, "1", ("process",)) == []
    assert attempts(report)[4]["result"] == "ok"
    assert sim.store.token_of(TP) == sim.lifecycles[2].token(TP)
    assert sim.store.token_of(TP).epoch == 2 and sim.store.token_of(TP).frontier == 2


def test_replacement_after_the_effect_retires_the_old_lifetime_on_reread() -> None:
    report, sim = run(make(puts(0, [0, 1]), [*head(), step("process", 1, 0, fault(
        "process", 1, "unknown-committed", at="after", replacement=2)), step("process", 2, 0)]))
    assert report["status"] == "PASS", report["violations"]
    old = [e for e in events(report, 3) if e["lifetime"] == "1"]
    assert [(e["operation"], e["call"], e["applied"], e["observed"]) for e in old] == [
        ("process", 1, True, "outcome-unknown"), ("observe", 1, False, "ok"),
        ("journal", 1, True, "ok")]  # the retire row
    lc1 = sim.lifecycles[1]
    assert lc1.state is LifetimeState.RETIRED and "Fenced" in lc1.retired_reason
    assert lc1.token(TP) is None  # never adopted epoch 2
    assert attempts(report)[3]["result"] == "fenced"
    assert len(_writes(sim, "1", ("process",))) == 1  # the decision was not repeated
    assert sim.cursors[(2, 0)] == 2 and attempts(report)[4]["result"] == "idle"


def test_replacement_after_a_clean_commit_fences_the_old_lifetimes_next_batch() -> None:
    report, sim = run(make(puts(0, [0, 1, 2]), [*head(), step("process", 1, 0, fault(
        "process", 1, "commit", at="after", replacement=2)), step("process", 1, 0)],
        batch_max=2))
    assert report["violations"] == [] and report["status"] == "INCOMPLETE"  # offset 2 left
    assert attempts(report)[3]["result"] == "ok"
    assert attempts(report)[4]["result"] == "fenced"
    assert sim.store.token_of(TP).frontier == 2 and sim.store.token_of(TP).epoch == 2


# -- cancellation ---------------------------------------------------------------------------
def test_cancelled_assign_applies_nothing_and_later_calls_do_no_io() -> None:
    report, sim = run(make(puts(0, [0]), [step("start", 1), step("assign", 1, 0, fault(
        "claim", 1, "commit", at="before", stop=True)), step("seek", 1, 0), step("assign", 1, 0)]))
    ev = [(e["operation"], e["selected"], e["applied"], e["observed"]) for e in events(report, 1)]
    assert ev == [("validate", None, False, "ok"), ("claim", "commit", False, "cancelled")]
    assert attempts(report)[1]["result"] == "retired"
    assert sim.store.rows == {} and sim.store.writes == []
    assert events(report, 2) == [] and events(report, 3) == []
    assert [a["result"] for a in attempts(report)[2:]] == ["retired", "retired"]


def test_cancelled_after_the_claim_effect_leaves_an_unused_epoch() -> None:
    report, sim = run(make(puts(0, [0]), [step("start", 1), step("assign", 1, 0, fault(
        "claim", 1, "commit", at="after", stop=True)), step("start", 2), step("assign", 2, 0)]))
    ev = [(e["operation"], e["applied"], e["observed"]) for e in events(report, 1)]
    assert ev == [("validate", False, "ok"), ("claim", True, "cancelled")]
    assert sim.lifecycles[1].state is LifetimeState.STOPPED
    assert sim.lifecycles[1].token(TP) is None
    assert sim.lifecycles[2].token(TP).epoch == 2


def test_cancelled_seek_a_stopped_lifetime_rejects_seek_without_io() -> None:
    report, _sim = run(make(puts(0, [0]), [*head(), step("stop", 1), step("seek", 1, 0)]))
    assert attempts(report)[4]["result"] == "retired"
    assert events(report, 4) == []
    assert "stopped" in attempts(report)[4]["error"]


# -- retirement and retries -----------------------------------------------------------------
def test_unresolved_observe_retires_the_lifetime_and_it_never_writes_again() -> None:
    faults = [fault("process", 1, "unknown-committed")] + [
        fault("observe", n, "abort") for n in (1, 2, 3)]
    report, sim = run(make(puts(0, [0, 1]), [*head(), step("process", 1, 0, *faults),
                                             step("process", 1, 0), step("assign", 1, 0)]))
    ev = [(e["operation"], e["call"], e["observed"], e["t_us"]) for e in events(report, 3)]
    assert ev == [("process", 1, "outcome-unknown", 0), ("observe", 1, "read-failed", 0),
                  ("observe", 2, "read-failed", 100_000), ("observe", 3, "read-failed", 300_000),
                  ("journal", 1, "ok", 300_000)]  # the retire row
    att = attempts(report)[3]
    assert att["result"] == "retired" and "Unresolved" in att["error"]
    assert sim.lifecycles[1].state is LifetimeState.RETIRED
    writes = [w.kind for w in sim.store.writes if w.lifetime == "1"]
    assert writes == ["claim", "process", "journal"]  # the retire journal row is the last
    assert sim.store.journal_rows[-1].event == "retire"
    assert events(report, 4) == [] and events(report, 5) == []


def test_retry_exhaustion_is_exactly_three_calls_with_100_and_200_ms_waits() -> None:
    faults = [fault("process", n, "abort") for n in (1, 2, 3)]
    report, sim = run(make(puts(0, [0]), [*head(), step("process", 1, 0, *faults)]))
    ev = [(e["operation"], e["call"], e["observed"], e["t_us"]) for e in events(report, 3)]
    assert ev == [("process", 1, "not-committed", 0), ("process", 2, "not-committed", 100_000),
                  ("process", 3, "not-committed", 300_000), ("journal", 1, "ok", 300_000)]
    att = attempts(report)[3]
    assert att["result"] == "retired" and "NotCommitted" in att["error"]
    assert att["selectors_used"] == 3
    assert sim.store.token_of(TP).frontier == 0 and sim.store.quarantine == []
    assert report["status"] == "INCOMPLETE"


def test_progress_across_offset_gaps_and_restart() -> None:
    records = [rec(0, 0, "a"), rec(0, 1, "b"), rec(0, 4, "c")]
    report, sim = run(make(records, [*head(), step("process", 1, 0), step("stop", 1),
                                     step("start", 2), step("assign", 2, 0), step("seek", 2, 0),
                                     step("process", 2, 0)]))
    assert report["status"] == "PASS", report["violations"]
    assert report["boundary"]["0"] == {"frontier": 5, "epoch": 2, "end": 5}
    assert sim.cursors[(2, 0)] == 5 and attempts(report)[-1]["result"] == "idle"


def test_incomplete_then_blocked_precedence() -> None:
    records = puts(0, [0, 1, 2, 3, 4])
    steps = [*head(), step("process", 1, 0)]
    partial, _ = run(make(records, steps, batch_max=2))
    assert partial["status"] == "INCOMPLETE" and partial["before_drain"] == "INCOMPLETE"
    assert any("durable frontier 2" in d for d in partial["diagnostics"])
    blocked, _ = run(make(records, steps, batch_max=2, drain=True, lows=(4,)))
    assert blocked["before_drain"] == "INCOMPLETE" and blocked["status"] == "BLOCKED"
    assert any("RetentionGap" in d for d in blocked["diagnostics"])
    excluded, sim = run(make(records, steps, batch_max=2, drain=True, lows=(4,),
                             allow_gap=True))
    assert excluded["status"] == "PASS_WITH_EXCLUSIONS", excluded["violations"]
    assert excluded["excluded_records"] == 2
    assert [j.event for j in sim.store.journal_rows].count("gap-skip") == 1
    drained, _ = run(make(records, steps, batch_max=2, drain=True))
    assert drained["before_drain"] == "INCOMPLETE" and drained["status"] == "PASS"


def test_quarantine_is_atomic_with_the_frontier() -> None:
    records = [rec(0, 0, "a"), rec(0, 1, "a", "correct", rev=5)]  # second is rejected
    report, sim = run(make(records, [*head(), step("process", 1, 0, fault(
        "process", 1, "unknown-aborted"))], klass="conflict"))
    assert report["status"] == "PASS", report["violations"]
    first = events(report, 3)[0]
    assert first["applied"] is False and first["installed"] == {"sim[0]": [1, 0]}
    assert [(q.offset, q.reason) for q in sim.store.quarantine] == [
        (1, "skipped-revision: rev 5, current 1")]
    assert sim.store.token_of(TP).frontier == 2


def test_late_seek_after_revoke_is_fenced_without_io_or_retirement() -> None:
    report, sim = run(make(puts(0, [0]), [*head(), step("revoke", 1, 0), step("seek", 1, 0),
                                          step("process", 1, 0)]))
    att = attempts(report)[4]
    assert att["result"] == "fenced" and "holds no token" in att["error"]
    assert events(report, 4) == []
    late = attempts(report)[5]  # the batch fetched before the revoke is delivered late
    assert late["result"] == "fenced" and "holds no token" in late["error"]
    assert events(report, 5) == []
    assert sim.lifecycles[1].state is LifetimeState.LIVE
    assert [j.event for j in sim.store.journal_rows] == ["claim", "release"]


def test_the_simulator_drives_the_production_lifecycle() -> None:
    import consumer.lifecycle
    from fencing.memory.store import MemoryFenceStore

    _report, sim = run(make(puts(0, [0]), [*head(), step("process", 1, 0)]))
    assert type(sim.lifecycles[1]) is consumer.lifecycle.Lifecycle
    assert type(sim.store) is MemoryFenceStore
