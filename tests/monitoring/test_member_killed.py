"""A SIGKILLed member, seen through a real Prometheus with the rules loaded.

Two members (KIP-848, the broker's 6 s session) share 4 partitions and are scraped by the
local stack's Prometheus. One is SIGKILLed: its target goes down (``FenceWorkerDown``
pending), and until the broker expires its session its partitions are owned by no live
member -- the survivor reports them with ``fence_partition_owned`` 0 -- so
``FencePartitionUnowned`` goes pending for exactly those partitions, and for no other.
Once the survivor claims them every partition is owned again, the alert leaves the active
alerts without firing (its ``for`` is 3 minutes), and every record is applied once.
"""

from __future__ import annotations

import asyncio
import functools
import time

import pytest

from ops.stack import prometheus as stack_prometheus
from ops.stack.config import ServiceSettings
from tests.integration.observability_support import free_port, http_get, metric, readyz
from tests.integration.workers import (
    GROUP_SETUPS,
    WorkerProc,
    committed_total,
    create_topic,
    exactly_once_problems,
    fresh_schema,
    generated,
    produce,
    unique,
)
from tests.monitoring.conftest import Prometheus
from tests.polling import wait_until

pytestmark = pytest.mark.integration

KIP848 = next(s for s in GROUP_SETUPS if s.name == "kip848-consumer")
PARTITIONS = 4


def _owned(base: str, group: str) -> set[int]:
    got = http_get(base + "/metrics")
    assert got is not None and got[0] == 200
    return {p for p in range(PARTITIONS)
            if metric(got[1], "fence_partition_owned", group=group, partition=str(p)) == 1}


def test_a_killed_members_partitions_go_unowned_until_the_survivor_claims_them(
        services: ServiceSettings, prometheus: Prometheus) -> None:
    dsn = services.dsn
    topic, group = unique("alert-kill"), unique("g-alert-kill")
    create_topic(services.kafka_bootstrap, topic, PARTITIONS)
    records, source = generated(topic, count=400, partitions=PARTITIONS, seed=33)
    schema = asyncio.run(fresh_schema(dsn))
    ports = {name: free_port() for name in ("w1", "w2")}
    base = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    instance = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    target = f"kill-{ports['w1']}"
    workers = {name: WorkerProc(topic=topic, group=group, schema=schema, setup=KIP848,
                                name=name, extra=("--http-port", str(port)))
               for name, port in ports.items()}
    owned_by_group = f'group_topic_partition:fence_partition_owned:max{{group="{group}"}}'
    try:
        stack_prometheus.write_targets(prometheus.settings, target, list(instance.values()))
        def owning_two(name: str) -> bool:
            r = readyz(base[name])
            return r is not None and r[0] == 200 and len(r[1]["assigned"]) == 2

        for name in workers:
            wait_until(functools.partial(owning_two, name), timeout_s=90,
                       what=f"{name} ready, owning 2 partitions")
        victim = _owned(base["w2"], group)
        assert len(victim) == 2 and _owned(base["w1"], group) == set(range(PARTITIONS)) - victim
        wait_until(lambda: len(prometheus.query(f"{owned_by_group} == 1")) == PARTITIONS,
                   timeout_s=30, what="Prometheus seeing every partition owned")
        produce(services.kafka_bootstrap, records[:200])

        killed_s = time.time()  # unowned moments of the startup (before the assigns) were earlier
        workers["w2"].kill()
        assert workers["w2"].wait(30) == -9
        wait_until(lambda: prometheus.alerts("FenceWorkerDown", instance=instance["w2"]),
                   timeout_s=30, what="FenceWorkerDown pending for the killed member")
        wait_until(lambda: _owned(base["w1"], group) == set(range(PARTITIONS)), timeout_s=60,
                   what="the survivor owning every partition")
        wait_until(lambda: len(prometheus.query(f"{owned_by_group} == 1")) == PARTITIONS,
                   timeout_s=30, what="Prometheus seeing every partition owned again")
        since_kill_s = int(time.time() - killed_s)  # whole seconds: none from before the kill
        went_pending = prometheus.query(
            f'max_over_time(ALERTS{{alertname="FencePartitionUnowned", group="{group}", '
            f'alertstate="pending"}}[{since_kill_s}s])')
        assert {int(s["metric"]["partition"]) for s in went_pending} == victim
        assert prometheus.query(f'ALERTS{{alertname="FencePartitionUnowned", '
                                f'group="{group}", alertstate="firing"}}') == []
        assert prometheus.alerts("FencePartitionUnowned", group=group) == []

        produce(services.kafka_bootstrap, records[200:])
        wait_until(lambda: committed_total(dsn, schema, group, topic) >= len(source),
                   timeout_s=90, what="every record processed by the survivor")
        workers["w1"].terminate()
        assert workers["w1"].wait(30) == 0, workers["w1"].log()[-3000:]
    finally:
        stack_prometheus.write_targets(prometheus.settings, target, [])
        for worker in workers.values():
            worker.ensure_dead()
    assert asyncio.run(exactly_once_problems(dsn, schema, group, topic, source)) == []
