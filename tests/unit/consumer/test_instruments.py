"""consumer.observability.instruments:
each API call moves the right instrument by the right amount."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import generate_latest

from consumer.observability.instruments import Instruments
from consumer.observability.readiness import Phase
from fencing.handler import Declaration, Durability, Effects
from fencing.types import TopicPartition
from ops.worker.telemetry import setup_telemetry

TP = TopicPartition("orders", 2)


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    out: dict[str, list[Any]] = {}
    if data is None:
        return out
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out[metric.name] = list(metric.data.data_points)
    return out


def _make() -> tuple[Instruments, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    return Instruments(provider.get_meter("test")), reader


def _value(points: list[Any], **attrs: Any) -> Any:
    matches = [p for p in points if all(p.attributes.get(k) == v for k, v in attrs.items())]
    assert len(matches) == 1, (attrs, [p.attributes for p in points])
    return matches[0]


def test_committed_batches_count_records_rejects_and_latency() -> None:
    inst, reader = _make()
    inst.batch_committed(TP, records=10, rejects=2, duration_s=0.02)
    inst.batch_committed(TP, records=5, rejects=0, duration_s=0.03)
    inst.batch_failed(TP, outcome="fenced", duration_s=0.01)
    points = _points(reader)
    assert _value(points["fence.records.processed"], topic="orders", partition=2).value == 15
    assert _value(points["fence.records.rejected"], partition=2).value == 2
    assert _value(points["fence.batches"], outcome="committed").value == 2
    assert _value(points["fence.batches"], outcome="fenced").value == 1
    hist = _value(points["fence.batch.duration"], outcome="committed")
    assert hist.count == 2 and abs(hist.sum - 0.05) < 1e-9


def test_fence_events_and_retries() -> None:
    inst, reader = _make()
    inst.unknown_outcome("process", "committed")
    inst.unknown_outcome("process", "committed")
    inst.unknown_outcome("claim", "reclaim")
    inst.fenced(TP)
    inst.retired(reason="fenced")
    inst.on_retry("process")(RuntimeError("x"), 0.1)
    inst.retry(operation="observe")
    inst.rebalance(kind="assign", duration_s=0.4)
    points = _points(reader)
    assert _value(points["fence.unknown_outcomes"], operation="process",
                  resolution="committed").value == 2
    assert _value(points["fence.unknown_outcomes"], operation="claim").value == 1
    assert _value(points["fence.fences"], topic="orders").value == 1
    assert _value(points["fence.retirements"], reason="fenced").value == 1
    assert _value(points["fence.retries"], operation="process").value == 1
    assert _value(points["fence.rebalance.duration"], kind="assign").count == 1


def test_lag_gauge_follows_ownership() -> None:
    inst, reader = _make()
    other = TopicPartition("orders", 3)
    inst.set_lag(TP, high_watermark=100, frontier=90)
    inst.set_lag(other, high_watermark=5, frontier=7)  # a stale watermark never gives negative lag
    points = _points(reader)["fence.partition.lag"]
    assert _value(points, partition=2).value == 10
    assert _value(points, partition=3).value == 0
    inst.clear_lag([TP])
    assert [p.attributes["partition"] for p in _points(reader)["fence.partition.lag"]] == [3]
    inst.clear_lag()
    assert not _points(reader).get("fence.partition.lag")


def test_prometheus_exposition_names() -> None:
    tel = setup_telemetry(env={}, service_name="prom-unit", set_global=False)
    inst = Instruments(tel.meter())
    inst.batch_committed(TP, records=3, rejects=1, duration_s=0.01)
    inst.set_lag(TP, high_watermark=8, frontier=3)
    text = generate_latest(tel.registry).decode()
    assert 'fence_records_processed_total{' in text
    assert 'fence_records_rejected_total{' in text
    assert 'fence_batch_duration_seconds_bucket{' in text
    line = next(ln for ln in text.splitlines() if ln.startswith("fence_records_processed_total{"))
    assert 'topic="orders"' in line and 'partition="2"' in line and line.endswith(" 3.0")
    lag = next(ln for ln in text.splitlines() if ln.startswith("fence_partition_lag"))
    assert lag.endswith(" 5.0")
    counts = {"s.orders": 0}
    inst.watch_unknown_fields(lambda: counts)
    assert 'fence_sink_unknown_fields_total{table="s.orders"} 0.0' in \
        generate_latest(tel.registry).decode()
    counts["s.orders"] = 4
    assert 'fence_sink_unknown_fields_total{table="s.orders"} 4.0' in \
        generate_latest(tel.registry).decode()
    tel.shutdown(timeout_s=1)


def test_default_meter_is_a_silent_no_op() -> None:
    inst = Instruments()
    inst.batch_committed(TP, records=1, rejects=0, duration_s=0.0)
    inst.set_lag(TP, high_watermark=1, frontier=0)
    assert inst.lag() == {TP: 1}


async def test_counting_handler_feeds_rejects_of_the_committed_call() -> None:
    from fencing.types import ACCEPT, Reject, SourceRecord

    inst, reader = _make()
    recs = [SourceRecord("orders", 2, o, None, b"") for o in range(3)]

    async def handler(_conn: object, records: object) -> list[object]:
        return [ACCEPT, Reject("bad"), Reject("worse")]

    counted = inst.counting_handler(handler)  # type: ignore[arg-type]
    assert len(await counted(None, recs)) == 3
    inst.batch_committed(TP, records=3, duration_s=0.01)
    inst.batch_committed(TP, records=3, duration_s=0.01)  # nothing remembered: 0 rejects
    points = _points(reader)
    assert _value(points["fence.records.rejected"], partition=2).value == 2
    assert _value(points["fence.records.processed"], partition=2).value == 6


def test_ownership_gauge_names_every_known_partition_of_the_group() -> None:
    """1 for owned partitions, 0 for known ones (``export_zeros`` or owned once), with the
    process's group: ``max by (group, topic, partition)`` is 0 only where nobody owns."""
    reader = InMemoryMetricReader()
    inst = Instruments(MeterProvider(metric_readers=[reader]).get_meter("t"), group_id="billing")
    other, extra = TopicPartition("orders", 3), TopicPartition("refunds", 0)
    inst.export_zeros([TP, other])

    def owned() -> dict[tuple[str, str, int], int]:
        return {(p.attributes["group"], p.attributes["topic"], p.attributes["partition"]):
                p.value for p in _points(reader)["fence.partition.owned"]}

    assert owned() == {("billing", "orders", 2): 0, ("billing", "orders", 3): 0}
    inst.set_owned(frozenset({TP, extra}))
    assert owned() == {("billing", "orders", 2): 1, ("billing", "orders", 3): 0,
                       ("billing", "refunds", 0): 1}
    inst.set_owned(frozenset())  # revoked, lost or retired: known, owned by nobody here
    assert set(owned().values()) == {0} and len(owned()) == 3


def test_ready_and_mirror_gauges_start_at_zero_and_follow_their_setters() -> None:
    inst, reader = _make()
    assert _value(_points(reader)["fence.worker.ready"]).value == 0
    assert {p.attributes["phase"]: p.value for p in _points(reader)["fence.worker.phase"]} == {
        phase.value: int(phase is Phase.STARTING) for phase in Phase}
    assert _value(_points(reader)["fence.partitions.mirror_lagging"]).value == 0
    inst.set_readiness(ready=True, phase=Phase.READY)
    inst.set_mirror_lagging(2)
    assert _value(_points(reader)["fence.worker.ready"]).value == 1
    assert _value(_points(reader)["fence.partitions.mirror_lagging"]).value == 2
    assert _value(_points(reader)["fence.worker.phase"], phase="ready").value == 1
    assert _value(_points(reader)["fence.worker.phase"], phase="starting").value == 0


def test_export_zeros_exports_handler_failures_per_partition_and_kind() -> None:
    """A retry or quarantine rate needs the partition's series at 0 before its first event."""
    inst, reader = _make()
    inst.export_zeros([TP])
    points = _points(reader)["fence.handler.failures"]
    per_tp = {p.attributes["kind"]: p.value for p in points if p.attributes.get("partition") == 2}
    assert per_tp == {"attempt": 0, "retry": 0, "bisection": 0, "quarantine": 0, "split": 0,
                      "too-slow": 0}
    inst.handler_failure(TP, kind="retry")
    assert _value(_points(reader)["fence.handler.failures"], kind="retry", partition=2).value == 1


def test_lag_carries_the_group() -> None:
    reader = InMemoryMetricReader()
    inst = Instruments(MeterProvider(metric_readers=[reader]).get_meter("t"), group_id="g1")
    inst.set_lag(TP, high_watermark=9, frontier=4)
    assert _value(_points(reader)["fence.partition.lag"], group="g1", partition=2).value == 5


def test_the_exposition_has_the_process_start_time() -> None:
    """A restarted process shows as a changed ``process_start_time_seconds``."""
    tel = setup_telemetry(env={}, service_name="prom-unit", set_global=False)
    text = generate_latest(tel.registry).decode()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("process_start_time_seconds ")]
    assert float(line.split()[1]) > 1.6e9
    tel.shutdown(timeout_s=1)


def test_quarantines_are_counted_per_partition_by_cause() -> None:
    inst, reader = _make()
    inst.handler_failure(TP, kind="quarantine", count=2, cause="killed-the-process")
    inst.handler_failure(TP, kind="quarantine", cause="outcome-unknown")
    inst.handler_failure(TP, kind="split")
    points = _points(reader)["fence.handler.failures"]
    assert _value(points, kind="quarantine", cause="killed-the-process", partition=2).value == 2
    assert _value(points, kind="quarantine", cause="outcome-unknown", partition=2).value == 1
    assert _value(points, kind="split", partition=2).value == 1
    # every cause and kind is exported from the start, before anything happened
    _fresh, fresh_reader = _make()
    zero = _points(fresh_reader)["fence.handler.failures"]
    assert {p.attributes.get("cause") for p in zero if p.value == 0} >= {
        "raised", "killed-the-process", "outcome-unknown", "too-slow", "rejected"}
    assert {p.attributes["kind"] for p in zero} >= {"split", "too-slow", "attempt"}


def test_a_best_effort_handler_never_claims_completeness_in_the_metrics() -> None:
    for durability, completeness in (("best-effort", "not-claimed"),
                                     ("durable-critical", "claimed")):
        inst, reader = _make()
        inst.declare(Declaration(Durability(durability), Effects.TRANSACTIONAL))
        inst.set_lag(TP, high_watermark=10, frontier=10)
        [declared] = _points(reader)["fence.handler.declaration"]
        assert dict(declared.attributes) == {
            "durability": durability, "effects": "transactional", "on_failure": "quarantine",
            "completeness": completeness}
        [lag] = _points(reader)["fence.partition.lag"]
        assert lag.attributes["completeness"] == completeness and lag.value == 0
