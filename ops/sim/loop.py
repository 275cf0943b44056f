"""The simulator's event loop: its clock is the run's logical clock.

The lifecycle bounds each guarded call twice: by the injected clock (``_live_until``) and by
``asyncio.timeout``, a timer on the event loop's clock. On a stock loop that timer runs in
real time, so a sweep process starved of CPU for longer than a budget (0.4 s in a quarter
of generated traces) saw the budget expire although logical time never reached it, and the
run's report depended on the machine's load (seed 42518 ``valid`` ended BLOCKED in a
loaded 100,000-seed sweep and PASSed alone). Here the loop's ``time()`` is the run's
``LogicalClock``, so every timer (``asyncio.timeout``, ``wait_for``, ``sleep``) is logical.

How asyncio uses the two hooks (CPython 3.11 ``base_events.BaseEventLoop._run_once``): it
computes the select timeout from ``time()`` and the earliest timer (0 when callbacks are
ready, ``None`` when there is neither), calls ``selector.select(timeout)``, then runs every
timer whose deadline is before ``time()`` plus the clock resolution. The selector below
never blocks: when nothing is ready it moves logical time forward to the earliest timer
(rounded up to the clock's microsecond, or the timer would never be due), as real time
would have passed; with no timer at all the run could only hang, and raises
``SimulationStuck`` instead.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

__all__ = ["LogicalClock", "SimulationStuck", "run_sync"]

T = TypeVar("T")


class SimulationStuck(RuntimeError):
    """The simulated run waits for something that nothing will ever deliver."""


class LogicalClock:
    """Logical time in whole microseconds; ``wait`` advances it and yields once."""

    def __init__(self) -> None:
        self.now_us = 0

    def __call__(self) -> float:
        return self.now_us / 1_000_000

    def advance(self, seconds: float) -> None:
        """Move ``seconds`` on, to the microsecond; a positive wait moves at least one (a
        backoff polling its deadline with what is left of it must reach it)."""
        self.now_us += max(round(seconds * 1_000_000), 1 if seconds > 0 else 0)


class _LogicalSelector(selectors.BaseSelector):
    """Polls the loop's own file descriptors (its self-pipe) without blocking; an idle
    wait for a timer becomes a jump of logical time."""

    def __init__(self, clock: LogicalClock) -> None:
        self._real = selectors.DefaultSelector()
        self._clock = clock

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise SimulationStuck("the simulated run waits but nothing is ready and no "
                                  "timer is set: it would hang")
        self._clock.now_us += max(1, math.ceil(timeout * 1_000_000))
        return ready

    def close(self) -> None:
        self._real.close()

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()


class _LogicalLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: LogicalClock) -> None:
        super().__init__(_LogicalSelector(clock))
        self._logical = clock

    def time(self) -> float:
        return self._logical()


def run_sync(coro: Coroutine[Any, Any, T], *, clock: LogicalClock) -> T:
    """``asyncio.run(coro)`` on a loop whose time is ``clock``, and without ``asyncio.run``'s
    SIGINT handler: installing that handler formats the main task's repr (the whole trace,
    ~1 ms a run). Tasks left pending are cancelled and awaited before the loop closes, as
    ``asyncio.run`` does."""
    loop = _LogicalLoop(clock)
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
