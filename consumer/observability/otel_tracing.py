"""OpenTelemetry implementation of ``fencing.tracing.Tracing`` (tracer ``fenceworker``).

Wired by ``fencectl run`` into every ``Lifecycle`` (and through it into the guarded store
calls); a no-op without an SDK. ``fence.outcome`` is what the opener set (a resolution),
else ``ok``, or the class name of the error leaving the span.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, Tracer

__all__ = ["TRACER_NAME", "OtelTracing"]

TRACER_NAME = "fenceworker"


class _Recorded:
    """The span, remembering whether its opener set ``fence.outcome`` itself."""

    __slots__ = ("outcome_set", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.outcome_set = False

    def set_attribute(self, key: str, value: Any) -> None:
        self.outcome_set = self.outcome_set or key == "fence.outcome"
        self.span.set_attribute(key, value)

    def add_event(self, name: str, attrs: Mapping[str, Any]) -> None:
        self.span.add_event(name, attributes=dict(attrs))


class OtelTracing:
    """Spans from ``tracer`` (default: the global provider's ``fenceworker`` tracer)."""

    def __init__(self, tracer: Tracer | None = None) -> None:
        self._tracer = tracer if tracer is not None else trace.get_tracer(TRACER_NAME)

    @contextmanager
    def span(self, name: str, attrs: Mapping[str, Any], *, links: Sequence[object] = (),
             context: object | None = None) -> Iterator[_Recorded]:
        otel_links = [link for link in links if isinstance(link, Link)]
        otel_context = context if isinstance(context, Context) else None
        with self._tracer.start_as_current_span(name, context=otel_context, links=otel_links,
                                                attributes=dict(attrs)) as sp:
            recorded = _Recorded(sp)
            try:
                yield recorded
            except BaseException as exc:
                sp.set_attribute("fence.outcome", type(exc).__name__)
                raise
            if not recorded.outcome_set:
                sp.set_attribute("fence.outcome", "ok")
