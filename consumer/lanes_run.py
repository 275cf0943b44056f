"""One partition's key-ordered lanes in a lifetime (``--lanes N``; ``fencing.lanes``).

Rules
- A partition runs lanes when ``--lanes`` is above 1, or when its claim found a completion
  set with spans (an earlier owner ran lanes): then one lane does, so nothing a predecessor
  applied is applied again.
- The dispatcher (the partition's runner) takes batches from the partition's buffer and
  cuts them with ``fencing.lanes.Dispatch`` into N queues, one per lane; records a
  predecessor applied are skipped; a full window stops it (the buffer fills, the consumer
  pauses) until the effective frontier moves.
- Each lane has a task: it takes up to ``--batch-max-records`` records of its queue, in
  offset order, and submits them under a database slot through the failure handling
  (``consumer.failure_run``), whose transactions the lifecycle commits as lane
  transactions (``Lifecycle.run_lanes``): retries, bisection and quarantine stay inside the
  lane; a lane blocked on a failing record holds back only its own keys (and, through the
  window, how far the others run ahead).
- After a lane's batch is settled its spans join the completion set; when the effective
  frontier moves it is queued for Kafka (advisory, as without lanes), and once it moved
  ``FOLD_EVERY`` offsets past the durable frontier, or the partition's lanes are idle
  (caught up), or the partition is revoked, a fold writes it into the partition row.
- A closing partition or an ending run stops the dispatcher; each lane ends after its
  batch in flight, and the partition's runner ends only once every lane did (a revoke
  waits for it, and the lifecycle's revoke waits for the lane transactions).
- A lane's failure is the run's, as a batch's is without lanes (``LifetimeRun._submit``).
- Liveness: a lane is *busy* while records are queued in it or in flight; the partition
  keeps, per busy lane, when it last settled a batch (or became busy: ``lanes_since``), so
  the stall detection sees a lane that holds its keys back while the others run on
  (``LifetimeRun.progress``: a partition's progress is its oldest busy lane's). ``load``:
  busy lanes and the offsets dispatched past the effective frontier (the window used),
  for the metrics and the member row.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from consumer.batching import in_flight_of
from consumer.ports import LifecyclePort, Partition
from fencing.crashpoints import crash_point
from fencing.lanes import Dispatch, Span
from fencing.types import SourceRecord

__all__ = ["FOLD_EVERY", "LaneRun"]

log = logging.getLogger("fenceworker.lanes")

FOLD_EVERY = 1_000  # offsets the effective frontier runs ahead before a fold writes it


class LaneRun:
    """The lanes of one partition (see the module Rules)."""

    def __init__(self, part: Partition, dispatch: Dispatch, *, lifecycle: LifecyclePort,
                 slots: asyncio.Semaphore, batch_max_records: int,
                 submit: Callable[[Partition, list[SourceRecord]], Awaitable[bool]],
                 commit: Callable[[int], None], stopping: Callable[[], bool],
                 take: Callable[[Partition], list[SourceRecord]],
                 clock: Callable[[], float]) -> None:
        """``submit``: the run's submission of one batch (False: the lane must end);
        ``commit``: queue a frontier for Kafka; ``take``: the next batch of the buffer;
        ``clock``: the run's clock (``lanes_since``)."""
        self.part = part
        self.dispatch = dispatch
        self._lc = lifecycle
        self._slots = slots
        self._max = batch_max_records
        self._submit = submit
        self._commit = commit
        self._stopping = stopping
        self._take = take
        self._clock = clock
        self.span_of: dict[int, Span] = {}
        self._queues: list[deque[SourceRecord]] = [deque() for _ in range(dispatch.lanes)]
        self._wakes = [asyncio.Event() for _ in range(dispatch.lanes)]
        self._room = asyncio.Event()
        self._pending: list[SourceRecord] = []
        self._folded = dispatch.completion.base
        self._folding: asyncio.Task[None] | None = None
        self._ended = False

    def _closed(self) -> bool:
        return self.part.closing or self._stopping() or self._ended

    async def run(self) -> None:
        """Dispatch until the partition closes, then wait for every lane."""
        part = self.part
        self._lc.run_lanes(part.tp, self.span_of)
        part.lane_load = self.load
        lanes = [asyncio.create_task(self._lane(i), name=f"lane {part.tp}#{i}")
                 for i in range(self.dispatch.lanes)]
        try:
            while not self._closed():
                if not self._pending:
                    if len(part.buffer) == 0:
                        part.wake.clear()
                        await part.wake.wait()
                        continue
                    self._pending = self._take(part)
                taken, used = self.dispatch.take(self._pending)
                self._pending = self._pending[used:]
                for lane, rec, span in taken:
                    self.span_of[rec.offset] = span
                    self._queues[lane].append(rec)
                    self._wakes[lane].set()
                    part.lanes_since.setdefault(lane, self._clock())  # busy from now
                if self._pending and not taken:  # the window is full: wait for the frontier
                    self._room.clear()
                    waiters = [asyncio.ensure_future(part.wake.wait()),
                               asyncio.ensure_future(self._room.wait())]
                    try:
                        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        for waiter in waiters:
                            waiter.cancel()
                    part.wake.clear()
        finally:
            self._ended = True
            part.lanes_since.clear()
            part.lane_load = None
            for wake in self._wakes:
                wake.set()
            await asyncio.gather(*lanes, return_exceptions=True)
            if self._folding is not None:
                await asyncio.gather(self._folding, return_exceptions=True)
            frontier = self.dispatch.completion.frontier
            if frontier > self._folded and self._lc.token(self.part.tp) is not None:
                await self._fold(frontier)  # revoked or stopping: the next owner's row

    async def _lane(self, lane: int) -> None:
        queue, wake = self._queues[lane], self._wakes[lane]
        while not self._closed():
            if not queue:
                wake.clear()
                await wake.wait()
                continue
            async with self._slots:
                if self._closed():
                    return
                batch = [queue.popleft() for _ in range(min(self._max, len(queue)))]
                self.part.lanes_inflight[lane] = in_flight_of(batch)
                try:
                    go_on = await self._submit(self.part, batch)
                finally:
                    self.part.lanes_inflight.pop(lane, None)
            if not go_on:
                self._ended = True  # the partition's lanes end with the failed one
                self.part.wake.set()
                return
            if queue:
                self.part.lanes_since[lane] = self._clock()  # progress, still busy
            else:
                self.part.lanes_since.pop(lane, None)  # idle
            self._settled(batch)

    def _settled(self, batch: Sequence[SourceRecord]) -> None:
        """Every record of ``batch`` is applied or quarantined: the completion set grows."""
        before = self.dispatch.completion.frontier
        frontier = self.dispatch.applied([self.span_of.pop(r.offset) for r in batch])
        token = self._lc.token(self.part.tp)
        crash_point("after-commit", partition=str(self.part.tp),
                    epoch=None if token is None else token.epoch, first_offset=batch[0].offset,
                    last_offset=batch[-1].offset, batch_end=frontier, lane=True)
        if frontier > before:
            self._room.set()
            self._commit(frontier)
        if frontier > self._folded and (frontier - self._folded >= FOLD_EVERY or self._idle()) \
                and (self._folding is None or self._folding.done()):
            self._folding = asyncio.ensure_future(self._fold(frontier))

    def load(self) -> tuple[int, int]:
        """(busy lanes, offsets dispatched past the effective frontier: the window used)."""
        busy = sum(1 for lane, queue in enumerate(self._queues)
                   if queue or lane in self.part.lanes_inflight)
        return busy, max(0, self.dispatch.next_offset - self.dispatch.completion.frontier)

    def _idle(self) -> bool:
        """Nothing queued, pending or in flight in any lane: the partition caught up."""
        return not (self._pending or any(self._queues) or self.part.lanes_inflight
                    or len(self.part.buffer))

    async def _fold(self, frontier: int) -> None:
        """Fold to ``frontier``; then again while the lanes are idle and the effective
        frontier moved meanwhile (a lane that settled during the fold started none)."""
        while True:
            try:
                await self._lc.fold(self.part.tp, to_frontier=frontier)
                self._folded = frontier
            except Exception as exc:  # the next lane transaction meets the same cause
                log.warning("%s: fold to %d failed: %s", self.part.tp, frontier, exc)
                return
            frontier = self.dispatch.completion.frontier
            if frontier <= self._folded or not self._idle():
                return
