"""consumer.outage: one bound per episode, backoff, give-up message, early stop (no real time)."""

from __future__ import annotations

import asyncio

import pytest

from consumer.outage import OutageBound, OutageWatch, retry_outage, retry_outage_async
from fencing.errors import ConfigError, SourceUnavailable


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s

    async def asleep(self, s: float) -> None:
        self.sleep(s)


def _give_up(exc: BaseException, elapsed_s: float) -> BaseException:
    return SourceUnavailable(f"gave up after {elapsed_s:.1f} s: {exc}")


def test_schedule_doubles_to_the_cap_and_never_passes_the_bound() -> None:
    b = OutageBound(bound_s=20.0, started_s=0.0)
    assert [b.next_wait_s(attempt=n, now_s=0.0) for n in (1, 2, 3, 4, 5)] == [
        0.5, 1.0, 2.0, 4.0, 5.0]
    assert b.next_wait_s(attempt=9, now_s=18.0) == 2.0  # only what is left of the bound
    assert b.next_wait_s(attempt=9, now_s=20.0) is None


def test_an_episode_shorter_than_the_bound_is_retried_to_success() -> None:
    t = FakeTime()
    calls: list[float] = []

    def call() -> str:
        calls.append(t.now)
        if len(calls) < 4:
            raise SourceUnavailable("controller moving")
        return "facts"

    retried: list[float] = []
    got = retry_outage(call, bound_s=60.0, retry_on=(SourceUnavailable,), give_up=_give_up,
                       clock=t.clock, sleep=t.sleep, on_retry=lambda _e, s: retried.append(s))
    assert got == "facts"
    assert t.sleeps == retried == [0.5, 1.0, 2.0]


def test_past_the_bound_the_last_error_is_given_up_naming_the_time() -> None:
    t = FakeTime()
    n = 0

    def call() -> None:
        nonlocal n
        n += 1
        raise SourceUnavailable(f"timed out #{n}")

    with pytest.raises(SourceUnavailable, match=r"gave up after 10.0 s: timed out #") as info:
        retry_outage(call, bound_s=10.0, retry_on=(SourceUnavailable,), give_up=_give_up,
                     clock=t.clock, sleep=t.sleep)
    assert sum(t.sleeps) == pytest.approx(10.0)
    assert isinstance(info.value.__cause__, SourceUnavailable)
    assert str(info.value.__cause__) == f"timed out #{n}"  # the last error, chained


def test_other_errors_propagate_at_once_and_stopped_ends_early() -> None:
    t = FakeTime()

    def refused() -> None:
        raise ConfigError("topic gone")

    with pytest.raises(ConfigError):
        retry_outage(refused, bound_s=60.0, retry_on=(SourceUnavailable,), give_up=_give_up,
                     clock=t.clock, sleep=t.sleep)
    assert t.sleeps == []
    stop = False

    def flaky() -> None:
        nonlocal stop
        stop = True
        raise SourceUnavailable("down")

    with pytest.raises(SourceUnavailable, match=r"^down$"):  # unchanged: not given up
        retry_outage(flaky, bound_s=60.0, retry_on=(SourceUnavailable,), give_up=_give_up,
                     clock=t.clock, sleep=t.sleep, stopped=lambda: stop)


def test_async_variant_keeps_the_same_schedule() -> None:
    t = FakeTime()
    n = 0

    async def call() -> int:
        nonlocal n
        n += 1
        if n < 3:
            raise SourceUnavailable("x")
        return n

    got = asyncio.run(retry_outage_async(call, bound_s=60.0, retry_on=(SourceUnavailable,),
                                         give_up=_give_up, clock=t.clock, sleep=t.asleep))
    assert got == 3 and t.sleeps == [0.5, 1.0]


def test_watch_opens_on_failure_closes_on_answer_and_reports_past_the_bound() -> None:
    t = FakeTime()
    w = OutageWatch(bound_s=20.0, clock=t.clock)
    assert w.over() is None
    w.failed("commit: _TRANSPORT")
    t.now += 15
    w.failed("lag sample: list_offsets -1001")
    assert w.over() is None
    t.now += 5
    assert w.over() == (20.0, "lag sample: list_offsets -1001")  # from the first failure
    w.answered()
    assert w.over() is None
    t.now += 100
    assert w.over() is None  # quiet is not an outage
