"""The simulator's event loop keeps logical time: a run's report does not depend on how
much CPU the process had. A budget (``asyncio.timeout`` in the lifecycle) is a timer on the
loop's clock, and the simulator's loop reads the run's logical clock, so a process starved
of CPU (another sweep job, a full test suite beside it) sees exactly the report of a quiet
one. Before this, seed 42518 ``valid`` ended BLOCKED ("the call outlived its budget of
0.4 s") in a loaded 100,000-seed sweep and PASSed when replayed alone."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from fencing.memory.store import MemoryFenceStore
from ops.sim import make_trace, run_trace
from ops.sim.loop import LogicalClock, SimulationStuck, run_sync


def _starve(monkeypatch: pytest.MonkeyPatch, calls: list[str], names: tuple[str, ...]) -> None:
    """Every store call of ``names`` blocks the loop's thread for longer than the budget,
    as a process that gets no CPU for that long would."""
    for name in names:
        def make(name: str, original: Any) -> Any:
            async def slow(self: MemoryFenceStore, *args: Any, **kwargs: Any) -> Any:
                calls.append(name)
                time.sleep(0.45)  # noqa: ASYNC251 (blocking on purpose: starvation)
                return await original(self, *args, **kwargs)
            return slow
        monkeypatch.setattr(MemoryFenceStore, name, make(name, getattr(MemoryFenceStore, name)))


@pytest.mark.parametrize(("seed", "names"), [(149, ("claim", "process")),
                                             (27, ("claim", "process_lane"))],
                         ids=["batches", "lanes"])
def test_a_run_starved_of_cpu_reports_what_a_quiet_run_reports(
        monkeypatch: pytest.MonkeyPatch, seed: int, names: tuple[str, ...]) -> None:
    trace = make_trace(seed, steps=6)
    assert (trace.config.lanes > 1) == ("process_lane" in names)
    assert trace.config.budget_ms < 450  # each starved call outlives the budget in real time
    quiet = run_trace(trace)
    calls: list[str] = []
    _starve(monkeypatch, calls, names)
    starved = run_trace(trace)
    assert set(names) <= set(calls)  # starved inside guarded calls of both kinds
    assert dumps_report(starved) == dumps_report(quiet)
    assert quiet["status"] == "PASS"


def dumps_report(report: dict[str, Any]) -> str:
    return json.dumps(report, sort_keys=True)


def test_the_loop_jumps_to_the_next_timer_instead_of_sleeping() -> None:
    clock = LogicalClock()

    async def nap() -> float:
        await asyncio.sleep(3600)  # an hour of logical time, no real time
        return clock()
    started = time.monotonic()
    assert run_sync(nap(), clock=clock) == pytest.approx(3600, abs=1e-6)
    assert time.monotonic() - started < 5


def test_a_budget_expires_in_logical_time() -> None:
    clock = LogicalClock()

    async def bounded() -> str:
        try:
            async with asyncio.timeout(0.4):
                clock.advance(0.5)  # a store call that took 0.5 s of logical time
                await asyncio.sleep(0)
                await asyncio.sleep(0)
        except TimeoutError:
            return f"expired at {clock():.1f}"
        return "not expired"
    assert run_sync(bounded(), clock=clock) == "expired at 0.5"


def test_a_run_waiting_on_nothing_is_reported_not_hung() -> None:
    clock = LogicalClock()

    async def forever() -> None:
        await asyncio.get_running_loop().create_future()
    with pytest.raises(SimulationStuck, match="nothing is ready"):
        run_sync(forever(), clock=clock)
