"""The worker process: runs one lifetime after another until stopped or failed.

Rules
- One asyncio loop runs the lifecycle and the batches; each lifetime has its own Kafka
  thread and consumer (``consumer.lifetime_run.LifetimeRun`` holds the rules of one run).
- ``run()`` returns the process exit code (``consumer.exits``). After a retirement (3) or
  unavailability (5) it starts a fresh lifetime -- with a fresh lifecycle, consumer and
  member id -- while ``restart_lifetimes`` allows, unless a stop was requested, a run
  abandoned work past the shutdown bound (its exit 6 is final: no fresh lifetime starts
  beside abandoned work) or Kafka fenced the static ``--instance-id`` (``InstanceFenced``:
  another process holds it; a fresh lifetime would fence that one in turn).
- A retired lifetime is never used again; only the current run's callbacks are served.
- Events (``consumer.events``) go to ``on_event`` and are logged as they happen.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence

from consumer import events as ev
from consumer.alone_gate import AloneGate
from consumer.batching import InFlight
from consumer.config import WorkerConfig
from consumer.exits import ExitCode
from consumer.failure_run import FailureRun
from consumer.kafka.adapter import Rebalancer
from consumer.lifetime_run import LifetimeRun, RunContext
from consumer.mirror import MirrorState
from consumer.observability.instruments import Instruments
from consumer.ports import FactsPort, KafkaPort, LifecyclePort
from fencing.errors import ConfigError, InstanceFenced
from fencing.handler import Effects, declaration_of
from fencing.slow import handler_limit_s
from fencing.store import HandlerFn
from fencing.tracing import NO_TRACING, Tracing
from fencing.types import SourceFacts, SourceRecord, Token, TopicPartition

__all__ = ["KafkaPort", "Worker"]

log = logging.getLogger("fenceworker.worker")

TraceLinks = Callable[[Sequence[SourceRecord]], Sequence[object]]


class Worker:
    """Runs lifetimes until stopped or failed; ``run()`` returns the process exit code."""

    def __init__(self, *, config: WorkerConfig, handler: HandlerFn,
                 lifecycle_factory: Callable[[str], LifecyclePort],
                 kafka_factory: Callable[[Rebalancer], KafkaPort], source: FactsPort,
                 on_event: Callable[[ev.WorkerEvent], None] | None = None,
                 trace_links: TraceLinks | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wait: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 rng: random.Random | None = None,
                 instruments: Instruments | None = None,
                 tracing: Tracing = NO_TRACING) -> None:
        if config.lanes > 1 and declaration_of(handler).effects is Effects.OUTCOME_UNCERTAIN:
            raise ConfigError(f"--lanes {config.lanes}: an outcome-uncertain handler runs no "
                              "lanes (its intent is one per partition); use --lanes 1")
        self.config = config
        self.clock = clock
        self.wait = wait  # retry backoffs (``consumer.failure_run``)
        self._rng = rng if rng is not None else random.Random()
        self._instruments = instruments
        self._tracing = tracing
        self.handler = handler
        # producer-span links of a batch (opaque; None: none). They cost a header parse per
        # record, so ``fencectl run`` passes them only when spans are exported.
        self.trace_links = trace_links
        self._source = source
        self._lifecycle_factory = lifecycle_factory
        self._kafka_factory = kafka_factory
        self._on_event = on_event or (lambda _event: None)
        self._stop_requested = asyncio.Event()
        self.current: LifetimeRun | None = None
        self._lifecycle: LifecyclePort | None = None  # the current lifetime's
        self.abandoned = False  # a run's in-flight work outlived the shutdown bound
        self.lifetimes: list[str] = []
        self._gate = AloneGate()  # process-wide: a record tried alone is alone in the process
        self._context = RunContext(
            config=config, source=source, clock=clock, wait=wait, emit=self.emit,
            trace_links=trace_links, failure_run=self.failure_run,
            is_current=lambda run: self.current is run)

    def failure_run(self, lifecycle: LifecyclePort) -> FailureRun:
        """The handler-failure handling of one lifetime (``consumer.failure_run``), with the
        process's one ``AloneGate`` (its lifetimes share it)."""
        cfg = self.config
        return FailureRun(lifecycle=lifecycle, handler=self.handler,
                          declaration=declaration_of(self.handler), policy=cfg.retry,
                          rng=self._rng, clock=self.clock, wait=self.wait,
                          # what a dead process can have had in flight: a batch per lane
                          suspect_window=cfg.batch_max_records * cfg.lanes,
                          instruments=self._instruments, tracing=self._tracing,
                          gate=self._gate, limit_s=handler_limit_s(
                              budget_s=cfg.budget_s,
                              idle_in_transaction_s=cfg.db_idle_in_transaction_timeout_s))

    @property
    def source(self) -> FactsPort:
        return self._source

    def request_stop(self) -> None:
        """SIGTERM/SIGINT: finish in-flight batches within the bound, then exit 0."""
        if not self._stop_requested.is_set():
            self.emit(ev.StopRequested())
        self._stop_requested.set()

    @property
    def member_id(self) -> str | None:
        """The current lifetime's Kafka group member id (None before its first assignment)."""
        return None if self.current is None else getattr(self.current.kafka, "member_id", None)

    @property
    def in_flight(self) -> list[InFlight]:
        return [] if self.current is None else self.current.in_flight

    def offset_mirror(self) -> dict[TopicPartition, MirrorState]:
        """Per positioned partition of the current lifetime: Kafka's offset mirror."""
        return {} if self.current is None else self.current.kafka.mirror()

    def watched_facts(self, tps: list[TopicPartition]) -> dict[TopicPartition, SourceFacts]:
        """Kafka's facts of ``tps`` for a lag sample, watched by the current lifetime
        (``LifetimeRun.watched_facts``)."""
        run = self.current
        return self._source.facts(tps) if run is None else run.watched_facts(tps)

    def progress(self) -> dict[TopicPartition, float]:
        """Per owned partition of the current lifetime: its last fetch or commit progress."""
        return {} if self.current is None else self.current.progress()

    def lanes(self) -> dict[TopicPartition, tuple[int, int]]:
        """Per owned partition of the current lifetime running lanes: (busy lanes, window
        used)."""
        return {} if self.current is None else self.current.lanes()

    def tokens(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, Token | None]:
        """The current lifetime's retained token per partition (None when not held); no I/O."""
        lc = self._lifecycle
        return {tp: None if lc is None else lc.token(tp) for tp in tps}

    def operator_owned(self, tps: Collection[TopicPartition]) -> None:
        """A heartbeat read the partitions an operator owns now: the current lifetime
        claims again those it runs (``LifetimeRun.operator_owned``)."""
        if self.current is not None:
            self.current.operator_owned(tps)

    def emit(self, event: ev.WorkerEvent) -> None:
        """Log ``event`` and hand it to the observer."""
        log.info("%s", event)
        self._on_event(event)

    async def run(self) -> ExitCode:
        """Run lifetimes until a stop request or a failure not covered by restarts."""
        restarts = self.config.restart_lifetimes
        while True:
            code = await self._run_lifetime()
            fenced_id = self.current is not None and isinstance(self.current.failure,
                                                                InstanceFenced)
            if code in (ExitCode.RETIRED, ExitCode.UNAVAILABLE) and restarts > 0 \
                    and not self._stop_requested.is_set() and not self.abandoned \
                    and not fenced_id:
                restarts -= 1
                log.warning("starting a fresh lifetime (%d restarts left)", restarts)
                continue
            return code

    async def _run_lifetime(self) -> ExitCode:
        lifetime_id = f"lt-{uuid.uuid4().hex[:12]}"
        self.lifetimes.append(lifetime_id)
        self._lifecycle = lifecycle = self._lifecycle_factory(lifetime_id)
        self.current = run = LifetimeRun(self._context, lifetime_id, lifecycle, self._kafka_factory)
        self.emit(ev.LifetimeStarted(lifetime_id))
        code = await run.run(self._stop_requested)
        self.abandoned = self.abandoned or run.abandoned
        self.emit(ev.LifetimeEnded(lifetime_id, int(code)))
        return code
