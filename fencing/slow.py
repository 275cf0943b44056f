"""Pure decisions about slow handlers: how long a handler call may last, and how a batch
that was too slow is split.

Rules
- ``handler_limit_s``: a handler call may last 90 % of the session's idle-in-transaction
  timeout (PostgreSQL ends a session idle that long inside its transaction, and asyncpg then
  only reports "connection is closed") and at most three quarters of the call budget (the
  rest is COMMIT's and a lost reply's re-read). A longer one is stopped: ``TooSlow``.
- ``Split`` cuts a batch whose handler was too slow into halves until a chunk fits; a
  single record that still does not fit is too slow by itself (the caller quarantines it or
  stops). The size that fitted is kept for the partition's next batches and doubled again
  once a chunk commits in under a quarter of the limit.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Split", "handler_limit_s"]

_IDLE_SHARE = 0.9
_BUDGET_SHARE = 0.75


def handler_limit_s(*, budget_s: float, idle_in_transaction_s: float | None,
                    elapsed_s: float = 0.0) -> float:
    """The longest a handler call may last when ``elapsed_s`` of its call's budget is gone
    (see the module Rules)."""
    limit = _BUDGET_SHARE * budget_s - elapsed_s
    if idle_in_transaction_s is not None:
        limit = min(limit, _IDLE_SHARE * idle_in_transaction_s)
    return limit


@dataclass(slots=True)
class Split:
    """Chunks of a batch of ``n`` records whose handler was too slow (see the module Rules):
    ``next`` gives ``[start, end)`` of the next chunk to try."""

    n: int
    size: int  # records per chunk
    lo: int = 0

    @classmethod
    def after_too_slow(cls, n: int) -> Split:
        """The plan for a batch of ``n`` that was just too slow as a whole."""
        if n < 1:
            raise ValueError("split of an empty batch")
        return cls(n, max(1, n // 2))

    def next(self) -> tuple[int, int] | None:
        if self.lo >= self.n:
            return None
        return self.lo, min(self.n, self.lo + self.size)

    def too_slow(self) -> bool:
        """The current chunk was too slow: halve; True when it was a single record (too
        slow by itself: the caller settles it and calls ``skip``)."""
        chunk = self.next()
        if chunk is None:
            raise AssertionError("no chunk in progress")
        if chunk[1] - chunk[0] == 1:
            return True
        self.size = max(1, self.size // 2)
        return False

    def committed(self, *, duration_s: float, limit_s: float) -> None:
        """The current chunk committed in ``duration_s``; a fast chunk doubles the size."""
        start, end = self.lo, min(self.n, self.lo + self.size)
        self.lo = end
        if end - start == self.size and duration_s * 4 < limit_s:
            self.size *= 2

    def skip(self) -> None:
        """The current single record was settled otherwise (quarantined)."""
        self.lo += 1
