"""Pure resolution of unknown outcomes (docs/ARCHITECTURE.md: "Resolving unknown outcomes")."""

from __future__ import annotations

import pytest

from fencing.resolution import Resolution, compatible_claim, resolve_process
from fencing.types import Token

SENT = Token(4, 10)


@pytest.mark.parametrize(("observed", "expected"), [
    (Token(4, 15), Resolution.COMMITTED),       # same epoch, frontier = batch end
    (Token(4, 10), Resolution.NOT_COMMITTED),   # same epoch, original frontier
    (Token(4, 12), Resolution.FENCED),          # same epoch, another frontier
    (Token(4, 20), Resolution.FENCED),
    (Token(5, 15), Resolution.FENCED),          # another epoch, even with the batch end
    (Token(5, 10), Resolution.FENCED),
    (Token(3, 10), Resolution.FENCED),
    (None, Resolution.FENCED),                  # row gone
])
def test_resolve_process(observed: Token | None, expected: Resolution) -> None:
    assert resolve_process(sent=SENT, batch_end=15, observed=observed) is expected


@pytest.mark.parametrize("batch_end", [10, 9])
def test_resolve_process_rejects_empty_batch(batch_end: int) -> None:
    with pytest.raises(ValueError):
        resolve_process(sent=SENT, batch_end=batch_end, observed=SENT)


@pytest.mark.parametrize(("claimed", "previous", "ok"), [
    (Token(1, 0), None, True),
    (Token(5, 7), Token(4, 7), True),
    (Token(4, 7), Token(4, 7), False),   # reading an epoch never proves we installed it
    (Token(3, 7), Token(4, 7), False),
    (Token(0, 0), None, False),
    (Token(1, -1), None, False),
])
def test_compatible_claim(claimed: Token, previous: Token | None, ok: bool) -> None:
    assert compatible_claim(claimed, previous) is ok
