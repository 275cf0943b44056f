"""Lost COMMIT replies during real consumption, through ``ops.pgproxy``: a worker process talks
to PostgreSQL through the proxy, which cuts connections around COMMIT both ways (the server
committed and the reply was lost; the server never saw COMMIT). Both unknown outcomes must
resolve by re-reading the fence row: no duplicate effect, nothing missing, no retirement."""

from __future__ import annotations

import asyncio
import threading
from typing import Any
from urllib.parse import urlsplit

import pytest

from ops.pgproxy import Action, PgProxy, Rule
from tests.integration.workers import (
    GROUP_SETUPS,
    GroupSetup,
    WorkerProc,
    create_topic,
    durable_rows,
    exactly_once_problems,
    fresh_schema,
    generated,
    produce,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration


class ProxyThread:
    """A ``PgProxy`` on its own event loop thread, so worker subprocesses can use it."""

    def __init__(self, dsn: str) -> None:
        parts = urlsplit(dsn)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.proxy = self._call(PgProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
                                .start())
        self.dsn = self.proxy.dsn(dsn)

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def add_rule(self, needle: str, action: Action, times: int) -> Rule:
        async def add() -> Rule:
            return self.proxy.add_rule(needle, action, times=times)
        return self._call(add())

    def close(self) -> None:
        self._call(self.proxy.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


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
        wait_until(lambda: sum(f for _e, f in asyncio.run(
            durable_rows(dsn, schema, group, topic)).values()) >= len(source),
            timeout_s=90, what="every record committed")
        assert len(fired) == 6
        w.terminate()
        assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        w.ensure_dead()
        proxy.close()
    assert "lifetime ends" not in w.log()
    assert asyncio.run(exactly_once_problems(dsn, schema, group, topic, source)) == []
