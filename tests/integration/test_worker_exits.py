"""Exit codes of real ``fencectl run`` processes, each as docs/configuration.md says (real Kafka and
PostgreSQL; misbehaving handlers from ``tests.integration.handlers``).

Items of the liveness issue: 3 (a consumer that cannot be built exits 2 naming the
setting), 4 (COMMIT answered ROLLBACK: nothing applied, Kafka's offset does not move,
exit 1 naming the mistake), 6 (PostgreSQL unavailable after the three-call policy exits 5;
a handler declared to stop on failure 1 with its traceback; an undefined table 2 naming the
SQLSTATE) and 9
(the shutdown bound is final: exit 6 listing the abandoned batch).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTP

from tests.integration.workers import (
    FENCECTL,
    GROUP_SETUPS,
    ROOT,
    ProxyThread,
    WorkerProc,
    committed_total,
    create_topic,
    durable_rows,
    fresh_schema,
    generated,
    produce,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

SETUP = GROUP_SETUPS[1]  # cooperative-sticky: the default assignor
HANDLERS = "tests.integration.handlers"


def _topic_with_records(services, count: int = 600, partitions: int = 2) -> tuple[str, str, str]:
    topic, group = unique("exits"), unique("gexits")
    create_topic(services.kafka_bootstrap, topic, partitions)
    recs, _ = generated(topic, count=count, partitions=partitions)
    produce(services.kafka_bootstrap, recs)
    schema = asyncio.run(fresh_schema(services.dsn))
    return topic, group, schema


def _finish(w: WorkerProc, timeout_s: float) -> tuple[int, str]:
    try:
        code = w.wait(timeout_s)
    finally:
        w.ensure_dead()
    return code, w.log()


@pytest.mark.parametrize("option", ["max.poll.interval.ms=abc", "no.such.property=1"])
def test_consumer_that_cannot_be_built_exits_2_naming_the_setting(services, option: str) -> None:
    topic, group, schema = _topic_with_records(services, count=10)
    proc = subprocess.run(
        [*FENCECTL, "run", "--topic", topic, "--group", group, "--schema", schema,
         "-X", option], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**_env(), "OTEL_TRACES_EXPORTER": "none"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert option.split("=")[0] in out and "-X" in out
    assert "Traceback" not in out


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_postgres_unavailable_after_three_calls_exits_5(services) -> None:
    topic, group, schema = _topic_with_records(services, count=2000)
    proxy = ProxyThread(services.dsn)
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name="nopg",
                   extra=("--handler", f"{HANDLERS}:slow_handler", "--batch-max-records", "10",
                          "--db-concurrency", "1"),
                   env={"FENCE_DSN": proxy.dsn, "FENCE_TEST_BATCH_DELAY_S": "0.3"})
    try:
        wait_until(lambda: committed_total(services.dsn, schema, group, topic) >= 20,
                   timeout_s=60, what="progress")
        proxy.refuse(True)  # the handler sleeps inside its transaction: cut before COMMIT
        code, log = _finish(w, 60)
    finally:
        proxy.close()
    assert code == 5, log[-3000:]
    assert "lifetime ends (exit 5" in log


def test_handler_declared_to_stop_exits_1_with_its_traceback(services) -> None:
    """A handler exception no longer retires the lifetime (poison records are isolated and
    quarantined, tests/integration/test_worker_failures.py), except for a handler declared
    ``on_failure="stop"``: it fail-stops with exit 1 and the handler's traceback."""
    topic, group, schema = _topic_with_records(services)
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name="raise",
                   extra=("--handler", f"{HANDLERS}:stopping_raising_handler"))
    code, log = _finish(w, 60)
    assert code == 1, log[-3000:]
    assert "Traceback" in log and "ValueError: handler bug at offset" in log
    assert "HandlerFailed" in log
    rows = asyncio.run(durable_rows(services.dsn, schema, group, topic))
    assert {f for _e, f in rows.values()} == {0}


def test_undefined_table_exits_2_naming_the_sqlstate(services) -> None:
    topic, group, schema = _topic_with_records(services)
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name="undef",
                   extra=("--handler", f"{HANDLERS}:undefined_table_handler"))
    code, log = _finish(w, 60)
    assert code == 2, log[-3000:]
    assert "42P01" in log and "no_such_table_for_fenceworker" in log
    assert "not retried" in log


def _kafka_committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = c.committed([KafkaTP(topic, p) for p in range(partitions)], timeout=10)
    finally:
        c.close()
    return [tp.offset for tp in got]


def test_commit_answered_rollback_applies_nothing_and_exits_1(services) -> None:
    topic, group, schema = _topic_with_records(services)
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name="swallow",
                   extra=("--handler", f"{HANDLERS}:swallowing_handler"))
    code, log = _finish(w, 60)
    assert code == 1, log[-3000:]
    assert "answered COMMIT with ROLLBACK" in log and "SAVEPOINT" in log
    rows = asyncio.run(durable_rows(services.dsn, schema, group, topic))
    assert rows and {f for _e, f in rows.values()} == {0}  # nothing reported applied
    # Kafka's offset does not move past the unapplied batch: none committed, or the
    # assignment's convergence commit of the unchanged frontier 0 (issue 16)
    assert all(o < 0 or o == 0 for o in _kafka_committed(services.kafka_bootstrap, group,
                                                         topic, 2))


def test_shutdown_bound_is_final_even_for_work_ignoring_cancellation(services) -> None:
    topic, group, schema = _topic_with_records(services)
    with tempfile.TemporaryDirectory() as hold_dir:
        (Path(hold_dir) / "hold").write_text("hold")
        w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name="stubborn",
                       extra=("--handler", f"{HANDLERS}:stubborn_handler",
                              "--shutdown-timeout-s", "2", "--restart-lifetimes", "2"),
                       env={"FENCE_TEST_HOLD_DIR": hold_dir})
        try:
            wait_until(lambda: list(Path(hold_dir).glob("held-*")), timeout_s=60,
                       what="a batch held inside its transaction")
            started = time.monotonic()
            w.signal(signal.SIGTERM)
            code, log = _finish(w, 40)
            elapsed = time.monotonic() - started
        finally:
            (Path(hold_dir) / "hold").unlink(missing_ok=True)
    assert code == 6, log[-3000:]
    assert "shutdown bound 2.0s exceeded" in log and f"{topic}[" in log
    assert elapsed < 15, elapsed  # the bound, the close of the consumer and a margin
    assert log.count("lifetime.start") == 1  # no fresh lifetime beside abandoned work
