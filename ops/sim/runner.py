"""Runs one trace: the production ``consumer.Lifecycle`` over ``MemoryFenceStore`` with
logical time, serially, on a private asyncio loop whose clock is the logical clock
(``ops.sim.loop``); no real sleeps, no wall clock.

Long because the serial schedule interpreter handles every actor and fault kind in one
place, so a trace reads top to bottom against it.

Rules
- One step is one attempt: the store's call numbers restart and the step's faults apply.
- A fetch cursor per (lifetime, partition) is set by ``seek`` and advances as soon as a
  batch is delivered to ``process`` (even if processing fails); ``assign`` clears it,
  ``revoke`` keeps it (a batch fetched before the revoke may still be delivered: a late
  call). Processing without a cursor is ``unseeked``; nothing left is ``idle``.
- A process step of a set (version 3) fetches one batch per partition and has them all in
  flight at once in its lifetime (``asyncio.gather``); each batch's outcome is reported
  (``batches``) and checked on its own.
- An interleave runs its replacement (fresh lifetime: assign the step's partitions in one
  call, seek each; no faults), then starts the calling lifetime's concurrent revoke of them
  (``revoke: true``; awaited after the step; for a process step of a set, a revoke of all
  of them, which must wait for every batch's guard), then stops the calling lifetime, before
  the selected call returns (or, for a read, before it reads).
- A ``lost: true`` interleave and the ``lost`` actor: ``ops.sim.lost`` (a queued batch
  behind the guard, the loss, and the worker's judgement of the step's failed batches).
  A seek of a set (version 4) is one ``Lifecycle.seek_all``: one observe for the set.
- ``expire`` moves Kafka's low watermark of a partition (what the next source check sees);
  batches already fetched below it may still be delivered. A ``heartbeat`` step is one tick
  of the lifetime's member heartbeat (``ops.sim.boundaries``).
- The checker runs after every store call returns, every interleave, every wait and every
  attempt. Drain stops every lifetime, starts a fresh one, assigns every partition (one
  claim for the set from trace version 2; one per partition for version 1), seeks each (one
  seek of the set from version 4) and
  processes to the end without faults; each drain attempt must advance
  durable progress, and the complete source must then match the output.
"""

from __future__ import annotations

import asyncio
from typing import Any

from consumer.decisions import LifetimeState
from consumer.failure_run import FailureRun, RetryInterrupted
from consumer.lifecycle import Lifecycle
from fencing.errors import Fenced, FenceError, Retired, SourceRefused
from fencing.memory.faults import InterleavePoint
from fencing.memory.store import MemoryFenceStore, StoreEvent
from fencing.store import BatchCall
from fencing.types import SourceCheck, SourceFacts, SourceRecord, Token, TopicPartition
from ops.reference.memory import memory_ref_handler
from ops.sim.boundaries import Heartbeats, refusal_rules
from ops.sim.checks import Checker
from ops.sim.failures import FailingHandler, Timed, failure_run
from ops.sim.lanes import LaneState, dropped, process_lanes, sought
from ops.sim.lanes import ready as lanes_ready
from ops.sim.loop import LogicalClock, run_sync
from ops.sim.lost import lose, queue_and_lose, worker_judges
from ops.sim.report import build_report
from ops.sim.trace import Step, Trace, fault_json

__all__ = ["LogicalClock", "finish", "new_run", "run_sync", "run_trace"]

TOPIC_ID = "sim-topic-id"


def _result(exc: BaseException) -> str:
    for cls, name in ((Retired, "retired"), (Fenced, "fenced"), (SourceRefused, "refused")):
        if isinstance(exc, cls):
            return name
    return "error"


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if exc.__cause__ is not None:
        text += f" (cause {type(exc.__cause__).__name__}: {exc.__cause__})"
    return text


class _Run:
    def __init__(self, trace: Trace, *, checking: bool = True) -> None:
        cfg = trace.config
        self.trace = trace
        self.clock = LogicalClock()
        self.store = MemoryFenceStore(cfg.group_id, clock=self.clock, wait=self._wait,
                                      on_event=self._on_event)
        self.store.interleave_hook = self._interleave
        self.lifecycles: dict[int, Lifecycle] = {}
        self._live: list[Lifecycle] = []
        self._dead_ids: frozenset[str] = frozenset()
        self.cursors: dict[tuple[int, int], int] = {}
        self.attempts: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.diagnostics: list[str] = []
        self.lows = [0] * cfg.partitions
        self._tps = [TopicPartition(cfg.topic, p) for p in range(cfg.partitions)]
        self.topic_id = TOPIC_ID
        self.by_partition: dict[int, list[SourceRecord]] = {p: [] for p in range(cfg.partitions)}
        for r in trace.records:
            self.by_partition[r.partition].append(r)
        self.ends = [rs[-1].offset + 1 if rs else 0 for rs in self.by_partition.values()]
        self.checker = Checker(self.store, trace.records, dead=self._dead, enabled=checking)
        self.attempt_index = -1
        self.current: Step | None = None
        self.call_us: dict[str, int] = {}  # lifetime -> when its current lifecycle call began
        self.batch_ends: dict[int, int] = {}  # partition -> end of the batch delivered
        self.batch_results: dict[int, tuple[str, FenceError | None]] = {}
        self.heartbeats = Heartbeats(self)
        self.pending: list[asyncio.Future[None]] = []
        self.ended_in_flight: dict[int, dict[str, Any]] = {}  # lifetime -> the attempt
        self.queued_results: dict[int, tuple[str, FenceError | None]] = {}  # ops.sim.lost
        self.failing: FailingHandler | None = None  # ops.sim.failures, for such a config
        self.failure_runs: dict[int, FailureRun] = {}
        self.lanes: dict[tuple[int, int], LaneState] = {}  # ops.sim.lanes, for such a config
        self.lane_results: list[tuple[int, int, list[SourceRecord], str]] = []  # this step's
        self.fold_results: list[tuple[int, int, str]] = []  # this step's: partition, to, end
        self.checker.lanes = cfg.lanes > 1
        if cfg.poison or cfg.transient:
            self.failing = FailingHandler(cfg.poison, cfg.transient)
            self.checker.poison = frozenset(cfg.poison)
            self.checker.leave_out(self.checker.poison)

    # -- hooks ---------------------------------------------------------------------------
    def _dead(self) -> frozenset[str]:
        """Lifetimes that are not LIVE (none comes back): an immutable snapshot, rebuilt
        only when one more left LIVE."""
        gone = [lc for lc in self._live if lc.state is not LifetimeState.LIVE]
        if gone:
            self._live = [lc for lc in self._live if lc.state is LifetimeState.LIVE]
            self._dead_ids = self._dead_ids | {lc.lifetime_id for lc in gone}
        return self._dead_ids

    async def _wait(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.checker.check(f"attempt {self.attempt_index} wait {round(seconds * 1000)} ms")
        await asyncio.sleep(0)

    def _on_event(self, ev: StoreEvent) -> None:
        attempt, _, worker = ev.attempt.partition("/")
        self.events.append({
            "attempt": int(attempt) if attempt.lstrip("-").isdigit() else -1,
            "lifetime": worker, "operation": ev.operation, "call": ev.call,
            "selected": ev.requested, "delay_ms": ev.delay_ms, "interleave": ev.interleave,
            "applied": ev.applied, "observed": ev.observed, "t_us": self.clock.now_us,
            "installed": {tp: [epoch, frontier] for tp, epoch, frontier in ev.installed}})
        if ev.partition is not None:
            self.events[-1]["partition"] = ev.partition
        if ev.operation not in ("journal", "heartbeat"):  # best-effort rows, not guarded
            self.checker.call_started_in_budget(
                f"attempt {attempt} {ev.operation} call {ev.call}", worker,
                round(ev.started_s * 1_000_000), self.call_us.get(worker),
                self.trace.config.budget_ms * 1000)
        self.checker.check(f"attempt {attempt} {ev.operation} call {ev.call} by lifetime "
                           f"{worker} ({ev.observed})")

    async def _interleave(self, point: InterleavePoint) -> None:
        fault, step = point.fault, self.current
        if fault is None or fault.interleave is None or fault.interleave.at != point.at:
            return
        if step is None or not step.partitions:
            return
        il = fault.interleave
        if il.replacement is not None:
            await self._replacement(il.replacement, step.partitions)
        if il.revoke:  # runs concurrently: it must wait for this in-flight call's guard
            lc = self.lifecycles[step.worker]
            self.pending.append(asyncio.ensure_future(
                lc.revoke([self.tp(p) for p in step.partitions])))
            await asyncio.sleep(0)
        entry: dict[str, Any] = {
            "at": point.at, "operation": point.operation.value, "call": point.call,
            "stop": il.stop, "replacement": il.replacement, "revoke": il.revoke}
        if il.lost:  # the next batches queue behind the guards, then the loss
            entry["lost"] = True
            await queue_and_lose(self, step.worker, step.partitions, entry,
                                 behind=point.partition)
        if il.stop:
            entry["stopped_from"] = self.lifecycles[step.worker].state.value
            self.lifecycles[step.worker].stop()
        self.attempts[-1]["interleaves"].append(entry)
        self.checker.check(f"attempt {self.attempt_index} interleave {point.at} "
                           f"{point.operation.value} call {point.call}")

    async def _replacement(self, worker: int, partitions: tuple[int, ...]) -> None:
        lc = self._new_lifecycle(worker)
        with self.store.attempt(f"{self.attempt_index}/{lc.lifetime_id}"):
            try:
                self.call_us[lc.lifetime_id] = self.clock.now_us
                await lc.assign([self.source_check(p) for p in partitions])
                for p in partitions:
                    self.call_us[lc.lifetime_id] = self.clock.now_us
                    sought(self, worker, p, await lc.seek(self.tp(p)))
                outcome = "ok"
            except FenceError as exc:
                outcome = _error_text(exc)
        self.attempts[-1]["replacements"].append({
            "lifetime": worker, "partition": partitions[0] if len(partitions) == 1 else
            list(partitions), "result": outcome})

    # -- model ---------------------------------------------------------------------------
    def tp(self, partition: int) -> TopicPartition:
        return self._tps[partition]

    def source_check(self, partition: int) -> SourceCheck:
        facts = SourceFacts(self.topic_id, self.lows[partition], self.ends[partition])
        return SourceCheck(self.tp(partition), facts)

    def _new_lifecycle(self, worker: int) -> Lifecycle:
        lc = Lifecycle(store=self.store, lifetime_id=str(worker), clock=self.clock,
                       wait=self._wait, budget_s=self.trace.config.budget_ms / 1000,
                       allow_retention_gap=self.trace.config.allow_retention_gap)
        self.lifecycles[worker] = lc
        self._live.append(lc)
        if self.failing is not None:  # each lifetime a worker process of its own

            def began(lifetime: str = lc.lifetime_id) -> None:
                self.call_us[lifetime] = self.clock.now_us

            self.failure_runs[worker] = failure_run(
                Timed(lc, began), self.failing, seed=self.trace.seed, worker=worker,
                clock=self.clock, wait=self._wait, window=self.trace.config.batch_max)
        return lc

    def take_batch(self, worker: int, partition: int, *,
                   queued: bool = False) -> tuple[SourceRecord, ...] | str:
        """The next batch of ``partition`` for ``worker`` (moves the fetch cursor); a
        ``queued`` one (``ops.sim.lost``) is not the step's own batch."""
        cursor = self.cursors.get((worker, partition))
        if cursor is None:
            return "unseeked"
        batch = tuple(r for r in self.by_partition[partition]
                      if r.offset >= cursor)[: self.trace.config.batch_max]
        if not batch:
            return "idle"
        self.cursors[(worker, partition)] = batch[-1].offset + 1
        if not queued:
            self.batch_ends[partition] = batch[-1].offset + 1
        return batch

    # -- steps ---------------------------------------------------------------------------
    async def step(self, step: Step, *, fair: bool = False) -> dict[str, Any]:
        self.attempt_index += 1
        self.current = step
        self.store.begin_attempt(f"{self.attempt_index}/{step.worker}", step.faults)
        attempt: dict[str, Any] = {
            "index": self.attempt_index, "actor": step.actor, "lifetime": step.worker,
            "partition": list(step.partition) if isinstance(step.partition, tuple)
            else step.partition, "choices": [fault_json(f) for f in step.faults],
            "result": "ok", "error": None, "fair_recovery": fair, "interleaves": [],
            "replacements": [], "t_us": self.clock.now_us}
        self.attempts.append(attempt)
        first_event = len(self.events)
        self.call_us[str(step.worker)] = self.clock.now_us
        self.batch_ends, self.batch_results, self.queued_results = {}, {}, {}
        self.lane_results, self.fold_results = [], []
        lc = self.lifecycles.get(step.worker)
        held = {p: lc.token(self.tp(p)) for p in step.partitions} if lc is not None else {}
        failure: FenceError | None = None
        refusable = self._refusable(step.partitions) if step.actor == "assign" else []
        writes_before = len(self.store.writes)
        known = set(self.lifecycles)
        live_before = {w for w, x in self.lifecycles.items() if x.state is LifetimeState.LIVE}
        try:
            attempt["result"] = await self._act(step)
        except FenceError as exc:
            attempt["result"], attempt["error"] = _result(exc), _error_text(exc)
            failure = exc
        if len(self.batch_results) > 1:  # several batches in flight: each its own outcome
            attempt["batches"] = {str(q): r for q, (r, _) in sorted(self.batch_results.items())}
            attempt["error"] = next((_error_text(e) for _, e in self.batch_results.values()
                                     if e is not None), None)
        if self.lane_results:  # ops.sim.lanes: each lane batch of the step and its end
            attempt["lanes"] = [f"{q}/{lane} {recs[0].offset}..{recs[-1].offset} {result}"
                                for q, lane, recs, result in self.lane_results]
        if self.fold_results:
            attempt["folds"] = [f"{q} to {to} {end}" for q, to, end in self.fold_results]
        for task in self.pending:  # an interleaved revoke finishes after the call it awaited
            try:
                await task
            except FenceError as exc:
                attempt["interleaves"].append({"revoke": _error_text(exc)})
        self.pending.clear()
        if any(i.get("lost") for i in attempt["interleaves"]):
            attempt["queued"] = {str(q): r for q, (r, _) in sorted(self.queued_results.items())}
            failures = [(q, e) for q, (_, e) in [*sorted(self.batch_results.items()),
                                                 *sorted(self.queued_results.items())]
                        if e is not None]
            worker_judges(self, f"attempt {self.attempt_index}", step.worker, held, failures,
                          attempt)
        self._left_in_flight(step, live_before, known)
        self._token_checks(step, attempt["result"], held, failure)
        label = str(step.worker)
        lc = self.lifecycles.get(step.worker)
        place = f"attempt {self.attempt_index}"
        if lc is not None and step.actor in ("assign", "seek", "process", "revoke"):
            self.checker.attempt_outcome(
                place, worker=step.worker, state=lc.state, result=attempt["result"],
                held=next((t for t in held.values() if t is not None), None), actor=step.actor)
            for q, (result, _) in sorted(self.batch_results.items()):
                if result == "interrupted":  # bisected parts may be committed: no claim
                    continue
                acked = self.failing is None and any(  # failure path: several commits
                    e["lifetime"] == label and e["operation"] == "process"
                    and e.get("partition") == q and e["observed"] == "ok"
                    for e in self.events[first_event:])
                self.checker.batch_outcome(place, worker=step.worker, tp=self.tp(q),
                                           result=result, batch_end=self.batch_ends.get(q),
                                           acked=acked)
            for q, lane, records, result in self.lane_results:
                self.checker.lane_outcome(place, worker=step.worker, tp=self.tp(q), lane=lane,
                                          offsets=[r.offset for r in records], result=result)
        stops = [i["stopped_from"] for i in attempt["interleaves"] if i.get("stop")]
        if lc is not None and stops:
            self.checker.stopped_in_flight(place, worker=step.worker, result=attempt["result"],
                                           state=lc.state, stopped_from=stops[0], tokens=[
                                               lc.token(self.tp(q)) for q in range(
                                                   self.trace.config.partitions)])
        if step.actor == "assign" and lc is not None:
            claimed = [w.tp for w in self.store.writes[writes_before:]
                       if w.kind == "claim" and w.lifetime == label]
            refusal_rules(self.checker, place, worker=step.worker, result=attempt["result"],
                          refusable=refusable, claimed=claimed,
                          interleaved=bool(attempt["interleaves"] or attempt["replacements"]),
                          tokens=[lc.token(self.tp(q)) for q in step.partitions])
        attempt["selectors_used"] = sum(
            1 for e in self.events[first_event:]
            if e["selected"] is not None and e["lifetime"] == label)
        self.checker.check(f"attempt {self.attempt_index} end ({step.actor} by lifetime "
                           f"{step.worker})")
        self.current = None
        return attempt

    def _left_in_flight(self, step: Step, live_before: set[int], known: set[int]) -> None:
        """Record the lifetimes that left LIVE during this attempt with a call in flight:
        every one but the target of a ``stop`` step (stopped between calls), also a
        replacement started inside the attempt."""
        for w, x in self.lifecycles.items():
            if x.state is LifetimeState.LIVE or w in self.ended_in_flight:
                continue
            if w in live_before or w not in known:
                if step.actor == "stop" and w == step.worker:
                    continue
                self.ended_in_flight[w] = {"attempt": self.attempt_index, "actor": step.actor,
                                           "partitions": list(step.partitions)}

    def _token_checks(self, step: Step, result: str, held: dict[int, Token | None],
                      exc: BaseException | None) -> None:
        place = f"attempt {self.attempt_index}"
        if step.actor == "seek" and len(held) > 1 and exc is not None:
            # one read for the set: a fence is one moved partition's; never all unmoved
            moved = [q for q, t in held.items() if t is not None and (
                (now := self.store.token_of(self.tp(q))) is None or now.epoch != t.epoch)]
            held = {} if moved else held
        for q, token in held.items():
            failed = self.batch_results[q][1] if q in self.batch_results else exc
            if failed is not None and token is not None:
                self.checker.not_self_fenced(place, step.worker, self.tp(q), token, failed)
        self.checker.retained_tokens(place, self.lifecycles, self._tps)
        for p in step.partitions if step.actor == "seek" and result == "ok" else ():
            self.checker.seek_position(place, step.worker, self.tp(p),
                                       self.lifecycles[step.worker].token(self.tp(p)),
                                       self.cursors.get((step.worker, p)))

    async def _act(self, step: Step) -> str:
        worker, p = step.worker, step.partition
        if step.actor == "start":
            self._new_lifecycle(worker)
            return "started"
        if step.actor == "expire":  # Kafka's retention: the source check sees a new low
            assert isinstance(p, int) and step.offset is not None
            self.lows[p] = max(self.lows[p], step.offset)
            return "expired"
        lc = self.lifecycles.get(worker)
        if lc is None:
            return "unstarted"  # a replacement whose interleave was never reached
        if step.actor == "stop":
            lc.stop()
            return "stopped"
        ps = step.partitions
        if step.actor == "lost":
            return lose(self, worker, ps)
        if step.actor == "assign":
            for q in ps:
                self.cursors.pop((worker, q), None)
            dropped(self, worker, ps)
            held = await lc.assign([self.source_check(q) for q in ps])
            return "ok" if all(self.tp(q) in held for q in ps) else "not-retained"
        if step.actor == "revoke":  # the fetch cursor stays: a fetched batch may come late
            await lc.revoke([self.tp(q) for q in ps])
            return "ok"
        if step.actor == "heartbeat":
            return await self.heartbeats.tick(worker, lc)
        if step.actor == "process":
            return await self._process(lc, worker, ps)
        if len(ps) > 1:  # version 4: one seek_all, one observe for the set
            for tp, frontier in (await lc.seek_all([self.tp(q) for q in ps])).items():
                sought(self, worker, tp.partition, frontier)
            return "ok"
        assert isinstance(p, int)
        sought(self, worker, p, await lc.seek(self.tp(p)))
        return "ok"

    async def _process(self, lc: Lifecycle, worker: int, ps: tuple[int, ...]) -> str:
        """One batch per partition, all in flight at once; a single one raises its error."""
        async def one(q: int) -> str:
            if self.trace.config.lanes > 1:  # ops.sim.lanes
                try:
                    outcome = await process_lanes(self, lc, worker, q)
                except FenceError as exc:
                    self.batch_results[q] = (_result(exc), exc)
                    raise
                if outcome == "ok":
                    self.batch_results[q] = ("ok", None)
                return outcome
            batch = self.take_batch(worker, q)
            if isinstance(batch, str):
                return batch
            try:
                if self.failing is None:
                    await lc.process(BatchCall(self.tp(q), batch, memory_ref_handler))
                else:
                    tp = self.tp(q)
                    await self.failure_runs[worker].submit(tp, batch, links=(), stopped=lambda:
                                                           lc.state is not LifetimeState.LIVE
                                                           or lc.token(tp) is None)
            except RetryInterrupted:  # the lifetime left LIVE or dropped the partition
                self.batch_results[q] = ("interrupted", None)
                return "interrupted"
            except FenceError as exc:
                self.batch_results[q] = (_result(exc), exc)
                raise
            self.batch_results[q] = ("ok", None)
            return "ok"

        if len(ps) == 1:
            return await one(ps[0])
        done = await asyncio.gather(*(one(q) for q in ps), return_exceptions=True)
        for outcome in done:
            if isinstance(outcome, BaseException) and not isinstance(outcome, FenceError):
                raise outcome
        failed = [self.batch_results[q][0] for q in ps
                  if q in self.batch_results and self.batch_results[q][1] is not None]
        if failed:
            return failed[0]
        return "ok" if self.batch_results else next(
            (o for o in done if isinstance(o, str) and o != "idle"), "idle")

    def _refusable(self, ps: tuple[int, ...]) -> list[int]:
        """Partitions whose source check must be refused now: Kafka deleted records below
        the durable frontier (without ``allow_retention_gap``) or reports another topic."""
        out = []
        for q in ps:
            row = self.store.rows.get(self.tp(q))
            if row is None:
                continue
            if (row.topic_id is not None and row.topic_id != self.topic_id) or (
                    row.frontier < self.lows[q] and not self.trace.config.allow_retention_gap):
                out.append(q)
        return out

    # -- drain ---------------------------------------------------------------------------
    def _progress(self) -> int:
        """Grows with every commit: a batch, a lane's spans (above the frontier), a fold."""
        above = sum(b - a + 1 for tp, row in self.store.rows.items()
                    for s in self.store.completion_rows.get(tp, ()) for a, b in s[1]
                    if a >= row.frontier)
        return sum(2 * row.frontier for row in self.store.rows.values()) + above

    def ready(self, worker: int, partition: int) -> bool:
        """``worker`` has something to process of ``partition`` (``ops.sim.lanes``)."""
        if self.trace.config.lanes > 1:
            return lanes_ready(self, worker, partition)
        cursor = self.cursors.get((worker, partition))
        return cursor is not None and cursor < self.ends[partition]

    def durable(self, partition: int) -> int | None:
        token = self.store.token_of(self.tp(partition))
        return None if token is None else token.frontier

    async def drain(self) -> bool:
        """Fair recovery; returns False (BLOCKED) when the source cannot be finished."""
        cfg = self.trace.config
        for lc in self.lifecycles.values():
            lc.stop()
        if cfg.topic_recreated_before_drain:  # Kafka now reports another topic id
            self.topic_id = f"{TOPIC_ID}-recreated"
        for p, low in enumerate(cfg.low_watermarks_before_drain):
            self.lows[p] = max(self.lows[p], low)
            durable = self.durable(p) or 0
            if cfg.allow_retention_gap and durable < self.lows[p]:
                self.checker.give_up(self.tp(p), durable, self.lows[p])
        worker = max([*self.lifecycles, *_declared(self.trace)], default=0) + 1
        ok = (await self.step(Step("start", worker), fair=True))["result"] == "started"
        every = tuple(range(cfg.partitions))
        if self.trace.version >= 4 and len(every) > 1:  # one claim, one observe: production
            fair = [Step("assign", worker, every), Step("seek", worker, every)]
        elif self.trace.version >= 2:  # the whole set in one claim, as production assigns
            fair = [Step("assign", worker, every), *(Step("seek", worker, p) for p in every)]
        else:
            fair = [Step(actor, worker, p) for p in every for actor in ("assign", "seek")]
        for fair_step in fair:
            att = await self.step(fair_step, fair=True)
            if att["result"] != "ok":
                self.diagnostics.append(
                    f"drain: {fair_step.actor} of partition {att['partition']} ended "
                    f"{att['result']}: {att['error']}")
                return False
        for p in range(cfg.partitions):
            while ok:
                before = self._progress()
                att = await self.step(Step("process", worker, p), fair=True)
                if att["result"] == "idle":
                    break
                if att["result"] != "ok" or self._progress() <= before:
                    self.diagnostics.append(f"drain: attempt {att['index']} on partition {p} "
                                            f"did not advance durable progress "
                                            f"({att['result']}: {att['error']})")
                    return False
        return ok


def _declared(trace: Trace) -> list[int]:
    ids = [s.worker for s in trace.steps]
    for s in trace.steps:
        ids.extend(f.interleave.replacement for f in s.faults
                   if f.interleave is not None and f.interleave.replacement is not None)
    return ids


async def _execute(run: _Run, trace: Trace) -> dict[str, Any]:
    for step in trace.steps:
        await run.step(step)
    return await finish(run, trace)


async def finish(run: _Run, trace: Trace) -> dict[str, Any]:
    """Drain (if asked) and report ``run``, whose steps are exactly ``trace``'s, done."""
    run.trace = trace
    boundary_before = run_boundary(run)
    complete_before = all(b["frontier"] == b["end"] for b in boundary_before.values())
    violations_before = len(run.checker.violations)
    lifetimes = _lifetimes(run)
    drained = blocked = False
    if trace.drain:
        drained = await run.drain()
        blocked = not drained
        if drained:
            frontiers = [run.durable(p) for p in range(trace.config.partitions)]
            for p, frontier in enumerate(frontiers):
                if (frontier or 0) < run.ends[p]:
                    run.checker.fail("final", f"partition {p} ended at {frontier}, "
                                              f"source ends at {run.ends[p]}")
                missing = run.checker.unapplied(p) if run.checker.lanes else []
                if missing:
                    run.checker.fail("final", f"partition {p}: offsets {missing} were never "
                                              "applied by a lane")
            run.checker.check(f"final comparison at {sorted(f or 0 for f in frontiers)}")
    return build_report(trace, attempts=run.attempts, events=run.events,
                        violations=run.checker.violations, violations_before=violations_before,
                        complete_before=complete_before, boundary_before=boundary_before,
                        boundary=run_boundary(run), drained=drained, blocked=blocked,
                        excluded=run.checker.excluded, diagnostics=run.diagnostics,
                        checks=run.checker.checks, lifetimes=lifetimes)


def _lifetimes(run: _Run) -> list[dict[str, Any]]:
    """Every lifetime's end state before the drain stops them (``ops.sim.report``). A
    lifetime that ended with a call in flight names the live successor that holds the
    current epoch of every partition of that call (``followed_up_by``), or None."""
    out = []
    for w, lc in sorted(run.lifecycles.items()):
        ended = run.ended_in_flight.get(w)
        if ended is not None:
            ended = {**ended, "followed_up_by": _successor(run, w, ended["partitions"])}
        out.append({"lifetime": str(w), "state": lc.state.value,
                    "reason": lc.retired_reason, "ended_in_flight": ended})
    return out


def _successor(run: _Run, worker: int, partitions: list[int]) -> str | None:
    """The one live lifetime other than ``worker`` holding the durable token of every
    partition in ``partitions``, if any."""
    for w, lc in sorted(run.lifecycles.items()):
        if w == worker or lc.state is not LifetimeState.LIVE:
            continue
        if all(lc.token(run.tp(p)) is not None and lc.token(run.tp(p)) ==
               run.store.token_of(run.tp(p)) for p in partitions):
            return str(w)
    return None


def new_run(trace: Trace, *, checking: bool = False) -> _Run:
    """A fresh run of ``trace``'s config and source (oracle checks only when ``checking``);
    the generator steps it (``await run.step(step)``) on its own loop to aim its choices at
    the real state, and may ``finish`` it into the report its replay would give."""
    return _Run(trace, checking=checking)


def run_boundary(run: _Run) -> dict[str, dict[str, int | None]]:
    out: dict[str, dict[str, int | None]] = {}
    for p in range(run.trace.config.partitions):
        token = run.store.token_of(run.tp(p))
        out[str(p)] = {"frontier": None if token is None else token.frontier,
                       "epoch": None if token is None else token.epoch,
                       "end": run.ends[p]}
    return out


def run_trace(trace: Trace, *, keep: list[Any] | None = None) -> dict[str, Any]:
    """Run ``trace`` on a fresh event loop; return the report (a JSON-ready dict).

    ``keep`` (tests): receives the run object, whose ``store`` and ``lifecycles`` can then
    be inspected."""
    try:
        run = _Run(trace)
        if keep is not None:
            keep.append(run)
        return run_sync(_execute(run, trace), clock=run.clock)
    except Exception as exc:  # a simulator or production bug: ERROR, never a crash
        return build_report(trace, attempts=[], events=[], violations=[
            f"internal: {type(exc).__name__}: {exc}"], violations_before=1,
            complete_before=False, boundary_before={}, boundary={}, drained=False,
            blocked=False, excluded=0, diagnostics=[repr(exc)], checks=0)
