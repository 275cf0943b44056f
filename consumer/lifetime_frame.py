"""The guarded-call frame of a lifetime: state, budget, cancellation, retirement.

Rules (used by ``consumer.lifecycle.Lifecycle``; see its module Rules)
- The state (``consumer.decisions.LifetimeState``) is the whole truth: calls do I/O only
  while LIVE; every change goes through ``_move`` (``decisions.transition``).
- ``_guarded`` runs a body in its own task, tracked so ``stop`` can cancel it, with a
  deadline taken before the body waits for any lock; a cancellation by ``stop`` reaches
  the caller as ``Retired``; a cancellation of the caller retires the lifetime.
- ``_framed`` is the one error frame of every guarded call: a cancellation in the middle of
  I/O moves the lifetime to RETIRING at once (nothing may follow); a late call's ``Fenced``
  passes through without retiring; any other error goes to ``_fail``.
- ``_fail`` retires for an error and returns what to raise (``consumer.decisions``
  classifies). ``_retire``: the call that moves LIVE -> RETIRING writes the one best-effort
  ``retire`` journal row (after the other partitions' in-flight batches ended, so it is the
  lifetime's last write; a partition whose suspect window is open gets a row of its own
  saying so); RETIRING -> RETIRED follows. Budget exhaustion and cancellation
  retire without journaling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from consumer import decisions as d
from consumer.decisions import LifetimeState
from fencing.errors import BudgetExceeded, Fenced, FenceError, Retired
from fencing.failures import SUSPECT_OPEN
from fencing.store import FenceStore
from fencing.types import Token, TopicPartition

__all__ = ["LifetimeFrame"]

T = TypeVar("T")


def _never_late() -> bool:
    return False


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
    _suspect_open: set[TopicPartition]

    def _move(self, to: LifetimeState) -> None:
        self.state = d.transition(self.state, to)

    def _check_live(self) -> None:
        if self.state is not LifetimeState.LIVE:
            raise Retired(f"lifetime {self.lifetime_id} is {self.state.value}"
                          f" ({self.retired_reason or 'retiring'})")

    def _live_until(self, deadline_s: float) -> Callable[[], None]:
        def check() -> None:
            self._check_live()
            if d.deadline_passed(self._clock(), deadline_s):
                raise BudgetExceeded(f"lifetime {self.lifetime_id}: budget of "
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
            budget = BudgetExceeded(f"lifetime {self.lifetime_id}: the call outlived its "
                                    f"budget of {self._budget_s} s")
            budget.__cause__ = exc
            raise Retired(f"lifetime {self.lifetime_id}: budget used up") from budget

    async def _framed(self, body: Callable[[], Awaitable[T]], *,
                      late: Callable[[], bool] = _never_late,
                      holding: TopicPartition | None = None) -> T:
        """Run ``body`` (the caller holds the mutex, or the guard of ``holding``) inside the
        one error frame of a guarded call; see the module Rules."""
        try:
            return await body()
        except asyncio.CancelledError:
            self._begin_retiring("interrupted during I/O")  # nothing may follow
            raise
        except Fenced as exc:
            if late():
                raise  # a late call after revoke/lost: nothing to retire for
            raise await self._fail(exc, holding=holding)  # noqa: B904 (cause set by _fail)
        except Exception as exc:
            raise await self._fail(exc, holding=holding)  # noqa: B904

    async def _fail(self, exc: BaseException, *,
                    holding: TopicPartition | None = None) -> BaseException:
        """Retire for ``exc`` (caller holds the mutex, or the guard of ``holding``); return
        what to raise."""
        action = d.classify_failure(exc)
        if action is d.FailureAction.PASS_THROUGH:
            return exc
        await self._retire(f"{type(exc).__name__}: {exc}",
                           journal=not isinstance(exc, BudgetExceeded), holding=holding)
        if action is d.FailureAction.RAISE_AS_IS:
            return exc
        retired = Retired(f"lifetime {self.lifetime_id} retired: {self.retired_reason}")
        retired.__cause__ = exc
        return retired

    def _begin_retiring(self, reason: str) -> bool:
        """LIVE -> RETIRING (the gate closes); True when this call closed it."""
        if self.state is not LifetimeState.LIVE:
            return False
        self._move(LifetimeState.RETIRING)
        self.retired_reason = reason
        return True

    async def _settle(self, tps: Iterable[TopicPartition]) -> None:
        """Wait for the in-flight process calls of ``tps`` (callers hold the mutex, or the
        gate is closed, so nothing new starts)."""
        for tp in sorted(set(tps)):
            guard = self._guards.get(tp)
            if guard is not None and guard.locked():
                async with guard:
                    pass

    async def _settle_others(self, holding: TopicPartition | None) -> None:
        """Wait, bounded by the budget, until no other partition's batch is in flight."""
        # a list, not a generator: wait_for runs the coroutine later, when another call may
        # have added a guard (a generator over the dict then raised RuntimeError)
        others = [tp for tp in self._guards if tp != holding]
        try:
            await asyncio.wait_for(self._settle(others), timeout=self._budget_s)
        except TimeoutError:
            pass  # each batch is bounded by its own budget; journaling is best effort

    async def _retire(self, reason: str, *, journal: bool,
                      holding: TopicPartition | None = None) -> None:
        held = sorted(self._tokens)
        if self._begin_retiring(reason) and journal and held:
            await self._settle_others(holding)  # the retire row is the last write
            suspect = [tp for tp in held if tp in self._suspect_open]
            for tps, detail in ((suspect, f"{SUSPECT_OPEN}; {reason}"),
                                ([tp for tp in held if tp not in suspect], reason)):
                if not tps:
                    continue
                try:
                    await self._store.journal(tps, lifetime=self.lifetime_id, event="retire",
                                              detail=detail[:500])
                except FenceError:
                    pass  # best effort: the next owner then sees an unclean end
        if self.state is LifetimeState.RETIRING:
            self._move(LifetimeState.RETIRED)
        self._tokens.clear()
