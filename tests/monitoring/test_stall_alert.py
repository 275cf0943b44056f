"""A frozen partition fires FencePartitionStalled through a real Prometheus, which then
resolves once the partition progresses.

The local stack's Prometheus loads ops/monitoring/fenceworker.rules.yml and scrapes the
worker at the target this test writes. The worker's downstream is down (every batch fails
with ``Transient`` while the hold file exists), so both partitions keep their lag and make
no fetch or commit progress: past ``--stall-timeout-s`` the worker counts them in
``fence_partitions_stalled``, the alert goes pending and, after its ``for: 1m``, firing.
Removing the file lets the retries commit: the gauge returns to 0 and the alert leaves
Prometheus's active alerts. Every record is then applied exactly once.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ops.stack import prometheus as stack_prometheus
from ops.stack.config import ServiceSettings
from tests.integration.observability_support import free_port, http_get, metric, start_worker
from tests.integration.workers import (
    GroupSetup,
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

ALERT = "FencePartitionStalled"
FOR_S = 60.0  # the rule's `for: 1m`
# retried for as long as the file exists, and never quarantined as a suspect: a lost
# assignment would make the counted retries "unfinished attempts" at the next claim
FROZEN = ("--handler", "tests.integration.handlers:transient_while_held_handler",
          "--stall-timeout-s", "2", "--batch-max-records", "10",
          "--retry-max-attempts", "1000000", "--max-attempts", "1000000",
          "--retry-initial-ms", "100", "--retry-max-ms", "500")
# one member and no rebalance wanted: a session that outlasts a loaded broker's hiccup (a
# lost assignment ends the stall and restarts the alert's `for`)
PATIENT = GroupSetup("patient-eager", ("--group-protocol", "classic", "--assignment-strategy",
                                       "range", "-X", "session.timeout.ms=30000", "-X",
                                       "heartbeat.interval.ms=1000"))


def _alert(prometheus: Prometheus, instance: str) -> dict[str, Any] | None:
    alerts = prometheus.alerts(ALERT, instance=instance)
    assert len(alerts) <= 1, alerts
    return alerts[0] if alerts else None


def test_a_stalled_partition_fires_the_alert_and_it_resolves(services: ServiceSettings,
                                                             prometheus: Prometheus) -> None:
    dsn = services.dsn
    topic, group = unique("alert-stall"), unique("g-alert-stall")
    create_topic(services.kafka_bootstrap, topic, 2)
    records, source = generated(topic, count=200, partitions=2, seed=32)
    schema = asyncio.run(fresh_schema(dsn))
    port = free_port()
    instance = f"127.0.0.1:{port}"
    target = f"stall-{port}"
    with tempfile.TemporaryDirectory() as hold_dir:
        hold = Path(hold_dir) / "hold"
        hold.write_text("hold")
        produce(services.kafka_bootstrap, records)
        worker = start_worker(topic=topic, group=group, schema=schema, http_port=port,
                              setup=PATIENT, env={"FENCE_TEST_HOLD_DIR": hold_dir},
                              extra=FROZEN)
        try:
            stack_prometheus.write_targets(prometheus.settings, target, [instance])
            wait_until(lambda: prometheus.target_up(instance), timeout_s=60,
                       what="Prometheus scraping the worker")
            pending = wait_until(lambda: _alert(prometheus, instance), timeout_s=60,
                                 what=f"{ALERT} pending", interval_s=0.5)
            assert pending["state"] == "pending", pending
            firing = wait_until(
                lambda: (a := _alert(prometheus, instance)) and a["state"] == "firing" and a,
                timeout_s=FOR_S + 60, what=f"{ALERT} firing", interval_s=0.5)
            seen_firing_s = time.time()
            active_s = datetime.fromisoformat(firing["activeAt"]).timestamp()
            assert seen_firing_s - active_s >= FOR_S  # pending for the whole `for`
            assert firing["labels"]["severity"] == "page"
            assert firing["labels"]["job"] == stack_prometheus.JOB
            assert firing["annotations"]["summary"] == f"2 stalled partition(s) on {instance}"
            assert firing["annotations"]["runbook_url"] == \
                "docs/monitoring.md#fencepartitionstalled"
            assert committed_total(dsn, schema, group, topic) == 0  # frozen all along
            got = http_get(f"http://{instance}/metrics")
            assert got is not None and metric(got[1], "fence_partitions_stalled") == 2
            assert metric(got[1], "fence_handler_failures_total", kind="retry") > 0

            hold.unlink()  # the downstream is back: the retries commit
            wait_until(lambda: _alert(prometheus, instance) is None, timeout_s=60,
                       what=f"{ALERT} resolved", interval_s=0.5)
            assert prometheus.query(f'ALERTS{{alertname="{ALERT}", instance="{instance}"}}') == []
            wait_until(lambda: committed_total(dsn, schema, group, topic) >= len(source),
                       timeout_s=60, what="every record processed")
            worker.terminate()
            assert worker.wait(30) == 0, worker.log()[-3000:]
        finally:
            hold.unlink(missing_ok=True)
            stack_prometheus.write_targets(prometheus.settings, target, [])
            worker.ensure_dead()
    assert asyncio.run(exactly_once_problems(dsn, schema, group, topic, source)) == []
