"""An idle worker costs nothing: with no new records, a real worker (its PostgreSQL traffic
routed through ``fencing.testing.pgproxy``, which sees every statement executed) issues only
member heartbeats, at their configured rate, and uses under 1% of a CPU.

The window is 60 s (the issue's), after the worker committed its backlog and settled.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from tests.integration.workers import (
    GROUP_SETUPS,
    ProxyThread,
    WorkerProc,
    committed_total,
    create_topic,
    fresh_schema,
    generated,
    produce,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

WINDOW_S = 60.0
HEARTBEAT_S = 2.0
HEARTBEAT_SQL = ".members AS m"  # the heartbeat upsert (fencing.postgres.sql)


def _cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_idle_worker_issues_only_heartbeats_and_uses_no_cpu(services) -> None:
    dsn, bootstrap = services.dsn, services.kafka_bootstrap
    topic, group = unique("idle"), unique("gidle")
    create_topic(bootstrap, topic, 3)
    recs, _source = generated(topic, count=300, partitions=3, seed=5)
    produce(bootstrap, recs)
    schema = asyncio.run(fresh_schema(dsn))
    proxy = ProxyThread(dsn)
    setup = next(s for s in GROUP_SETUPS if s.name == "cooperative-sticky")
    w = WorkerProc(topic=topic, group=group, schema=schema, setup=setup, name="idle",
                   extra=("--heartbeat-interval-s", str(HEARTBEAT_S)),
                   env={"FENCE_DSN": proxy.dsn})
    try:
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= len(recs),
                   timeout_s=60, what="the backlog committed")
        time.sleep(3.0)  # the last Kafka commit, the member row's state change
        t0, cpu0 = time.monotonic(), _cpu_s(w.pid)
        time.sleep(WINDOW_S)
        t1, cpu1 = time.monotonic(), _cpu_s(w.pid)
        assert w.alive(), w.log()[-3000:]
        window = [sql for at, sql in list(proxy.proxy.statements) if t0 <= at < t1]
        w.terminate()
        assert w.wait(30) == 0, w.log()[-3000:]
    finally:
        w.ensure_dead()
        proxy.close()
    others = [sql for sql in window if HEARTBEAT_SQL not in sql]
    assert others == [], f"an idle worker issued {len(others)} other statements: {others[:5]}"
    expected = WINDOW_S / HEARTBEAT_S
    assert expected - 2 <= len(window) <= expected + 2, (len(window), expected)
    cpu_share = (cpu1 - cpu0) / (t1 - t0)
    print(f"idle {t1 - t0:.0f} s: {len(window)} heartbeats, CPU {cpu_share:.3%}")
    assert cpu_share < 0.01, f"idle worker used {cpu_share:.2%} of a CPU"
