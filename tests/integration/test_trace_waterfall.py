"""``fencectl trace`` renders a record's batch as a waterfall from the real Jaeger's query API.

A real ``fencectl produce`` (one producer span per record, W3C header) and a real worker
export to Jaeger; ``fencectl trace`` finds the batch of one record and prints its span tree
(bars, durations, epoch, frontier, outcome) and the producer spans it links to, looked up by
trace id; ``--json`` holds the same rows.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from ops.stack.config import ServiceSettings
from tests.integration.observability_support import (
    jaeger_spans,
    run_fencectl,
    start_worker,
    unique_service,
)
from tests.integration.workers import durable_rows, fresh_schema, unique
from tests.polling import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("go_services")]  # Jaeger


def test_waterfall_of_one_record_batch(services: ServiceSettings) -> None:
    topic, group = unique("wf"), unique("g-wf")
    service = unique_service("wf")
    schema = asyncio.run(fresh_schema(services.dsn))
    produced = run_fencectl("produce", "--topic", topic, "--count", "20", "--seed", "3",
                            "--class", "valid", "--partitions", "1", "--span-every", "1")
    assert produced.returncode == 0, produced.stderr
    worker = start_worker(topic=topic, group=group, schema=schema, service=service)
    try:
        wait_until(lambda: asyncio.run(durable_rows(services.dsn, schema, group, topic))
                   .get(0, (0, 0))[1] == 20, timeout_s=60, what="20 records committed")
        worker.terminate()
        assert worker.wait(30) == 0, worker.log()[-3000:]
    finally:
        worker.ensure_dead()
    jaeger_spans(services.jaeger_query_url, service, operation="fence.process",
                 until=lambda ss: any(s.tags.get("fence.last_offset") == 19 for s in ss))
    env = {"JAEGER_QUERY_URL": services.jaeger_query_url}
    args = ("trace", "--topic", topic, "--partition", "0", "--offset", "7", "--service",
            service, "--lookback", "1h")
    found = run_fencectl(*args, "--links", "50", "--json", env=env)
    assert found.returncode == 0, found.stderr
    (batch,) = json.loads(found.stdout)
    root = batch["spans"][0]
    assert (root["name"], root["depth"], root["start_ms"]) == ("fence.process", 0, 0.0)
    assert root["span_id"] == batch["span_id"] and root["duration_ms"] > 0
    assert (root["epoch"], root["frontier"], root["outcome"]) == (
        1, batch["last_offset"] + 1, "ok")
    producers = {p["offset"]: p for p in batch["producers"]}
    record = producers[7]  # the record's own producer span, read back by its trace id
    assert record["service"] == "fencectl-produce" and record["start_ms_before_batch"] > 0

    text = run_fencectl(*args, env=env)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"trace {batch['trace_id']} ")
    assert "EPOCH FRONTIER OUTCOME" in lines[1]
    process = lines[2]
    assert process.startswith("fence.process *") and "█" in process
    assert process.split("|")[2].split() == ["1", str(batch["last_offset"] + 1), "ok"]
    assert f"producer links: 3 shown of {len(batch['producer_links'])}" in text.stdout
    links = [line for line in lines if line.startswith("  -> ")]
    assert len(links) == 3 and links[0].startswith(f"  -> fencectl-produce send {topic} "
                                                   "offset 7: ")  # the record's own first
