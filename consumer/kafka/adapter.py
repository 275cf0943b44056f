"""The confluent-kafka adapter: one thread owns the ``Consumer``; callbacks block on the loop.

Long because one Consumer handle's threading model, command queue, rebalance callbacks,
pause reconciliation and error translation follow librdkafka rules that couple them.

Threading model (deliberate; see docs/librdkafka.md)
- librdkafka serves rebalance events inside ``poll()``/``consume()``/``close()`` on the
  calling thread, and the Python wrapper re-assigns by itself after a callback that did not
  call ``assign``/``incremental_assign``/``incremental_unassign`` -- also when the callback
  raised (confluent-kafka-python ``Consumer_rebalance_cb``: "if the user did not do this
  from callback, or there was no callback, or the callback failed, then we perform that
  assign() call here instead"). So our callbacks never raise and always assign explicitly.
- confluent-kafka 2.16 serialises calls on one Consumer handle (its AIOConsumer docs: "the
  Consumer is not thread-safe, so concurrent access ... is serialized"): a ``pause`` or
  ``commit`` from the event-loop thread would wait for a running ``consume()``. Hence every
  Consumer call happens on this thread: the loop sends commands (pause, resume, commit)
  through a queue drained between two short ``consume()`` calls (``poll_timeout_s``), each
  of which returns as soon as records are there (``consume_ready``).
- Rebalance callbacks run here and hand the lifecycle work to the asyncio loop with
  ``asyncio.run_coroutine_threadsafe(...).result(timeout)``: the callback returns only when
  the lifecycle finished (bounded by the budget), exactly as the protocol requires.
- ``pause()`` in librdkafka stops the fetcher and purges already-fetched messages of the
  partition; on ``resume()`` fetching restarts at the last message delivered to the
  application + 1 (librdkafka #1849/#2052), so pausing a full partition loses nothing.
- Eager assignors (range, roundrobin) hand the full assignment to ``on_assign`` and revoke
  everything first: ``assign(list with offsets)`` / ``unassign()``. Cooperative-sticky and
  KIP-848 (``group.protocol=consumer``) are incremental: ``incremental_assign`` with offsets
  / ``incremental_unassign``. The wrapper in 2.16 has no ``rebalance_protocol()``, so the
  mode is decided from the configuration.
- Without ``on_lost`` lost partitions would go to ``on_revoke``; we register ``on_lost`` so a
  lost assignment (session timeout, max.poll.interval exceeded) does local invalidation only.
- Delivery to the loop is bounded: at most ``max_outstanding`` consume() results wait for
  the loop; then this thread only serves commands until the loop catches up. Messages are
  translated to ``SourceRecord`` on the loop, not here (``translated``): this thread then
  holds the GIL only briefly, so the loop is not kept waiting for it (a convoy).
- Pause state is reconciled on every assignment: librdkafka keeps an application
  ``pause()`` across unassign/assign of the same partition on the same handle (librdkafka
  #1849, confluent-kafka-go #193; pinned by tests/integration/test_worker_liveness.py), so
  every positioned partition is resumed right after it is assigned, and a pause or resume
  queued for an earlier assignment of a partition (its *generation*) is dropped.
- A failure never ends this thread silently: a consumer that cannot be built is reported as
  ``ConfigError`` (the librdkafka message names the property), a failed
  ``assign``/``incremental_assign`` inside the assignment callback as
  ``KafkaClientFailed`` (the wrapper then does not assign by itself: it counts the failed
  call as the callback's assignment, so nothing is positioned from Kafka's committed
  offset), and anything else unexpected as itself; each through ``Rebalancer.failed``.
- librdkafka errors are translated here and never leave this module: a position out of
  range is ``RetentionGap``, a fatal error ``KafkaClientFailed``; transient ones are logged
  (librdkafka retries them: a broker that goes down makes it refresh the metadata of the
  topics it fetches, ``rd_kafka_broker_fail`` "broker down", and a lost coordinator is
  looked up again; pinned by tests/integration/test_kafka_faults.py). A fatal error reaches
  ``consume()`` as a message error with code ``_FATAL`` -- whose ``fatal()`` is False --
  and the text of the underlying error; both are checked.
- ``reposition`` (an operator's reset was picked up: the partition was claimed again at a
  new frontier) seeks an assigned partition on this thread, resumes it, and converges the
  mirror there. librdkafka's seek bumps the partition's version barrier in the calling
  thread before it returns (``rd_kafka_toppar_op_seek``), and ``consume()`` drops messages
  of an older version (``rd_kafka_q_serve_rkmessages``: ``rd_kafka_op_version_outdated``),
  so no message fetched before the seek is delivered after it. The caller's ``then`` runs
  on this thread right after the seek, before the next ``consume()``: what it schedules on
  the loop lands after every delivery of the old position and before any of the new one.
- Static membership (``group.instance.id``; ``consumer.config.WorkerConfig.instance_id``):
  a fatal FENCED_INSTANCE_ID (classic: a newer process joined with the same id) is
  ``InstanceFenced``. With KIP-848 a member joining while the group still holds the id for
  an earlier process (killed, its session not yet expired) gets UNRELEASED_INSTANCE_ID,
  which librdkafka makes fatal (rdkafka_cgrp.c, ConsumerGroupHeartbeat response); a consumer
  that was never assigned in this lifetime then closes and joins again with a fresh handle
  after a backoff, within ``outage_bound_s`` (``consumer.outage``), until the broker expires
  the old session (``group.consumer.session.timeout.ms``). One that had been assigned was
  replaced by another process with its id: ``InstanceFenced``.
- Kafka commits mirror the durable frontier (``consumer.kafka.committer``): converged once per
  assignment after positioning, asynchronous per batch with results through ``on_commit``,
  synchronous on revoke and on graceful shutdown, dropped (counted) on a lost assignment.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from consumer.config import KAFKA_CONFIG_ENV, client_properties
from consumer.kafka.committer import Committer, OnFailure
from consumer.mirror import CommitFailure, MirrorState, classify_commit_error
from consumer.outage import DEFAULT_BOUND_S, OutageBound
from fencing.crashpoints import crash_point
from fencing.errors import ConfigError, InstanceFenced, KafkaClientFailed, RetentionGap
from fencing.types import SourceRecord, TopicPartition

__all__ = ["KafkaThread", "Rebalancer", "call_on_loop", "check_consumer_settings",
           "checked_client_properties", "consume_ready", "to_record", "translated"]

log = logging.getLogger("fenceworker.adapter")

# the texts librdkafka gives the two static-membership errors (rd_kafka_err2str)
_FENCED_INSTANCE = KafkaError(KafkaError.FENCED_INSTANCE_ID).str()
_UNRELEASED_INSTANCE = KafkaError(KafkaError.UNRELEASED_INSTANCE_ID).str()


class Rebalancer(Protocol):
    """The loop side the Kafka thread reports to (implemented by
    ``consumer.lifetime_run.LifetimeRun``, one per lifetime)."""

    def assigned(self, tps: list[TopicPartition]) -> dict[TopicPartition, int] | None:
        """Blocking: positions for ``tps``, or None to hold them paused (refused/stopping)."""

    def revoked(self, tps: list[TopicPartition]) -> None:
        """Blocking: returns once in-flight work of ``tps`` finished and tokens are cleared."""

    def lost(self, tps: list[TopicPartition]) -> None:
        """Blocking but I/O-free: local invalidation of ``tps``."""

    def deliver(self, take: Callable[[], list[SourceRecord]],
                release: Callable[[], None]) -> None:
        """Non-blocking: hand one consume() call's records to the loop, which translates
        them by calling ``take`` (see ``translated``); ``release`` once they are taken."""

    def failed(self, exc: BaseException) -> None:
        """Non-blocking: this thread cannot go on; the lifetime must end (see Rules)."""

    def kafka_outcome(self, answered: bool, what: str) -> None:
        """Non-blocking: the cluster answered a request (a commit), or did not (``what``)."""


# ``to_record`` runs once per consumed record, on the loop (``translated``). ``SourceRecord`` is a
# frozen slots dataclass whose generated ``__init__`` sets every field through
# ``object.__setattr__``; filling the slots through their member descriptors is what that
# ends up doing, at half the cost (``python -m ops.bench.hotpath``: 1,340 -> 640 ns/record).
# The field order is checked here, so a new field cannot be silently left unset.
_FIELDS = ("topic", "partition", "offset", "key", "value", "headers", "timestamp_ms")
assert tuple(f.name for f in dataclasses.fields(SourceRecord)) == _FIELDS, "update to_record"
(_set_topic, _set_partition, _set_offset, _set_key, _set_value, _set_headers,
 _set_timestamp) = (getattr(SourceRecord, name).__set__ for name in _FIELDS)
_new = object.__new__


def to_record(msg: Any) -> SourceRecord:
    """Translate a confluent-kafka ``Message`` (without error) into a ``SourceRecord``."""
    ts_type, ts = msg.timestamp()
    headers = msg.headers()
    rec: SourceRecord = _new(SourceRecord)
    _set_topic(rec, msg.topic())
    _set_partition(rec, msg.partition())
    _set_offset(rec, msg.offset())
    _set_key(rec, msg.key())
    _set_value(rec, msg.value())
    _set_headers(rec, tuple(headers) if headers else ())
    _set_timestamp(rec, ts if ts_type else None)
    return rec


def consume_ready(consumer: Any, max_records: int, poll_timeout_s: float, *,
                  closing: Callable[[], bool] = lambda: False) -> list[Any]:
    """The records librdkafka holds now (at most ``max_records``); when it holds none (and
    not ``closing``), the first one to arrive within ``poll_timeout_s`` and what came with
    it. Never ``consume(n, timeout)`` alone: librdkafka returns from it only once it has
    ``n`` records or the timeout passed (``rd_kafka_q_serve_rkmessages``), so a record that
    arrived first waited up to the whole timeout for others (pinned by
    tests/integration/test_worker_kafka_facts.py). How long a batch may wait for more
    records is the partition runner's linger (``consumer.batching``)."""
    msgs = consumer.consume(max_records, 0)
    if msgs or closing():
        return list(msgs)
    first = consumer.consume(1, poll_timeout_s)
    if not first or max_records == 1:
        return list(first)
    return [*first, *consumer.consume(max_records - 1, 0)]


def translated(msgs: Sequence[Any]) -> list[SourceRecord]:
    """``to_record`` of each message, called by the loop thread that takes a delivery.

    Why there and not on this module's Kafka thread: both threads share the GIL, and CPython
    (3.11, ``Python/ceval_gil.h``) hands it over to a waiting thread when the holder blocks
    in a system call, and takes it back only when that thread blocks or after the switch
    interval (5 ms). Translating 1,000 records here took ~0.7 ms of Python with the GIL held,
    and the loop -- which releases the GIL for every socket send, receive and epoll wait of
    its batches -- waited for it after each of those calls. The total CPU is the same; the
    loop no longer waits for the Kafka thread (measured side by side: docs/benchmarks.md's worker
    benchmark section)."""
    return [to_record(m) for m in msgs]


class KafkaThread:
    """Owns one ``Consumer`` for one lifetime: subscribe, consume, commands, close."""

    def __init__(self, *, settings: dict[str, str], topic: str | Sequence[str], cooperative: bool,
                 rebalancer: Rebalancer, poll_timeout_s: float = 0.05,
                 consume_max_records: int = 1000, max_outstanding: int = 2,
                 clock: Callable[[], float] = time.monotonic,
                 on_commit_failure: OnFailure | None = None,
                 outage_bound_s: float = DEFAULT_BOUND_S) -> None:
        self._settings = settings
        # a topic, or the subscription list (names, and regexes with librdkafka's leading ^)
        self._subscription = [topic] if isinstance(topic, str) else list(topic)
        self._cooperative = cooperative
        self._rb = rebalancer
        self._poll_timeout_s = poll_timeout_s
        self._consume_max = consume_max_records
        self._commands: queue.SimpleQueue[Callable[[Consumer], None]] = queue.SimpleQueue()
        self._committer = Committer(clock=clock, on_failure=on_commit_failure)
        self._outstanding = threading.Semaphore(max_outstanding)
        self._stop_fetching = threading.Event()
        self._close = threading.Event()
        self._closed: Future[None] = Future()
        self._assigned: set[TopicPartition] = set()
        self._positioned: set[TopicPartition] = set()  # assigned at a durable frontier
        # assignment generation per partition: commands of an older one are dropped
        self._generation: dict[TopicPartition, int] = {}
        self.member_id: str | None = None  # the group member id, read at each assignment
        self._clock = clock
        self._outage_bound_s = outage_bound_s
        self._ever_assigned = False
        self._rejoin: OutageBound | None = None  # the episode of an unreleased instance id
        self._rejoins = 0
        self._rejoin_wait_s = 0.0
        self._rejoin_due = False
        self._thread = threading.Thread(target=self._main, name="kafka-consumer", daemon=True)

    # ---- called from the loop (thread-safe, non-blocking) ----------------------------------

    def start(self) -> None:
        self._thread.start()

    def pause(self, tp: TopicPartition) -> None:
        """Pause ``tp`` in its current assignment (dropped once it was re-assigned)."""
        gen = self._generation.get(tp, 0)
        self._commands.put(lambda c: self._pause_if_current(c, tp, gen))

    def resume(self, tp: TopicPartition) -> None:
        """Resume ``tp`` in its current assignment unless shutting down."""
        gen = self._generation.get(tp, 0)
        self._commands.put(lambda c: self._resume_if_current(c, tp, gen))

    def commit(self, tp: TopicPartition, frontier: int) -> None:
        """Mirror the durable ``frontier`` of ``tp`` into Kafka (advisory: lag tools only)."""
        self._committer.queue(tp, frontier)

    def reposition(self, tp: TopicPartition, offset: int,
                   then: Callable[[bool | BaseException], None]) -> None:
        """Seek ``tp`` to ``offset`` and resume it (see Rules); then, on this thread, call
        ``then`` with True (done), False (not assigned any more, or shutting down) or the
        error. ``then`` runs before this thread hands over any message fetched after the
        seek, so a ``call_soon_threadsafe`` from it reaches the loop before them."""

        def run(consumer: Consumer) -> None:
            result: bool | BaseException = False
            try:
                if tp in self._assigned and not self._stop_fetching.is_set():
                    self._generation[tp] = self._generation.get(tp, 0) + 1  # older pauses
                    consumer.seek(KafkaTP(tp.topic, tp.partition, offset))
                    consumer.resume([KafkaTP(tp.topic, tp.partition)])
                    self._positioned.add(tp)
                    self._committer.positioned(consumer, {tp: offset})
                    result = True
            except (KafkaException, RuntimeError) as exc:
                result = exc
            then(result)

        self._commands.put(run)

    def freeze_mirror(self) -> None:
        """The lifetime failed: commit nothing more to Kafka (``consumer.kafka.committer``)."""
        self._committer.freeze()

    def mirror(self) -> dict[TopicPartition, MirrorState]:
        """The offset mirror of every positioned partition (``consumer.mirror``)."""
        return self._committer.snapshot()

    def stop_fetching(self) -> None:
        """Pause every assigned partition and keep them paused (shutdown)."""
        self._stop_fetching.set()
        self._commands.put(self._pause_all)

    def close(self) -> Future[None]:
        """Leave the group: ``Consumer.close()`` on this thread, outside any callback."""
        self._stop_fetching.set()
        self._close.set()
        return self._closed

    # ---- the thread ------------------------------------------------------------------------

    def _join(self) -> Consumer:
        consumer = _build_consumer({**self._settings, "on_commit": self._on_commit})
        consumer.subscribe(self._subscription, on_assign=self._on_assign,
                           on_revoke=self._on_revoke, on_lost=self._on_lost)
        return consumer

    def _main(self) -> None:
        consumer: Consumer | None = None
        try:
            consumer = self._join()
            while not self._close.is_set():
                if self._rejoin_due:
                    consumer = self._join_again(consumer)
                    continue
                self._drain(consumer)
                if not self._outstanding.acquire(timeout=self._poll_timeout_s):
                    continue
                try:
                    msgs = self._consume(consumer)
                except KafkaException as exc:
                    self._outstanding.release()
                    self._consumer_error(exc.args[0] if exc.args else exc, None)
                    continue
                self._hand_over(msgs)
            self._run_commands(consumer)
            # graceful shutdown: Kafka gets every durable frontier before we leave
            self._committer.commit_sync(consumer, set(self._assigned))
        except BaseException as exc:  # report, never die silently
            if not isinstance(exc, ConfigError):
                log.exception("kafka thread failed")
            self._rb.failed(exc)  # reported once; close() then just completes
        finally:
            if consumer is not None:
                try:
                    consumer.close()  # serves the final on_revoke, leaves the group
                except (KafkaException, RuntimeError) as exc:
                    log.warning("consumer close: %s", exc)
            if not self._closed.done():
                self._closed.set_result(None)

    def _join_again(self, consumer: Consumer) -> Consumer:
        """The static instance id is still held (see Rules): close this handle, wait out the
        episode's next backoff (a close request ends the wait) and join with a fresh one."""
        self._rejoin_due = False
        try:
            consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.debug("closing the consumer before joining again: %s", exc)
        self._close.wait(self._rejoin_wait_s)
        return self._join()

    def _consume(self, consumer: Consumer) -> list[Any]:
        return consume_ready(consumer, self._consume_max, self._poll_timeout_s,
                             closing=self._close.is_set)

    def _hand_over(self, msgs: Sequence[Any]) -> None:
        good: list[Any] = []
        for msg in msgs:
            err = msg.error()
            if err is None:
                good.append(msg)
            elif err.code() != KafkaError._PARTITION_EOF:
                tp = (TopicPartition(msg.topic(), msg.partition())
                      if msg.topic() is not None and msg.partition() is not None
                      and msg.partition() >= 0 else None)
                self._consumer_error(err, tp)
        if good:
            self._rb.deliver(functools.partial(translated, good), self._outstanding.release)
        else:
            self._outstanding.release()

    def _consumer_error(self, err: object, tp: TopicPartition | None) -> None:
        """Translate a consumer error: a position out of range (``auto.offset.reset`` is
        ``error``) is a ``RetentionGap``, a fatal error ``KafkaClientFailed`` (static
        membership's: see Rules); anything else librdkafka retries by itself and is only
        logged."""
        if not isinstance(err, KafkaError):
            self._rb.failed(KafkaClientFailed(f"consumer error: {err}"))
        elif err.fatal() or err.code() == KafkaError._FATAL:
            self._fatal(err)
        elif err.code() == KafkaError._AUTO_OFFSET_RESET and tp not in self._positioned:
            # a partition this lifetime never positioned (its assignment was refused, e.g. a
            # recreated topic): librdkafka reports it has no offset; there is nothing to lose
            log.debug("kafka: %s: %s (partition not positioned; ignored)", tp, err.str())
        elif err.code() == KafkaError._AUTO_OFFSET_RESET:
            self._rb.failed(RetentionGap(
                f"{tp}: the consumer position fell out of range while consuming (records "
                f"were deleted before processing: {err.str()}); decide, then restart with or "
                "without --allow-retention-gap"))
        else:
            log.warning("kafka: %s", err.str())

    def _fatal(self, err: KafkaError) -> None:
        text = err.str()
        instance = self._settings.get("group.instance.id")
        if _UNRELEASED_INSTANCE in text and not self._ever_assigned:
            now = self._clock()
            if self._rejoin is None:
                self._rejoin, self._rejoins = OutageBound(bound_s=self._outage_bound_s,
                                                          started_s=now), 0
            self._rejoins += 1
            wait_s = self._rejoin.next_wait_s(attempt=self._rejoins, now_s=now)
            if wait_s is not None:
                log.warning("--instance-id %s is still held by an earlier member of the group "
                            "(until the broker expires its session, "
                            "group.consumer.session.timeout.ms); joining again in %.1f s",
                            instance, wait_s)
                self._rejoin_wait_s, self._rejoin_due = wait_s, True
                return
            self._stop_fetching.set()
            self._rb.failed(KafkaClientFailed(
                f"--instance-id {instance}: still held by another member of the group after "
                f"{self._rejoin.elapsed_s(now):.0f} s (--outage-bound-s "
                f"{self._outage_bound_s:g}); is a process with the same id running? "
                f"({text})"))
        elif _FENCED_INSTANCE in text or _UNRELEASED_INSTANCE in text:
            self._stop_fetching.set()
            self._rb.failed(InstanceFenced(
                f"--instance-id {instance}: another process joined the group with this id and "
                f"Kafka fenced this one ({text}); give every running member its own id"))
        else:
            self._stop_fetching.set()
            self._rb.failed(KafkaClientFailed(f"fatal Kafka error: {text}"))

    def _drain(self, consumer: Consumer) -> None:
        self._run_commands(consumer)
        self._committer.flush(consumer, self._assigned)

    def _run_commands(self, consumer: Consumer) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                break
            try:
                cmd(consumer)
            except KafkaException as exc:
                log.debug("consumer command failed: %s", exc)

    def _on_commit(self, err: Any, partitions: list[KafkaTP]) -> None:
        """librdkafka's answer to an (advisory) offset commit, served inside consume(): the
        mirror's bookkeeping (``consumer.kafka.committer``), then the crash point."""
        self._committer.results(err, partitions)
        self._report_outcome(err, partitions)
        if err is not None:
            return
        for p in partitions:
            if p.error is None and p.offset >= 0:
                crash_point("after-kafka-commit", partition=f"{p.topic}[{p.partition}]",
                            frontier=p.offset)

    def _report_outcome(self, err: Any, partitions: Sequence[KafkaTP]) -> None:
        """A commit's answer to the outage watch: confirmed, or the cluster unavailable (a
        refusal such as a stale generation is an answer)."""
        errors = [e for e in (err, *(p.error for p in partitions)) if e is not None]
        down = [e for e in errors if isinstance(e, KafkaError)
                and classify_commit_error(e.name()) is CommitFailure.UNAVAILABLE]
        if down:
            self._rb.kafka_outcome(False, f"offset commit: {down[0].str()}")
        elif partitions or err is None:
            self._rb.kafka_outcome(True, "offset commit")

    def _pause_all(self, consumer: Consumer) -> None:
        if self._assigned:
            consumer.pause([KafkaTP(tp.topic, tp.partition) for tp in self._assigned])

    def _current(self, tp: TopicPartition, gen: int) -> bool:
        return tp in self._assigned and self._generation.get(tp, 0) == gen

    def _pause_if_current(self, consumer: Consumer, tp: TopicPartition, gen: int) -> None:
        if self._current(tp, gen):
            consumer.pause([KafkaTP(tp.topic, tp.partition)])

    def _resume_if_current(self, consumer: Consumer, tp: TopicPartition, gen: int) -> None:
        if not self._stop_fetching.is_set() and self._current(tp, gen):
            consumer.resume([KafkaTP(tp.topic, tp.partition)])

    # ---- rebalance callbacks (on this thread, inside consume()/close()) ---------------------

    def _on_assign(self, consumer: Consumer, partitions: list[KafkaTP]) -> None:
        self.member_id = consumer.memberid()
        self._ever_assigned = True
        self._rejoin = None
        tps = [TopicPartition(p.topic, p.partition) for p in partitions]
        for tp in tps:  # before the loop builds the new buffers: older commands are stale
            self._generation[tp] = self._generation.get(tp, 0) + 1
        positions = None if self._stop_fetching.is_set() else self._rb.assigned(tps)
        if positions is None:
            ktps = [KafkaTP(tp.topic, tp.partition) for tp in tps]
        else:
            ktps = [KafkaTP(tp.topic, tp.partition, positions[tp]) for tp in tps]
        try:
            self._assign(consumer, ktps)
        except (KafkaException, RuntimeError) as exc:
            # The wrapper counted the failed call as our assignment: librdkafka positions
            # nothing by itself. The claimed partitions are not fetched: fail-stop.
            self._stop_fetching.set()
            self._rb.failed(KafkaClientFailed(
                f"{'incremental_assign' if self._cooperative else 'assign'} of "
                f"{', '.join(str(tp) for tp in tps)} failed inside the assignment callback: "
                f"{_kafka_message(exc)}"))
            return
        if not self._cooperative:
            self._assigned.clear()
            self._positioned.clear()
        self._assigned.update(tps)
        if positions is not None:
            self._positioned.update(tps)
        if not ktps:
            return
        if positions is None:
            consumer.pause(ktps)
        else:  # reconcile: an application pause survives unassign/assign (see Rules)
            consumer.resume(ktps)
            crash_point("after-seek", positions={str(tp): positions[tp] for tp in tps})
            self._committer.positioned(consumer, positions)

    def _assign(self, consumer: Consumer, ktps: list[KafkaTP]) -> None:
        """``incremental_assign`` or ``assign`` (a seam for the fail-stop test)."""
        if self._cooperative:
            consumer.incremental_assign(ktps)
        else:
            consumer.assign(ktps)

    def _on_revoke(self, consumer: Consumer, partitions: list[KafkaTP]) -> None:
        tps = [TopicPartition(p.topic, p.partition) for p in partitions]
        self._rb.revoked(tps)  # in-flight batches ended: their frontiers are queued
        self._committer.commit_sync(consumer, tps)
        self._committer.forget(tps)
        self._unassign(consumer, partitions, tps)

    def _on_lost(self, consumer: Consumer, partitions: list[KafkaTP]) -> None:
        tps = [TopicPartition(p.topic, p.partition) for p in partitions]
        self._committer.lost(tps)
        self._rb.lost(tps)
        self._unassign(consumer, partitions, tps)

    def _unassign(self, consumer: Consumer, partitions: list[KafkaTP],
                  tps: list[TopicPartition]) -> None:
        if self._cooperative:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()
        self._assigned.difference_update(tps)
        self._positioned.difference_update(tps)


def check_consumer_settings(settings: dict[str, str]) -> None:
    """Build and close a consumer with ``settings`` (no group join, no fetch); raise
    ``ConfigError`` with librdkafka's reason when it refuses them."""
    # its connection attempts would log otherwise
    _build_consumer({"log_level": "0", **settings}).close()


def checked_client_properties(env: Mapping[str, str]) -> dict[str, str]:
    """``client_properties(env)`` (``FENCE_KAFKA_CONFIG``), checked by librdkafka the way
    ``check_consumer_settings`` checks a worker's: ``ConfigError`` naming the file and
    librdkafka's reason when it refuses one of them (an operator command's clients)."""
    props = client_properties(env)
    if props:
        try:
            Consumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "fencectl-check",
                      "log_level": "0", **props}).close()
        except (KafkaException, ValueError, TypeError) as exc:
            raise ConfigError(f"{KAFKA_CONFIG_ENV} {env[KAFKA_CONFIG_ENV]}: librdkafka "
                              f"refused it: {_kafka_message(exc)}") from exc
    return props


def _build_consumer(settings: dict[str, Any]) -> Consumer:
    """A ``Consumer``; ``ConfigError`` with librdkafka's reason when it refuses ``settings``."""
    try:
        return Consumer(settings)
    except (KafkaException, ValueError, TypeError) as exc:
        raise ConfigError(f"librdkafka refused the consumer configuration: "
                          f"{_kafka_message(exc)} (fix the -X option, FENCE_KAFKA_CONFIG's "
                          "file or the flag that sets it)") from exc


def _kafka_message(exc: BaseException) -> str:
    """The librdkafka error text of ``exc`` (``KafkaError.str()``), else ``str(exc)``."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return err.str() if isinstance(err, KafkaError) else str(exc)


def call_on_loop(loop: asyncio.AbstractEventLoop, coro: Any, *, timeout_s: float) -> Any:
    """Run ``coro`` on ``loop`` from another thread and wait for it; cancel it on timeout."""
    fut = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return fut.result(timeout=timeout_s)
    except FutureTimeout:
        fut.cancel()
        raise
