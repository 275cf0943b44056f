"""The worker: one asyncio loop runs the lifecycle and the batches; a Kafka thread feeds it.

Rules
- Rebalance callbacks (on the Kafka thread) block on coroutines of this loop:
  ``assigned`` validates and claims through the lifecycle, then returns the durable
  frontiers the consumer is positioned at; ``revoked`` first lets every in-flight batch of
  those partitions finish, then calls ``lifecycle.revoke``; ``lost`` is local only.
- One runner task per owned partition takes batches from its buffer and submits them with
  ``lifecycle.process``; at most ``db_concurrency`` batches are in flight across partitions.
- After each commit the frontier is queued for Kafka (advisory; ``consumer.committer``),
  also when the batch's COMMIT reply was lost and the re-read resolved it as committed:
  ``lifecycle.process`` returns the resolved token either way.
- A fenced batch means this process was a zombie (its partition was lost and a newer owner
  committed): nothing of it applied, and the lifetime ends with exit 3 even though the
  lifecycle would allow rejoining -- a supervisor (or ``--restart-lifetimes``) starts fresh.
- A failure ends the lifetime with ``exit_code_for(exc)``: stop fetching, leave the group
  (``Consumer.close()`` on the Kafka thread, outside any callback), stop the lifecycle.
  A retired lifetime is never used again; ``restart_lifetimes`` starts fresh ones.
- Shutdown (``request_stop``): stop fetching, drop unstarted batches, wait for in-flight
  ones up to ``shutdown_timeout_s``; past it, report them and end with code 6. The bound is
  final: code 6 wins over an earlier failure's code, the stuck work is cancelled and not
  waited for again, and no fresh lifetime starts beside it (``abandoned``).
- Callbacks carry their lifetime: each lifetime's Kafka thread reports to its own
  ``LifetimeCallbacks``; a callback of an earlier lifetime's consumer is logged and ignored.
- The Kafka thread never dies silently: ``failed`` ends the lifetime with the error's exit
  code (2 for a consumer that cannot be built, 5 for a failed assign, 1 for anything else,
  logged with its traceback).
- Progress (records fetched into a partition's buffer, a batch committed) is timed per
  partition on the injected clock; ``progress()`` feeds stall detection (``consumer.stall``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError

from consumer.adapter import call_on_loop
from consumer.batching import Flow, InFlight, PartitionBuffer, in_flight_of
from consumer.config import WorkerConfig
from consumer.decisions import LifetimeState
from consumer.exits import ExitCode, exit_code_for
from consumer.mirror import MirrorState
from consumer.ports import FactsPort, KafkaPort, Partition
from consumer.source import build_checks
from consumer.tracecontext import links_for_records
from fencing.errors import Fenced, FenceError, RetentionGap, Retired, SourceRefused
from fencing.store import HandlerFn
from fencing.types import SourceRecord, TopicPartition

__all__ = ["KafkaPort", "Worker"]

log = logging.getLogger("fenceworker.worker")


class Worker:
    """Runs lifetimes until stopped or failed; ``run()`` returns the process exit code."""

    def __init__(self, *, config: WorkerConfig, handler: HandlerFn,
                 lifecycle_factory: Callable[[str], Any],
                 kafka_factory: Callable[[Any], KafkaPort], source: FactsPort,
                 on_event: Callable[[str, dict[str, Any]], None] | None = None,
                 trace_links: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._cfg = config
        self._clock = clock
        self._trace_links = trace_links  # producer-span links cost a header parse per record
        self._handler = handler
        self._lifecycle_factory = lifecycle_factory
        self._kafka_factory = kafka_factory
        self._source = source
        self._on_event = on_event or (lambda _name, _attrs: None)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = asyncio.Event()
        self._failure: BaseException | None = None
        self._failed = asyncio.Event()
        self._parts: dict[TopicPartition, Partition] = {}
        self._slots = asyncio.Semaphore(config.db_concurrency)
        self._stopping = False
        self._lc: Any = None
        self._kafka: KafkaPort | None = None
        self._lifetime: str | None = None
        self.abandoned = False  # in-flight work outlived the shutdown bound
        self.lifetimes: list[str] = []

    # ---- public ------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """SIGTERM/SIGINT: finish in-flight batches within the bound, then exit 0."""
        if not self._stop_requested.is_set():
            self._event("stopping")
        self._stop_requested.set()

    @property
    def member_id(self) -> str | None:
        """The current lifetime's Kafka group member id (None before its first assignment)."""
        return getattr(self._kafka, "member_id", None)

    @property
    def in_flight(self) -> list[InFlight]:
        return [p.inflight for p in self._parts.values() if p.inflight is not None]

    def offset_mirror(self) -> dict[TopicPartition, MirrorState]:
        """Per positioned partition of the current lifetime: Kafka's offset mirror."""
        return {} if self._kafka is None else self._kafka.mirror()

    def progress(self) -> dict[TopicPartition, float]:
        """Per owned partition: the clock time of its last fetch or commit progress."""
        return {tp: p.progress_s for tp, p in self._parts.items() if not p.closing}

    async def run(self) -> ExitCode:
        """Run lifetimes until a stop request or a failure not covered by restarts."""
        self._loop = asyncio.get_running_loop()
        restarts = self._cfg.restart_lifetimes
        while True:
            code = await self._run_lifetime()
            if code in (ExitCode.RETIRED, ExitCode.UNAVAILABLE) and restarts > 0 \
                    and not self._stop_requested.is_set() and not self.abandoned:
                restarts -= 1
                log.warning("starting a fresh lifetime (%d restarts left)", restarts)
                continue
            return code

    # ---- one lifetime ------------------------------------------------------------------------

    async def _run_lifetime(self) -> ExitCode:
        lifetime_id = f"lt-{uuid.uuid4().hex[:12]}"
        self.lifetimes.append(lifetime_id)
        self._failure, self._stopping, self._parts = None, False, {}
        self._failed = asyncio.Event()
        self._lc = self._lifecycle_factory(lifetime_id)
        self._lifetime = lifetime_id
        self._kafka = self._kafka_factory(LifetimeCallbacks(self, lifetime_id))
        self._event("lifetime.start", lifetime=lifetime_id)
        self._kafka.start()
        waiters = [asyncio.ensure_future(self._stop_requested.wait()),
                   asyncio.ensure_future(self._failed.wait())]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()
        code = await self._end_lifetime()
        self._event("lifetime.end", lifetime=lifetime_id, exit_code=int(code))
        return code

    async def _end_lifetime(self) -> ExitCode:
        assert self._kafka is not None
        self._stopping = True
        self._kafka.stop_fetching()
        for part in self._parts.values():
            part.buffer.clear()
            part.wake.set()
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
            self._event("shutdown.timeout", in_flight=[i.describe() for i in stuck])
            code = ExitCode.SHUTDOWN_TIMEOUT  # final: work was abandoned
            self.abandoned = True
            await self._stop_lifecycle()  # cancel the stuck calls before leaving the group
        closed = self._kafka.close()  # on_revoke -> lifecycle.revoke (journals the release)
        try:
            await asyncio.wait_for(asyncio.wrap_future(closed), timeout=self._cfg.budget_s + 10)
        except Exception as exc:  # timeout or Kafka thread failure: it could not leave cleanly
            log.warning("consumer close did not finish: %r", exc)
        await self._stop_lifecycle()
        for part in list(self._parts.values()):
            if part.task is not None and not part.task.done():
                part.task.cancel()
        return code

    async def _stop_lifecycle(self) -> None:
        try:
            self._lc.stop()
        except FenceError as exc:
            log.debug("lifecycle stop: %s", exc)

    def _fail(self, exc: BaseException) -> None:
        """Record the failure that ends this lifetime; a failure with a cause replaces a bare
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
            self._event("failed", error=type(exc).__name__, exit_code=int(exit_code_for(exc)))
            if self._kafka is not None:  # its frontiers may be stale (fenced): stop mirroring
                self._kafka.freeze_mirror()
        self._failed.set()

    # ---- Rebalancer (called from the Kafka thread) ---------------------------------------------

    def assigned(self, tps: list[TopicPartition]) -> dict[TopicPartition, int] | None:
        return self._blocking(self._assigned(tps), "assign")

    def revoked(self, tps: list[TopicPartition]) -> None:
        self._blocking(self._revoked(tps), "revoke")

    def lost(self, tps: list[TopicPartition]) -> None:
        self._blocking(self._lost(tps), "lost")

    def deliver(self, records: list[SourceRecord], release: Callable[[], None]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._take_delivery, records, release)

    def kafka_error(self, err: KafkaError, tp: TopicPartition | None) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._on_kafka_error, err, tp)

    def failed(self, exc: BaseException) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._fail, exc)

    def _blocking(self, coro: Any, what: str) -> Any:
        """Run ``coro`` on the loop and wait; a failure ends the lifetime and gives None."""
        assert self._loop is not None
        try:
            return call_on_loop(self._loop, coro, timeout_s=self._cfg.budget_s + 5)
        except BaseException as exc:  # a callback must never raise into librdkafka
            self._loop.call_soon_threadsafe(self._fail, exc)
            log.debug("%s callback failed: %r", what, exc)
            return None

    # ---- loop side of the callbacks ------------------------------------------------------------

    async def _assigned(self, tps: list[TopicPartition]) -> dict[TopicPartition, int] | None:
        if self._stopping:
            return None
        if not tps:
            self._event("assigned", partitions=[])
            return {}
        self._event("assign", partitions=[str(tp) for tp in tps])
        lc = self._lc
        facts = await asyncio.to_thread(self._source.facts, tps)
        checks = build_checks(facts, allow_retention_gap=self._cfg.allow_retention_gap)
        try:
            await lc.assign(checks)
            positions = {tp: int(await lc.seek(tp)) for tp in tps}
        except BaseException as exc:
            self._fail(exc)
            return None
        if lc is not self._lc or self._stopping:
            return None  # the lifetime ended meanwhile: hold the partitions paused
        for tp in tps:
            self._start_partition(tp, positions[tp])
        self._event("assigned", partitions=[str(tp) for tp in tps])
        return positions

    def _start_partition(self, tp: TopicPartition, position: int) -> None:
        cfg = self._cfg
        buffer = PartitionBuffer(next_offset=position, max_records=cfg.batch_max_records,
                                 max_bytes=cfg.batch_max_bytes,
                                 queue_max_records=cfg.queue_max_records,
                                 queue_max_bytes=cfg.queue_max_bytes)
        part = Partition(tp, buffer, progress_s=self._clock())
        part.task = asyncio.create_task(self._run_partition(part), name=f"partition {tp}")
        self._parts[tp] = part

    async def _revoked(self, tps: list[TopicPartition]) -> None:
        self._event("revoke", partitions=[str(tp) for tp in tps])
        tasks = self._close_partitions(tps)
        if tasks and not self.abandoned:  # abandoned work is not waited for twice
            await asyncio.wait(tasks, timeout=self._cfg.budget_s)
        if self._live():
            await self._lc.revoke(tps)
        self._event("revoked", partitions=[str(tp) for tp in tps])

    async def _lost(self, tps: list[TopicPartition]) -> None:
        self._event("lost", partitions=[str(tp) for tp in tps])
        self._close_partitions(tps)
        if self._live():
            self._lc.lost(tps)

    def _close_partitions(self, tps: list[TopicPartition]) -> list[asyncio.Task[None]]:
        tasks = []
        for tp in tps:
            part = self._parts.pop(tp, None)
            if part is None:
                continue
            part.closing = True
            part.buffer.clear()
            part.wake.set()
            if part.task is not None and not part.task.done():
                tasks.append(part.task)
        return tasks

    def _take_delivery(self, records: list[SourceRecord], release: Callable[[], None]) -> None:
        try:
            start = 0
            while start < len(records):
                tp = records[start].tp
                end = start + 1
                while end < len(records) and records[end].partition == tp.partition \
                        and records[end].topic == tp.topic:
                    end += 1
                part = self._parts.get(tp)
                if part is not None and not part.closing and not self._stopping:
                    if part.buffer.add(records[start:end]) < end - start:
                        part.progress_s = self._clock()
                    self._apply_flow(part)
                    part.wake.set()
                start = end
        finally:
            release()

    def _apply_flow(self, part: Partition) -> None:
        assert self._kafka is not None
        if part.closing or self._parts.get(part.tp) is not part:
            return  # an older assignment of the partition: its flow state is gone
        flow = part.buffer.flow()
        if flow is Flow.PAUSE:
            self._kafka.pause(part.tp)
        elif flow is Flow.RESUME:
            self._kafka.resume(part.tp)

    def _on_kafka_error(self, err: KafkaError, tp: TopicPartition | None) -> None:
        if err.code() == KafkaError._AUTO_OFFSET_RESET:
            self._fail(RetentionGap(
                f"{tp}: the consumer position fell out of range while consuming (records were "
                f"deleted before processing: {err.str()}); decide, then restart with or without "
                "--allow-retention-gap"))
        elif err.fatal():
            self._fail(FenceError(f"fatal Kafka error: {err.str()}"))
        else:
            log.warning("kafka: %s", err.str())

    # ---- processing ---------------------------------------------------------------------------

    async def _run_partition(self, part: Partition) -> None:
        while not part.closing and not self._stopping:
            if len(part.buffer) == 0:
                part.wake.clear()
                await part.wake.wait()
                continue
            async with self._slots:
                if part.closing or self._stopping:
                    return
                batch = part.buffer.take_batch()
                self._apply_flow(part)
                part.inflight = inflight = in_flight_of(batch)
                try:
                    links = links_for_records(batch) if self._trace_links else ()
                    token = await self._lc.process(part.tp, batch, self._handler, links=links)
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:
                    if part.closing and isinstance(exc, Fenced):
                        # Lost meanwhile and a newer owner committed: this process was a
                        # zombie. Nothing of the batch applied; the lifetime ends (exit 3).
                        log.warning("batch %s not applied: fenced after the partition was lost "
                                    "(%s)", inflight.describe(), exc)
                    self._fail(exc)
                    return
                finally:
                    part.inflight = None
            part.progress_s = self._clock()
            assert self._kafka is not None
            self._kafka.commit(part.tp, token.frontier)

    def _live(self) -> bool:
        return self._lc.state is LifetimeState.LIVE

    def _event(self, name: str, **attrs: Any) -> None:
        log.info("%s %s", name, attrs)
        self._on_event(name, attrs)


class LifetimeCallbacks:
    """The ``Rebalancer`` one lifetime's Kafka thread reports to: calls from a consumer of an
    earlier lifetime (e.g. a late revoke from a close that timed out) are logged and ignored;
    they never touch the current lifetime's tokens or partitions."""

    def __init__(self, worker: Worker, lifetime_id: str) -> None:
        self._worker = worker
        self.lifetime_id = lifetime_id

    def _current(self, what: str) -> bool:
        current = self._worker._lifetime
        if current == self.lifetime_id:
            return True
        log.warning("ignored %s callback of earlier lifetime %s (current: %s)", what,
                    self.lifetime_id, current)
        return False

    def assigned(self, tps: list[TopicPartition]) -> dict[TopicPartition, int] | None:
        return self._worker.assigned(tps) if self._current("assign") else None

    def revoked(self, tps: list[TopicPartition]) -> None:
        if self._current("revoke"):
            self._worker.revoked(tps)

    def lost(self, tps: list[TopicPartition]) -> None:
        if self._current("lost"):
            self._worker.lost(tps)

    def deliver(self, records: list[SourceRecord], release: Callable[[], None]) -> None:
        if self._current("deliver"):
            self._worker.deliver(records, release)
        else:
            release()

    def kafka_error(self, err: KafkaError, tp: TopicPartition | None) -> None:
        if self._current("error"):
            self._worker.kafka_error(err, tp)

    def failed(self, exc: BaseException) -> None:
        if self._current("failure"):
            self._worker.failed(exc)


def _bare(exc: BaseException | None) -> bool:
    """A ``Retired`` refusal that names no cause (a call after the retirement began)."""
    return isinstance(exc, Retired) and exc.__cause__ is None


def _advice(exc: BaseException) -> str:
    if isinstance(exc, SourceRefused):
        return f"{exc} -- the source no longer matches the durable state; an operator must decide"
    return str(exc) or type(exc).__name__
