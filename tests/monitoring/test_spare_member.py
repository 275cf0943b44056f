"""A spare member under the KIP-848 protocol, seen through a real Prometheus.

With ``group.protocol=consumer`` a member that gets no partition (here: 2 members, 1
partition) receives no assignment callback at all, so its readiness stays ``waiting`` and
``/readyz`` answers 503 for as long as it is spare (the classic protocols call it with an
empty assignment and it is ready). ``FenceWorkerNotReady`` leaves a waiting member out, so
it does not even go pending for the spare; when the owner is SIGKILLed, the spare gets the
partition and is ready.
"""

from __future__ import annotations

import asyncio

import pytest

from ops.stack import prometheus as stack_prometheus
from ops.stack.config import ServiceSettings
from tests.integration.observability_support import free_port, readyz
from tests.integration.workers import (
    GROUP_SETUPS,
    WorkerProc,
    create_topic,
    fresh_schema,
    unique,
)
from tests.monitoring.conftest import Prometheus
from tests.polling import wait_until

pytestmark = pytest.mark.integration

KIP848 = next(s for s in GROUP_SETUPS if s.name == "kip848-consumer")


def test_a_spare_kip848_member_waits_and_the_not_ready_alert_leaves_it_out(
        services: ServiceSettings, prometheus: Prometheus) -> None:
    topic, group = unique("alert-spare"), unique("g-alert-spare")
    create_topic(services.kafka_bootstrap, topic, 1)
    schema = asyncio.run(fresh_schema(services.dsn))
    ports = {name: free_port() for name in ("w1", "w2")}
    base = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    instance = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    target = f"spare-{ports['w1']}"
    workers: dict[str, WorkerProc] = {}
    try:
        stack_prometheus.write_targets(prometheus.settings, target, list(instance.values()))
        workers["w1"] = WorkerProc(topic=topic, group=group, schema=schema, setup=KIP848,
                                   name="w1", extra=("--http-port", str(ports["w1"])))
        wait_until(lambda: (r := readyz(base["w1"])) is not None and r[0] == 200
                   and r[1]["assigned"] == [f"{topic}[0]"], timeout_s=90, what="w1 owning it")
        workers["w2"] = WorkerProc(topic=topic, group=group, schema=schema, setup=KIP848,
                                   name="w2", extra=("--http-port", str(ports["w2"])))
        spare = f'instance="{instance["w2"]}"'
        # 10 scrapes of the spare waiting, each followed by an evaluation of the rules
        wait_until(lambda: prometheus.query(
            f'count_over_time(fence_worker_phase{{{spare}, phase="waiting"}}[1m]) >= 10 '
            f'and fence_worker_phase{{{spare}, phase="waiting"}} == 1'),
                   timeout_s=90, what="the spare scraped 10 times while waiting")
        got = readyz(base["w2"])
        assert got is not None and got[0] == 503
        assert (got[1]["phase"], got[1]["assigned"]) == ("waiting", [])
        assert prometheus.query(f"fence_worker_ready{{{spare}}} == 0")
        assert prometheus.alerts("FenceWorkerNotReady", instance=instance["w2"]) == []
        assert prometheus.alerts("FencePartitionUnowned", group=group) == []
        got = readyz(base["w1"])
        assert got is not None and got[0] == 200  # the owner is unaffected

        workers["w1"].kill()
        wait_until(lambda: (r := readyz(base["w2"])) is not None and r[0] == 200
                   and r[1]["assigned"] == [f"{topic}[0]"], timeout_s=90,
                   what="the spare owning the partition once the owner is gone")
        workers["w2"].terminate()
        assert workers["w2"].wait(30) == 0, workers["w2"].log()[-3000:]
    finally:
        stack_prometheus.write_targets(prometheus.settings, target, [])
        for worker in workers.values():
            worker.ensure_dead()
