"""The three-call policy (docs/ARCHITECTURE.md: "The three-call policy").

Rules
- A guarded store operation makes at most ``MAX_CALLS`` (3) calls.
- Between calls it waits ``WAITS_S`` (100 ms, then 200 ms) through the injected ``wait``.
- Only ``StoreUnavailable`` (``NotCommitted`` and ``ReadFailed``) is retried; every other
  error, including ``OutcomeUnknown`` and ``Fenced``, propagates at once.
- ``check_live`` runs before every call, so cancellation is seen after each wait and
  before the next call; whatever it raises propagates unchanged.
- After the last call the last ``StoreUnavailable`` is re-raised.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_chain,
    wait_fixed,
)

from fencing.errors import StoreUnavailable

__all__ = ["MAX_CALLS", "WAITS_S", "Wait", "with_policy"]

T = TypeVar("T")
Wait = Callable[[float], Awaitable[None]]

MAX_CALLS = 3
WAITS_S = (0.1, 0.2)


def _never_cancelled() -> None:
    return None


async def with_policy(
    call: Callable[[], Awaitable[T]],
    *,
    wait: Wait,
    check_live: Callable[[], None] = _never_cancelled,
    on_retry: Callable[[BaseException, float], None] | None = None,
) -> T:
    """Run ``call`` under the three-call policy; return its result or raise its last error."""

    def before(_state: RetryCallState) -> None:
        check_live()

    def before_sleep(state: RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None and state.next_action is not None:
            exc = state.outcome.exception()
            if exc is not None:
                on_retry(exc, state.next_action.sleep)

    retrying = AsyncRetrying(
        stop=stop_after_attempt(MAX_CALLS),
        wait=wait_chain(*(wait_fixed(s) for s in WAITS_S)),
        retry=retry_if_exception_type(StoreUnavailable),
        sleep=wait,
        before=before,
        before_sleep=before_sleep,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await call()
    raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover
