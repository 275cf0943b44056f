"""Handler failures with real Kafka, PostgreSQL and ``fencectl run`` processes
(``tests.integration.handlers:failing_handler``): a transient error retried with backoff
while the sibling partition flows; a poison record in a 500-record batch bisected and
quarantined while the other 499 apply once; a record that SIGKILLs its process quarantined
after ``--max-attempts`` deaths, its count surviving the kills and the rebalances to the
other member."""

from __future__ import annotations

import asyncio
import json
import math
import re
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import asyncpg
import pytest
from confluent_kafka import Producer

from tests.integration.observability_support import run_fencectl
from tests.integration.workers import (
    GROUP_SETUPS,
    WorkerProc,
    create_topic,
    durable_rows,
    fresh_schema,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

SETUP = GROUP_SETUPS[1]  # cooperative-sticky, 2 s sessions
HANDLER = ("--handler", "tests.integration.handlers:failing_handler")


def _topic(services: Any, partitions: int, per_partition: int) -> tuple[str, str, str]:
    topic, group = unique("fail"), unique("gfail")
    create_topic(services.kafka_bootstrap, topic, partitions)
    p = Producer({"bootstrap.servers": services.kafka_bootstrap, "enable.idempotence": True,
                  "linger.ms": 5})
    for part in range(partitions):
        for o in range(per_partition):
            p.produce(topic, f"v{o}".encode(), f"k{o}".encode(), partition=part)
    assert p.flush(60) == 0
    return topic, group, asyncio.run(fresh_schema(services.dsn))


async def _fetch(dsn: str, sql: str, *args: Any) -> list[Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


def _applied(dsn: str, schema: str, topic: str) -> dict[tuple[int, int], int]:
    rows = asyncio.run(_fetch(dsn, f'SELECT partition, "offset", n FROM "{schema}".applied '
                                   "WHERE topic = $1", topic))
    return {(r["partition"], r["offset"]): r["n"] for r in rows}


def _quarantine(dsn: str, schema: str, group: str) -> list[Any]:
    return asyncio.run(_fetch(
        dsn, f'SELECT partition, "offset", reason, error_type, error_message, traceback_digest'
             f' FROM "{schema}".quarantine WHERE group_id = $1 ORDER BY partition, "offset"',
        group))


def _attempts(dsn: str, schema: str, group: str) -> dict[tuple[int, int], int]:
    rows = asyncio.run(_fetch(dsn, f'SELECT partition, "offset", attempts FROM "{schema}".attempts'
                                   " WHERE group_id = $1", group))
    return {(r["partition"], r["offset"]): r["attempts"] for r in rows}


def _frontiers(dsn: str, schema: str, group: str, topic: str) -> dict[int, int]:
    return {p: f for p, (_e, f) in asyncio.run(durable_rows(dsn, schema, group, topic)).items()}


def _stop(w: WorkerProc) -> tuple[int, str]:
    try:
        w.terminate()
        code = w.wait(30)
    finally:
        w.ensure_dead()
    return code, w.log()


def test_transient_twice_applies_once_after_backoff_while_the_sibling_flows(services) -> None:
    topic, group, schema = _topic(services, partitions=2, per_partition=200)
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name="transient",
                   extra=(*HANDLER, "--handler-setting", "transient=0:10",
                          "--handler-setting", "transient_times=2", "--batch-max-records", "50",
                          # backoffs of 2-4 s then 4-8 s (jitter x[0.5, 1)): a window wide
                          # enough for a cold `fencectl status` on a loaded machine
                          "--retry-initial-ms", "4000", "--retry-max-ms", "8000"))
    pool = ThreadPoolExecutor(1)
    try:
        done: dict[int, float] = {}
        job: Future[Any] | None = None

        def progress() -> bool:
            nonlocal job
            now = time.monotonic()
            for p, f in _frontiers(services.dsn, schema, group, topic).items():
                if f == 200:
                    done.setdefault(p, now)
            if 0 not in done and job is None and _attempts(services.dsn, schema, group):
                # a durable count while partition 0 backs off: status shows it retrying (run
                # beside this poll, which keeps stamping completions while it runs)
                job = pool.submit(run_fencectl, "status", "--json", "--group", group,
                                  "--schema", schema, env={"FENCE_DSN": services.dsn})
            return len(done) == 2

        wait_until(progress, timeout_s=90, what="both partitions complete", interval_s=0.1)
        code, log = _stop(w)
        assert job is not None, "no attempt count was ever seen while partition 0 backed off"
        out = job.result(timeout=60)
    finally:
        w.ensure_dead()
        pool.shutdown(wait=False, cancel_futures=True)
    assert code == 0, log[-3000:]
    assert out.returncode == 0, out.stderr
    status: list[dict[str, Any]] = json.loads(out.stdout)["partitions"]
    applied = _applied(services.dsn, schema, topic)
    assert applied == {(p, o): 1 for p in (0, 1) for o in range(200)}  # each exactly once
    assert _quarantine(services.dsn, schema, group) == []
    assert _attempts(services.dsn, schema, group) == {}  # deleted with the frontier
    [p0] = [p for p in status if p["partition"] == 0]
    retrying = p0["retrying"]
    assert retrying is not None and retrying["offset"] == 0 and retrying["max_attempts"] == 5
    assert retrying["attempt"] in (2, 3) and retrying["next_retry_at"] is not None
    assert any(n.startswith("retrying offset 0: attempt") for n in p0["notes"])
    assert done[1] < done[0]  # the sibling completed while partition 0 backed off
    assert "SerializationError" in log and "Transient: downstream busy (failure 2)" in log
    assert log.count("lifetime.start") == 1 and "lifetime ends" not in log


def test_poison_in_a_500_record_batch_is_quarantined_and_499_apply_once(services) -> None:
    topic, group, schema = _topic(services, partitions=1, per_partition=500)
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name="poison",
                   extra=(*HANDLER, "--handler-setting", "poison=0:250",
                          "--batch-max-records", "500"))
    try:
        wait_until(lambda: _frontiers(services.dsn, schema, group, topic).get(0) == 500,
                   timeout_s=90, what="the partition complete")
        code, log = _stop(w)
    finally:
        w.ensure_dead()
    assert code == 0, log[-3000:]
    assert _applied(services.dsn, schema, topic) == {(0, o): 1 for o in range(500) if o != 250}
    [q] = _quarantine(services.dsn, schema, group)
    assert (q["partition"], q["offset"], q["error_type"]) == (0, 250, "ValueError")
    assert q["error_message"] == "cannot parse record 250 of partition 0"
    assert re.fullmatch(r"[0-9a-f]{16}", q["traceback_digest"])
    m = re.search(r"bisected (\d+) records in (\d+) probes, 1 poison", log)
    assert m is not None, log[-3000:]
    size, probes = int(m[1]), int(m[2])
    assert probes <= math.ceil(math.log2(size))
    print(f"poison batch of {size} records: {probes} probe transactions")  # the note's number
    assert log.count("lifetime.start") == 1


def test_a_record_that_kills_its_process_is_quarantined_after_max_attempts_deaths(
        services) -> None:
    """Two members; whichever owns partition 0 SIGKILLs itself on offset 5. The dead are
    restarted (as a supervisor would) once no member is left, so the survivor always takes
    the partition over first (a restart after a fixed delay raced a survivor slowed by load
    for it: the deaths' order then depended on timing)."""
    topic, group, schema = _topic(services, partitions=2, per_partition=40)
    extra = (*HANDLER, "--handler-setting", "kill=0:5", "--max-attempts", "2")
    members = {name: WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP,
                                name=name, extra=extra) for name in ("a", "b")}
    deaths: list[tuple[str, dict[tuple[int, int], int]]] = []
    dead: set[str] = set()
    try:
        def supervise() -> bool:
            for name, w in list(members.items()):
                if name not in dead and not w.alive():
                    assert w.wait(1) == -signal.SIGKILL, w.log()[-3000:]
                    deaths.append((name, _attempts(services.dsn, schema, group)))
                    dead.add(name)
            if dead == set(members):  # both started together: their set-ups must not race
                for name in sorted(dead):
                    members[name] = WorkerProc(topic=topic, group=group, schema=schema,
                                               setup=SETUP, name=name, extra=extra)
                dead.clear()
            return _frontiers(services.dsn, schema, group, topic) == {0: 40, 1: 40}

        wait_until(supervise, timeout_s=150, what="both partitions complete", interval_s=0.2)
    finally:
        for w in members.values():
            w.ensure_dead()
    # 1 death in a multi-record batch (not yet attributed), then 2 counted: the record alone,
    # its count written before each attempt and left behind by the SIGKILL
    assert [counts.get((0, 5)) for _name, counts in deaths] == [None, 1, 2], deaths
    assert len({name for name, _ in deaths}) == 2  # it moved to the other member and back
    [q] = _quarantine(services.dsn, schema, group)
    assert (q["partition"], q["offset"], q["error_type"]) == (0, 5, "ProcessDeath")
    assert "after 2 attempts that did not complete" in q["reason"]
    assert "killed the process" in q["reason"]
    assert _applied(services.dsn, schema, topic) == {
        (p, o): 1 for p in (0, 1) for o in range(40) if (p, o) != (0, 5)}
    assert _attempts(services.dsn, schema, group) == {}


def test_idle_members_killed_repeatedly_never_quarantine(services) -> None:
    """SIGKILL an idle owner three times (--max-attempts 1): each successor sees the unclean
    end, but nothing was in flight, so no count accumulates and nothing is quarantined."""
    topic, group, schema = _topic(services, partitions=1, per_partition=10)
    extra = (*HANDLER, "--max-attempts", "1")
    for n in range(3):
        before = asyncio.run(durable_rows(services.dsn, schema, group, topic)).get(0, (0, 0))[0]

        def claimed_and_complete(before: int = before) -> bool:
            r = asyncio.run(durable_rows(services.dsn, schema, group, topic)).get(0)
            return r is not None and r[0] > before and r[1] == 10

        w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name=f"idle{n}",
                       extra=extra)
        try:
            # this member claimed the partition (a new epoch) and it is complete: from the
            # second round on the frontier is 10 already, so the claim is what to wait for
            wait_until(claimed_and_complete, timeout_s=60, what="claimed and complete")
            time.sleep(0.5)  # idle now
            w.kill()
            assert w.wait(30) == -signal.SIGKILL
        finally:
            w.ensure_dead()
        assert _quarantine(services.dsn, schema, group) == []
        assert _attempts(services.dsn, schema, group) == {}
    # new records after the third death: applied once, one by one, nothing quarantined
    p = Producer({"bootstrap.servers": services.kafka_bootstrap, "enable.idempotence": True})
    for o in range(10, 20):
        p.produce(topic, f"v{o}".encode(), f"k{o}".encode(), partition=0)
    assert p.flush(60) == 0
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=SETUP, name="idle-last",
                   extra=extra)
    try:
        wait_until(lambda: _frontiers(services.dsn, schema, group, topic).get(0) == 20,
                   timeout_s=60, what="the new records")
        code, log = _stop(w)
    finally:
        w.ensure_dead()
    assert code == 0, log[-3000:]
    assert _quarantine(services.dsn, schema, group) == []
    assert _applied(services.dsn, schema, topic) == {(0, o): 1 for o in range(20)}
    assert _attempts(services.dsn, schema, group) == {}
