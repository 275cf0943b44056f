"""Jaeger is real: a span exported over OTLP gRPC is read back from /api/traces."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
import uuid

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from ops.stack.config import ServiceSettings

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("go_services")]  # Jaeger

READ_BACK_TIMEOUT_S = 30.0


def _traces(base_url: str, service: str) -> list[dict[str, object]]:
    query = urllib.parse.urlencode({"service": service, "limit": 10})
    with urllib.request.urlopen(f"{base_url}/api/traces?{query}", timeout=10) as resp:
        body = json.loads(resp.read())
    return list(body.get("data") or [])


def test_span_exported_over_otlp_is_queryable(services: ServiceSettings) -> None:
    service = f"fence-smoke-{uuid.uuid4().hex[:8]}"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=services.otlp_endpoint, insecure=True, timeout=10)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("fenceworker.smoke")
    with tracer.start_as_current_span("smoke-span") as span:
        span.set_attribute("fence.smoke", "yes")
        trace_id = format(span.get_span_context().trace_id, "032x")
    provider.shutdown()

    deadline = time.monotonic() + READ_BACK_TIMEOUT_S
    traces = _traces(services.jaeger_query_url, service)
    while not traces:
        assert time.monotonic() < deadline, f"no trace for {service} in Jaeger"
        time.sleep(0.5)
        traces = _traces(services.jaeger_query_url, service)

    [trace] = traces
    assert str(trace["traceID"]).lstrip("0") == trace_id.lstrip("0")
    spans = trace["spans"]
    assert isinstance(spans, list)
    [got] = spans
    assert got["operationName"] == "smoke-span"
    tags = {t["key"]: t["value"] for t in got["tags"]}
    assert tags["fence.smoke"] == "yes"
