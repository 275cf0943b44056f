"""The Prometheus metrics a worker exports, as its ``/metrics`` names them, rendered as
``docs/metrics.md``.

Rules
- The metrics are read from a real ``consumer.observability.instruments.Instruments`` on the
  worker's own telemetry set-up (``ops.worker.telemetry.setup_telemetry``: the OpenTelemetry
  Prometheus reader and the process collector), after one observation of every kind
  (``_observe``): names, types, help and labels are what the exporter produces.
- Every instrument ``Instruments`` creates must show: one created but never observed by
  ``_observe`` raises ``ValueError`` naming it (the page cannot silently miss a metric).
- The label values are the sample's; the page lists label names only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

__all__ = ["Family", "families", "render"]


@dataclass(frozen=True, slots=True)
class Family:
    """One metric as exported: its name on ``/metrics``, type, help and label names."""

    name: str
    type: str
    help: str
    labels: tuple[str, ...]


class _Recording:
    """A meter that remembers the name of every instrument created through it."""

    def __init__(self, meter: Any) -> None:
        self._meter = meter
        self.created: list[str] = []

    def __getattr__(self, attr: str) -> Any:
        inner = getattr(self._meter, attr)
        if not attr.startswith("create_"):
            return inner

        def create(name: str, *args: Any, **kwargs: Any) -> Any:
            self.created.append(name)
            return inner(name, *args, **kwargs)
        return create


def _observe(instruments: Any) -> None:
    from consumer.mirror import CommitFailure
    from consumer.observability.readiness import Phase
    from fencing.handler import Declaration
    from fencing.types import TopicPartition

    tp = TopicPartition("orders", 0)
    instruments.export_zeros([tp])
    instruments.batch_committed(tp, records=2, rejects=1, duration_s=0.01)
    instruments.batch_failed(tp, outcome="fenced", duration_s=0.01)
    instruments.unknown_outcome("process", "committed")
    instruments.fenced(tp)
    instruments.retired(reason="Fenced")
    instruments.handler_failure(tp, kind="quarantine", cause="raised")
    instruments.retry(operation="claim")
    instruments.rebalance(kind="assign", duration_s=0.1)
    instruments.kafka_commit_failed(CommitFailure.REJECTED)
    instruments.watch_unknown_fields(lambda: {"orders": 0})
    instruments.watch_stale_changes(lambda: {"orders": 0})
    instruments.declare(Declaration())
    instruments.set_lag(tp, high_watermark=10, frontier=5)
    instruments.set_owned(frozenset({tp}))
    instruments.set_stalled(frozenset())
    instruments.set_readiness(ready=True, phase=Phase.READY)
    instruments.set_mirror_lagging(0)
    instruments.set_lanes({tp: (2, 40)})


def _exposed(name: str, kind: str) -> str:
    return f"{name}_total" if kind == "counter" else f"{name}_info" if kind == "info" else name


def families() -> list[Family]:
    """Every metric family of a worker's ``/metrics`` (see Rules), ``fence_*`` first."""
    from consumer.observability.instruments import Instruments
    from ops.worker.telemetry import setup_telemetry

    telemetry = setup_telemetry(env={}, set_global=False)
    try:
        meter = _Recording(telemetry.meter())
        _observe(Instruments(cast(Any, meter), group_id="billing"))
        out = []
        for metric in telemetry.registry.collect():
            labels = {k for s in metric.samples for k in s.labels if k != "le"}
            out.append(Family(_exposed(metric.name, metric.type), metric.type,
                              " ".join(metric.documentation.split()), tuple(sorted(labels))))
    finally:
        telemetry.shutdown(timeout_s=1.0)
    missing = [n for n in meter.created
               if not any(f.name.startswith(n.replace(".", "_")) for f in out)]
    if missing:
        raise ValueError(f"created but not observed by ops.docgen.metrics._observe: {missing}")
    return sorted(out, key=lambda f: (not f.name.startswith("fence_"), f.name))


def _table(rows: Sequence[Family]) -> list[str]:
    out = ["| metric | type | labels | help |", "|---|---|---|---|"]
    out += [f"| `{f.name}` | {f.type} | {', '.join(f'`{x}`' for x in f.labels) or '—'} | "
            f"{f.help.replace('|', '/')} |" for f in rows]
    return out


def render() -> list[str]:
    """The worker's metrics (``fence_*``), then the others its registry holds."""
    got = families()
    fence = [f for f in got if f.name.startswith("fence_")]
    other = [f for f in got if not f.name.startswith("fence_")]
    return [*_table(fence), "", "Also on `/metrics`, from the Prometheus client and the "
            "OpenTelemetry exporter:", "", *_table(other)]
