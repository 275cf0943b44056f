"""Pure terminal views of Jaeger traces for ``fencectl trace``: a span tree as a waterfall.

Rules
- Input is Jaeger's query-API JSON (``/api/traces/{id}``: ``spans`` with ``spanID``,
  ``operationName``, ``references``, ``startTime`` and ``duration`` in microseconds,
  ``tags``, ``processID``; ``processes`` naming the services). Nothing here does I/O.
- ``span_rows`` orders a trace depth-first from its roots (spans without a ``CHILD_OF``
  parent inside the trace), children by start time; times are relative to the trace's
  first start.
- ``render_waterfall`` draws each span as a bar on one shared time axis ``width`` columns
  wide (at least one column per span, so a short span stays visible), followed by its
  duration and the fence attributes (epoch, frontier, outcome) where the span has them.
- Producer links are shown after the tree with their start relative to the batch span's
  start (negative: produced before the batch began); a link whose trace Jaeger does not hold
  (sampled out, expired) is shown as such, never dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LinkedSpan", "SpanRow", "linked_span", "render_waterfall", "span_rows"]

_FENCE_TAGS = (("epoch", "fence.epoch"), ("frontier", "fence.frontier"),
               ("outcome", "fence.outcome"))


@dataclass(frozen=True, slots=True)
class SpanRow:
    span_id: str
    name: str
    service: str
    depth: int
    start_us: int  # relative to the trace's first span
    duration_us: int
    tags: Mapping[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"span_id": self.span_id, "name": self.name, "service": self.service,
                "depth": self.depth, "start_ms": self.start_us / 1000,
                "duration_ms": self.duration_us / 1000,
                **{key: self.tags.get(tag) for key, tag in _FENCE_TAGS}}


@dataclass(frozen=True, slots=True)
class LinkedSpan:
    """A producer span the batch links to; ``name`` None when Jaeger does not hold it."""

    trace_id: str
    span_id: str
    name: str | None = None
    service: str | None = None
    start_us: int | None = None  # absolute, microseconds since the epoch
    duration_us: int | None = None
    offset: int | None = None  # the record's offset as the producer recorded it

    def as_dict(self, batch_start_us: int) -> dict[str, Any]:
        return {"trace_id": self.trace_id, "span_id": self.span_id, "name": self.name,
                "service": self.service, "offset": self.offset,
                "start_ms_before_batch": (None if self.start_us is None
                                          else (batch_start_us - self.start_us) / 1000),
                "duration_ms": None if self.duration_us is None else self.duration_us / 1000}


def _tags(span: Mapping[str, Any]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span.get("tags", [])}


def _parent(span: Mapping[str, Any]) -> str | None:
    return next((r["spanID"] for r in span.get("references", [])
                 if r.get("refType") == "CHILD_OF"), None)


def span_rows(trace: Mapping[str, Any]) -> list[SpanRow]:
    """Pure: the trace's spans depth-first (see the module Rules)."""
    spans = list(trace.get("spans", []))
    if not spans:
        return []
    services = {k: v.get("serviceName", "") for k, v in (trace.get("processes") or {}).items()}
    ids = {s["spanID"] for s in spans}
    children: dict[str | None, list[Mapping[str, Any]]] = {}
    for s in spans:
        parent = _parent(s)
        children.setdefault(parent if parent in ids else None, []).append(s)
    t0 = min(int(s.get("startTime", 0)) for s in spans)
    out: list[SpanRow] = []

    def walk(parent: str | None, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda x: int(x.get("startTime", 0))):
            out.append(SpanRow(s["spanID"], s.get("operationName", "?"),
                               services.get(s.get("processID", ""), ""), depth,
                               int(s.get("startTime", 0)) - t0, int(s.get("duration", 0)),
                               _tags(s)))
            walk(s["spanID"], depth + 1)

    walk(None, 0)
    return out


def linked_span(trace: Mapping[str, Any] | None, *, trace_id: str, span_id: str) -> LinkedSpan:
    """Pure: the linked span ``span_id`` out of its trace's JSON (None: not in Jaeger)."""
    for s in (trace or {}).get("spans", []):
        if s["spanID"].lstrip("0") == span_id.lstrip("0"):
            services = {k: v.get("serviceName", "")
                        for k, v in ((trace or {}).get("processes") or {}).items()}
            offset = _tags(s).get("messaging.kafka.offset")
            return LinkedSpan(trace_id, span_id, s.get("operationName"),
                              services.get(s.get("processID", ""), ""),
                              int(s.get("startTime", 0)), int(s.get("duration", 0)),
                              offset if isinstance(offset, int) else None)
    return LinkedSpan(trace_id, span_id)


def _ms(us: float) -> str:
    return f"{us / 1000:.1f}ms" if abs(us) >= 1000 else f"{us / 1000:.2f}ms"


def _bar(start_us: int, duration_us: int, total_us: int, width: int) -> str:
    first = min(width - 1, int(start_us * width / total_us))
    last = max(first + 1, min(width, -(-(start_us + duration_us) * width // total_us)))
    return " " * first + "█" * (last - first) + " " * (width - last)


def render_waterfall(rows: Sequence[SpanRow], *, batch_span_id: str,
                     links: Sequence[LinkedSpan] = (), links_total: int = 0,
                     batch_start_us: int = 0, width: int = 40) -> list[str]:
    """Pure: the waterfall lines of ``rows`` (from ``span_rows``) and the producer links."""
    if not rows:
        return ["(the trace has no spans)"]
    total_us = max(1, max(r.start_us + r.duration_us for r in rows))
    name_w = max(len("  " * r.depth + r.name) for r in rows) + 3
    out = [f"{'SPAN':<{name_w}}{'START':>9} {'DURATION':>9}  |{_ms(0):<{width // 2}}"
           f"{_ms(total_us):>{width - width // 2}}|  EPOCH FRONTIER OUTCOME"]
    for r in rows:
        label = "  " * r.depth + r.name + (" *" if r.span_id == batch_span_id else "")
        epoch, frontier, outcome = (r.tags.get(tag, "-") for _key, tag in _FENCE_TAGS)
        out.append(f"{label:<{name_w}}{'+' + _ms(r.start_us):>9} "
                   f"{_ms(r.duration_us):>9}  |{_bar(r.start_us, r.duration_us, total_us, width)}"
                   f"|  {epoch!s:>5} {frontier!s:>8} {outcome}")
    if links_total:
        out.append(f"producer links: {len(links)} shown of {links_total}")
    for link in links:
        if link.name is None:
            out.append(f"  -> trace {link.trace_id} span {link.span_id}: not in Jaeger "
                       "(sampled out or expired)")
            continue
        before = batch_start_us - (link.start_us or 0)
        offset = "" if link.offset is None else f" offset {link.offset}"
        out.append(f"  -> {link.service} {link.name}{offset}: {_ms(link.duration_us or 0)}, "
                   f"started {_ms(before)} before the batch (trace {link.trace_id} span "
                   f"{link.span_id})")
    return out
