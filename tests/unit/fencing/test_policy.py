"""The three-call policy: exact call counts, waits, what is retried, liveness checks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from fencing.errors import Fenced, NotCommitted, OutcomeUnknown, ReadFailed, Retired
from fencing.policy import MAX_CALLS, WAITS_S, with_policy


class Script:
    """A call that raises the scripted errors in order, then returns ``"ok"``."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.log: list[str] = []

    async def __call__(self) -> str:
        self.calls += 1
        self.log.append("call")
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def waits_into(script: Script, waits: list[float]) -> Callable[[float], Awaitable[None]]:
    async def wait(seconds: float) -> None:
        waits.append(seconds)
        script.log.append(f"wait {seconds}")

    return wait


def test_constants() -> None:
    assert MAX_CALLS == 3 and WAITS_S == (0.1, 0.2)


async def test_success_first_call_no_wait() -> None:
    s = Script()
    waits: list[float] = []
    assert await with_policy(s, wait=waits_into(s, waits)) == "ok"
    assert s.calls == 1 and waits == []


@pytest.mark.parametrize("error", [NotCommitted("x"), ReadFailed("x")])
async def test_retryable_three_calls_then_last_error(error: Exception) -> None:
    last = type(error)("last")
    s = Script(error, error, last, error)
    waits: list[float] = []
    with pytest.raises(type(error)) as info:
        await with_policy(s, wait=waits_into(s, waits))
    assert info.value is last
    assert s.calls == 3 and waits == [0.1, 0.2]
    assert s.log == ["call", "wait 0.1", "call", "wait 0.2", "call"]


async def test_retry_then_success() -> None:
    s = Script(NotCommitted("a"), ReadFailed("b"))
    waits: list[float] = []
    assert await with_policy(s, wait=waits_into(s, waits)) == "ok"
    assert s.calls == 3 and waits == [0.1, 0.2]


@pytest.mark.parametrize("error", [OutcomeUnknown("u"), Fenced("f"), ValueError("bug")])
async def test_non_retryable_propagates_at_once(error: Exception) -> None:
    s = Script(error)
    waits: list[float] = []
    with pytest.raises(type(error)):
        await with_policy(s, wait=waits_into(s, waits))
    assert s.calls == 1 and waits == []


async def test_check_live_runs_before_every_call_after_each_wait() -> None:
    s = Script(NotCommitted("a"), NotCommitted("b"))
    waits: list[float] = []
    checks: list[int] = []

    def check_live() -> None:
        checks.append(s.calls)
        s.log.append("check")

    assert await with_policy(s, wait=waits_into(s, waits), check_live=check_live) == "ok"
    assert s.log == ["check", "call", "wait 0.1", "check", "call", "wait 0.2", "check", "call"]


async def test_cancellation_seen_after_wait_stops_before_next_call() -> None:
    s = Script(NotCommitted("a"), NotCommitted("b"))
    waits: list[float] = []
    live = {"ok": True}

    async def wait(seconds: float) -> None:
        waits.append(seconds)
        live["ok"] = False  # stopped during the wait

    def check_live() -> None:
        if not live["ok"]:
            raise Retired("stopped")

    with pytest.raises(Retired):
        await with_policy(s, wait=wait, check_live=check_live)
    assert s.calls == 1 and waits == [0.1]


async def test_on_retry_reports_error_and_wait() -> None:
    s = Script(NotCommitted("a"))
    waits: list[float] = []
    seen: list[tuple[str, float]] = []
    await with_policy(s, wait=waits_into(s, waits),
                      on_retry=lambda exc, w: seen.append((str(exc), w)))
    assert seen == [("a", 0.1)]
