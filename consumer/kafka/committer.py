"""Kafka commits of the durable frontier (the offset mirror's I/O shell on the Kafka thread).

Rules
- Kafka's committed offset is advisory: it never positions a consumer (PostgreSQL does).
  This module only keeps it equal to the durable frontier so lag tools read true lag.
- ``queue`` runs on the worker's loop (after each PostgreSQL commit); everything else runs
  on the Kafka thread, inside ``consume()``/``close()`` or a rebalance callback.
- Convergence: once an assignment is positioned, Kafka's committed offsets of its
  partitions are read (``Consumer.committed``, bounded by ``read_timeout_s``) and the
  durable frontier is committed where they differ (or could not be read): one commit per
  assignment, so a stale offset left by a crashed or fenced member is repaired even when
  the partition has nothing left to process.
- Batches are mirrored asynchronously (the latest frontier per partition, coalesced between
  two ``consume()`` calls); each result comes back through ``on_commit`` (librdkafka serves
  it inside ``consume()``). A failed commit is counted by reason and retried after
  ``retry_s`` while the partition is still assigned and Kafka still lacks the frontier.
- One commit request awaits its answer at a time: while one does (and is younger than
  ``unanswered_s``), ``flush`` sends nothing and the frontiers queued meanwhile go together
  in the next request. Why: the coordinator answers a connection's requests in order, and
  the group's heartbeats share that connection. At a low rate every batch holds a record or
  two (1,000 records/s on 6 partitions: ~960 transactions/s); committing each batch queued
  OffsetCommit requests faster than the coordinator answered them, until a heartbeat waited
  behind them past the session timeout ("Timed out HeartbeatRequest in flight ... possibly
  held back by preceeding OffsetCommitRequest", librdkafka 2.16) and the member lost its
  assignment for 20-30 s (``ops.bench.latency``, the table sink at 1,000 records/s).
- Kafka behind with nothing on the way is committed again: an assigned partition whose
  mirror lacks the frontier while no commit of it is queued, due for a retry or awaiting
  its answer gets the frontier committed at the next ``flush``. Why: librdkafka applies a
  member's commits out of order across a coordinator move. After a SIGKILL of the
  coordinator's node (librdkafka 2.16, ``debug=cgrp``), the commits sent meanwhile wait in
  its wait-for-coordinator queue (``rd_kafka_cgrp_defer_offset_commit``, up to
  ``session.timeout.ms``) or fail with ``_TRANSPORT`` and are retried
  (``rd_kafka_handle_OffsetCommit``); once a new coordinator is up they are sent as a burst
  (105 of them at once in one member) and an older offset can land after a newer one:
  Kafka then holds an offset below the frontier although every commit succeeded. The
  results come back in the order the coordinator applied them, so the last answer tells
  what Kafka holds (``mirror.confirmed``) and a late success of an older offset leaves the
  mirror behind: committed again here. Offset commits are idempotent: a duplicate costs a
  request.
- A commit with no answer is sent again: when ``unanswered_s`` (default 10 s) passed since
  the last commit of an assigned partition that Kafka still lacks and neither a result nor
  a queued batch came meanwhile, the frontier is committed again (a result librdkafka
  dropped would otherwise leave the partition's Kafka offset behind for good).
- Revoke and graceful shutdown commit synchronously whatever Kafka lacks. librdkafka's
  synchronous commit (``rd_kafka_commit_queue`` without a queue) waits without a timeout
  of its own (``RD_POLL_INFINITE``). What bounds it (librdkafka ``rdkafka_cgrp.c``,
  ``rdkafka_request.c``): each OffsetCommit request times out after ``socket.timeout.ms``
  (default 60 s) and is retried at most twice for retriable errors; while no coordinator is
  known the commit waits for one at most ``session.timeout.ms`` (the client property;
  45 s by default, also under KIP-848 where it cannot be set), then fails with
  ``_WAIT_COORD``. What we bound: nothing is sent when Kafka already holds the frontier,
  one request covers every partition, a lost assignment commits nothing, and the worker
  stops waiting for the Kafka thread after its close bound (``budget_s`` + 10 s).
- A lost assignment drops what Kafka lacks (counted as ``lost``); a commit queued for a
  partition no longer assigned is dropped (counted as ``not-assigned``).
- ``freeze`` (the lifetime failed): nothing more is sent. A retired lifetime's frontier may
  be stale (it was fenced by a newer owner or an operator reset); the next owner converges
  Kafka when it is assigned the partition.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTP

from consumer import mirror
from consumer.mirror import CommitFailure, MirrorState
from fencing.types import TopicPartition

__all__ = ["Committer"]

log = logging.getLogger("fenceworker.committer")

OnFailure = Callable[[CommitFailure, int], None]


class Committer:
    """The mirror of one consumer's assignment; see the module Rules."""

    def __init__(self, *, clock: Callable[[], float], on_failure: OnFailure | None = None,
                 read_timeout_s: float = 5.0, retry_s: float = 1.0,
                 unanswered_s: float = 10.0) -> None:
        self._clock = clock
        self._on_failure = on_failure or (lambda _reason, _count: None)
        self._read_timeout_s = read_timeout_s
        self._retry_s = retry_s
        self._unanswered_s = unanswered_s
        self._lock = threading.Lock()
        self._pending: dict[TopicPartition, int] = {}
        self._states: dict[TopicPartition, MirrorState] = {}
        self._retry_at: dict[TopicPartition, float] = {}
        # the last commit sent and not answered yet: (when, offset)
        self._sent_at: dict[TopicPartition, tuple[float, int]] = {}
        self._frozen = False

    # ---- loop side --------------------------------------------------------------------------

    def queue(self, tp: TopicPartition, frontier: int) -> None:
        """A batch of ``tp`` committed in PostgreSQL up to ``frontier``: mirror it."""
        with self._lock:
            state = self._states.get(tp)
            if state is not None:
                if frontier < state.durable:
                    return  # a late report from an earlier assignment of the partition
                self._states[tp] = mirror.durable_moved(state, frontier, self._clock())
            self._pending[tp] = frontier

    def freeze(self) -> None:
        """The lifetime failed: send nothing more (see Rules)."""
        with self._lock:
            self._frozen = True
            self._pending.clear()
            self._retry_at.clear()
            self._sent_at.clear()

    def snapshot(self) -> dict[TopicPartition, MirrorState]:
        """The mirror of every positioned partition (for the lag warning)."""
        with self._lock:
            return dict(self._states)

    # ---- Kafka thread -----------------------------------------------------------------------

    def positioned(self, consumer: Any, positions: dict[TopicPartition, int]) -> None:
        """Inside the assignment callback, after positioning: converge (see Rules)."""
        if not positions:
            return
        kafka = self._read_committed(consumer, list(positions))
        now = self._clock()
        with self._lock:
            for tp, frontier in positions.items():
                self._pending.pop(tp, None)
                self._retry_at.pop(tp, None)
                self._states[tp] = mirror.assigned(durable=frontier, kafka=kafka.get(tp),
                                                   now_s=now)
            send = {tp: s.durable for tp, s in self._states.items()
                    if tp in positions and mirror.needs_commit(s)}
        if send:
            log.info("kafka committed offsets differ from the durable frontier: committing %s "
                     "(Kafka had %s)", _fmt(send), _fmt({tp: kafka.get(tp) for tp in send}))
            self._send_async(consumer, send)

    def flush(self, consumer: Any, assigned: set[TopicPartition]) -> None:
        """Send queued commits and due retries asynchronously (between two consume())."""
        now = self._clock()
        with self._lock:
            if any(tp in assigned and now - at < self._unanswered_s
                   for tp, (at, _offset) in self._sent_at.items()):
                return  # one request awaits its answer: the rest goes next (Rules)
            pending, self._pending = self._pending, {}
            dropped = [tp for tp in pending if tp not in assigned or tp not in self._states]
            send = {tp: off for tp, off in pending.items() if tp not in dropped}
            for tp, at in list(self._retry_at.items()):
                state = self._states.get(tp)
                if state is None or not mirror.needs_commit(state):
                    del self._retry_at[tp]
                elif at <= now and tp in assigned:
                    del self._retry_at[tp]
                    send.setdefault(tp, state.durable)
            for tp, (at, _offset) in list(self._sent_at.items()):
                state = self._states.get(tp)
                if state is None or not mirror.needs_commit(state) or tp not in assigned:
                    del self._sent_at[tp]
                elif now - at >= self._unanswered_s and tp not in self._retry_at:
                    send.setdefault(tp, state.durable)  # no answer: sent again (Rules)
            behind = {tp: state for tp, state in self._states.items()
                      if tp in assigned and tp not in send and tp not in self._retry_at
                      and tp not in self._sent_at and mirror.needs_commit(state)}
            send.update({tp: state.durable for tp, state in behind.items()})
        if behind and not self._frozen:  # behind with nothing on the way (Rules)
            log.info("kafka holds %s after its last answer, below the durable frontier: "
                     "committing %s again", _fmt({tp: s.kafka for tp, s in behind.items()}),
                     _fmt({tp: s.durable for tp, s in behind.items()}))
        if dropped:
            log.info("kafka commit dropped for %s: no longer assigned", _fmt(
                {tp: pending[tp] for tp in dropped}))
            self._on_failure(CommitFailure.NOT_ASSIGNED, len(dropped))
        if send:
            self._send_async(consumer, send)

    def commit_sync(self, consumer: Any, tps: Iterable[TopicPartition]) -> None:
        """Commit synchronously what Kafka lacks of ``tps`` (revoke, shutdown; see Rules)."""
        with self._lock:
            wanted = set(tps)
            for tp in wanted:
                self._pending.pop(tp, None)
                self._retry_at.pop(tp, None)
            send = {tp: s.durable for tp, s in self._states.items()
                    if tp in wanted and mirror.needs_commit(s)}
        if not send or self._frozen:
            return
        try:
            results = consumer.commit(offsets=_ktps(send), asynchronous=False)
        except KafkaException as exc:
            self._failed(send, _error_name(exc), str(exc))
            return
        self.results(None, results or [])

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """``tps`` were revoked: the next owner mirrors them."""
        with self._lock:
            for tp in tps:
                self._states.pop(tp, None)
                self._pending.pop(tp, None)
                self._retry_at.pop(tp, None)
                self._sent_at.pop(tp, None)

    def lost(self, tps: Iterable[TopicPartition]) -> None:
        """``tps`` were lost: drop what Kafka lacks (counted), commit nothing."""
        with self._lock:
            dropped = 0
            for tp in tps:
                state = self._states.pop(tp, None)
                queued = self._pending.pop(tp, None)
                self._retry_at.pop(tp, None)
                self._sent_at.pop(tp, None)
                if queued is not None or (state is not None and mirror.needs_commit(state)):
                    dropped += 1
        if dropped:
            log.info("kafka commits of %d lost partition(s) dropped", dropped)
            self._on_failure(CommitFailure.LOST, dropped)

    def results(self, err: KafkaError | None, partitions: Sequence[KafkaTP]) -> None:
        """``on_commit`` (served inside consume()) and the synchronous commit's results."""
        ok: dict[TopicPartition, int] = {}
        failed: dict[str, dict[TopicPartition, int]] = {}
        for p in partitions:
            tp, perr = TopicPartition(p.topic, p.partition), p.error or err
            if perr is None:
                ok[tp] = p.offset
            else:
                failed.setdefault(perr.name(), {})[tp] = p.offset
        with self._lock:  # answered: a failure is retried after its backoff instead
            for offs in (ok, *failed.values()):
                for tp, off in offs.items():
                    if tp in self._sent_at and off >= self._sent_at[tp][1]:
                        del self._sent_at[tp]
        if ok:
            now = self._clock()
            with self._lock:
                for tp, off in ok.items():
                    state = self._states.get(tp)
                    if state is not None:
                        self._states[tp] = mirror.confirmed(state, off, now)
        for name, offs in failed.items():
            self._failed(offs, name, name)

    # ---- internals --------------------------------------------------------------------------

    def _read_committed(self, consumer: Any,
                        tps: list[TopicPartition]) -> dict[TopicPartition, int | None]:
        try:
            got = consumer.committed(_ktps({tp: 0 for tp in tps}), timeout=self._read_timeout_s)
        except (KafkaException, RuntimeError) as exc:
            log.info("reading kafka committed offsets of %s failed (%s): committing the "
                     "frontier", ", ".join(map(str, tps)), exc)
            return {}
        return {TopicPartition(p.topic, p.partition): p.offset for p in got
                if p.error is None and p.offset >= 0}

    def _send_async(self, consumer: Any, send: dict[TopicPartition, int]) -> None:
        if self._frozen:
            return
        now = self._clock()
        with self._lock:
            for tp, offset in send.items():
                self._sent_at[tp] = (now, offset)
        try:
            consumer.commit(offsets=_ktps(send), asynchronous=True)
        except KafkaException as exc:  # refused before sending (e.g. a fatal error)
            self._failed(send, _error_name(exc), str(exc))

    def _failed(self, offsets: dict[TopicPartition, int], name: str, text: str) -> None:
        reason = mirror.classify_commit_error(name)
        retry_at = self._clock() + self._retry_s
        with self._lock:
            for tp in offsets:
                state = self._states.get(tp)
                if state is not None and mirror.needs_commit(state) and tp not in self._pending:
                    self._retry_at[tp] = retry_at
        log.info("kafka commit of %s failed: %s (%s); retried while still assigned",
                 _fmt(offsets), text, reason.value)
        self._on_failure(reason, len(offsets))


def _ktps(offsets: dict[TopicPartition, int]) -> list[KafkaTP]:
    return [KafkaTP(tp.topic, tp.partition, off) for tp, off in sorted(offsets.items())]


def _fmt(offsets: dict[TopicPartition, Any]) -> str:
    return ", ".join(f"{tp}@{off if off is not None else '-'}"
                     for tp, off in sorted(offsets.items()))


def _error_name(exc: KafkaException) -> str:
    err = exc.args[0] if exc.args else None
    return err.name() if isinstance(err, KafkaError) else "_FAIL"
