"""The mutation harness: patches are restored, and a mutant is seen by a generated run."""

from __future__ import annotations

import pytest

import consumer.decisions
from ops.sim.mutants import FIRST_KILLS, MUTANTS, Mutant, patched, runs_up_to
from ops.sim.reduce import failure_of
from ops.sim.schedule import generate_and_run
from tests.sim.simkit import quiet


def test_patches_are_restored_even_when_the_run_raises() -> None:
    original = consumer.decisions.seek_matches
    (seek,) = [m for m in MUTANTS if m.name == "seek-unchecked"]
    with pytest.raises(RuntimeError), patched(seek.patches()):
        assert consumer.decisions.seek_matches is not original
        raise RuntimeError("boom")
    assert consumer.decisions.seek_matches is original


def test_there_are_at_least_twelve_named_mutants() -> None:
    names = [m.name for m in MUTANTS]
    assert len(set(names)) == len(names) >= 12


def test_a_mutant_is_killed_by_a_generated_run_and_the_healthy_run_passes() -> None:
    (unjournaled,) = [m for m in MUTANTS if m.name == "claim-unjournaled"]
    assert failure_of(generate_and_run(1)[1]) is None
    with patched(unjournaled.patches()):
        failure = failure_of(generate_and_run(1)[1])
    assert failure is not None and "has no claim journal row" in failure
    assert failure_of(generate_and_run(1)[1]) is None


def test_every_mutant_is_pinned() -> None:
    assert set(FIRST_KILLS) == {m.name for m in MUTANTS}


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_each_mutant_is_first_killed_by_its_pinned_run(mutant: Mutant) -> None:
    """The randomized sweep alone kills every mutant, first at its pinned run (a moved pin
    means the generator changed: re-run ``make sim-mutants`` and update the pins)."""
    seed, klass = FIRST_KILLS[mutant.name]
    assert failure_of(generate_and_run(seed, klass=klass)[1]) is None  # healthy code passes
    outcomes = []
    with quiet(), patched(mutant.patches()):
        for s, k in runs_up_to(seed, klass):
            outcomes.append((s, k, failure_of(generate_and_run(s, klass=k)[1])))
    *before, (_, _, killing) = outcomes
    assert killing is not None, (seed, klass)
    assert [(s, k) for s, k, f in before if f is not None] == [], "the pin moved"
