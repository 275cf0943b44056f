"""The guarded-call frame of a lifetime: liveness gate, budget, cancellation, retirement.

Rules (used by ``consumer.lifecycle.Lifecycle``; see its module Rules)
- ``_guarded`` runs a body in its own task, tracked so ``stop`` can cancel it, with a
  deadline taken before the body waits for any lock; a cancellation by ``stop`` reaches
  the caller as ``Retired``; a cancellation of the caller retires the lifetime.
- ``_fail`` retires for an error and returns what to raise (``consumer.decisions``
  classifies); ``_retire`` closes the gate first, journals best-effort, then marks RETIRED.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from consumer import decisions as d
from consumer.decisions import LifetimeState
from fencing.errors import FenceError, Retired
from fencing.store import FenceStore
from fencing.types import Token, TopicPartition

__all__ = ["LifetimeFrame"]

T = TypeVar("T")


class LifetimeFrame:
    """State and guarded-call machinery shared by every lifecycle operation."""

    lifetime_id: str
    state: LifetimeState
    retired_reason: str | None
    _store: FenceStore
    _clock: Callable[[], float]
    _budget_s: float
    _tokens: dict[TopicPartition, Token]
    _tasks: set[asyncio.Task[object]]
    _guards: dict[TopicPartition, asyncio.Lock]
    _gate_open: bool

    def _check_live(self) -> None:
        if self.state is not LifetimeState.LIVE or not self._gate_open:
            raise Retired(f"lifetime {self.lifetime_id} is {self.state.value}"
                          f" ({self.retired_reason or 'retiring'})")

    def _live_until(self, deadline_s: float) -> Callable[[], None]:
        def check() -> None:
            self._check_live()
            if d.deadline_passed(self._clock(), deadline_s):
                raise d.BudgetExceeded(f"lifetime {self.lifetime_id}: budget of "
                                       f"{self._budget_s} s used up")
        return check

    async def _guarded(self, body: Callable[[float], Awaitable[T]]) -> T:
        self._check_live()
        deadline_s = self._clock() + self._budget_s
        task: asyncio.Task[T] = asyncio.create_task(self._bounded(body, deadline_s))
        self._tasks.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if task.cancelled() and (me is None or me.cancelling() == 0):
                raise Retired(f"lifetime {self.lifetime_id} stopped during the call") from None
            await asyncio.shield(self._retire("cancelled by the caller", journal=False))
            raise
        finally:
            self._tasks.discard(task)

    async def _bounded(self, body: Callable[[float], Awaitable[T]], deadline_s: float) -> T:
        try:
            async with asyncio.timeout(max(0.0, deadline_s - self._clock())):
                return await body(deadline_s)
        except TimeoutError as exc:
            await self._retire(f"budget of {self._budget_s} s used up", journal=False)
            budget = d.BudgetExceeded(f"lifetime {self.lifetime_id}: the call outlived its "
                                      f"budget of {self._budget_s} s")
            budget.__cause__ = exc
            raise Retired(f"lifetime {self.lifetime_id}: budget used up") from budget

    async def _fail(self, exc: BaseException, *,
                    holding: TopicPartition | None = None) -> BaseException:
        """Retire for ``exc`` (caller holds the mutex, or the guard of ``holding``); return
        what to raise."""
        action = d.classify_failure(exc)
        if action is d.FailureAction.PASS_THROUGH:
            return exc
        await self._retire(f"{type(exc).__name__}: {exc}",
                           journal=not isinstance(exc, d.BudgetExceeded), holding=holding)
        if action is d.FailureAction.RAISE_AS_IS:
            return exc
        retired = Retired(f"lifetime {self.lifetime_id} retired: {self.retired_reason}")
        retired.__cause__ = exc
        return retired

    async def _settle_others(self, holding: TopicPartition | None) -> None:
        """Wait, bounded by the budget, until no other partition's batch is in flight."""
        others = [g for tp, g in self._guards.items() if tp != holding and g.locked()]
        if not others:
            return

        async def settle() -> None:
            for guard in others:
                async with guard:
                    pass

        try:
            await asyncio.wait_for(settle(), timeout=self._budget_s)
        except TimeoutError:
            pass  # each batch is bounded by its own budget; journaling is best effort

    async def _retire(self, reason: str, *, journal: bool,
                      holding: TopicPartition | None = None) -> None:
        if self.state is not LifetimeState.LIVE:
            return
        first = self._gate_open
        self._gate_open = False
        if first:
            self.retired_reason = reason  # the first cause, whoever finishes the retirement
        held = sorted(self._tokens)
        if journal and first and held:
            await self._settle_others(holding)  # the retire row is the last write
            try:
                await self._store.journal(held, lifetime=self.lifetime_id, event="retire",
                                          detail=reason[:500])
            except FenceError:
                pass  # best effort: the journal decides nothing
        if self.state is LifetimeState.LIVE:
            self.state = d.transition(self.state, LifetimeState.RETIRED)
            self.retired_reason = self.retired_reason or reason
        self._tokens.clear()
