"""ops.commands.trace: picking the batch span of one record out of Jaeger's JSON."""

from __future__ import annotations

from typing import Any

from ops.commands.trace import batches_for_record


def _span(span_id: str, name: str, refs: list[dict[str, str]], **tags: Any) -> dict[str, Any]:
    return {"traceID": "t1", "spanID": span_id, "operationName": name, "references": refs,
            "startTime": int(span_id, 16),
            "tags": [{"key": k.replace("__", "."), "value": v} for k, v in tags.items()]}


def _process(span_id: str, first: int, last: int, partition: str = "1",
             group: str = "g") -> dict[str, Any]:
    return _span(span_id, "fence.process",
                 [{"refType": "FOLLOWS_FROM", "traceID": "p1", "spanID": "ps"}],
                 **{"messaging.destination.name": "orders",
                    "messaging.destination.partition.id": partition,
                    "messaging.consumer.group.name": group, "fence.first_offset": first,
                    "fence.last_offset": last, "fence.epoch": 2, "fence.outcome": "ok",
                    "fence.lifetime": "lt-1", "fence.frontier": last + 1})


def test_only_the_covering_batch_of_that_partition_and_group() -> None:
    resolve = _span("0d", "fence.resolve", [{"refType": "CHILD_OF", "traceID": "t1",
                                            "spanID": "0b"}], **{"fence.outcome": "committed"})
    traces = [{"spans": [_process("0a", 0, 9), _process("0b", 10, 19), resolve,
                         _process("0c", 10, 19, partition="2"),
                         _process("0e", 10, 19, group="other")]}]
    (got,) = batches_for_record(traces, topic="orders", partition=1, offset=12, group="g")
    assert (got["span_id"], got["first_offset"], got["last_offset"]) == ("0b", 10, 19)
    assert got["resolutions"] == ["committed"] and got["epoch"] == 2
    assert got["producer_links"] == [{"trace_id": "p1", "span_id": "ps"}]
    assert got["ui_path"] == "/trace/t1"
    both = batches_for_record(traces, topic="orders", partition=1, offset=12)
    assert [b["span_id"] for b in both] == ["0b", "0e"]
    assert batches_for_record(traces, topic="orders", partition=1, offset=20) == []
