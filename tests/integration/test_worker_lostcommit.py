"""Lost COMMIT replies during real consumption, through ``fencing.testing.pgproxy``: a worker
process talks to PostgreSQL through the proxy, which cuts connections around COMMIT both ways
(the server committed and the reply was lost; the server never saw COMMIT). Both unknown
outcomes must resolve by re-reading the fence row: no duplicate effect, nothing missing, no
retirement."""

from __future__ import annotations

import asyncio

import pytest

from fencing.testing.pgproxy import Action
from tests.integration.workers import (
    GROUP_SETUPS,
    GroupSetup,
    ProxyThread,
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


@pytest.mark.parametrize("setup", GROUP_SETUPS, ids=lambda s: s.name)
def test_lost_commit_replies_resolve_without_duplicates(services, setup: GroupSetup) -> None:
    bootstrap, dsn = services.kafka_bootstrap, services.dsn
    topic, group = unique("lost"), unique("glost")
    create_topic(bootstrap, topic, 3)
    recs, source = generated(topic, count=10_000, partitions=3, klass="conflict", seed=13)
    produce(bootstrap, recs)
    schema = asyncio.run(fresh_schema(dsn))
    proxy = ProxyThread(dsn)
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name="lost",
                   extra=("--batch-max-records", "10", "--db-concurrency", "1"),
                   env={"FENCE_DSN": proxy.dsn})
    try:
        # The worker's start-up (schema check, handler tables) is done once it is assigned.
        wait_until(lambda: "assigned {" in w.log(), timeout_s=30, what="assignment")
        # One cut at a time: three cuts in a row of the same batch would exhaust the
        # three-call policy (and rightly end the lifetime).
        fired = []
        for action in (Action.CUT_AFTER, Action.CUT_BEFORE) * 3:
            rule = proxy.add_rule("COMMIT", action, times=1)
            wait_until(lambda rule=rule: rule.count >= 1,  # type: ignore[misc]
                       timeout_s=30, what=f"{action} fired")
            fired.append(action)
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= len(source),
            timeout_s=90, what="every record committed")
        assert len(fired) == 6
        w.terminate()
        assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        w.ensure_dead()
        proxy.close()
    assert "lifetime ends" not in w.log()
    assert asyncio.run(exactly_once_problems(dsn, schema, group, topic, source)) == []
