"""Liveness with real Kafka and PostgreSQL: a partition that was paused (its local queue was
full) and then moved away and back -- or lost and re-assigned -- is fetched again.

librdkafka keeps an application ``pause()`` across unassign/assign of the same partition on
the same handle (librdkafka #1849, confluent-kafka-go #193); the worker must reconcile the
pause state on every assignment. Each test keeps every partition paused most of the time
(a queue bound of 2 batches of 10 records under a 10,000-record backlog, processed at about
400 records/s by a handler that sleeps 0.1 s per batch), moves partitions while they are
paused, and asserts that every record is processed exactly once.
"""

from __future__ import annotations

import asyncio
import signal

import pytest
from confluent_kafka.admin import AdminClient

from tests.integration.workers import (
    GROUP_SETUPS,
    GroupSetup,
    WorkerProc,
    committed_total,
    create_topic,
    exactly_once_problems,
    fresh_schema,
    generated,
    produce,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
COUNT = 10_000
# every partition pauses at once: one consume() delivers far more than 2 x 10 records
SMALL_QUEUE = ("--batch-max-records", "10", "--queue-max-batches", "2",
               "--handler", "tests.integration.handlers:slow_handler")
SLOW = {"FENCE_TEST_BATCH_DELAY_S": "0.1"}


def _owners(dsn: str, schema: str, group: str, topic: str) -> set[str]:
    async def read() -> set[str]:
        import asyncpg

        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch(f'SELECT owner FROM "{schema}".partitions '
                                    "WHERE group_id = $1 AND topic = $2", group, topic)
        finally:
            await conn.close()
        return {r["owner"] for r in rows}
    return asyncio.run(read())


def _backlog(services, *, seed: int) -> tuple[str, str, str, list]:
    topic, group = unique("live"), unique("glive")
    create_topic(services.kafka_bootstrap, topic, PARTITIONS)
    recs, source = generated(topic, count=COUNT, partitions=PARTITIONS, seed=seed)
    produce(services.kafka_bootstrap, recs)
    schema = asyncio.run(fresh_schema(services.dsn))
    return topic, group, schema, source


@pytest.mark.parametrize("setup", GROUP_SETUPS, ids=lambda s: s.name)
def test_paused_partition_moved_away_and_back_is_fetched_again(services,
                                                              setup: GroupSetup) -> None:
    """Item 1: a second member joins (partitions move away, for eager ones also back),
    then leaves (they move back): every record is processed."""
    dsn = services.dsn
    topic, group, schema, source = _backlog(services, seed=21)
    procs: list[WorkerProc] = []
    try:
        w1 = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name="w1",
                        extra=SMALL_QUEUE, env=SLOW)
        procs.append(w1)
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= 400, timeout_s=60,
                   what="w1 processing")
        w2 = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name="w2",
                        extra=SMALL_QUEUE, env=SLOW)
        procs.append(w2)
        wait_until(lambda: len(_owners(dsn, schema, group, topic)) == 2, timeout_s=60,
                   what="both members owning partitions")
        done = committed_total(dsn, schema, group, topic)
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= done + 400, timeout_s=60,
                   what="progress with two members")
        w2.terminate()
        assert w2.wait(30) == 0, w2.log()[-3000:]
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= COUNT, timeout_s=120,
                   what="every record processed after the partitions moved back")
        w1.terminate()
        assert w1.wait(30) == 0, w1.log()[-3000:]
    finally:
        for w in procs:
            w.ensure_dead()
    assert asyncio.run(exactly_once_problems(dsn, schema, group, topic, source)) == []


@pytest.mark.parametrize("setup", GROUP_SETUPS, ids=lambda s: s.name)
def test_paused_partition_lost_and_reassigned_is_fetched_again(services,
                                                              setup: GroupSetup) -> None:
    """Item 1, lost assignment: the only member is stopped past its session timeout
    (SIGSTOP), its assignment is lost (``on_lost``), it rejoins and gets the same paused
    partitions back: every record is processed."""
    dsn = services.dsn
    topic, group, schema, source = _backlog(services, seed=22)
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name="solo",
                   extra=SMALL_QUEUE, env=SLOW)
    try:
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= 400, timeout_s=60,
                   what="processing")
        admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap})

        def expired() -> bool:  # the broker dropped the stopped member (session timeout)
            return not admin.describe_consumer_groups([group])[group].result(10).members

        w.signal(signal.SIGSTOP)
        # classic session 2 s; KIP-848 broker session 6 s: waited for, not slept (a loaded
        # broker may expire the member late, and a member resumed before that is not lost)
        wait_until(expired, timeout_s=60, what="the stopped member expired", interval_s=0.5)
        w.signal(signal.SIGCONT)
        wait_until(lambda: "lost {" in w.log(), timeout_s=60, what="the assignment lost")
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= COUNT, timeout_s=120,
                   what="every record processed after the lost assignment")
        w.terminate()
        assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        w.ensure_dead()
    assert asyncio.run(exactly_once_problems(dsn, schema, group, topic, source)) == []


def test_a_stall_is_visible_in_readyz_metrics_status_and_the_log(services) -> None:
    """Item 2: partitions with lag that make no fetch or commit progress for
    ``--stall-timeout-s`` are reported -- here because every batch is held inside its
    transaction (a stuck downstream) -- and the report clears once they progress again."""
    import json
    import tempfile
    from pathlib import Path

    from tests.integration.observability_support import (
        free_port,
        http_get,
        metric,
        readyz,
        run_fencectl,
        start_worker,
    )

    dsn = services.dsn
    topic, group = unique("stall"), unique("gstall")
    create_topic(services.kafka_bootstrap, topic, 2)
    recs, source = generated(topic, count=400, partitions=2, seed=23)
    produce(services.kafka_bootstrap, recs)
    schema = asyncio.run(fresh_schema(dsn))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as hold_dir:
        hold = Path(hold_dir) / "hold"
        hold.write_text("hold")
        w = start_worker(topic=topic, group=group, schema=schema, http_port=port,
                         env={"FENCE_TEST_HOLD_DIR": hold_dir},
                         extra=("--handler", "tests.integration.handlers:holding_handler",
                                "--stall-timeout-s", "2", "--batch-max-records", "10",
                                "--db-idle-in-transaction-timeout-s", "19"))
        try:
            stalled = wait_until(
                lambda: (r := readyz(base)) and r[0] == 503 and len(r[1]["stalled"]) == 2 and r,
                timeout_s=30, what="/readyz naming both stalled partitions")
            assert stalled[1]["phase"] == "ready"  # positioned, but not making progress
            assert sorted(stalled[1]["stalled"]) == [f"{topic}[0]", f"{topic}[1]"]
            assert "stalled" in stalled[1]["reason"]
            got = http_get(base + "/metrics")
            assert got is not None and metric(got[1], "fence_partitions_stalled") == 2
            status = wait_until(lambda: (p := run_fencectl(
                "status", "--group", group, "--schema", schema, "--json")).returncode == 0
                and all(x["stalled"] for x in json.loads(p.stdout)["partitions"]) and p,
                timeout_s=15, what="fencectl status showing the partitions stalled")
            assert "stalled" in run_fencectl("status", "--group", group,
                                             "--schema", schema).stdout
            assert status.returncode == 0
            assert "stalled: lag" in w.log()
            hold.unlink()  # the downstream recovers
            wait_until(lambda: (r := readyz(base)) and r[0] == 200, timeout_s=30,
                       what="ready again once the partitions progress")
            got = http_get(base + "/metrics")
            assert got is not None and metric(got[1], "fence_partitions_stalled") == 0
            wait_until(lambda: committed_total(dsn, schema, group, topic) >= len(source),
                timeout_s=60, what="every record processed")
            w.terminate()
            assert w.wait(30) == 0, w.log()[-3000:]
        finally:
            hold.unlink(missing_ok=True)
            w.ensure_dead()
    assert asyncio.run(exactly_once_problems(dsn, schema, group, topic, source)) == []
