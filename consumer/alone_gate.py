"""The process-wide gate that makes a process death attributable to one record.

Rules
- One gate per worker process (``consumer.worker.Worker``), shared by its lifetimes' failure
  handling (``consumer.failure_run``). Every batch transaction enters it ``shared``: any
  number run side by side. A record of a suspect window is tried ``alone``: it waits until no
  shared transaction is in flight, and while it runs none starts. So a death during an
  attempt counted alone was that record's; a death while several records were in flight
  is counted against none.
- Alone requests win: once one waits, new shared entries wait too (the suspect windows drain
  first, then the healthy partitions go on). Alone holders take turns.
- ``try_shared`` is the hot path: a counter increment, no await, when no record is alone or
  waiting to be. Waiting re-checks ``stopped()`` at least every ``poll_s`` (a partition that
  closed, or a run that ends, stops waiting: the entry returns False).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["AloneGate"]


class AloneGate:
    """Shared entries side by side, or one alone entry (see the module Rules)."""

    def __init__(self, *, poll_s: float = 0.1) -> None:
        self._poll_s = poll_s
        self._shared = 0
        self._alone = False
        self._waiting = 0  # alone requests not yet in
        self._changed: asyncio.Event | None = None

    @property
    def alone_busy(self) -> bool:
        """A record is being tried alone, or waits to be."""
        return self._alone or self._waiting > 0

    def try_shared(self) -> bool:
        """Enter shared at once when nothing is alone or waiting to be; True when entered."""
        if self._alone or self._waiting:
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
            self._notify()

    async def alone(self, stopped: Callable[[], bool]) -> bool:
        """Enter alone once nothing else is in; False (not entered) once ``stopped()``."""
        self._waiting += 1
        try:
            while self._alone or self._shared:
                if stopped():
                    return False
                await self._changes()
            self._alone = True
            return True
        finally:
            self._waiting -= 1
            if not self._alone:
                self._notify()  # gave up: shared entries may go on

    def release_alone(self) -> None:
        self._alone = False
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
