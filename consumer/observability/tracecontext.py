"""W3C trace context in Kafka record headers (``traceparent``/``tracestate``).

Rules
- Header keys match case-insensitively; values are bytes decoded as latin-1; a missing or
  malformed context yields an invalid span context and no link.
- ``links_for_records`` returns one link per distinct valid producer span context, in record
  order, each with the first such record's ``messaging.kafka.offset``, at most ``limit``
  (default ``LINKS_MAX``, OpenTelemetry's default span link limit: a batch's later records
  have no link).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter

from fencing.types import SourceRecord

__all__ = ["LINKS_MAX", "context_from_headers", "links_for_records", "links_from_headers"]

LINKS_MAX = 128  # OTEL_SPAN_LINK_COUNT_LIMIT's default

Headers = Iterable[tuple[str, bytes | None]]


class _HeaderGetter(Getter[list[tuple[str, bytes | None]]]):
    """Reads W3C headers from a record's ``((key, value), ...)`` headers (bytes values)."""

    def get(self, carrier: list[tuple[str, bytes | None]], key: str) -> list[str] | None:
        found = [
            v.decode("latin-1") if isinstance(v, bytes | bytearray) else str(v)
            for k, v in carrier
            if k.lower() == key and v is not None
        ]
        return found or None

    def keys(self, carrier: list[tuple[str, bytes | None]]) -> list[str]:
        return [k for k, _ in carrier]


_GETTER = _HeaderGetter()


def context_from_headers(headers: Headers) -> Context:
    """The trace context a producer put in record headers (empty context when absent)."""
    return propagate.extract(list(headers), getter=_GETTER)


def _span_context(headers: Headers) -> trace.SpanContext:
    return trace.get_current_span(context_from_headers(headers)).get_span_context()


def _links(items: Iterable[tuple[Headers, Mapping[str, str | int]]],
           limit: int) -> list[trace.Link]:
    """One link per distinct valid span context of ``(headers, attributes)``, at most ``limit``."""
    links: list[trace.Link] = []
    seen: set[tuple[int, int]] = set()
    for headers, attributes in items:
        ctx = _span_context(headers)
        if not ctx.is_valid or (ctx.trace_id, ctx.span_id) in seen:
            continue
        seen.add((ctx.trace_id, ctx.span_id))
        links.append(trace.Link(ctx, dict(attributes)))
        if len(links) >= limit:
            break
    return links


def links_from_headers(
    records_headers: Iterable[Headers],
    *,
    attributes: Mapping[str, str | int] | None = None,
    limit: int = LINKS_MAX,
) -> list[trace.Link]:
    """One link per distinct valid producer span context, in order, at most ``limit``."""
    attrs = attributes or {}
    return _links(((headers, attrs) for headers in records_headers), limit)


def links_for_records(records: Sequence[SourceRecord], *,
                      limit: int = LINKS_MAX) -> list[trace.Link]:
    """Links from each record's headers to its producer span, with the record's offset."""
    return _links(((r.headers, {"messaging.kafka.offset": r.offset}) for r in records
                   if r.headers), limit)
