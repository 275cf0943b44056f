"""OpenTelemetry metric instruments of the worker, behind a small call API.

Rules
- One ``Instruments`` per worker process; built on a ``Meter`` (default: the global meter,
  a no-op until ``ops.worker.telemetry.setup_telemetry`` installs a provider).
- Labels are bounded: ``topic``, ``partition``, ``operation``, ``resolution``, ``reason``,
  ``kind``, ``outcome``; never record keys, offsets or lifetime ids.
- ``fence.kafka.commits.failed`` is exported from the start with 0 for every reason
  (``consumer.mirror.CommitFailure``), so an alert on its rate needs no first failure.
- Lag is a gauge read at collection time from the last value set per partition; a partition
  whose lag is cleared (revoked, lost, retired) disappears from the next scrape.
- Every method is cheap and never raises on telemetry failure paths it does not own.
- Every counter is exported from the start at 0, so a dashboard or alert sees "none yet"
  rather than "no data": label values known in advance (unknown outcomes by operation and
  resolution, retries by operation, retirement reasons) at construction, per-partition
  series with ``export_zeros(tps)`` (``fencectl run`` passes every partition of its topic
  at start). Histograms and the lag gauge appear with their first observation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from consumer.mirror import CommitFailure
from fencing.errors import Fenced, OutcomeUnknown, RecreatedTopic, RetentionGap, Retired
from fencing.failures import CAUSES
from fencing.handler import Declaration
from fencing.resolution import Resolution
from fencing.store import HandlerFn
from fencing.types import ACCEPT, Reject, SourceRecord, TopicPartition, Verdict

__all__ = [
    "BATCH_BUCKETS_S",
    "FAILURE_KINDS",
    "REBALANCE_BUCKETS_S",
    "RETIREMENT_REASONS",
    "RETRY_OPERATIONS",
    "UNKNOWN_OUTCOME_LABELS",
    "Instruments",
]

METER_NAME = "fenceworker"
BATCH_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
REBALANCE_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)
# label values known before anything happens (fencing.guarded on_resolve; lifecycle hooks)
UNKNOWN_OUTCOME_LABELS = (*(("process", r.value) for r in Resolution), ("claim", "reclaim"))
RETRY_OPERATIONS = ("validate", "claim", "observe", "process")
# the failures that retire a lifetime (the worker's ``failed`` event names the class)
RETIREMENT_REASONS = tuple(c.__name__ for c in (Fenced, Retired, OutcomeUnknown, RecreatedTopic,
                                                RetentionGap))


def _tp_attrs(tp: TopicPartition) -> dict[str, str | int]:
    return {"topic": tp.topic, "partition": tp.partition}


FAILURE_KINDS = ("attempt", "retry", "bisection", "quarantine", "split", "too-slow")


class Instruments:
    """Counters, histograms and the lag gauge; the lifecycle and the worker call these methods."""

    def __init__(self, meter: Meter | None = None) -> None:
        m = meter if meter is not None else metrics.get_meter(METER_NAME)
        self._records = m.create_counter(
            "fence.records.processed", unit="{record}",
            description="Records whose batch committed (accepted and rejected)")
        self._rejects = m.create_counter(
            "fence.records.rejected", unit="{record}",
            description="Records the handler rejected into quarantine (committed batches)")
        self._batches = m.create_counter(
            "fence.batches", unit="{batch}",
            description="Batches submitted, by final outcome (committed, fenced, not-committed, "
                        "unresolved)")
        self._unknown = m.create_counter(
            "fence.unknown_outcomes", unit="{call}",
            description="Unknown commit outcomes, by operation and resolution")
        self._fences = m.create_counter(
            "fence.fences", unit="{event}",
            description="Times this process found a partition fenced by a newer owner")
        self._retirements = m.create_counter(
            "fence.retirements", unit="{lifetime}",
            description="Lifetimes retired, by reason")
        self._retries = m.create_counter(
            "fence.retries", unit="{call}",
            description="Store calls retried under the three-call policy, by operation")
        self._failures = m.create_counter(
            "fence.handler.failures", unit="{event}",
            description="Handler failure handling, by kind: attempt (a durable count written "
                        "before a suspect record is tried alone), retry (a transient retry), "
                        "bisection (a probe transaction), split (a batch too slow for the "
                        "handler's time limit, split), too-slow (records whose handler alone "
                        "outlived it), quarantine (records quarantined, by cause: raised, "
                        "killed-the-process, outcome-unknown, too-slow)")
        for kind in FAILURE_KINDS:
            self._failures.add(0, {"kind": kind})
        for cause in CAUSES:
            self._failures.add(0, {"kind": "quarantine", "cause": cause})
        self._batch_duration = m.create_histogram(
            "fence.batch.duration", unit="s",
            description="Wall time of one guarded batch commit, including retries",
            explicit_bucket_boundaries_advisory=BATCH_BUCKETS_S)
        self._rebalance = m.create_histogram(
            "fence.rebalance.duration", unit="s",
            description="Wall time of a rebalance callback (assign, revoke, lost)",
            explicit_bucket_boundaries_advisory=REBALANCE_BUCKETS_S)
        self._kafka_commits_failed = m.create_counter(
            "fence.kafka.commits.failed", unit="{partition}",
            description="Kafka commits of the durable frontier that failed or were dropped, "
                        "per partition, by reason (rejected, unavailable, error, lost, "
                        "not-assigned)")
        for failure in CommitFailure:
            self._kafka_commits_failed.add(0, {"reason": failure.value})
        self._lock = threading.Lock()
        self._lag: dict[TopicPartition, int] = {}
        self._last_rejects: dict[TopicPartition, int] = {}
        m.create_observable_gauge(
            "fence.partition.lag", callbacks=[self._observe_lag], unit="{record}",
            description="Kafka high watermark minus the durable frontier, per owned partition; "
                        "completeness=not-claimed for a best-effort handler (records below "
                        "the frontier were attempted, their effects may have been dropped)")
        self._declared: dict[str, str] | None = None
        m.create_observable_gauge(
            "fence.handler.declaration", callbacks=[self._observe_declaration],
            unit="{handler}",
            description="1, labelled with the handler's durability, effects, on_failure and "
                        "whether its frontier claims completeness (not for best-effort)")
        self._stalled: frozenset[TopicPartition] = frozenset()
        m.create_observable_gauge(
            "fence.partitions.stalled", callbacks=[self._observe_stalled], unit="{partition}",
            description="Owned partitions with lag and no fetch or commit progress for "
                        "--stall-timeout-s")
        for operation, resolution in UNKNOWN_OUTCOME_LABELS:
            self._unknown.add(0, {"operation": operation, "resolution": resolution})
        for operation in RETRY_OPERATIONS:
            self._retries.add(0, {"operation": operation})
        for reason in RETIREMENT_REASONS:
            self._retirements.add(0, {"reason": reason})

    def export_zeros(self, tps: Iterable[TopicPartition]) -> None:
        """Export the per-partition counters of ``tps`` at 0 (records, rejects, fences,
        committed batches); a series that already moved keeps its value."""
        for tp in tps:
            attrs = _tp_attrs(tp)
            for counter in (self._records, self._rejects, self._fences):
                counter.add(0, attrs)
            self._batches.add(0, {**attrs, "outcome": "committed"})

    # batches -----------------------------------------------------------------------------

    def counting_handler(self, handler: HandlerFn) -> HandlerFn:
        """Wrap ``handler`` so the rejects of its last call per partition are remembered.

        The last handler call of a committed ``process`` is the committed transaction's, so
        ``batch_committed(..., rejects=None)`` takes its count from there.
        """

        async def counted(conn: Any, records: Sequence[SourceRecord]) -> Sequence[Verdict]:
            verdicts = await handler(conn, records)
            if records:
                # all-accepted batches (the common case) skip the per-verdict isinstance scan
                rejects = 0 if verdicts.count(ACCEPT) == len(verdicts) else sum(
                    isinstance(v, Reject) for v in verdicts)
                with self._lock:
                    self._last_rejects[records[0].tp] = rejects
            return verdicts

        return counted

    def batch_committed(
        self, tp: TopicPartition, *, records: int, rejects: int | None = None,
        duration_s: float,
    ) -> None:
        """One batch of ``records`` (of which ``rejects`` quarantined) committed.

        ``rejects=None``: the count remembered by ``counting_handler`` (0 if none).
        """
        with self._lock:
            remembered = self._last_rejects.pop(tp, 0)
        if rejects is None:
            rejects = remembered
        attrs = _tp_attrs(tp)
        self._records.add(records, attrs)
        if rejects:
            self._rejects.add(rejects, attrs)
        self._batches.add(1, {**attrs, "outcome": "committed"})
        self._batch_duration.record(duration_s, {**attrs, "outcome": "committed"})

    def batch_failed(self, tp: TopicPartition, *, outcome: str, duration_s: float) -> None:
        """A batch ended without committing: ``fenced``, ``not-committed`` or ``unresolved``."""
        with self._lock:
            self._last_rejects.pop(tp, None)
        attrs = {**_tp_attrs(tp), "outcome": outcome}
        self._batches.add(1, attrs)
        self._batch_duration.record(duration_s, attrs)

    # fence events ------------------------------------------------------------------------

    def unknown_outcome(self, operation: str, resolution: str) -> None:
        """An unknown outcome of ``operation`` (process, claim) resolved as ``resolution``.

        Signature matches ``fencing.guarded`` ``on_resolve``.
        """
        self._unknown.add(1, {"operation": operation, "resolution": resolution})

    def fenced(self, tp: TopicPartition) -> None:
        """This process lost ``tp`` to a newer epoch (observed fence)."""
        self._fences.add(1, _tp_attrs(tp))

    def retired(self, *, reason: str) -> None:
        """A lifetime retired (``fenced``, ``unresolved``, ``source-refused``, ``stopped`` ...)."""
        self._retirements.add(1, {"reason": reason})

    def handler_failure(self, tp: TopicPartition, *, kind: str, count: int = 1,
                        cause: str | None = None) -> None:
        """``count`` handler-failure events of ``kind`` (``FAILURE_KINDS``) on ``tp``; a
        ``quarantine`` names its ``cause`` (``fencing.failures.CAUSES``)."""
        attrs: dict[str, str | int] = {"kind": kind, **_tp_attrs(tp)}
        if cause is not None:
            attrs["cause"] = cause
        self._failures.add(count, attrs)

    def retry(self, *, operation: str) -> None:
        """One store call of ``operation`` is retried after a not-committed or read error."""
        self._retries.add(1, {"operation": operation})

    def on_retry(self, operation: str) -> Callable[[BaseException, float], None]:
        """An ``on_retry`` callback for ``fencing.guarded`` counting retries of ``operation``."""

        def callback(_exc: BaseException, _wait_s: float) -> None:
            self.retry(operation=operation)

        return callback

    def kafka_commit_failed(self, reason: CommitFailure, partitions: int = 1) -> None:
        """Kafka commits of ``partitions`` partitions failed or were dropped (the mirror)."""
        self._kafka_commits_failed.add(partitions, {"reason": reason.value})

    # rebalance and lag -------------------------------------------------------------------

    def rebalance(self, *, kind: str, duration_s: float) -> None:
        """A rebalance callback (``assign``, ``revoke``, ``lost``) took ``duration_s``."""
        self._rebalance.record(duration_s, {"kind": kind})

    def set_lag(self, tp: TopicPartition, *, high_watermark: int, frontier: int) -> None:
        """Record lag = max(0, high watermark - durable frontier) for an owned partition."""
        with self._lock:
            self._lag[tp] = max(0, high_watermark - frontier)

    def clear_lag(self, tps: Iterable[TopicPartition] | None = None) -> None:
        """Forget lag for ``tps`` (all partitions when None): they are no longer owned."""
        with self._lock:
            if tps is None:
                self._lag.clear()
            else:
                for tp in tps:
                    self._lag.pop(tp, None)

    def lag(self) -> dict[TopicPartition, int]:
        """A snapshot of the current lag values."""
        with self._lock:
            return dict(self._lag)

    def set_stalled(self, tps: frozenset[TopicPartition]) -> None:
        """The partitions currently stalled (``consumer.observability.stall``)."""
        with self._lock:
            self._stalled = tps

    def _observe_stalled(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            return [Observation(len(self._stalled))]

    def declare(self, declaration: Declaration) -> None:
        """The handler's declaration: exported as ``fence.handler.declaration``, and a
        best-effort handler's lag is labelled ``completeness=not-claimed``."""
        with self._lock:
            self._declared = {**declaration.as_dict(), "completeness": "claimed"
                              if declaration.claims_completeness else "not-claimed"}

    def _observe_declaration(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            declared = self._declared
        return [] if declared is None else [Observation(1, declared)]

    def _observe_lag(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            declared = self._declared
        extra = {} if declared is None else {"completeness": declared["completeness"]}
        return [Observation(v, {**_tp_attrs(tp), **extra}) for tp, v in sorted(self.lag().items())]
