"""The one polling helper of the suite: wait for an observable condition, or fail saying what.

``wait_until`` polls a predicate from synchronous test code (worker subprocesses, HTTP
endpoints, rows); ``until_async`` does the same from a coroutine, running a blocking
predicate in a thread so the event loop keeps serving. Prefer an event or a future where
one exists: poll only what another process or thread changes.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

__all__ = ["until_async", "until_blocking", "wait_until"]


def wait_until(pred: Callable[[], Any], *, timeout_s: float, what: str,
               interval_s: float = 0.2) -> Any:
    """Return ``pred()`` once truthy; raise ``AssertionError`` naming ``what`` after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


async def until_async(pred: Callable[[], Any], *, timeout_s: float = 5.0,
                      what: str = "the condition", interval_s: float = 0.01,
                      blocking: bool = False) -> Any:
    """``wait_until`` for coroutines; ``blocking``: ``pred`` does I/O (run in a thread)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        got = await asyncio.to_thread(pred) if blocking else pred()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(interval_s)


async def until_blocking(pred: Callable[[], Any], *, timeout_s: float, what: str) -> Any:
    """``until_async`` for a predicate that does blocking I/O (HTTP, a database query)."""
    return await until_async(pred, timeout_s=timeout_s, what=what, interval_s=0.2,
                             blocking=True)
