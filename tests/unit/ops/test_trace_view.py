"""ops.operator.trace_view: a Jaeger trace as a depth-first waterfall, producer links."""

from __future__ import annotations

from typing import Any

from ops.operator.trace_view import linked_span, render_waterfall, span_rows


def _span(span_id: str, name: str, start: int, duration: int, parent: str | None = None,
          **tags: Any) -> dict[str, Any]:
    refs = [] if parent is None else [{"refType": "CHILD_OF", "traceID": "t", "spanID": parent}]
    return {"traceID": "t", "spanID": span_id, "operationName": name, "startTime": start,
            "duration": duration, "references": refs, "processID": "p1",
            "tags": [{"key": k.replace("__", "."), "value": v} for k, v in tags.items()]}


TRACE = {"processes": {"p1": {"serviceName": "fenceworker"}}, "spans": [
    _span("c2", "fence.resolve", 1_007_000, 2_000, "a1", fence__outcome="committed",
          fence__epoch=3, fence__frontier=10),
    _span("a1", "fence.process", 1_000_000, 10_000, None, fence__outcome="ok",
          fence__epoch=3, fence__frontier=20),
    _span("b1", "fence.handler", 1_001_000, 4_000, "a1"),
]}


def test_rows_are_depth_first_by_start_relative_to_the_trace() -> None:
    rows = span_rows(TRACE)
    assert [(r.name, r.depth, r.start_us, r.duration_us) for r in rows] == [
        ("fence.process", 0, 0, 10_000), ("fence.handler", 1, 1_000, 4_000),
        ("fence.resolve", 1, 7_000, 2_000)]
    assert rows[0].service == "fenceworker"
    assert rows[2].as_dict()["outcome"] == "committed" and rows[2].as_dict()["start_ms"] == 7.0


def test_waterfall_bars_share_one_axis_and_show_fence_attributes() -> None:
    lines = render_waterfall(span_rows(TRACE), batch_span_id="a1", width=10)
    header, process, handler, resolve = lines
    assert "EPOCH FRONTIER OUTCOME" in header and "10.0ms" in header
    bar = [line.split("|")[1] for line in (process, handler, resolve)]
    assert bar == ["██████████", " ████     ", "       ██ "]
    assert process.startswith("fence.process *") and "*" not in handler  # the batch span
    assert process.split("|")[2].split() == ["3", "20", "ok"]
    assert resolve.split("|")[2].split() == ["3", "10", "committed"]
    assert handler.split("|")[2].split() == ["-", "-", "-"]


def test_a_tiny_span_keeps_one_column() -> None:
    trace = {"spans": [_span("a", "root", 0, 1_000_000), _span("b", "tiny", 999_999, 1, "a")]}
    lines = render_waterfall(span_rows(trace), batch_span_id="a", width=10)
    assert lines[2].split("|")[1] == "         █"


def test_producer_links_found_and_missing() -> None:
    producer = {"processes": {"p9": {"serviceName": "fencectl-produce"}}, "spans": [
        {"spanID": "00ab", "operationName": "orders publish", "startTime": 400_000,
         "duration": 250, "processID": "p9",
         "tags": [{"key": "messaging.kafka.offset", "value": 12}]}]}
    found = linked_span(producer, trace_id="pt", span_id="ab")
    assert (found.service, found.name, found.offset) == ("fencectl-produce", "orders publish",
                                                         12)
    assert found.as_dict(1_000_000)["start_ms_before_batch"] == 600.0
    missing = linked_span(None, trace_id="gone", span_id="cd")
    lines = render_waterfall(span_rows(TRACE), batch_span_id="a1", links=[found, missing],
                             links_total=5, batch_start_us=1_000_000)
    assert lines[-3] == "producer links: 2 shown of 5"
    assert "fencectl-produce orders publish offset 12: 0.25ms, started 600.0ms before" \
        in lines[-2]
    assert "not in Jaeger" in lines[-1]


def test_empty_trace() -> None:
    assert render_waterfall(span_rows({}), batch_span_id="x") == ["(the trace has no spans)"]
