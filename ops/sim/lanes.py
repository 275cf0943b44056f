"""Key-ordered lanes in the simulator (trace version 5: a config with ``lanes`` of 2 or
more): the worker's side of ``consumer.lanes_run`` over the production ``Lifecycle``.

Rules
- Every partition of every lifetime runs lanes. A seek builds the partition's
  ``fencing.lanes.Dispatch`` from the completion set its lifetime's assign read
  (``Lifecycle.completion``, else the retained frontier) and registers its spans with
  ``Lifecycle.run_lanes``, as a partition's ``LaneRun`` does; a reseek within the same
  assignment keeps the completion set it has (what its lanes applied since), empties the
  lanes' queues and dispatches again from the fetch cursor the seek set. An assign drops
  the lifetime's lanes of its partitions (a new assignment runs new lanes).
- A process step of a partition dispatches the next fetched batch (the fetch cursor, as
  without lanes) when nothing is queued or held back by the window (and the one after it
  while a batch held only records a predecessor applied); then every lane with
  queued records takes up to ``batch_max`` of them, in offset order, and all of them are in
  flight at once (``Lifecycle.process`` commits lane transactions). A settled lane's spans
  join the set; once the effective frontier runs ``fold_every`` offsets past the folded
  one, or the partition is caught up (nothing queued, held back or left to fetch), a fold
  starts while the other lanes are still in flight (``LaneRun._settled``).
- A step with nothing to dispatch or apply folds a caught-up partition whose effective
  frontier is above the retained one, else it is ``idle``. A failed fold fails no step
  (``LaneRun._fold`` logs it; the next lane transaction meets its cause, and the lifecycle
  retires on what retires it) unless the lifetime ended during it (``Retired``: the step
  ends so, as every call in flight of a stopped lifetime does); the attempt lists each fold
  and its end (``folds``).
- A failed lane batch ends the partition's lanes in that lifetime: its later process steps
  make no store call (``ended``), as a failed lane ends its ``LaneRun``. So does a lane
  that would start after its lifetime dropped the partition during the step (an interleaved
  revoke or loss: the partition closed, ``LaneRun._lane`` submits nothing); a step that
  begins without the partition's token is a late call and its lanes meet the fence. A lane
  whose call failed because its partition closed meanwhile (``TokenDropped``, even after its
  commit) is dropped as the worker drops it (``consumer.decisions.after_batch_failure``).
- Oracles (``ops.sim.checks``): each lane write applies records never applied before, and
  only once every earlier record of the same key was (per-key order, exactly once); the
  effects equal the reference fold, in offset order, of the durable completion set; a lane
  batch reported ok lies inside the durable set.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import consumer.decisions
from consumer.decisions import LifetimeState
from consumer.lifecycle import Lifecycle
from fencing.errors import FenceError, Retired
from fencing.lanes import Completion, Dispatch, Span
from fencing.store import BatchCall
from fencing.types import SourceRecord
from ops.reference.memory import memory_ref_handler

__all__ = ["LaneState", "dropped", "process_lanes", "ready", "sought"]


@dataclass(slots=True)
class LaneState:
    """One partition's lanes in one lifetime."""

    dispatch: Dispatch
    folded: int  # the durable frontier the lifetime last folded to (or claimed)
    span_of: dict[int, Span] = field(default_factory=dict)
    queues: list[deque[SourceRecord]] = field(default_factory=list)
    pending: list[SourceRecord] = field(default_factory=list)
    ended: bool = False

    def idle(self) -> bool:
        return not self.pending and not any(self.queues)


def sought(run: Any, worker: int, partition: int, frontier: int) -> None:
    """The fetch cursor of a successful seek, and the partition's lanes from it."""
    run.cursors[(worker, partition)] = frontier
    cfg = run.trace.config
    if cfg.lanes <= 1:
        return
    lc: Lifecycle = run.lifecycles[worker]
    tp = run.tp(partition)
    old: LaneState | None = run.lanes.get((worker, partition))
    if old is not None and not old.ended:
        completion = old.dispatch.completion
    else:
        read = lc.completion(tp)
        completion = read if read is not None and read.base == frontier else Completion(frontier)
    dispatch = Dispatch(completion, cfg.lanes, window=cfg.lanes_window)
    state = LaneState(dispatch, frontier, queues=[deque() for _ in range(cfg.lanes)])
    run.lanes[(worker, partition)] = state
    lc.run_lanes(tp, state.span_of)


def dropped(run: Any, worker: int, partitions: tuple[int, ...]) -> None:
    """An assign: the lifetime's lanes of ``partitions`` end (new ones start at the seek)."""
    for q in partitions:
        run.lanes.pop((worker, q), None)


def ready(run: Any, worker: int, partition: int) -> bool:
    """Something to dispatch, apply or fold for ``worker``'s lanes of ``partition``."""
    state: LaneState | None = run.lanes.get((worker, partition))
    if state is None or state.ended:
        return False
    token = run.lifecycles[worker].token(run.tp(partition))
    return (not state.idle() or run.cursors[(worker, partition)] < run.ends[partition]
            or (token is not None and state.dispatch.completion.frontier > token.frontier))


def dispatch(state: LaneState) -> None:
    """The pending records into the lanes' queues, up to the window."""
    if state.pending:
        taken, used = state.dispatch.take(state.pending)
        state.pending = state.pending[used:]
        for lane, rec, span in taken:
            state.span_of[rec.offset] = span
            state.queues[lane].append(rec)


async def process_lanes(run: Any, lc: Lifecycle, worker: int, q: int) -> str:
    """One process step of ``q``'s lanes (module Rules); a failed lane raises its error
    after every other lane and the fold settled."""
    state: LaneState | None = run.lanes.get((worker, q))
    if state is None:
        return "unseeked"
    if state.ended:
        return "ended"
    tp = run.tp(q)
    while state.idle():  # fetch until a record is dispatched (a predecessor's are skipped)
        batch = run.take_batch(worker, q)
        run.batch_ends.pop(q, None)  # lanes settle their records apart: per-lane outcomes
        if isinstance(batch, str):
            break
        state.pending = list(batch)
        dispatch(state)
    dispatch(state)
    cfg = run.trace.config
    batches = [(lane, [queue.popleft() for _ in range(min(cfg.batch_max, len(queue)))])
               for lane, queue in enumerate(state.queues) if queue]
    folding: list[asyncio.Future[None]] = []
    failures: list[FenceError] = []

    def caught_up() -> bool:
        return state.idle() and run.cursors[(worker, q)] >= run.ends[q] and all(
            running.values())

    async def fold() -> None:
        token = lc.token(tp)
        frontier = state.dispatch.completion.frontier
        if token is None or frontier <= token.frontier:
            return
        run.call_us[lc.lifetime_id] = run.clock.now_us  # a lifecycle call of its own
        try:
            await lc.fold(tp, to_frontier=frontier)
        except FenceError as exc:  # production logs it; the next lane meets its cause
            run.fold_results.append((q, frontier, type(exc).__name__))
            if isinstance(exc, Retired):  # the lifetime ended during it: so does the step
                failures.append(exc)
            return
        run.fold_results.append((q, frontier, "ok"))
        state.folded = frontier

    def settled(records: list[SourceRecord]) -> None:
        frontier = state.dispatch.applied([state.span_of.pop(r.offset) for r in records])
        if frontier > state.folded and (frontier - state.folded >= cfg.fold_every
                                        or caught_up()) and not any(
                                            not f.done() for f in folding):
            folding.append(asyncio.ensure_future(fold()))

    running: dict[int, bool] = {}
    held = lc.token(tp) is not None  # else a late call: a zombie's lanes meet the fence

    async def one(lane: int, records: list[SourceRecord]) -> None:
        running[lane] = False
        await asyncio.sleep(0)  # every lane starts before any reaches the store
        if held and lc.token(tp) is None:  # revoked or lost meanwhile: the partition
            state.ended = True  # closed, its lanes end without a call (``LaneRun._lane``)
            running[lane] = True
            run.lane_results.append((q, lane, records, "closed"))
            return
        try:
            await lc.process(BatchCall(tp, tuple(records), memory_ref_handler))
        except FenceError as exc:
            state.ended = True
            closing = held and lc.token(tp) is None
            if consumer.decisions.after_batch_failure(
                    exc, closing=closing) is consumer.decisions.BatchFailure.DROP:
                run.lane_results.append((q, lane, records, "dropped"))  # the worker drops it
                return
            failures.append(exc)
            run.lane_results.append((q, lane, records, "failed"))
            return
        finally:
            running[lane] = True
        run.lane_results.append((q, lane, records, "ok"))
        settled(records)

    if batches:
        await asyncio.gather(*(one(lane, records) for lane, records in batches))
        if folding:
            await asyncio.gather(*folding)
    elif not state.ended and lc.state is LifetimeState.LIVE and caught_up():
        token = lc.token(tp)
        if token is None or state.dispatch.completion.frontier <= token.frontier:
            return "idle"
        await fold()
    else:
        return "idle"
    if failures:  # a lifetime that ended during the step ends the step as Retired
        raise next((e for e in failures if isinstance(e, Retired)), failures[0])
    return "ok"
