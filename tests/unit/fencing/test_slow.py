"""Pure decisions about slow handlers (``fencing.slow``) and the causes of quarantined
records (``fencing.failures.quarantine_cause``)."""

from __future__ import annotations

import pytest

from fencing.failures import CAUSES, quarantine_cause
from fencing.slow import Split, handler_limit_s


def test_a_handler_call_may_last_90_percent_of_idle_and_75_percent_of_the_budget() -> None:
    assert handler_limit_s(budget_s=20.0, idle_in_transaction_s=8.0) == pytest.approx(7.2)
    assert handler_limit_s(budget_s=20.0, idle_in_transaction_s=None) == 15.0
    assert handler_limit_s(budget_s=4.0, idle_in_transaction_s=30.0) == 3.0
    # time already spent in the call (the mutex wait, the intent) comes off the budget share
    assert handler_limit_s(budget_s=20.0, idle_in_transaction_s=8.0,
                           elapsed_s=10.0) == pytest.approx(5.0)


def run_split(n: int, fits: int, slow_alone: frozenset[int] = frozenset()) -> tuple[
        list[tuple[int, int]], list[int], int]:
    """Drive a Split: a chunk longer than ``fits`` records is too slow, and so is any chunk
    holding an index of ``slow_alone``. Returns (committed chunks, too-slow records, tries)."""
    plan = Split.after_too_slow(n)
    committed: list[tuple[int, int]] = []
    slow: list[int] = []
    tries = 0
    while (chunk := plan.next()) is not None:
        tries += 1
        start, end = chunk
        if end - start > fits or any(i in slow_alone for i in range(start, end)):
            if plan.too_slow():
                slow.append(start)
                plan.skip()
            continue
        committed.append(chunk)
        plan.committed(duration_s=1.0, limit_s=1.0)  # not fast: the size stays
    return committed, slow, tries


@pytest.mark.parametrize("n, fits", [(500, 250), (500, 100), (500, 1), (7, 3), (2, 1)])
def test_a_too_slow_batch_is_halved_until_it_fits_and_every_record_is_committed_once(
        n: int, fits: int) -> None:
    committed, slow, _ = run_split(n, fits)
    assert slow == []
    covered = [i for start, end in committed for i in range(start, end)]
    assert covered == list(range(n))  # each record once, in order
    assert all(end - start <= fits for start, end in committed)


def test_a_record_too_slow_alone_is_reported_and_the_rest_goes_on() -> None:
    committed, slow, _ = run_split(8, 8, slow_alone=frozenset({5}))
    assert slow == [5]
    assert [i for s, e in committed for i in range(s, e)] == [0, 1, 2, 3, 4, 6, 7]


def test_the_size_that_fits_doubles_after_a_fast_chunk() -> None:
    plan = Split(100, 10)
    plan.committed(duration_s=0.1, limit_s=1.0)  # under a quarter of the limit
    assert (plan.lo, plan.size) == (10, 20)
    plan.committed(duration_s=0.5, limit_s=1.0)
    assert (plan.lo, plan.size) == (30, 20)


def test_causes_of_quarantined_records() -> None:
    assert [quarantine_cause(t) for t in (None, "ProcessDeath", "OutcomeUnknown", "TooSlow",
                                          "ValueError", "DeadlockDetectedError")] == [
        "rejected", "killed-the-process", "outcome-unknown", "too-slow", "raised", "raised"]
    assert set(CAUSES) == {"rejected", "raised", "killed-the-process", "outcome-unknown",
                           "too-slow"}
