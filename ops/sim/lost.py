"""The worker's side of a lost assignment in the simulator (trace version 4).

Rules
- ``lost`` (actor): the group session is lost; the lifetime drops the tokens of the
  partitions locally (``Lifecycle.lost``), no I/O, as ``consumer.lifetime_run`` does.
- A ``lost: true`` interleave on a process step's process call: the next batch of that
  call's partition is delivered to the same lifetime and queues behind the partition's
  guard (the call holds it until the interleave returns), then the assignment of the
  step's partitions is lost. Only that partition's: production submits a partition's
  batches one after another (one runner task per partition, ``consumer.lifetime_run``), so
  a queued batch never overtakes its predecessor; the step's other batches may be between
  calls (a handler failure's retry gives the guard up and takes it again), and a batch
  queued behind one of them could reach the guard first and commit past the records its
  predecessor still owes -- an interleaving production cannot produce.
- After a lost interleave, every batch of the step (the ones in flight and the queued ones)
  that failed is judged by the production worker's rule
  (``consumer.decisions.after_batch_failure``, read through the module so a mutant sees
  the same rule): ``drop`` and the lifetime goes on; ``end`` and the worker ends the
  lifetime (``Lifecycle.stop``, as the worker's exit does).
- The oracle (independent of that rule): a lifetime the worker ends for a ``Fenced`` after
  a loss is a zombie, so some newer owner holds the partition (its durable epoch is newer
  than the one the lifetime held); ending a lifetime whose own epoch is still the durable
  one is a liveness violation (the batch was never sent, nothing fenced it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import consumer.decisions
from consumer.decisions import BatchFailure, LifetimeState
from fencing.errors import Fenced, FenceError
from fencing.store import BatchCall
from fencing.types import SourceRecord, Token
from ops.reference.memory import memory_ref_handler

__all__ = ["lose", "queue_and_lose", "worker_judges"]

QUEUE_TURNS = 8  # loop turns for a queued batch to reach the guard (it needs far fewer)


def lose(run: Any, worker: int, ps: tuple[int, ...]) -> str:
    """The ``lost`` actor."""
    run.lifecycles[worker].lost([run.tp(p) for p in ps])
    return "lost"


async def queue_and_lose(run: Any, worker: int, ps: tuple[int, ...],
                         record: dict[str, Any], *, behind: int | None) -> None:
    """The ``lost: true`` interleave: queue the next batch of ``behind`` (the interleaving
    call's partition, whose guard that call holds), then lose all of ``ps``. ``record``
    (the interleave's entry) gets the queued partitions."""
    lc = run.lifecycles[worker]

    async def queued(p: int, batch: tuple[SourceRecord, ...]) -> None:
        try:
            await lc.process(BatchCall(run.tp(p), batch, memory_ref_handler))
            run.queued_results[p] = ("ok", None)
        except FenceError as exc:
            run.queued_results[p] = (type(exc).__name__, exc)

    if behind in ps:
        batch = run.take_batch(worker, behind, queued=True)
        if not isinstance(batch, str):
            run.pending.append(asyncio.ensure_future(queued(behind, batch)))
            record.setdefault("queued", []).append(behind)
    for _ in range(QUEUE_TURNS):
        await asyncio.sleep(0)
    if lc.state is LifetimeState.LIVE:
        lc.lost([run.tp(p) for p in ps])


def worker_judges(run: Any, place: str, worker: int, held: dict[int, Token | None],
                  failures: Sequence[tuple[int, BaseException]], attempt: dict[str, Any]) -> None:
    """Apply the worker's rule to the failed batches (partition, error) of a step with a
    lost interleave, the step's own first, and check the oracle's rule for a lifetime it
    ends (module Rules)."""
    lc = run.lifecycles[worker]
    ended: list[str] = []
    verdicts: list[list[Any]] = []
    for p, exc in failures:
        action = consumer.decisions.after_batch_failure(exc, closing=True)
        verdicts.append([p, type(exc).__name__, action.value])
        if action is not BatchFailure.END:
            continue
        ended.append(f"{type(exc).__name__}: {exc}")
        own, durable = held.get(p), run.store.token_of(run.tp(p))
        if isinstance(exc, Fenced) and own is not None and durable is not None and (
                durable.epoch <= own.epoch):
            run.checker.fail(place, f"the worker ended lifetime {worker} for a batch of "
                                    f"partition {p} after a loss ({type(exc).__name__}), but "
                                    f"its own epoch {own.epoch} is still the durable one: no "
                                    "newer owner fenced it")
    attempt["worker"] = verdicts
    if ended:
        lc.stop()
        attempt["worker_ended"] = ended[0]
