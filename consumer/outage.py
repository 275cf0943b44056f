"""Outages of a service the worker needs: retried with backoff within one bound per episode.

Rules
- An episode starts with the first failed call and ends with a call that succeeds. Its calls
  are retried after ``BACKOFF_S`` (0.5 s, doubling up to 5 s) while the episode is younger
  than its bound (``--outage-bound-s``, default ``DEFAULT_BOUND_S`` = 60 s); the next wait
  never runs past the bound, so the last call is made at the bound at the latest.
- Past the bound the failure is given up: ``give_up`` turns the last error into the one
  raised (``SourceUnavailable``/``StoreUnavailable`` saying how long the service did not
  answer), chained to it; it ends the lifetime with exit 5 (``consumer.exits``).
- Only errors of ``retry_on`` are retried; any other propagates at once, unchanged.
- ``stopped`` is checked before every call after the first: once it is true (the lifetime is
  ending) the last error is re-raised unchanged instead of waiting on.
- The clock and the sleep are injected (tenacity runs the loop with them), so tests and the
  simulator need no real time.
- ``OutageWatch`` follows Kafka between calls that are not retried here (a lifetime's lag
  samples, the offset mirror's commits, the group session): a failure opens an episode, any
  answer closes it; ``over`` says when an open episode has outlived the bound. It is
  thread-safe (the Kafka thread and the loop both report).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception_type,
)

__all__ = ["BACKOFF_S", "DEFAULT_BOUND_S", "GiveUp", "OutageBound", "OutageWatch",
           "kafka_gave_up", "retry_outage", "retry_outage_async"]

T = TypeVar("T")
#: default of ``--outage-bound-s``: seconds one episode of an unreachable service is retried
DEFAULT_BOUND_S = 60.0
#: first wait, factor, longest wait between two calls of one episode
BACKOFF_S = (0.5, 2.0, 5.0)

GiveUp = Callable[[BaseException, float], BaseException]


def kafka_gave_up(*, where: str, servers: str, bound_s: float) -> GiveUp:
    """The error a Kafka outage longer than the bound ends with (exit 5): it names the
    cluster (``servers``, from ``where``: the flag or the environment variable)."""
    from fencing.errors import SourceUnavailable

    def give_up(exc: BaseException, elapsed_s: float) -> BaseException:
        return SourceUnavailable(
            f"{where} {servers}: Kafka did not answer for {elapsed_s:.0f} s (--outage-bound-s "
            f"{bound_s:g}): {exc}; check the host and port (and any -X security settings) and "
            "that the cluster runs")
    return give_up


class OutageBound:
    """The pure schedule of one episode: when the next call is due, when to give up."""

    def __init__(self, *, bound_s: float, started_s: float) -> None:
        if bound_s < 0:
            raise ValueError("bound_s must be >= 0")
        self.bound_s = bound_s
        self.started_s = started_s

    def elapsed_s(self, now_s: float) -> float:
        return max(0.0, now_s - self.started_s)

    def next_wait_s(self, *, attempt: int, now_s: float) -> float | None:
        """The wait before call ``attempt + 1`` after ``attempt`` failed calls (1-based), or
        None when the episode is over its bound."""
        left = self.bound_s - self.elapsed_s(now_s)
        if left <= 0:
            return None
        first, factor, longest = BACKOFF_S
        return min(first * factor ** (attempt - 1), longest, left)


class OutageWatch:
    """Episodes of a service observed through calls that succeed or fail (see Rules)."""

    def __init__(self, *, bound_s: float, clock: Callable[[], float]) -> None:
        self.bound_s = bound_s
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None
        self._last = ""

    def failed(self, what: str) -> None:
        """A call failed because the service did not answer: open (or extend) an episode."""
        with self._lock:
            if self._since is None:
                self._since = self._clock()
            self._last = what

    def answered(self) -> None:
        """The service answered a call: the episode, if any, is over."""
        with self._lock:
            self._since, self._last = None, ""

    def over(self) -> tuple[float, str] | None:
        """(seconds, last failure) once the open episode is at least the bound old."""
        with self._lock:
            if self._since is None:
                return None
            elapsed = self._clock() - self._since
            return (elapsed, self._last) if elapsed >= self.bound_s else None


def _retrying_kwargs(*, bound_s: float, retry_on: tuple[type[BaseException], ...],
                     clock: Callable[[], float], stopped: Callable[[], bool],
                     on_retry: Callable[[BaseException, float], None] | None,
                     ) -> tuple[OutageBound, dict[str, object]]:
    episode = OutageBound(bound_s=bound_s, started_s=clock())

    def wait(state: RetryCallState) -> float:
        due = episode.next_wait_s(attempt=state.attempt_number, now_s=clock())
        return 0.0 if due is None else due

    def stop(state: RetryCallState) -> bool:
        return stopped() or episode.next_wait_s(attempt=state.attempt_number,
                                                now_s=clock()) is None

    def before_sleep(state: RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None and state.next_action is not None:
            exc = state.outcome.exception()
            if exc is not None:
                on_retry(exc, state.next_action.sleep)

    return episode, {"stop": stop, "wait": wait, "retry": retry_if_exception_type(retry_on),
                     "before_sleep": before_sleep, "reraise": True}


def retry_outage(call: Callable[[], T], *, bound_s: float,
                 retry_on: tuple[type[BaseException], ...], give_up: GiveUp,
                 clock: Callable[[], float], sleep: Callable[[float], None],
                 stopped: Callable[[], bool] = lambda: False,
                 on_retry: Callable[[BaseException, float], None] | None = None) -> T:
    """``call()`` retried within one episode's bound (see the module Rules); blocking."""
    episode, kwargs = _retrying_kwargs(bound_s=bound_s, retry_on=retry_on, clock=clock,
                                       stopped=stopped, on_retry=on_retry)
    try:
        for attempt in Retrying(sleep=sleep, **kwargs):  # type: ignore[arg-type]
            with attempt:
                return call()
    except retry_on as exc:
        if stopped():
            raise
        raise give_up(exc, episode.elapsed_s(clock())) from exc
    raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover


async def retry_outage_async(call: Callable[[], Awaitable[T]], *, bound_s: float,
                             retry_on: tuple[type[BaseException], ...], give_up: GiveUp,
                             clock: Callable[[], float],
                             sleep: Callable[[float], Awaitable[None]],
                             stopped: Callable[[], bool] = lambda: False,
                             on_retry: Callable[[BaseException, float], None] | None = None,
                             ) -> T:
    """``await call()`` retried within one episode's bound (see the module Rules)."""
    episode, kwargs = _retrying_kwargs(bound_s=bound_s, retry_on=retry_on, clock=clock,
                                       stopped=stopped, on_retry=on_retry)
    try:
        async for attempt in AsyncRetrying(sleep=sleep, **kwargs):  # type: ignore[arg-type]
            with attempt:
                return await call()
    except retry_on as exc:
        if stopped():
            raise
        raise give_up(exc, episode.elapsed_s(clock())) from exc
    raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover
