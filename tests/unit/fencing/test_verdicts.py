"""``check_verdicts`` and ``accepted_all``: the per-batch verdict check of both stores."""

from __future__ import annotations

import pytest

from fencing.errors import HandlerDeclarationError
from fencing.handler import accepted_all, check_verdicts
from fencing.types import ACCEPT, Accept, Reject


def test_all_accepted_is_recognised_also_for_fresh_accept_instances() -> None:
    assert accepted_all([ACCEPT] * 500, 500)
    assert accepted_all([Accept(), ACCEPT], 2)  # equal to the singleton, not identical
    assert check_verdicts([ACCEPT] * 3, 3) == [ACCEPT] * 3


def test_a_reject_among_accepts_is_not_all_accepted() -> None:
    verdicts: list[Accept | Reject] = [ACCEPT, Reject("bad"), ACCEPT]
    assert not accepted_all(verdicts, 3)
    assert check_verdicts(verdicts, 3) is verdicts


@pytest.mark.parametrize("verdicts", [[ACCEPT] * 2, [ACCEPT, "ok", ACCEPT], [True] * 3])
def test_wrong_count_or_type_raises_from_both(verdicts: list[object]) -> None:
    with pytest.raises(HandlerDeclarationError, match="verdicts for 3 records"):
        accepted_all(verdicts, 3)  # type: ignore[arg-type]
    with pytest.raises(HandlerDeclarationError, match="verdicts for 3 records"):
        check_verdicts(verdicts, 3)  # type: ignore[arg-type]
