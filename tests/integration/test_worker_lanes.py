"""``--lanes 8`` against real Kafka and PostgreSQL: a handler that waits 20 ms per batch
(an external call) over the reference handler's effects, members SIGKILLed at random
points and a frozen (SIGSTOP) zombie continued after its partitions moved on (it may rejoin
the group as a member; it is then stopped); then lost COMMIT replies of lane transactions,
the Kafka broker lost and PostgreSQL crashed under two members running lanes. The effects
must equal the oracle's fold of the whole source (nothing applied twice, nothing lost,
each document's revisions in order), and every partition row ends at its high watermark
(folded)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from fencing.postgres.store import PgFenceStore
from fencing.store import BatchCall
from fencing.testing.pgproxy import Action
from fencing.types import ACCEPT, ClaimRequest, SourceRecord, TopicPartition
from tests.integration.workers import (
    GROUP_SETUPS,
    GroupSetup,
    ProxyThread,
    WorkerProc,
    committed_total,
    crash_kafka,
    crash_postgres,
    create_topic,
    exactly_once_problems,
    fresh_schema,
    generated,
    produce,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

LANES = ("--lanes", "8", "--batch-max-records", "20", "--db-concurrency", "8",
         "--handler", "tests.integration.handlers:slow_handler")
SLOW = {"FENCE_TEST_BATCH_DELAY_S": "0.02"}


@pytest.mark.parametrize("setup", GROUP_SETUPS, ids=lambda s: s.name)
def test_lanes_survive_kills_and_a_zombie_exactly_once(services, setup: GroupSetup) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("lanes"), unique("glanes")
    create_topic(bootstrap, topic, 3)
    recs, source = generated(topic, count=6_000, partitions=3, klass="conflict", seed=23)
    produce(bootstrap, recs)
    schema = asyncio.run(fresh_schema(dsn))
    rng = random.Random(f"lanes-{setup.name}")
    workers: list[WorkerProc] = []

    def start(name: str) -> WorkerProc:
        w = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name=name,
                       extra=LANES, env=SLOW)
        workers.append(w)
        return w

    try:
        for round_ in range(3):  # SIGKILL mid-lanes, at a random point
            w = start(f"k{round_}")
            wait_until(lambda w=w: "assign {" in w.log(), timeout_s=30,  # type: ignore[misc]
                       what="assignment")
            time.sleep(rng.uniform(0.3, 1.5))
            w.kill()
            w.wait(10)
        zombie = start("zombie")
        wait_until(lambda: "assign {" in zombie.log(), timeout_s=30, what="assignment")
        time.sleep(rng.uniform(0.3, 1.0))
        os.kill(zombie.pid, signal.SIGSTOP)  # frozen mid-lanes: its session times out
        final = start("final")
        wait_until(lambda: "assigned {" in final.log(), timeout_s=60, what="final assigned")
        time.sleep(rng.uniform(1.0, 3.0))
        # its lanes meet a newer epoch (nothing applies); it may rejoin as a member after
        os.kill(zombie.pid, signal.SIGCONT)
        time.sleep(3.0)
        zombie.terminate()
        assert zombie.wait(60) in (0, 3), zombie.log()[-3000:]
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= len(source),
                   timeout_s=180, what="every record committed (folded) after the faults")
        final.terminate()
        assert final.wait(30) == 0, final.log()[-3000:]
    finally:
        for w in workers:
            w.ensure_dead()
    assert asyncio.run(exactly_once_problems(dsn, schema, group, topic, source)) == []


@pytest.mark.exclusive  # crashes the stack's Kafka and PostgreSQL
@pytest.mark.parametrize("setup", GROUP_SETUPS, ids=lambda s: s.name)
def test_lanes_survive_lost_commit_replies_a_broker_loss_and_a_postgres_crash(
        services, setup: GroupSetup) -> None:
    """Two members with ``--lanes 8``, one through a proxy that loses lane COMMIT replies
    (after the server committed, and before), then the broker lost (SIGKILL, started again)
    and PostgreSQL crashed (SIGQUIT, crash recovery): members ride the outages out or exit
    5 (a service unavailable past ``--outage-bound-s``) and are started again, as their
    supervisor does; a lane is never applied twice or skipped."""
    from ops.stack.config import settings_from

    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("lanescrash"), unique("glanescrash")
    create_topic(bootstrap, topic, 3)
    recs, source = generated(topic, count=6_000, partitions=3, klass="conflict", seed=29)
    chunks = [recs[k * 1_000:(k + 1) * 1_000] for k in range(6)]  # in source order
    produce(bootstrap, chunks[0])
    schema = asyncio.run(fresh_schema(dsn))
    proxy = ProxyThread(dsn)
    members: list[WorkerProc] = []
    spawned: dict[WorkerProc, tuple[str, dict[str, str]]] = {}
    ended: list[tuple[str, int, str]] = []

    def member(name: str, env: dict[str, str]) -> WorkerProc:
        w = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name=name,
                       extra=LANES, env={**SLOW, **env})
        members.append(w)
        spawned[w] = (name, env)
        return w

    def supervise() -> None:
        for w in [w for w in members if not w.alive()]:
            members.remove(w)
            code = w.wait(5)
            name, env = spawned[w]
            ended.append((name, code, w.log()[-2000:]))
            if code == 5:  # a service unavailable past its bound: its supervisor restarts it
                member(name + "'", env)

    try:
        member("a", {"FENCE_DSN": proxy.dsn})
        member("b", {})
        wait_until(lambda: all("assigned {" in w.log() for w in members), timeout_s=60,
                   what="both members assigned")
        for chunk, action in zip(chunks[1:5], (Action.CUT_AFTER, Action.CUT_BEFORE) * 2,
                                 strict=True):  # lane COMMIT replies lost, with work to do
            rule = proxy.add_rule("COMMIT", action, times=1)
            produce(bootstrap, chunk)
            wait_until(lambda rule=rule: rule.count >= 1,  # type: ignore[misc]
                       timeout_s=60, what=f"{action} fired")
        settings = settings_from()
        produce(bootstrap, chunks[5])  # lanes busy when the broker goes
        crash_kafka(settings, while_down=lambda: time.sleep(2))
        crash_postgres(settings)
        deadline = time.monotonic() + 240
        while committed_total(dsn, schema, group, topic) < len(source):
            assert time.monotonic() < deadline, ("not every record committed (folded) after "
                                                 f"the faults; ended: {ended}")
            supervise()
            time.sleep(1)
        supervise()
        for w in list(members):
            w.terminate()
            assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        for w in list(spawned):
            w.ensure_dead()
        proxy.close()
    assert all(code == 5 for _, code, _ in ended), ended
    assert asyncio.run(exactly_once_problems(dsn, schema, group, topic, source)) == []


def test_a_reset_starts_the_partition_again_without_its_lanes_spans(services) -> None:
    """``fencectl reset frontier`` moves a partition back: the spans its lanes applied are
    deleted with the reset (from the new frontier on, everything runs again)."""
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("lanesreset"), unique("glanesreset")
    create_topic(bootstrap, topic, 1)
    schema = asyncio.run(fresh_schema(dsn))
    tp = TopicPartition(topic, 0)

    async def lanes_applied() -> None:
        store = await PgFenceStore.connect(dsn, group_id=group, schema=schema, pool_max=2)
        try:
            token = (await store.claim([ClaimRequest(tp, 0)], lifetime="lt-lanes"))[tp]

            async def accept(conn: Any, records: Any) -> list[Any]:
                return [ACCEPT] * len(records)

            recs = [SourceRecord(topic, 0, o, b"k", b"v") for o in (3, 7)]
            await store.process_lane(BatchCall(tp, recs, accept), token, [(0, 3), (7, 7)])
            got = (await store.completions([tp]))[tp]
            assert got is not None and got.frontier == 4 and got.spans == ((0, 3), (7, 7))
        finally:
            await store.close()

    asyncio.run(lanes_applied())
    out = subprocess.run(
        [sys.executable, "-m", "ops.cli", "reset", "frontier", "--group", group, "--topic",
         topic, "--partition", "0", "--to-offset", "0", "--schema", schema,
         "--yes-i-understand", "--bootstrap-servers", bootstrap],
        capture_output=True, text=True, timeout=120, env={**os.environ, "FENCE_DSN": dsn})
    assert out.returncode == 0, out.stdout + out.stderr

    async def after() -> None:
        store = await PgFenceStore.connect(dsn, group_id=group, schema=schema, pool_max=1)
        try:
            got = (await store.completions([tp]))[tp]
            assert got is not None and (got.base, got.spans, got.epoch) == (0, (), 2)
        finally:
            await store.close()

    asyncio.run(after())
