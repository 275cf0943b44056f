"""What an operator reads when the source moves under the worker, and what ``/metrics``
shows before anything happened.

- A recreated topic is refused (exit 4) with the runbook's fix (``reset adopt-topic``) and
  no retention-gap error advising ``--allow-retention-gap``.
- ``--allow-retention-gap`` skips a gap with a warning in the log, not only a journal row.
- A started worker exports its counters at 0 before the first record.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from confluent_kafka import TopicPartition as KTP
from confluent_kafka.admin import AdminClient

from tests.integration.observability_support import free_port, http_get, metric
from tests.integration.workers import (
    GROUP_SETUPS,
    WorkerProc,
    create_topic,
    delete_topic,
    fresh_schema,
    generated,
    produce,
    run_until_committed,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

SETUP = GROUP_SETUPS[0]


def _run_to(topic: str, group: str, schema: str, dsn: str, total: int,
            extra: tuple[str, ...] = ()) -> str:
    """Run a worker until ``total`` records are committed, stop it (exit 0), return its log."""
    return run_until_committed(topic=topic, group=group, schema=schema, dsn=dsn, setup=SETUP,
                               total=total, extra=extra)


def test_recreated_topic_advises_adopt_topic_only(services: Any) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("recreate17"), unique("g17")
    create_topic(bootstrap, topic, 2)
    recs, _ = generated(topic, count=100, partitions=2)
    produce(bootstrap, recs)
    schema = asyncio.run(fresh_schema(dsn))
    _run_to(topic, group, schema, dsn, len(recs))
    delete_topic(bootstrap, topic)
    create_topic(bootstrap, topic, 2)
    produce(bootstrap, recs[:20])
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name="refused")
    try:
        assert w.wait(60) == 4, w.log()[-3000:]
    finally:
        w.ensure_dead()
    log = w.log()
    errors = [ln for ln in log.splitlines() if " ERROR " in ln]
    assert len(errors) == 1, errors
    assert "RecreatedTopic" in errors[0] and "fencectl reset adopt-topic" in errors[0]
    assert "RetentionGap" not in log and "--allow-retention-gap" not in log
    assert "Traceback" not in log


def test_gap_skip_is_logged_as_a_warning(services: Any) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("gap17"), unique("g17")
    create_topic(bootstrap, topic, 1)
    recs, _ = generated(topic, count=300, partitions=1, seed=4)
    produce(bootstrap, recs[:100])
    schema = asyncio.run(fresh_schema(dsn))
    _run_to(topic, group, schema, dsn, 100)
    produce(bootstrap, recs[100:])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.delete_records([KTP(topic, 0, 250)]).values():
        fut.result(timeout=30)
    log = _run_to(topic, group, schema, dsn, 300, extra=("--allow-retention-gap",))
    warnings = [ln for ln in log.splitlines() if " WARNING " in ln and "skipped" in ln]
    assert len(warnings) == 1, log[-3000:]
    assert f"{topic}[0]: skipped offsets 100..249 unprocessed (retention-gap, 150 records;" \
        in warnings[0]


def test_counters_are_exported_at_zero_from_start(services: Any) -> None:
    topic, group = unique("zeros17"), unique("g17")
    create_topic(services.kafka_bootstrap, topic, 2)
    schema = asyncio.run(fresh_schema(services.dsn))
    port = free_port()
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP,
                   extra=("--http-port", str(port)))
    try:
        got = wait_until(lambda: http_get(f"http://127.0.0.1:{port}/metrics"), timeout_s=60,
                       what="/metrics answers")
        assert got[0] == 200
        text = got[1]
        lines = set(text.splitlines())
        for p in ("0", "1"):
            labels = f'partition="{p}",topic="{topic}"'
            for name in ("fence_records_processed_total", "fence_records_rejected_total",
                         "fence_fences_total"):
                assert f"{name}{{{labels}}} 0.0" in lines, (name, text)
            assert f'fence_batches_total{{outcome="committed",{labels}}} 0.0' in lines, text
        assert 'fence_retirements_total{reason="Fenced"} 0.0' in lines
        assert 'fence_unknown_outcomes_total{operation="process",resolution="committed"} 0.0' \
            in lines
        assert 'fence_retries_total{operation="process"} 0.0' in lines
        assert metric(text, "fence_records_processed_total") == 0
        w.terminate()
        assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        w.ensure_dead()
