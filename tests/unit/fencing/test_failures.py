"""Pure decisions of handler failures: bisection plan and its bound, backoff, classification,
the declaration grammar."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from typing import Any

import pytest

from fencing.errors import HandlerDeclarationError, HandlerFailed, Retired, Transient
from fencing.failures import Bisection, RetryPolicy, handler_failure, marked_transient, max_probes
from fencing.handler import INCOHERENT, Durability, Effects, declaration_of, handler
from fencing.types import SourceRecord, Verdict


def run_plan(n: int, poison: set[int]) -> tuple[list[int], list[int], int, int]:
    """Drive a Bisection against a deterministic handler that fails on ``poison`` indices.

    Returns (applied indices in commit order, quarantined indices, probes, transactions)."""
    plan = Bisection(n)
    applied: list[int] = []
    quarantined: list[int] = []
    txns = 0
    while (probe := plan.next()) is not None:
        txns += 1
        run = [i for i in range(probe.start, probe.end) if i not in probe.reject]
        if any(i in poison for i in run):
            plan.failed()
            continue
        applied += run
        quarantined += list(probe.reject)
        plan.committed()
    return applied, quarantined, plan.probes, txns


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 64, 100, 500])
def test_one_poison_anywhere_applies_every_other_record_once_within_log2_probes(n: int) -> None:
    for p in range(n):
        applied, quarantined, probes, txns = run_plan(n, {p})
        assert applied == [i for i in range(n) if i != p]  # each once, in order
        assert quarantined == [p]
        assert probes <= max_probes(n) == (math.ceil(math.log2(n)) if n > 1 else 0)
        assert txns == probes + 1  # the probes, then one transaction for the rest


def test_several_poison_records_are_each_found_and_bounded() -> None:
    n = 16
    for k in (2, 3):
        for poison in itertools.combinations(range(n), k):
            applied, quarantined, probes, _ = run_plan(n, set(poison))
            assert applied == [i for i in range(n) if i not in poison]
            assert quarantined == list(poison)
            assert probes <= k * max_probes(n)


def test_all_poison_quarantines_everything() -> None:
    applied, quarantined, _, _ = run_plan(4, {0, 1, 2, 3})
    assert (applied, quarantined) == ([], [0, 1, 2, 3])


def test_backoff_doubles_to_the_cap_with_equal_jitter() -> None:
    policy = RetryPolicy(initial_ms=100, max_ms=1000)
    rng = random.Random(7)
    for attempt, base_s in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        got = policy.backoff_s(attempt, rng)
        assert base_s / 2 <= got < base_s
    assert RetryPolicy().backoff_s(1, random.Random(1)) == RetryPolicy().backoff_s(
        1, random.Random(1))  # the randomness is injected


@pytest.mark.parametrize("kw, flag", [({"initial_ms": 0}, "--retry-initial-ms"),
                                      ({"initial_ms": 50, "max_ms": 10}, "--retry-max-ms"),
                                      ({"retry_max_attempts": 0}, "--retry-max-attempts"),
                                      ({"max_attempts": 0}, "--max-attempts")])
def test_retry_policy_names_the_bad_flag(kw: dict[str, int], flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        RetryPolicy(**kw).check()


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_transient_marker_is_found_in_the_cause_chain() -> None:
    try:
        try:
            raise Transient("downstream busy")
        except Transient as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert marked_transient(outer)
        wrapped = handler_failure(outer, what="process t[0]")
    assert isinstance(wrapped, HandlerFailed) and wrapped.transient
    poison = handler_failure(ValueError("bad record"), what="p")
    assert isinstance(poison, HandlerFailed) and not poison.transient
    assert poison.error_type == "ValueError" and poison.error_message == "bad record"
    assert len(poison.traceback_digest) == 16
    retired = Retired("gate closed")
    assert handler_failure(retired, what="p") is retired  # fence errors are never wrapped


def test_classifier_of_the_store_marks_transient() -> None:
    exc = raised(OSError("reset"))
    got = handler_failure(exc, what="p", transient=lambda e: isinstance(e, OSError))  # type: ignore[arg-type]
    assert isinstance(got, HandlerFailed) and got.transient


# every pair of the grammar, written out: None = accepted, else what the refusal says
GRAMMAR: dict[tuple[str, str], str | None] = {
    ("durable-critical", "transactional"): None,
    ("durable-critical", "idempotent-or-observable"): None,
    ("durable-critical", "outcome-uncertain"): None,
    ("durable-critical", "convergent"): None,
    ("durable-critical", "loss-tolerant"): "loss-tolerant effects require best-effort",
    ("derived-reconcilable", "transactional"): None,
    ("derived-reconcilable", "idempotent-or-observable"): None,
    ("derived-reconcilable", "outcome-uncertain"): "outcome-uncertain effect is never "
                                                   "applied again",
    ("derived-reconcilable", "convergent"): None,
    ("derived-reconcilable", "loss-tolerant"): "loss-tolerant effects require best-effort",
    ("best-effort", "transactional"): None,
    ("best-effort", "idempotent-or-observable"): None,
    ("best-effort", "outcome-uncertain"): None,
    ("best-effort", "convergent"): None,
    ("best-effort", "loss-tolerant"): None,
}


@pytest.mark.parametrize("durability, effects", sorted(GRAMMAR))
def test_declaration_grammar_all_15_pairs(durability: str, effects: str) -> None:
    fn = handler(durability=durability, effects=effects)(_noop)
    refusal = GRAMMAR[(durability, effects)]
    if refusal is None:
        decl = declaration_of(fn)
        assert (decl.durability.value, decl.effects.value) == (durability, effects)
        assert decl.claims_completeness is (durability != "best-effort")
        return
    with pytest.raises(HandlerDeclarationError, match=refusal) as info:
        declaration_of(fn)
    assert f"durability={durability} effects={effects}" in str(info.value)


def test_grammar_counts() -> None:
    assert len(GRAMMAR) == len(list(Durability)) * len(list(Effects)) == 15
    assert {(d.value, e.value) for d, e in INCOHERENT} == {
        pair for pair, refusal in GRAMMAR.items() if refusal is not None}


def test_on_failure_is_declared_and_unknown_values_are_refused() -> None:
    assert declaration_of(handler(on_failure="stop")(_noop)).on_failure.value == "stop"
    with pytest.raises(HandlerDeclarationError, match="on_failure"):
        declaration_of(handler(on_failure="ignore")(_noop))


async def _noop(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
    return []
