"""The corpus: seeds 1-8 x {valid, conflict} x 64 steps, each run twice; 16/16 strict PASS
and byte-identical traces and reports. A small sweep has zero violations."""

from __future__ import annotations

import itertools

from ops.sim.corpus import run_corpus, sweep


def test_corpus_passes_and_is_deterministic() -> None:
    manifest = run_corpus()
    bad = [r for r in manifest["runs"] if r["status"] != "PASS" or not r["deterministic"]]
    assert bad == [], bad
    assert (manifest["passed"], manifest["total"]) == (16, 16)
    assert {(r["seed"], r["class"]) for r in manifest["runs"]} == set(
        itertools.product(range(1, 9), ("valid", "conflict")))
    assert all(r["steps"] == 64 and r["oracle_checks"] > r["attempts"] for r in manifest["runs"])
    # the corpus exercises faults, not only happy paths
    assert sum(r["selected_faults"] for r in manifest["runs"]) > 50


def test_sweep_summary_counts_both_classes() -> None:
    ticks = iter([0.0, 2.0])
    summary = sweep(20, 29, now=lambda: next(ticks))
    assert summary["runs"] == 20 and summary["statuses"] == {"PASS": 20}
    assert summary["violations"] == 0 and summary["seeds_per_s"] == 5.0
