"""ops.worker.telemetry: configuration from OTEL_* variables, export, flush and header links."""

from __future__ import annotations

import time

import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from consumer.observability.tracecontext import (
    context_from_headers,
    links_for_records,
    links_from_headers,
)
from fencing.errors import ConfigError
from fencing.types import SourceRecord
from ops.worker.telemetry import DEFAULT_SERVICE_NAME, config_from_env, setup_telemetry


def test_no_exporter_configured_means_no_export() -> None:
    config = config_from_env({})
    assert config.service_name == DEFAULT_SERVICE_NAME
    assert config.traces_exporters == ()


def test_endpoint_alone_selects_otlp_grpc() -> None:
    config = config_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
                              "OTEL_SERVICE_NAME": "svc-a"})
    assert config.traces_exporters == ("otlp",)
    assert config.otlp_endpoint == "http://127.0.0.1:4317"
    assert config.otlp_protocol == "grpc"
    assert config.service_name == "svc-a"


def test_traces_specific_variables_win() -> None:
    config = config_from_env({
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4317",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    })
    assert (config.otlp_endpoint, config.otlp_protocol) == ("http://b:4318", "http/protobuf")


@pytest.mark.parametrize(("value", "expected"), [
    ("none", ()), ("otlp", ("otlp",)), ("otlp,otlp", ("otlp",)),
    ("console,otlp", ("console", "otlp")),
])
def test_traces_exporter_list(value: str, expected: tuple[str, ...]) -> None:
    env = {"OTEL_TRACES_EXPORTER": value, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317"}
    assert config_from_env(env).traces_exporters == expected


def test_sdk_disabled_exports_nothing() -> None:
    env = {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317"}
    assert config_from_env(env).traces_exporters == ()


@pytest.mark.parametrize("env", [
    {"OTEL_TRACES_EXPORTER": "zipkin"},
    {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
])
def test_unknown_values_are_config_errors(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        config_from_env(env)


def test_spans_reach_an_exporter_and_shutdown_flushes() -> None:
    exporter = InMemorySpanExporter()
    tel = setup_telemetry(env={}, service_name="unit-svc", span_exporters=[exporter],
                          set_global=False)
    assert not tel.exporting
    with tel.tracer().start_as_current_span("fence.process") as span:
        span.set_attribute("fence.epoch", 3)
    tel.shutdown(timeout_s=2)
    tel.shutdown(timeout_s=2)  # idempotent
    (finished,) = exporter.get_finished_spans()
    assert finished.name == "fence.process"
    assert finished.attributes is not None and finished.attributes["fence.epoch"] == 3
    assert finished.resource.attributes["service.name"] == "unit-svc"


def test_no_exporter_setup_creates_spans_without_error() -> None:
    tel = setup_telemetry(env={}, set_global=False)
    assert not tel.exporting  # nothing configured: spans are dropped, not sent
    with tel.tracer().start_as_current_span("x") as span:
        assert span.get_span_context().is_valid  # a real span the worker can annotate
        span.set_attribute("fence.epoch", 1)
    started = time.monotonic()
    tel.shutdown(timeout_s=1)
    assert time.monotonic() - started < 1.0  # nothing to flush


def test_otlp_exporter_to_unreachable_endpoint_does_not_raise() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SERVICE_NAME": "nobody"}
    tel = setup_telemetry(env=env, set_global=False)
    assert tel.exporting
    with tel.tracer().start_as_current_span("x"):
        pass
    started = time.monotonic()
    tel.shutdown(timeout_s=0.5)
    assert time.monotonic() - started < 2.5  # bounded, though the SDK flush ignores its timeout


def _headers_for(span_context: trace.SpanContext) -> list[tuple[str, bytes | None]]:
    carrier: dict[str, str] = {}
    ctx = trace.set_span_in_context(trace.NonRecordingSpan(span_context))
    propagate.inject(carrier, context=ctx)
    return [(k, v.encode()) for k, v in carrier.items()]


def test_w3c_context_round_trips_through_record_headers() -> None:
    sc = trace.SpanContext(trace_id=0xABC, span_id=0xDEF, is_remote=True,
                           trace_flags=trace.TraceFlags(1))
    headers = [("other", b"x"), *_headers_for(sc)]
    got = trace.get_current_span(context_from_headers(headers)).get_span_context()
    assert (got.trace_id, got.span_id) == (0xABC, 0xDEF)


def test_links_are_distinct_valid_contexts_in_order() -> None:
    a = trace.SpanContext(0x1, 0x11, True, trace.TraceFlags(1))
    b = trace.SpanContext(0x2, 0x22, True, trace.TraceFlags(1))
    none: list[tuple[str, bytes | None]] = [("k", None)]
    records = [_headers_for(a), none, _headers_for(b), _headers_for(a), []]
    links = links_from_headers(records, attributes={"messaging.kafka.offset": 1})
    assert [(lk.context.trace_id, lk.context.span_id) for lk in links] == [(0x1, 0x11), (0x2, 0x22)]
    assert links[0].attributes == {"messaging.kafka.offset": 1}
    assert len(links_from_headers(records, limit=1)) == 1


def test_links_for_records_carry_the_first_offset_per_context() -> None:
    a = trace.SpanContext(0x1, 0x11, True, trace.TraceFlags(1))
    recs = [SourceRecord("t", 0, off, None, b"", tuple(h)) for off, h in
            [(5, _headers_for(a)), (6, _headers_for(a)), (7, [])]]
    (link,) = links_for_records(recs)
    assert link.context.span_id == 0x11 and link.attributes == {"messaging.kafka.offset": 5}
