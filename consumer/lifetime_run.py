"""One worker lifetime's run: its consumer, its partitions, its batches, its end.

Long because the rebalance callbacks, the partition runners and the shutdown share the
run's state (handler failures live in ``consumer.failure_run``).

Rules (the worker's; see ``consumer.worker`` for the process around it)
- Rebalance callbacks (on the Kafka thread) block on coroutines of the loop: ``assigned``
  validates and claims through the lifecycle, then returns the durable frontiers the
  consumer is positioned at; ``revoked`` first lets every in-flight batch of those
  partitions finish, then calls ``lifecycle.revoke``; ``lost`` is local only.
- Callbacks carry their lifetime: the Kafka thread of this run reports to this run only;
  once another run is current, its callbacks are logged and ignored -- they never touch the
  current lifetime's tokens or partitions.
- One runner task per owned partition takes batches from its buffer and submits them with
  ``lifecycle.process``; at most ``db_concurrency`` batches are in flight across partitions.
  A batch that is not full waits for more records at most ``batch_linger_s`` after its
  oldest record arrived (``PartitionBuffer.linger_left_s``, on the loop's clock), then it
  waits only for a slot. While it lingers, a delivery wakes its runner only when the batch
  is full (count or bytes): one wake per batch, not one per delivery.
  After each commit the frontier is queued for Kafka (advisory; ``consumer.kafka.committer``),
  also when the batch's COMMIT reply was lost and the re-read resolved it as committed:
  ``lifecycle.process`` returns the resolved token either way.
- Lanes (``--lanes``, ``consumer.lanes_run``): a partition that runs lanes has a dispatcher
  instead of one runner; its lanes submit their batches like a runner does (``_submit``).
- Batches go through ``consumer.failure_run`` (``lifecycle.process``, and on a handler
  failure retries, bisection, quarantine; retries end once the partition closes).
- A fenced batch means this process was a zombie (its partition was lost and a newer owner
  committed): nothing of it applied, and the lifetime ends with exit 3. A batch fenced by
  an operator's reset (``ResetByOperator``), or a heartbeat that finds an owned partition
  owned by an operator (``operator_owned``), instead closes the partition's runner, claims
  it again (``lifecycle.reclaim``), seeks the consumer to the new frontier
  (``kafka.reposition``) and starts a fresh runner there; the lifetime goes on. A revoke or
  loss meanwhile ends the re-claim without a runner.
- Kafka's facts of an assignment (topic ids, watermarks) are read with the failover bound:
  a broker, controller or coordinator moving is retried within ``--outage-bound-s``
  (``consumer.outage``); only past it does the run end (exit 5 naming the cluster). The
  assignment callback waits that bound on top of the lifecycle's budget.
- Between assignments Kafka is watched (``kafka_watch``, an ``OutageWatch``): a failed lag
  sample (``watched_facts``), a failed offset-mirror commit (``kafka_outcome``) or a lost
  group session opens an episode; any answer -- facts read, a commit confirmed, an
  assignment -- closes it. An episode older than the bound ends the run with exit 5 naming
  the cluster (e.g. two of three nodes down: no quorum, no leader for some partitions, no
  coordinator); a quiet member has nothing that fails and is never ended by it.
- A failure ends the run with ``exit_code_for(exc)``: stop fetching, leave the group
  (``Consumer.close()`` on the Kafka thread, outside any callback), stop the lifecycle. The
  Kafka thread never dies silently: ``failed`` ends the run (2 for a consumer that cannot
  be built, 5 for a failed assign, 1 with the traceback for anything else).
- Shutdown: stop fetching, drop unstarted batches, wait for in-flight ones up to
  ``shutdown_timeout_s``; past it, report them and end with code 6, which wins over any
  earlier failure's code; the stuck work is cancelled and not waited for again
  (``abandoned``).
- Progress (records fetched into a partition's buffer, a batch committed) is timed per
  partition on the injected clock; ``progress()`` feeds stall detection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from consumer import decisions as d
from consumer import events as ev
from consumer.batching import Flow, InFlight, PartitionBuffer, in_flight_of
from consumer.config import WorkerConfig
from consumer.decisions import LifetimeState
from consumer.exits import ExitCode, exit_code_for
from consumer.failure_run import FailureRun, RetryInterrupted
from consumer.kafka.adapter import Rebalancer, call_on_loop
from consumer.kafka.source import build_checks
from consumer.lanes_run import LaneRun
from consumer.outage import OutageWatch, kafka_gave_up, retry_outage_async
from consumer.ports import FactsPort, KafkaPort, LifecyclePort, Partition
from fencing.crashpoints import crash_point
from fencing.errors import (
    Fenced,
    FenceError,
    KafkaClientFailed,
    ResetByOperator,
    Retired,
    SourceRefused,
    SourceUnavailable,
    TokenDropped,
)
from fencing.lanes import Completion, Dispatch
from fencing.types import SourceFacts, SourceRecord, Token, TopicPartition

__all__ = ["LifetimeRun", "RunContext"]

log = logging.getLogger("fenceworker.worker")

WATCH_INTERVAL_S = 1.0  # how often an open Kafka outage episode is compared with its bound


@dataclass(frozen=True, slots=True)
class RunContext:
    """What a lifetime takes from its process, built once by ``consumer.worker.Worker``:
    the configuration, the Kafka facts source, the injected clock and sleep, where events
    go, the producer-span links of a batch (None: none), the handler-failure handling of a
    lifetime (a ``FailureRun`` per lifecycle, sharing the process's gate), and whether a
    run is still the process's current one (only the current run's callbacks are served)."""

    config: WorkerConfig
    source: FactsPort
    clock: Callable[[], float]
    wait: Callable[[float], Awaitable[None]]
    emit: Callable[[ev.WorkerEvent], None]
    trace_links: Callable[[Sequence[SourceRecord]], Sequence[object]] | None
    failure_run: Callable[[LifecyclePort], FailureRun]
    is_current: Callable[[LifetimeRun], bool]


class LifetimeRun:
    """One lifetime of a ``Worker``; ``run()`` returns its exit code. It is also the
    ``Rebalancer`` its Kafka thread reports to (``consumer.kafka.adapter``)."""

    def __init__(self, context: RunContext, lifetime_id: str, lifecycle: LifecyclePort,
                 kafka_factory: Callable[[Rebalancer], KafkaPort]) -> None:
        self._ctx = context
        self._cfg = context.config
        self.lifetime_id = lifetime_id
        self._lc = lifecycle
        self._loop = asyncio.get_running_loop()
        self._failure: BaseException | None = None
        self._failed = asyncio.Event()
        self._parts: dict[TopicPartition, Partition] = {}
        self._slots = asyncio.Semaphore(self._cfg.db_concurrency)
        self._stopping = False
        self.abandoned = False  # in-flight work outlived the shutdown bound
        # partitions being claimed again after an operator's reset -> still wanted (a revoke
        # or loss meanwhile sets False: no runner is started)
        self._reclaims: dict[TopicPartition, bool] = {}
        self._reclaim_tasks: set[asyncio.Task[None]] = set()
        self.failures = context.failure_run(lifecycle)
        self.kafka_watch = OutageWatch(bound_s=self._cfg.outage_bound_s, clock=context.clock)
        self.kafka = kafka_factory(self)

    @property
    def failure(self) -> BaseException | None:
        """The failure that ended (or is ending) this run; None while it runs or when a stop
        was requested."""
        return self._failure

    @property
    def in_flight(self) -> list[InFlight]:
        return [*(p.inflight for p in self._parts.values() if p.inflight is not None),
                *(i for p in self._parts.values() for i in p.lanes_inflight.values())]

    def progress(self) -> dict[TopicPartition, float]:
        """Per owned partition: the clock time of its last fetch or commit progress."""
        return {tp: min((p.progress_s, *p.lanes_since.values()))
                for tp, p in self._parts.items() if not p.closing}

    def lanes(self) -> dict[TopicPartition, tuple[int, int]]:
        """Per owned partition running lanes: (busy lanes, window used) (``LaneRun.load``)."""
        return {tp: p.lane_load() for tp, p in self._parts.items()
                if p.lane_load is not None and not p.closing}

    async def run(self, stop_requested: asyncio.Event) -> ExitCode:
        """Run until ``stop_requested`` or a failure; then end (see the module Rules)."""
        self.kafka.start()
        waiters = [asyncio.ensure_future(stop_requested.wait()),
                   asyncio.ensure_future(self._failed.wait()),
                   asyncio.ensure_future(self._watch_kafka())]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()
        return await self._end()

    async def _watch_kafka(self) -> None:
        """End the run once a Kafka outage outlived the bound (see Rules)."""
        cfg = self._cfg
        while True:
            await self._ctx.wait(WATCH_INTERVAL_S)
            over = self.kafka_watch.over()
            if over is not None:
                elapsed_s, last = over
                self._fail(kafka_gave_up(where=cfg.bootstrap_source,
                                         servers=cfg.bootstrap_servers,
                                         bound_s=cfg.outage_bound_s)(
                    SourceUnavailable(last), elapsed_s))
                return

    def watched_facts(self, tps: list[TopicPartition]) -> dict[TopicPartition, SourceFacts]:
        """``source.facts`` for a lag sample (any thread), its outcome reported to the watch."""
        try:
            facts = self._ctx.source.facts(tps)
        except SourceUnavailable as exc:
            self.kafka_watch.failed(f"lag sample: {exc}")
            raise
        self.kafka_watch.answered()
        return facts

    def kafka_outcome(self, answered: bool, what: str) -> None:
        """The Kafka thread's report of a request to the cluster (a mirror commit)."""
        if not self._ctx.is_current(self):
            return
        if answered:
            self.kafka_watch.answered()
        else:
            self.kafka_watch.failed(what)

    async def _end(self) -> ExitCode:
        self._stopping = True
        self.kafka.stop_fetching()
        for part in self._parts.values():
            part.buffer.clear()
            part.wake.set()
        if self._failure is None:  # a requested stop (SIGTERM/SIGINT), not a failure
            crash_point("in-shutdown", lifetime=self.lifetime_id,
                        in_flight=[i.describe() for i in self.in_flight])
        tasks = [p.task for p in self._parts.values() if p.task is not None and not p.task.done()]
        pending: set[asyncio.Task[None]] = set()
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=self._cfg.shutdown_timeout_s)
        # after the in-flight batches ended: their failures may name the root cause
        code = ExitCode.OK if self._failure is None else exit_code_for(self._failure)
        if pending:
            stuck = self.in_flight
            log.error("shutdown bound %.1fs exceeded (exit 6%s); still in flight: %s",
                      self._cfg.shutdown_timeout_s,
                      "" if code is ExitCode.OK else f" instead of {int(code)}",
                      "; ".join(i.describe() for i in stuck) or "(between batches)")
            self._ctx.emit(ev.ShutdownTimedOut(tuple(stuck)))
            code = ExitCode.SHUTDOWN_TIMEOUT  # final: work was abandoned
            self.abandoned = True
            self._stop_lifecycle()  # cancel the stuck calls before leaving the group
        closed = self.kafka.close()  # on_revoke -> lifecycle.revoke (journals the release)
        try:
            await asyncio.wait_for(asyncio.wrap_future(closed), timeout=self._cfg.budget_s + 10)
        except Exception as exc:  # timeout or Kafka thread failure: it could not leave cleanly
            log.warning("consumer close did not finish: %r", exc)
        self._stop_lifecycle()
        for part in list(self._parts.values()):
            if part.task is not None and not part.task.done():
                part.task.cancel()
        return code

    def _stop_lifecycle(self) -> None:
        try:
            self._lc.stop()
        except FenceError as exc:
            log.debug("lifecycle stop: %s", exc)

    def _fail(self, exc: BaseException) -> None:
        """Record the failure that ends this run; a failure with a cause replaces a bare
        ``Retired`` (a refusal after the retirement began)."""
        first = self._failure is None
        if first or (_bare(self._failure) and not _bare(exc)):
            self._failure = exc
        cause = exc.__cause__ or exc.__context__
        code = exit_code_for(exc)
        log.error("lifetime %s (exit %d, %s): %s%s", "ends" if first else "also failed",
                  code, type(exc).__name__, _advice(exc),
                  f" [cause: {type(cause).__name__}: {cause}]" if cause is not None else "",
                  exc_info=exc if code is ExitCode.INTERNAL else None)
        if first:
            self._ctx.emit(ev.Failed(type(exc).__name__, int(code)))
            self.kafka.freeze_mirror()  # its frontiers may be stale (fenced): stop mirroring
        self._failed.set()

    # ---- Rebalancer (called from the Kafka thread) ---------------------------------------

    def _current(self, what: str) -> bool:
        if self._ctx.is_current(self):
            return True
        log.warning("ignored %s callback of earlier lifetime %s", what, self.lifetime_id)
        return False

    def assigned(self, tps: list[TopicPartition]) -> dict[TopicPartition, int] | None:
        self.kafka_watch.answered()  # the group coordinator answered
        return self._blocking(self._assigned(tps), "assign",
                              extra_s=self._cfg.outage_bound_s) \
            if self._current("assign") else None

    def revoked(self, tps: list[TopicPartition]) -> None:
        if self._current("revoke"):
            self._blocking(self._revoked(tps), "revoke")

    def lost(self, tps: list[TopicPartition]) -> None:
        self.kafka_watch.failed("the group session was lost (no answer from the group "
                                "coordinator within the session timeout, or a poll too late)")
        if self._current("lost"):
            self._blocking(self._lost(tps), "lost")

    def deliver(self, take: Callable[[], list[SourceRecord]],
                release: Callable[[], None]) -> None:
        if self._current("deliver"):
            self._loop.call_soon_threadsafe(self._take_delivery, take, release)
        else:
            release()

    def failed(self, exc: BaseException) -> None:
        if self._current("failure"):
            self._loop.call_soon_threadsafe(self._fail, exc)

    def _blocking(self, coro: Any, what: str, *, extra_s: float = 0.0) -> Any:
        """Run ``coro`` on the loop and wait (the budget, ``extra_s`` and a margin); a
        failure ends the run and gives None."""
        try:
            return call_on_loop(self._loop, coro, timeout_s=self._cfg.budget_s + extra_s + 5)
        except BaseException as exc:  # a callback must never raise into librdkafka
            self._loop.call_soon_threadsafe(self._fail, exc)
            log.debug("%s callback failed: %r", what, exc)
            return None

    # ---- loop side of the callbacks ------------------------------------------------------

    async def _assigned(self, tps: list[TopicPartition]) -> dict[TopicPartition, int] | None:
        if self._stopping:
            return None
        if not tps:
            self._ctx.emit(ev.Assigned(()))
            return {}
        self._ctx.emit(ev.RebalanceBegan("assign", tuple(tps)))
        facts = await self._facts(tps)
        checks = build_checks(facts, allow_retention_gap=self._cfg.allow_retention_gap)
        try:
            await self._lc.assign(checks)
            positions = await self._lc.seek_all(tps)  # one read for the assignment
        except BaseException as exc:
            self._fail(exc)
            return None
        if self._stopping or not self._ctx.is_current(self):
            return None  # the run ended meanwhile: hold the partitions paused
        for tp in tps:
            self._start_partition(tp, positions[tp])
        self._ctx.emit(ev.Assigned(tuple(tps)))
        return positions

    async def _facts(self, tps: list[TopicPartition]) -> dict[TopicPartition, SourceFacts]:
        """Kafka's facts of ``tps``, a failover retried within the bound (see Rules)."""
        cfg = self._cfg

        def retrying(exc: BaseException, wait_s: float) -> None:
            log.warning("kafka facts of %s unavailable (%s); retrying in %.1f s "
                        "(--outage-bound-s %g)", ", ".join(map(str, tps)), exc, wait_s,
                        cfg.outage_bound_s)

        facts = await retry_outage_async(
            lambda: asyncio.to_thread(self._ctx.source.facts, tps), bound_s=cfg.outage_bound_s,
            retry_on=(SourceUnavailable,),
            give_up=kafka_gave_up(where=cfg.bootstrap_source, servers=cfg.bootstrap_servers,
                                  bound_s=cfg.outage_bound_s),
            clock=self._ctx.clock, sleep=self._ctx.wait, stopped=lambda: self._stopping,
            on_retry=retrying)
        self.kafka_watch.answered()
        return facts

    def _start_partition(self, tp: TopicPartition, position: int) -> None:
        cfg = self._cfg
        buffer = PartitionBuffer(next_offset=position, max_records=cfg.batch_max_records,
                                 max_bytes=cfg.batch_max_bytes,
                                 queue_max_records=cfg.queue_max_records,
                                 queue_max_bytes=cfg.queue_max_bytes)
        part = Partition(tp, buffer, progress_s=self._ctx.clock())
        part.task = asyncio.create_task(self._run_partition(part), name=f"partition {tp}")
        self._parts[tp] = part

    async def _revoked(self, tps: list[TopicPartition]) -> None:
        self._ctx.emit(ev.RebalanceBegan("revoke", tuple(tps)))
        tasks = self._close_partitions(tps)
        if tasks and not self.abandoned:  # abandoned work is not waited for twice
            await asyncio.wait(tasks, timeout=self._cfg.budget_s)
        if self._live():
            await self._lc.revoke(tps)
        self._ctx.emit(ev.Revoked(tuple(tps)))

    async def _lost(self, tps: list[TopicPartition]) -> None:
        self._ctx.emit(ev.RebalanceBegan("lost", tuple(tps)))
        self._close_partitions(tps)
        if self._live():
            self._lc.lost(tps)

    def _close_partitions(self, tps: list[TopicPartition]) -> list[asyncio.Task[None]]:
        tasks = []
        for tp in tps:
            if tp in self._reclaims:
                self._reclaims[tp] = False
            part = self._parts.pop(tp, None)
            if part is None:
                continue
            part.closing = True
            part.buffer.clear()
            part.wake.set()
            if part.task is not None and not part.task.done():
                tasks.append(part.task)
        return tasks

    def _take_delivery(self, take: Callable[[], list[SourceRecord]],
                       release: Callable[[], None]) -> None:
        try:
            try:
                records = take()  # translated here, on the loop (kafka.adapter.translated)
            except Exception as exc:  # never lost silently in the loop's exception handler
                self._fail(exc)
                return
            start, now_s = 0, self._loop.time()
            while start < len(records):
                tp = records[start].tp
                end = start + 1
                while end < len(records) and records[end].partition == tp.partition \
                        and records[end].topic == tp.topic:
                    end += 1
                part = self._parts.get(tp)
                if part is not None and not part.closing and not self._stopping:
                    if part.buffer.add(records[start:end], now_s) < end - start:
                        part.progress_s = self._ctx.clock()
                    self._apply_flow(part)
                    if not part.lingering or part.buffer.full:
                        part.wake.set()
                start = end
        finally:
            release()

    def _apply_flow(self, part: Partition) -> None:
        if part.closing or self._parts.get(part.tp) is not part:
            return  # an older assignment of the partition: its flow state is gone
        flow = part.buffer.flow()
        if flow is Flow.PAUSE:
            self.kafka.pause(part.tp)
        elif flow is Flow.RESUME:
            self.kafka.resume(part.tp)

    # ---- processing ----------------------------------------------------------------------

    async def _run_partition(self, part: Partition) -> None:
        lanes = self._lanes_of(part)
        if lanes is not None:
            try:
                await lanes.run()
            finally:
                self._lc.run_lanes(part.tp, None)
            return
        while not part.closing and not self._stopping:
            if len(part.buffer) == 0:
                part.wake.clear()
                await part.wake.wait()
                continue
            linger_s = part.buffer.linger_left_s(self._loop.time(), self._cfg.batch_linger_s)
            if linger_s > 0:  # not full: more records may come within the linger
                # woken by the linger's end, the batch filling up, a close or a stop -- not
                # by each delivery meanwhile (one wake per batch, not per delivery)
                part.wake.clear()
                part.lingering = True
                timer = self._loop.call_later(linger_s, part.wake.set)
                try:
                    await part.wake.wait()
                finally:
                    timer.cancel()
                    part.lingering = False
                continue
            async with self._slots:
                if part.closing or self._stopping:
                    return
                batch = part.buffer.take_batch()
                self._apply_flow(part)
                part.inflight = inflight = in_flight_of(batch)
                try:
                    token = await self._submit(part, batch)
                finally:
                    part.inflight = None
            if token is None:
                return
            self._committed(part, inflight, token)

    async def _submit(self, part: Partition, batch: list[SourceRecord]) -> Token | None:
        """``failures.submit`` of one batch of ``part``; None when its runner (or lane) must
        end (see the module Rules)."""
        inflight = in_flight_of(batch)
        try:
            links = self._ctx.trace_links(batch) if self._ctx.trace_links else ()
            return await self.failures.submit(part.tp, batch, links=links, stopped=lambda:
                                              part.closing or self._stopping)
        except asyncio.CancelledError:
            raise
        except RetryInterrupted:
            return None
        except ResetByOperator as exc:
            # nothing of the batch applied; the records come again from the new
            # frontier (a partition closed meanwhile is its next owner's to claim)
            log.info("batch %s not applied: %s%s", inflight.describe(), exc,
                     "" if part.closing else "; claiming the partition again")
            if not part.closing:
                self._start_reclaim(part.tp)
            return None
        except BaseException as exc:
            if d.after_batch_failure(exc, closing=part.closing) is d.BatchFailure.DROP:
                # Lost while the batch waited behind the partition's guard: never
                # attempted, dropped like the records still buffered (the next owner,
                # this member again after a rejoin, processes it from the frontier).
                log.info("batch %s not attempted: the partition was lost before its "
                         "turn", inflight.describe())
                return None
            if part.closing and isinstance(exc, Fenced):
                # Lost meanwhile and a newer owner committed: this process was a
                # zombie. Nothing of the batch applied; the lifetime ends (exit 3).
                log.warning("batch %s not applied: fenced after the partition was lost "
                            "(%s)", inflight.describe(), exc)
            self._fail(exc)
            return None

    def _committed(self, part: Partition, inflight: InFlight, token: Token) -> None:
        part.progress_s = self._ctx.clock()
        crash_point("after-commit", partition=str(part.tp), epoch=token.epoch,
                    first_offset=inflight.first_offset, last_offset=inflight.last_offset,
                    batch_end=token.frontier)
        self.kafka.commit(part.tp, token.frontier)

    def _lanes_of(self, part: Partition) -> LaneRun | None:
        """The lanes of ``part`` when it runs lanes (see ``consumer.lanes_run``)."""
        cfg = self._cfg
        completion = self._lc.completion(part.tp)
        if cfg.lanes <= 1 and (completion is None or not completion.spans):
            return None
        if completion is None:
            token = self._lc.token(part.tp)
            if token is None:
                return None
            completion = Completion(token.frontier, epoch=token.epoch)
        dispatch = Dispatch(completion, cfg.lanes, window=cfg.lanes_window,
                            null_any=cfg.lanes_null_any)

        async def submit(p: Partition, batch: list[SourceRecord]) -> bool:
            token = await self._submit(p, batch)
            if token is not None:
                p.progress_s = self._ctx.clock()
            return token is not None

        def take(p: Partition) -> list[SourceRecord]:
            batch = p.buffer.take_batch()
            self._apply_flow(p)
            return batch

        return LaneRun(part, dispatch, lifecycle=self._lc, slots=self._slots,
                       batch_max_records=cfg.batch_max_records, submit=submit,
                       commit=lambda frontier: self.kafka.commit(part.tp, frontier),
                       stopping=lambda: self._stopping, take=take, clock=self._ctx.clock)

    # ---- operator resets ------------------------------------------------------------------

    def operator_owned(self, tps: Collection[TopicPartition]) -> None:
        """A heartbeat read that an operator owns ``tps`` now: claim again those this
        lifetime runs (``lifecycle.reclaim`` finds out whether the reset fenced it)."""
        for tp in tps:
            part = self._parts.get(tp)
            if part is not None and not part.closing:
                self._start_reclaim(tp)

    def _start_reclaim(self, tp: TopicPartition) -> None:
        if tp in self._reclaims or self._stopping:
            return
        self._reclaims[tp] = True
        task = asyncio.create_task(self._reclaim(tp, self._parts.get(tp)), name=f"reclaim {tp}")
        self._reclaim_tasks.add(task)
        task.add_done_callback(self._reclaim_tasks.discard)

    async def _reclaim(self, tp: TopicPartition, part: Partition | None) -> None:
        """Close ``tp``'s runner ``part``, claim it again, seek the consumer to the new
        frontier; the fresh runner starts in ``_repositioned`` (see the module Rules)."""
        positioned: asyncio.Future[None] = self._loop.create_future()
        try:
            if not self._reclaims.get(tp):
                return  # revoked or lost before this task ran
            if part is not None and self._parts.get(tp) is part:
                del self._parts[tp]
                part.closing = True
                part.buffer.clear()
                part.wake.set()
                if part.task is not None and not part.task.done():
                    await asyncio.wait([part.task], timeout=self._cfg.budget_s)
            facts = await asyncio.to_thread(self._ctx.source.facts, [tp])
            checks = build_checks(facts, allow_retention_gap=self._cfg.allow_retention_gap)
            token = await self._lc.reclaim(checks[0])
            current = token or self._lc.token(tp)
            if current is None or not self._reclaims.get(tp):
                return
            frontier = current.frontier

            def then(result: bool | BaseException) -> None:  # on the Kafka thread
                self._loop.call_soon_threadsafe(self._repositioned, tp, frontier, token,
                                                result, positioned)

            self.kafka.reposition(tp, frontier, then)
            await asyncio.wait_for(asyncio.shield(positioned), timeout=self._cfg.budget_s + 10)
        except TokenDropped as exc:
            log.info("%s: not claimed again: %s", tp, exc)  # revoked or lost meanwhile
        except TimeoutError:
            if not self._stopping:
                self._fail(KafkaClientFailed(f"{tp}: the consumer did not seek to the frontier "
                                             "claimed after an operator's reset in time"))
        except BaseException as exc:
            if not self._stopping:
                self._fail(exc)
        finally:
            self._reclaims.pop(tp, None)

    def _repositioned(self, tp: TopicPartition, frontier: int, token: Token | None,
                      result: bool | BaseException, positioned: asyncio.Future[None]) -> None:
        """On the loop, ordered with the deliveries: every message of the old position was
        taken (and dropped: no runner) before this runs, none of the new one yet."""
        if not positioned.done():
            positioned.set_result(None)
        if isinstance(result, BaseException):
            if not self._stopping:
                self._fail(KafkaClientFailed(f"{tp}: seek to {frontier} failed: {result}"))
            return
        if not result or not self._reclaims.get(tp) or self._stopping \
                or not self._ctx.is_current(self) or tp in self._parts \
                or self._lc.token(tp) is None:
            return
        self._start_partition(tp, frontier)
        if token is not None:
            log.info("%s: claimed again after an operator's reset: epoch %d, continuing from "
                     "frontier %d", tp, token.epoch, token.frontier)

    def _live(self) -> bool:
        return self._lc.state is LifetimeState.LIVE


def _bare(exc: BaseException | None) -> bool:
    """A ``Retired`` refusal that names no cause (a call after the retirement began)."""
    return isinstance(exc, Retired) and exc.__cause__ is None


def _advice(exc: BaseException) -> str:
    if isinstance(exc, SourceRefused):
        return f"{exc} -- the source no longer matches the durable state; an operator must decide"
    return str(exc) or type(exc).__name__
