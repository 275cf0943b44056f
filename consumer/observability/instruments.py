"""OpenTelemetry metric instruments of the worker, behind a small call API.

Rules
- One ``Instruments`` per worker process; built on a ``Meter`` (default: the global meter,
  a no-op until ``ops.worker.telemetry.setup_telemetry`` installs a provider).
- Labels are bounded: ``topic``, ``partition``, ``operation``, ``resolution``, ``reason``,
  ``kind``, ``outcome``, ``phase``, ``group`` (the process's one consumer group, on the lag
  and ownership gauges), ``table`` (a table sink's table: one per topic at most); never
  record keys, offsets, field names or lifetime ids.
- ``fence.kafka.commits.failed`` is exported from the start with 0 for every reason
  (``consumer.mirror.CommitFailure``), so an alert on its rate needs no first failure.
- The state gauges (lag, ownership, readiness, stalls, the offset mirror, the handler's
  declaration) are ``consumer.observability.gauges.Gauges``, which ``Instruments`` extends.
- Every method is cheap and never raises on telemetry failure paths it does not own.
- Every counter is exported from the start at 0, so a dashboard or alert sees "none yet"
  rather than "no data": label values known in advance (unknown outcomes by operation and
  resolution, retries by operation, retirement reasons) at construction, per-partition
  series (handler failures of every kind included) with ``export_zeros(tps)``
  (``fencectl run`` passes every partition of its topic at start). Histograms and the lag
  gauge appear with their first observation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from consumer.mirror import CommitFailure
from consumer.observability.gauges import Gauges
from consumer.observability.gauges import tp_attrs as _tp_attrs
from fencing.errors import Fenced, OutcomeUnknown, RecreatedTopic, RetentionGap, Retired
from fencing.failures import CAUSES
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


FAILURE_KINDS = ("attempt", "retry", "bisection", "quarantine", "split", "too-slow")


class Instruments(Gauges):
    """Counters, histograms and (``Gauges``) the state gauges; the lifecycle and the worker
    call these methods."""

    def __init__(self, meter: Meter | None = None, *, group_id: str = "") -> None:
        """``group_id``: the consumer group of this process (the ``group`` label)."""
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
        super().__init__(m, group_id=group_id)
        self._meter = m
        self._last_rejects: dict[TopicPartition, int] = {}
        for operation, resolution in UNKNOWN_OUTCOME_LABELS:
            self._unknown.add(0, {"operation": operation, "resolution": resolution})
        for operation in RETRY_OPERATIONS:
            self._retries.add(0, {"operation": operation})
        for reason in RETIREMENT_REASONS:
            self._retirements.add(0, {"reason": reason})

    def export_zeros(self, tps: Iterable[TopicPartition]) -> None:
        """Export the per-partition counters of ``tps`` at 0 (records, rejects, fences,
        committed batches, handler failures by kind) and their ownership gauge at 0; a
        series that already moved keeps its value."""
        for tp in tps:
            attrs = _tp_attrs(tp)
            for counter in (self._records, self._rejects, self._fences):
                counter.add(0, attrs)
            self._batches.add(0, {**attrs, "outcome": "committed"})
            for kind in FAILURE_KINDS:
                self._failures.add(0, {"kind": kind, **attrs})
            with self._lock:
                self._known.add(tp)

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

    def watch_unknown_fields(self, read: Callable[[], Mapping[str, int]]) -> None:
        """Export ``fence.sink.unknown_fields`` per ``table`` from ``read`` (the table
        sink's count, ``fencing.postgres.sink.unknown``; a table appears at 0 when the sink
        first writes it)."""
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(n, {"table": t}) for t, n in read().items()]
        self._meter.create_observable_counter(
            "fence.sink.unknown_fields", callbacks=[observe], unit="{record}",
            description="Records the table sink wrote while ignoring fields that have no "
                        "column (without --sink-evolve add-columns), by table")

    def watch_stale_changes(self, read: Callable[[], Mapping[str, int]]) -> None:
        """Export ``fence.sink.stale_changes`` per ``table`` from ``read`` (the table sink's
        version guard, ``--sink-version-column``; a guarded table appears at 0)."""
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(n, {"table": t}) for t, n in read().items()]
        self._meter.create_observable_counter(
            "fence.sink.stale_changes", callbacks=[observe], unit="{change}",
            description="Upserts and deletes the table sink's version guard left alone "
                        "(the stored row's version is newer), by table")

    # rebalances ----------------------------------------------------------------------------

    def rebalance(self, *, kind: str, duration_s: float) -> None:
        """A rebalance callback (``assign``, ``revoke``, ``lost``) took ``duration_s``."""
        self._rebalance.record(duration_s, {"kind": kind})
