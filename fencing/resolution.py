"""Pure decisions about tokens and unknown outcomes (DESIGN: "Resolving unknown outcomes").

Rules
- Unknown process commit, re-read ``observed``:
  same epoch and frontier == batch end  -> COMMITTED (advance the local frontier);
  same epoch and the original frontier  -> NOT_COMMITTED (retry the same batch);
  anything else (other epoch, other frontier, no row) -> FENCED (the lifetime retires).
- A claim's reply is compatible only when the epoch is positive and the frontier is
  not negative; reading an epoch never proves this caller installed it.
"""

from __future__ import annotations

import enum

from fencing.types import Token

__all__ = ["Resolution", "compatible_claim", "resolve_process"]


class Resolution(enum.Enum):
    COMMITTED = "committed"
    NOT_COMMITTED = "not-committed"
    FENCED = "fenced"


def resolve_process(*, sent: Token, batch_end: int, observed: Token | None) -> Resolution:
    """Classify an unknown process commit from the re-read token."""
    if batch_end <= sent.frontier:
        raise ValueError(f"batch end {batch_end} must be above the sent frontier {sent.frontier}")
    if observed is None or observed.epoch != sent.epoch:
        return Resolution.FENCED
    if observed.frontier == batch_end:
        return Resolution.COMMITTED
    if observed.frontier == sent.frontier:
        return Resolution.NOT_COMMITTED
    return Resolution.FENCED


def compatible_claim(claimed: Token, previous: Token | None) -> bool:
    """True when a claim's reply can be retained: a fresh epoch above any previous one."""
    if claimed.epoch < 1 or claimed.frontier < 0:
        return False
    return previous is None or claimed.epoch > previous.epoch
