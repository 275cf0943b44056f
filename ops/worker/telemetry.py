"""OpenTelemetry setup from the standard ``OTEL_*`` environment.

Rules
- ``OTEL_SERVICE_NAME`` names the service (default ``fenceworker``); ``OTEL_RESOURCE_ATTRIBUTES``
  is merged by the SDK.
- Traces are exported only when an exporter is configured: ``OTEL_TRACES_EXPORTER`` lists
  ``otlp`` / ``console`` / ``none``; when it is unset, ``otlp`` is chosen only if
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set. No exporter
  configured means spans are created and dropped: no export and no error.
  ``OTEL_SDK_DISABLED=true`` turns every span exporter off.
- OTLP protocol: ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL``,
  ``grpc`` (default; Jaeger's 4317) or ``http/protobuf`` (4318).
- Spans go through a ``BatchSpanProcessor``; ``Telemetry.shutdown`` flushes it.
- Metrics are read by a Prometheus reader into a registry of this ``Telemetry`` (served by
  ``ops.worker.http``); they are never pushed. The registry also holds prometheus_client's
  process collector (``process_start_time_seconds``, CPU, memory, file descriptors), so a
  restarted process is visible to ``changes(process_start_time_seconds[...])``.
- W3C trace context in record headers is read by ``consumer.observability.tracecontext``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from opentelemetry import metrics, trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)
from prometheus_client import CollectorRegistry, ProcessCollector

from fencing.errors import ConfigError

__all__ = [
    "DEFAULT_SERVICE_NAME",
    "Telemetry",
    "TelemetryConfig",
    "config_from_env",
    "run_bounded",
    "setup_telemetry",
]

DEFAULT_SERVICE_NAME = "fenceworker"
_PROTOCOLS = ("grpc", "http/protobuf")
_EXPORTERS = ("otlp", "console", "none")


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    """What ``setup_telemetry`` builds; derived from the environment by ``config_from_env``."""

    service_name: str = DEFAULT_SERVICE_NAME
    # span exporters to install, subset of ("otlp", "console"); empty: no export
    traces_exporters: tuple[str, ...] = ()
    # OTLP endpoint for traces (None: the exporter's own default)
    otlp_endpoint: str | None = None
    # "grpc" or "http/protobuf"
    otlp_protocol: str = "grpc"
    # OTEL_SDK_DISABLED: no span exporter, whatever else is set (metrics stay local)
    disabled: bool = False


def _get(env: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return value
    return None


def config_from_env(env: Mapping[str, str]) -> TelemetryConfig:
    """Pure: read the standard OTEL_* variables. Raises ``ConfigError`` on unknown values."""
    disabled = (_get(env, "OTEL_SDK_DISABLED") or "").lower() == "true"
    service = _get(env, "OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
    endpoint = _get(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    protocol = (
        _get(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
    )
    if protocol not in _PROTOCOLS:
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: use one of {_PROTOCOLS}")
    listed = _get(env, "OTEL_TRACES_EXPORTER")
    if listed is None:
        exporters: tuple[str, ...] = ("otlp",) if endpoint else ()
    else:
        names = tuple(n.strip().lower() for n in listed.split(",") if n.strip())
        unknown = [n for n in names if n not in _EXPORTERS]
        if unknown:
            raise ConfigError(f"OTEL_TRACES_EXPORTER: unknown exporter(s) {unknown}")
        exporters = tuple(dict.fromkeys(n for n in names if n != "none"))
    if disabled:
        exporters = ()
    return TelemetryConfig(
        service_name=service,
        traces_exporters=exporters,
        otlp_endpoint=endpoint,
        otlp_protocol=protocol,
        disabled=disabled,
    )


def _otlp_exporter(config: TelemetryConfig) -> SpanExporter:
    endpoint = config.otlp_endpoint
    if config.otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        insecure = None if endpoint is None else endpoint.startswith("http://")
        return GrpcExporter(endpoint=endpoint, insecure=insecure)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return HttpExporter(endpoint=endpoint)


def run_bounded(work: Callable[[], object], *, timeout_s: float) -> bool:
    """Run ``work`` in a daemon thread; True when it finished within ``timeout_s``.

    Past the bound the thread is abandoned, not killed (the SDK's flush and shutdown
    ignore their own timeouts).
    """
    done = threading.Event()

    def run() -> None:
        work()
        done.set()

    threading.Thread(target=run, name="otel-flush", daemon=True).start()
    return done.wait(timeout_s)


class _OnceExporter(SpanExporter):
    """Delegates to ``inner``; ``shutdown`` runs once so ``Telemetry.shutdown`` can interrupt
    an exporter stuck in retries before the span processor's own (unbounded) shutdown."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner
        self._down = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self._inner.export(spans)

    def shutdown(self) -> None:
        if not self._down:
            self._down = True
            self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class Telemetry:
    """The process's tracer and meter providers plus the Prometheus registry they feed."""

    def __init__(
        self,
        *,
        config: TelemetryConfig,
        tracer_provider: TracerProvider,
        meter_provider: MeterProvider,
        registry: CollectorRegistry,
        exporters: Sequence[SpanExporter] = (),
    ) -> None:
        self.config = config
        self._exporters = tuple(exporters)
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.registry = registry
        self._closed = False

    @property
    def exporting(self) -> bool:
        """True when spans leave the process."""
        return bool(self.config.traces_exporters)

    def tracer(self, name: str = DEFAULT_SERVICE_NAME) -> trace.Tracer:
        return self.tracer_provider.get_tracer(name)

    def meter(self, name: str = DEFAULT_SERVICE_NAME) -> metrics.Meter:
        return self.meter_provider.get_meter(name)

    def flush(self, *, timeout_s: float = 5.0) -> bool:
        """Export every finished span now; True when the export finished within ``timeout_s``.

        The SDK's own flush ignores its timeout, so it runs in a daemon thread that is
        abandoned (not killed) when the bound passes.
        """
        return run_bounded(self.tracer_provider.force_flush, timeout_s=timeout_s)

    def shutdown(self, *, timeout_s: float = 5.0) -> None:
        """Flush pending spans (bounded by ``timeout_s``), then stop the providers. Idempotent.

        Spans that could not be exported within the bound are dropped; shutdown never hangs
        on an unreachable collector.
        """
        if self._closed:
            return
        self._closed = True
        self.flush(timeout_s=timeout_s)
        for exporter in self._exporters:
            exporter.shutdown()
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown(timeout_millis=timeout_s * 1000)


def setup_telemetry(
    *,
    env: Mapping[str, str] | None = None,
    service_name: str | None = None,
    resource_attributes: Mapping[str, str | int] | None = None,
    span_exporters: Sequence[SpanExporter] = (),
    set_global: bool = True,
) -> Telemetry:
    """Build providers from ``env`` (default ``os.environ``) and optionally install them globally.

    ``service_name`` overrides ``OTEL_SERVICE_NAME``; ``span_exporters`` are added to the
    configured ones (tests). Installing globally only works once per process: later calls
    keep the first global providers and the returned ``Telemetry`` must be used directly.
    """
    config = config_from_env(os.environ if env is None else env)
    if service_name:
        config = replace(config, service_name=service_name)
    attrs: dict[str, str | int] = {"service.name": config.service_name}
    attrs.update(resource_attributes or {})
    resource = Resource.create(attrs)
    tracer_provider = TracerProvider(resource=resource)
    exporters: list[SpanExporter] = list(span_exporters)
    for name in config.traces_exporters:  # empty when disabled
        exporters.append(_otlp_exporter(config) if name == "otlp" else ConsoleSpanExporter())
    wrapped = [_OnceExporter(e) for e in exporters]
    for exporter in wrapped:
        tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    reader = PrometheusMetricReader(registry=registry, scope_info_enabled=False)
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    if set_global:
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
    return Telemetry(
        config=config,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        registry=registry,
        exporters=wrapped,
    )
