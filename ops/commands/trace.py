"""``fencectl trace``: find the batch (``fence.process`` span) that processed one record.

  fencectl trace --topic T --partition P --offset O [--group G] [--service fenceworker]

Prints, per batch found, a header line and the span tree of the batch's trace as a
waterfall (durations, epoch, frontier, outcome; the batch span marked ``*``), then the
producer spans it links to, fetched by trace id (``--links N`` of them, default 3, the
record's own first when the batch's links follow its records one to one; the local
Jaeger build has no UI, so this is the way to look at a trace there). ``--json`` prints the
same as data (``spans``, ``producers``).

Queries Jaeger's HTTP API (``JAEGER_QUERY_URL``; the same API the UI uses):
``/api/traces?service=S&operation=fence.process&tags={"messaging.destination.partition.id":
"P", "messaging.destination.name": "T"}&lookback=...`` and keeps the spans whose
``fence.first_offset <= O <= fence.last_offset``. Prints trace id, UI path, epoch, outcome,
lifetime, the batch's offsets, any ``fence.resolve`` child and the producer spans linked.
A record processed twice (a fenced batch, then its successor) shows every attempt. A batch
that quarantined records says how many (``quarantined=N``, the span's ``fence.rejected``).
When the asked record has no producer link, a line says why: the span keeps at most
``LINKS_MAX`` (128) links, so a later record of a larger batch is past that cap, or the
record carried no ``traceparent`` header.
Exit codes: ``EXITS`` (0 found, 1 not found or Jaeger failed, 2 bad usage).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from consumer.exits import Exit
from consumer.observability.tracecontext import LINKS_MAX
from ops.operator.trace_view import linked_span, render_waterfall, span_rows

__all__ = ["EXITS", "batches_for_record", "own_link", "register"]

FOUND = Exit(0, "the record's batch found (every attempt that processed it is shown)",
             "nothing")
NOT_FOUND = Exit(1, "no `fence.process` span covers the record within `--lookback`, or the "
                 "Jaeger query failed",
                 "widen `--lookback`; check `--group` and `--service` (the worker's "
                 "`OTEL_SERVICE_NAME`), that the worker exports traces "
                 "(`OTEL_EXPORTER_OTLP_ENDPOINT`) and that Jaeger answers")
USAGE = Exit(2, "`JAEGER_QUERY_URL` unset and no `--jaeger-url`; bad arguments",
             "fix what the line on stderr names")
EXITS = (FOUND, NOT_FOUND, USAGE)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg,unused-ignore]
    p = sub.add_parser("trace", help="find the batch span that processed a record (Jaeger)")
    p.add_argument("--topic", required=True, help="the record's topic")
    p.add_argument("--partition", type=int, required=True, help="the record's partition")
    p.add_argument("--offset", type=int, required=True, help="the record's offset")
    p.add_argument("--group", default=None, help="only this consumer group")
    p.add_argument("--service", default=os.environ.get("OTEL_SERVICE_NAME", "fenceworker"),
                   help="the worker's service name (default $OTEL_SERVICE_NAME or fenceworker)")
    p.add_argument("--lookback", default="24h", help="Jaeger lookback, e.g. 1h, 2d (default 24h)")
    p.add_argument("--limit", type=int, default=1500, help="traces to scan (default 1500)")
    p.add_argument("--jaeger-url", default=os.environ.get("JAEGER_QUERY_URL"),
                   help="Jaeger query base URL (default $JAEGER_QUERY_URL)")
    p.add_argument("--links", type=int, default=3,
                   help="producer links to look up and show per batch (default 3; 0: none)")
    p.add_argument("--width", type=int, default=40, help="waterfall width in columns")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_main, exits=EXITS)


def _tags(span: Mapping[str, Any]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span.get("tags", [])}


def batches_for_record(traces: Sequence[Mapping[str, Any]], *, topic: str, partition: int,
                       offset: int, group: str | None = None) -> list[dict[str, Any]]:
    """Pure: the ``fence.process`` spans of ``traces`` whose offset range holds ``offset``."""
    found: list[dict[str, Any]] = []
    for tr in traces:
        spans = list(tr.get("spans", []))
        for s in spans:
            tags = _tags(s)
            if s.get("operationName") != "fence.process" \
                    or tags.get("messaging.destination.name") != topic \
                    or str(tags.get("messaging.destination.partition.id")) != str(partition) \
                    or (group is not None and tags.get("messaging.consumer.group.name") != group):
                continue
            first, last = tags.get("fence.first_offset"), tags.get("fence.last_offset")
            if not (isinstance(first, int) and isinstance(last, int) and first <= offset <= last):
                continue
            children = [c for c in spans if any(r.get("refType") == "CHILD_OF" and
                                                 r.get("spanID") == s["spanID"]
                                                 for r in c.get("references", []))]
            found.append({
                "trace_id": s["traceID"], "span_id": s["spanID"],
                "ui_path": f"/trace/{s['traceID']}",
                "group": tags.get("messaging.consumer.group.name"),
                "lifetime": tags.get("fence.lifetime"), "epoch": tags.get("fence.epoch"),
                "outcome": tags.get("fence.outcome"),
                "quarantined": int(tags.get("fence.rejected") or 0),
                "records": tags.get("messaging.batch.message_count"), "first_offset": first,
                "last_offset": last, "frontier_after": tags.get("fence.frontier"),
                "start_us": s.get("startTime"),
                "resolutions": [_tags(c).get("fence.outcome") for c in children
                                if c.get("operationName") == "fence.resolve"],
                "producer_links": [{"trace_id": r["traceID"], "span_id": r["spanID"]}
                                   for r in s.get("references", [])
                                   if r.get("refType") == "FOLLOWS_FROM"],
            })
    found.sort(key=lambda b: b["start_us"] or 0)
    return found


def own_link(batch: Mapping[str, Any], offset: int) -> tuple[str, str | None]:
    """Pure: whether the batch links the producer span of the record at ``offset``:
    ``("linked", None)``, or ``("past-cap" | "none", why)``. Links follow the batch's
    records in order, one per record that carries trace context."""
    links = len(batch["producer_links"])
    position = offset - batch["first_offset"]
    if 0 <= position < links:
        return "linked", None
    if links >= LINKS_MAX:
        count = batch.get("records")
        of = f" of {count}" if isinstance(count, int) else ""
        return "past-cap", (f"offset {offset} is record {position + 1}{of} of this batch; a "
                            f"span keeps at most {LINKS_MAX} producer links (OpenTelemetry's "
                            "default), so its producer span is not linked")
    return "none", (f"offset {offset} has no producer link: the batch linked {links} "
                    "record(s) with trace context, and this record carried none (no "
                    "traceparent header)")


def _get(base: str, path: str) -> Any:
    with urllib.request.urlopen(f"{base.rstrip('/')}{path}", timeout=30) as resp:
        return json.loads(resp.read())


def _trace(base: str, trace_id: str) -> Mapping[str, Any] | None:
    """One trace by id; None when Jaeger does not hold it (404 or no data)."""
    try:
        data = _get(base, f"/api/traces/{urllib.parse.quote(trace_id)}").get("data") or []
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
    return data[0] if data else None


def _with_tree(base: str, batch: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Add ``spans`` and ``producers`` to ``batch``; return its waterfall lines."""
    rows = span_rows(_trace(base, batch["trace_id"]) or {})
    every = batch["producer_links"]
    own = args.offset - batch["first_offset"]  # links follow the batch's records in order
    first = [every[own]] if 0 <= own < len(every) else []
    ordered = first + [link for i, link in enumerate(every) if i != own]
    links = [linked_span(_trace(base, link["trace_id"]), **link)
             for link in ordered[:max(0, args.links)]]
    start = batch["start_us"] or 0
    batch["own_link"], batch["own_link_note"] = own_link(batch, args.offset)
    batch["spans"] = [r.as_dict() for r in rows]
    batch["producers"] = [link.as_dict(start) for link in links]
    return render_waterfall(rows, batch_span_id=batch["span_id"], links=links,
                            links_total=len(batch["producer_links"]), batch_start_us=start,
                            width=max(10, args.width))


def _query(base: str, args: argparse.Namespace) -> list[Mapping[str, Any]]:
    tags = {"messaging.destination.name": args.topic,
            "messaging.destination.partition.id": str(args.partition)}
    if args.group:
        tags["messaging.consumer.group.name"] = args.group
    query = urllib.parse.urlencode({
        "service": args.service, "operation": "fence.process", "tags": json.dumps(tags),
        "lookback": args.lookback, "limit": str(args.limit)})
    with urllib.request.urlopen(f"{base.rstrip('/')}/api/traces?{query}", timeout=30) as resp:
        body = json.loads(resp.read())
    return list(body.get("data") or [])


def _main(args: argparse.Namespace) -> int:
    if not args.jaeger_url:
        print("fencectl trace: JAEGER_QUERY_URL is not set (or pass --jaeger-url)",
              file=sys.stderr)
        return USAGE.code
    try:
        traces = _query(args.jaeger_url, args)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"fencectl trace: Jaeger query failed: {exc}", file=sys.stderr)
        return NOT_FOUND.code
    found = batches_for_record(traces, topic=args.topic, partition=args.partition,
                               offset=args.offset, group=args.group)
    try:
        trees = [_with_tree(args.jaeger_url, b, args) for b in found]
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"fencectl trace: Jaeger query failed: {exc}", file=sys.stderr)
        return NOT_FOUND.code
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        for b, tree in zip(found, trees, strict=True):
            print(f"trace {b['trace_id']} ({args.jaeger_url.rstrip('/')}{b['ui_path']}) "
                  f"group={b['group']} lifetime={b['lifetime']} epoch={b['epoch']} "
                  f"outcome={b['outcome']}"
                  + (f" quarantined={b['quarantined']}" if b["quarantined"] else "")
                  + f" offsets={b['first_offset']}..{b['last_offset']}"
                  + (f" resolved={','.join(map(str, b['resolutions']))}"
                     if b["resolutions"] else "")
                  + f" producer_links={len(b['producer_links'])}")
            if b["own_link_note"]:
                print(f"note: {b['own_link_note']}")
            print("\n".join(tree), end="\n\n")
        if not found:
            print(f"no fence.process span of {args.service} covers {args.topic}"
                  f"[{args.partition}]@{args.offset} within {args.lookback}", file=sys.stderr)
    return (FOUND if found else NOT_FOUND).code
