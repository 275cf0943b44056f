"""The process-wide gate that makes a process death attributable to one record.

Rules
- One gate per worker process (``consumer.worker.Worker``), shared by its lifetimes' failure
  handling (``consumer.failure_run``). Every batch transaction enters it ``shared``: any
  number run side by side. A record of a suspect window is tried ``alone``: it waits until no
  shared transaction is in flight, and while it runs none starts. So a death during an
  attempt counted alone was that record's; a death while several records were in flight
  is counted against none.
- Alone requests win: once one waits, new shared entries wait too (the suspect windows drain
  first, then the healthy partitions go on). Alone requests are served first come, first
  served: a partition that asks again after its attempt queues behind the others, so the
  suspect windows of all partitions advance together.
- ``try_shared`` is the hot path: a counter increment, no await, when no record is alone or
  waiting to be. Waiting re-checks ``stopped()`` at least every ``poll_s`` (a partition that
  closed, or a run that ends, stops waiting: the entry returns False).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

__all__ = ["AloneGate"]


class AloneGate:
    """Shared entries side by side, or one alone entry (see the module Rules)."""

    def __init__(self, *, poll_s: float = 0.1) -> None:
        self._poll_s = poll_s
        self._shared = 0
        self._alone = False
        self._queue: collections.deque[asyncio.Future[None]] = collections.deque()
        self._changed: asyncio.Event | None = None

    @property
    def alone_busy(self) -> bool:
        """A record is being tried alone, or waits to be."""
        return self._alone or bool(self._queue)

    def try_shared(self) -> bool:
        """Enter shared at once when nothing is alone or waiting to be; True when entered."""
        if self._alone or self._queue:
            return False
        self._shared += 1
        return True

    async def shared(self, stopped: Callable[[], bool]) -> bool:
        """Enter shared; False (not entered) once ``stopped()``."""
        while not self.try_shared():
            if stopped():
                return False
            await self._changes()
        return True

    def release_shared(self) -> None:
        self._shared -= 1
        if self._shared == 0:
            self._grant()

    async def alone(self, stopped: Callable[[], bool]) -> bool:
        """Enter alone once nothing else is in and the requests before this one were
        served; False (not entered) once ``stopped()``."""
        if not self._alone and not self._shared and not self._queue:
            self._alone = True
            return True
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(turn)
        try:
            while not turn.done():
                if stopped():
                    self._queue.remove(turn)
                    self._notify()  # shared entries may go on
                    return False
                await asyncio.wait([turn], timeout=self._poll_s)
        except asyncio.CancelledError:
            if turn.done():
                self.release_alone()  # granted while being cancelled: pass it on
            elif turn in self._queue:
                self._queue.remove(turn)
                self._notify()
            raise
        return True

    def release_alone(self) -> None:
        self._alone = False
        self._grant()

    def _grant(self) -> None:
        """The next alone request in line gets the gate when it is free; else wake the
        shared entries waiting."""
        if self._alone or self._shared:
            return
        while self._queue:
            turn = self._queue.popleft()
            if not turn.done():
                self._alone = True
                turn.set_result(None)
                return
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def _changes(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        try:
            await asyncio.wait_for(self._changed.wait(), self._poll_s)
        except TimeoutError:
            pass
