"""Pure lifecycle decisions: states and transitions, tokens, seek, batches, failures."""

from __future__ import annotations

import pytest

from consumer import decisions as d
from consumer.decisions import FailureAction, LifetimeState
from fencing.errors import (
    BudgetExceeded,
    ConfigError,
    Fenced,
    HandlerFailed,
    NotCommitted,
    OutcomeUnknown,
    ReadFailed,
    RecreatedTopic,
    RetentionGap,
    Retired,
    Unresolved,
)
from fencing.types import SourceFacts, SourceRecord, Token, TopicPartition

TP = TopicPartition("t", 0)


L, RG, RD, S = (LifetimeState.LIVE, LifetimeState.RETIRING, LifetimeState.RETIRED,
                LifetimeState.STOPPED)


@pytest.mark.parametrize(("src", "dst", "legal"), [
    (src, dst, (src, dst) in {(L, RG), (L, S), (RG, RD), (RG, S)})
    for src in LifetimeState for dst in LifetimeState])
def test_transition_table_is_the_whole_truth(src: LifetimeState, dst: LifetimeState,
                                             legal: bool) -> None:
    """LIVE -> RETIRING -> RETIRED; LIVE/RETIRING -> STOPPED; nothing else, ever."""
    if legal:
        assert d.transition(src, dst) is dst
    else:
        with pytest.raises(d.IllegalTransition):
            d.transition(src, dst)


T1, T1_EQUAL = Token(1, 5), Token(1, 5)


@pytest.mark.parametrize(("held", "current", "late"), [
    (None, None, True),  # no token when the call started (after revoke/lost)
    (T1, None, True),  # dropped while it waited for the mutex or the guard
    (T1, T1_EQUAL, True),  # replaced (a new claim) -- identity, not equality
    (T1, T1, False),  # still ours: a fence is real and retires the lifetime
])
def test_late_call_rule(held: Token | None, current: Token | None, late: bool) -> None:
    assert d.late_call(held, current) is late


def test_initial_frontier_follows_auto_offset_reset() -> None:
    facts = SourceFacts("id", 3, 9)
    assert d.initial_frontier(facts, "earliest") == 3
    assert d.initial_frontier(facts, "latest") == 9
    with pytest.raises(ConfigError, match="auto_offset_reset"):
        d.initial_frontier(facts, "none")


def test_a_claim_is_retained_only_above_every_known_epoch() -> None:
    assert d.retain_claim(Token(1, 0), None)
    assert d.retain_claim(Token(5, 2), d.newest(Token(3, 9), Token(4, 1), None))
    assert not d.retain_claim(Token(4, 2), Token(4, 2))  # reading an epoch proves nothing
    assert not d.retain_claim(Token(3, 2), Token(4, 2))
    assert not d.retain_claim(Token(0, 0), None)
    assert not d.retain_claim(None, None)
    assert d.newest(None, None) is None


def test_seek_needs_the_exact_retained_token() -> None:
    assert d.seek_matches(Token(2, 5), Token(2, 5))
    assert not d.seek_matches(Token(2, 5), Token(3, 5))  # a newer owner
    assert not d.seek_matches(Token(2, 5), Token(2, 6))  # progress this lifetime never saw
    assert not d.seek_matches(Token(2, 5), None)


def _r(offset: int, partition: int = 0) -> SourceRecord:
    return SourceRecord("t", partition, offset, b"k", b"v")


def test_submittable_drops_durable_records_and_refuses_bad_batches() -> None:
    assert [r.offset for r in d.submittable(Token(1, 5), [_r(3), _r(4), _r(7)])] == [7]
    assert d.submittable(Token(1, 9), [_r(3)]) == ()
    with pytest.raises(ValueError, match="out of order"):
        d.check_batch(TP, [_r(4), _r(4)])
    with pytest.raises(ValueError, match="record of t\\[1\\]"):
        d.check_batch(TP, [_r(4, partition=1)])


@pytest.mark.parametrize(("exc", "action"), [
    (Retired("x"), FailureAction.PASS_THROUGH),
    (Fenced("x"), FailureAction.RAISE_AS_IS),
    (RecreatedTopic("x"), FailureAction.RAISE_AS_IS),
    (RetentionGap("x"), FailureAction.RAISE_AS_IS),
    (NotCommitted("x"), FailureAction.RAISE_RETIRED),
    (ReadFailed("x"), FailureAction.RAISE_RETIRED),
    (OutcomeUnknown("x"), FailureAction.RAISE_RETIRED),
    (Unresolved("x"), FailureAction.RAISE_RETIRED),
    (BudgetExceeded("x"), FailureAction.RAISE_RETIRED),
    (RuntimeError("handler bug"), FailureAction.RAISE_RETIRED),
    (HandlerFailed("x", transient=False, error_type="ValueError", error_message="m",
                   traceback_digest="0" * 16), FailureAction.PASS_THROUGH),  # not retired
])
def test_failure_classification(exc: BaseException, action: FailureAction) -> None:
    assert d.classify_failure(exc) is action


def test_deadline_is_inclusive() -> None:
    assert not d.deadline_passed(19.999, 20.0)
    assert d.deadline_passed(20.0, 20.0)


def test_package_exports() -> None:
    import consumer
    import ops.sim

    for module in (consumer, d, ops.sim):
        assert all(hasattr(module, name) for name in module.__all__), module
    assert {"Lifecycle", "LifetimeState"} <= set(consumer.__all__)
