"""The gate of one lifetime: its state, the budget and task of every guarded call, the one
error frame, and retirement (which closes the gate). ``consumer.lifecycle.Lifecycle`` owns
one and runs every guarded operation through it.

Rules (see also the module Rules of ``consumer.lifecycle``)
- The state (``consumer.decisions.LifetimeState``) is the whole truth: calls do I/O only
  while LIVE; every change goes through ``move`` (``decisions.transition``).
- The gate shares the lifecycle's retained tokens, partition guards and open suspect
  windows: it waits on the guards, journals the held partitions and clears the tokens when
  the lifetime retires; it never adds to them.
- ``guarded`` runs a body in its own task, tracked so ``stop`` can cancel it, with a
  deadline taken before the body waits for any lock; a cancellation by ``stop`` reaches
  the caller as ``Retired``; a cancellation of the caller retires the lifetime.
- ``framed`` is the one error frame of every guarded call: a cancellation in the middle of
  I/O moves the lifetime to RETIRING at once (nothing may follow); a late call's ``Fenced``
  passes through without retiring; any other error goes to ``fail``.
- ``fail`` retires for an error and returns what to raise (``consumer.decisions``
  classifies). ``retire``: the call that moves LIVE -> RETIRING writes the one best-effort
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

__all__ = ["LaneCount", "LifetimeGate"]

T = TypeVar("T")


def _never_late() -> bool:
    return False


class LaneCount:
    """The lane transactions of one partition in flight (``Lifecycle.process_lane``): they
    hold no guard, so a revoke, an assign or a retirement waits for this to reach zero."""

    __slots__ = ("_idle", "n")

    def __init__(self) -> None:
        self.n = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.n += 1
        self._idle.clear()

    def leave(self) -> None:
        self.n -= 1
        if self.n == 0:
            self._idle.set()

    async def idle(self) -> None:
        await self._idle.wait()


class LifetimeGate:
    """State, budget, cancellation and retirement of one lifetime; see the module Rules."""

    def __init__(self, *, lifetime_id: str, store: FenceStore, clock: Callable[[], float],
                 budget_s: float, tokens: dict[TopicPartition, Token],
                 guards: dict[TopicPartition, asyncio.Lock],
                 suspect_open: set[TopicPartition],
                 lanes: dict[TopicPartition, LaneCount] | None = None) -> None:
        """``tokens``, ``guards``, ``suspect_open``: the lifecycle's, shared (module Rules)."""
        self.lifetime_id = lifetime_id
        self.state = LifetimeState.LIVE
        self.retired_reason: str | None = None
        self._store = store
        self._clock = clock
        self.budget_s = budget_s
        self._tokens = tokens
        self._guards = guards
        self._lanes = lanes if lanes is not None else {}
        self._suspect_open = suspect_open
        self.tasks: set[asyncio.Task[object]] = set()

    def move(self, to: LifetimeState) -> None:
        self.state = d.transition(self.state, to)

    def stop(self) -> None:
        """LIVE or RETIRING -> STOPPED, tokens dropped, calls in flight cancelled; no I/O."""
        if self.state is LifetimeState.LIVE:
            self.retired_reason = "stopped"
        if self.state in (LifetimeState.LIVE, LifetimeState.RETIRING):
            self.move(LifetimeState.STOPPED)
        self._tokens.clear()
        for task in list(self.tasks):
            task.cancel()

    def check_live(self) -> None:
        if self.state is not LifetimeState.LIVE:
            raise Retired(f"lifetime {self.lifetime_id} is {self.state.value}"
                          f" ({self.retired_reason or 'retiring'})")

    def live_until(self, deadline_s: float) -> Callable[[], None]:
        def check() -> None:
            self.check_live()
            if d.deadline_passed(self._clock(), deadline_s):
                raise BudgetExceeded(f"lifetime {self.lifetime_id}: budget of "
                                     f"{self.budget_s} s used up")
        return check

    async def guarded(self, body: Callable[[float], Awaitable[T]]) -> T:
        self.check_live()
        deadline_s = self._clock() + self.budget_s
        task: asyncio.Task[T] = asyncio.create_task(self._bounded(body, deadline_s))
        self.tasks.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if task.cancelled() and (me is None or me.cancelling() == 0):
                raise Retired(f"lifetime {self.lifetime_id} stopped during the call") from None
            await asyncio.shield(self.retire("cancelled by the caller", journal=False))
            raise
        finally:
            self.tasks.discard(task)

    async def _bounded(self, body: Callable[[float], Awaitable[T]], deadline_s: float) -> T:
        try:
            async with asyncio.timeout(max(0.0, deadline_s - self._clock())):
                return await body(deadline_s)
        except TimeoutError as exc:
            await self.retire(f"budget of {self.budget_s} s used up", journal=False)
            budget = BudgetExceeded(f"lifetime {self.lifetime_id}: the call outlived its "
                                    f"budget of {self.budget_s} s")
            budget.__cause__ = exc
            raise Retired(f"lifetime {self.lifetime_id}: budget used up") from budget

    async def framed(self, body: Callable[[], Awaitable[T]], *,
                     late: Callable[[], bool] = _never_late,
                     holding: TopicPartition | None = None) -> T:
        """Run ``body`` (the caller holds the mutex, or the guard of ``holding``) inside the
        one error frame of a guarded call; see the module Rules."""
        try:
            return await body()
        except asyncio.CancelledError:
            self.begin_retiring("interrupted during I/O")  # nothing may follow
            raise
        except Fenced as exc:
            if late():
                raise  # a late call after revoke/lost: nothing to retire for
            raise await self.fail(exc, holding=holding)  # noqa: B904 (cause set by fail)
        except Exception as exc:
            raise await self.fail(exc, holding=holding)  # noqa: B904

    async def fail(self, exc: BaseException, *,
                   holding: TopicPartition | None = None) -> BaseException:
        """Retire for ``exc`` (caller holds the mutex, or the guard of ``holding``); return
        what to raise."""
        action = d.classify_failure(exc)
        if action is d.FailureAction.PASS_THROUGH:
            return exc
        await self.retire(f"{type(exc).__name__}: {exc}",
                          journal=not isinstance(exc, BudgetExceeded), holding=holding)
        if action is d.FailureAction.RAISE_AS_IS:
            return exc
        retired = Retired(f"lifetime {self.lifetime_id} retired: {self.retired_reason}")
        retired.__cause__ = exc
        return retired

    def begin_retiring(self, reason: str) -> bool:
        """LIVE -> RETIRING (the gate closes); True when this call closed it."""
        if self.state is not LifetimeState.LIVE:
            return False
        self.move(LifetimeState.RETIRING)
        self.retired_reason = reason
        return True

    async def settle(self, tps: Iterable[TopicPartition]) -> None:
        """Wait for the in-flight process calls of ``tps`` (callers hold the mutex, or the
        gate is closed, so nothing new starts)."""
        for tp in sorted(set(tps)):
            guard = self._guards.get(tp)
            if guard is not None and guard.locked():
                async with guard:
                    pass
            lanes = self._lanes.get(tp)
            if lanes is not None and lanes.n:
                await lanes.idle()

    async def settle_others(self, holding: TopicPartition | None) -> None:
        """Wait, bounded by the budget, until no other partition's batch is in flight."""
        # a list, not a generator: wait_for runs the coroutine later, when another call may
        # have added a guard (a generator over the dict then raised RuntimeError)
        others = [tp for tp in {*self._guards, *self._lanes} if tp != holding]
        try:
            await asyncio.wait_for(self.settle(others), timeout=self.budget_s)
        except TimeoutError:
            pass  # each batch is bounded by its own budget; journaling is best effort

    async def retire(self, reason: str, *, journal: bool,
                     holding: TopicPartition | None = None) -> None:
        held = sorted(self._tokens)
        if self.begin_retiring(reason) and journal and held:
            await self.settle_others(holding)  # the retire row is the last write
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
            self.move(LifetimeState.RETIRED)
        self._tokens.clear()
