"""A frozen partition fires FencePartitionStalled through a real Prometheus, which then
resolves once the partition progresses.

The local stack's Prometheus loads ops/monitoring/fenceworker.rules.yml and scrapes the
worker at the target this test writes. The worker's downstream is down (every batch fails
with ``Transient`` while the hold file exists), so both partitions keep their lag and make
no fetch or commit progress: past ``--stall-timeout-s`` the worker counts them in
``fence_partitions_stalled``, the alert goes pending and, after its ``for: 1m``, firing.
Removing the file lets the retries commit: the gauge returns to 0 and the alert leaves
Prometheus's active alerts. Every record is then applied exactly once.

Each wait is bounded by what sets its time (``Timing``), read from the files that set it:
the rule's ``for:`` (ops/monitoring/fenceworker.rules.yml), the scrape interval, scrape
timeout, evaluation interval and target file refresh of the config the stack wrote for the
running Prometheus, and the worker's ``--stall-timeout-s`` and lag interval; plus one
margin for a loaded machine, stated below. Once pending, the alert keeps its ``activeAt``
until it fires. A pending alert that leaves or starts again is judged from Prometheus's
own series at once: a scrape that failed (the worker starved past the scrape timeout:
``up`` 0, its series stale, which drops a pending alert) while every other scrape read the
gauge at 2 restarts the wait for one more ``for`` (at most ``MAX_RESTARTS`` times);
anything else — the worker's gauge dropped, the alert left while the scrapes succeeded —
fails the test saying so, not after a timeout.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from ops.monitoring import RULES
from ops.stack import prometheus as stack_prometheus
from ops.stack.config import ServiceSettings, StackSettings
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
STALL_TIMEOUT_S = 2.0
# the worker samples lag every min(5 s, --stall-timeout-s / 3) (ops.worker.observability)
LAG_INTERVAL_S = min(5.0, STALL_TIMEOUT_S / 3)
# the bound the suite gives a worker subprocess to start, join its group and be assigned
STARTUP_S = 60.0
# one poll of Prometheus's API may take up to its timeout (``Prometheus.api``); the polls
# come every POLL_S
API_TIMEOUT_S = 10.0
POLL_S = 0.5
# on a loaded machine Prometheus's evaluations and scrapes start late: allow this many
# evaluation intervals of delay on top of each wait
LATE_EVALUATIONS = 10
# a worker starved of CPU past the scrape timeout fails a scrape: Prometheus marks its
# series stale and drops the pending alert, whose `for` starts again at the next scrape.
# Accepted this many times (each costs one more `for`), only when the worker's gauge held
MAX_RESTARTS = 3
# retried for as long as the file exists, and never quarantined as a suspect: a lost
# assignment would make the counted retries "unfinished attempts" at the next claim
FROZEN = ("--handler", "tests.integration.handlers:transient_while_held_handler",
          "--stall-timeout-s", str(STALL_TIMEOUT_S), "--batch-max-records", "10",
          "--retry-max-attempts", "1000000", "--max-attempts", "1000000",
          "--retry-initial-ms", "100", "--retry-max-ms", "500")
# one member and no rebalance wanted: a session that outlasts a loaded broker's hiccup (a
# lost assignment ends the stall and restarts the alert's `for`)
PATIENT = GroupSetup("patient-eager", ("--group-protocol", "classic", "--assignment-strategy",
                                       "range", "-X", "session.timeout.ms=30000", "-X",
                                       "heartbeat.interval.ms=1000"))


_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration_s(text: str) -> float:
    """Seconds of a Prometheus duration (``1m``, ``2s``, ``1m30s``, ``500ms``)."""
    parts = re.findall(r"(\d+)(ms|s|m|h|d)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * _UNITS_S[u] for n, u in parts)


@dataclass(frozen=True, slots=True)
class Timing:
    """What bounds each wait of the test (seconds), as the rule file and the running
    Prometheus's config set it."""

    for_s: float  # the alert rule's `for:`
    scrape_interval_s: float
    scrape_timeout_s: float
    evaluation_interval_s: float
    discovery_s: float  # the file_sd refresh interval: a new target file is read by then

    @classmethod
    def read(cls, settings: StackSettings) -> Timing:
        rules = yaml.safe_load(RULES.read_text())
        (rule,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == ALERT]
        # the config the stack wrote and the running Prometheus loaded (JSON is YAML)
        config = json.loads(Path(stack_prometheus.marker(settings)).read_text())
        glob = config["global"]
        (job,) = [j for j in config["scrape_configs"] if j["job_name"] == stack_prometheus.JOB]
        (file_sd,) = job["file_sd_configs"]
        return cls(for_s=duration_s(rule["for"]),
                   scrape_interval_s=duration_s(glob["scrape_interval"]),
                   scrape_timeout_s=duration_s(glob["scrape_timeout"]),
                   evaluation_interval_s=duration_s(glob["evaluation_interval"]),
                   discovery_s=duration_s(file_sd["refresh_interval"]))

    @property
    def margin_s(self) -> float:
        """A loaded machine: a poll at the API's timeout, the poll interval, and
        ``LATE_EVALUATIONS`` evaluation intervals of late scrapes and evaluations."""
        return API_TIMEOUT_S + POLL_S + LATE_EVALUATIONS * self.evaluation_interval_s

    @property
    def stalled_s(self) -> float:
        """From the worker's start to its gauge counting the stall: its start-up, then
        ``--stall-timeout-s`` after the first lag sample showing lag, then the next sample."""
        return STARTUP_S + STALL_TIMEOUT_S + 2 * LAG_INTERVAL_S + self.margin_s

    @property
    def scraped_s(self) -> float:
        """From writing the target file to the target's first good scrape: its discovery,
        then a scrape interval and the scrape's timeout."""
        return self.discovery_s + self.scrape_interval_s + self.scrape_timeout_s + self.margin_s

    @property
    def pending_s(self) -> float:
        """From the gauge counting the stall to the alert pending: the next scrape (up to
        an interval away, answered within its timeout), then the next evaluation."""
        return (self.scrape_interval_s + self.scrape_timeout_s + self.evaluation_interval_s
                + self.margin_s)

    @property
    def firing_s(self) -> float:
        """From the pending alert's ``activeAt`` to firing: the rule's ``for``, then the
        next evaluation."""
        return self.for_s + self.evaluation_interval_s + self.margin_s


def _alert(prometheus: Prometheus, instance: str) -> dict[str, Any] | None:
    alerts = prometheus.alerts(ALERT, instance=instance)
    assert len(alerts) <= 1, alerts
    return alerts[0] if alerts else None


@dataclass(frozen=True, slots=True)
class Target:
    """What Prometheus's own series say of the worker's target over a window."""

    up_min: float | None  # 0: a scrape failed (timed out: its series went stale)
    scrape_max_s: float | None  # the slowest scrape
    stalled_min: float | None  # the worker's gauge, over the scrapes that succeeded

    @classmethod
    def since(cls, prometheus: Prometheus, instance: str, since_s: float) -> Target:
        window = f"[{max(1, int(time.time() - since_s) + 1)}s]"
        sel = f'{{instance="{instance}"}}'

        def one(expr: str) -> float | None:
            result = prometheus.query(expr)
            return float(result[0]["value"][1]) if result else None

        return cls(up_min=one(f"min_over_time(up{sel}{window})"),
                   scrape_max_s=one(f"max_over_time(scrape_duration_seconds{sel}{window})"),
                   stalled_min=one(f"min_over_time(fence_partitions_stalled{sel}{window})"))

    @property
    def scrape_failed_gauge_held(self) -> bool:
        """A scrape failed while every scrape that succeeded read both partitions stalled:
        Prometheus reset the alert (a stale series), the worker did not."""
        return self.up_min == 0 and self.stalled_min == 2


def _wait_firing(prometheus: Prometheus, instance: str, pending: dict[str, Any],
                 timing: Timing) -> tuple[dict[str, Any], list[str]]:
    """The alert once firing, by its ``activeAt`` + ``timing.firing_s``, and the restarts
    it took. A pending alert that leaves or starts again (another ``activeAt``) is a
    restart: accepted (at most ``MAX_RESTARTS``) only when a scrape failed meanwhile and
    the worker's gauge held (``Target.scrape_failed_gauge_held``), then waited for again;
    any other fails at once saying why."""
    restarts: list[str] = []
    first_s = datetime.fromisoformat(pending["activeAt"]).timestamp()
    while True:
        deadline_s = datetime.fromisoformat(pending["activeAt"]).timestamp() + timing.firing_s
        alert = _alert(prometheus, instance)
        if alert is not None and alert["activeAt"] == pending["activeAt"]:
            if alert["state"] == "firing":
                return alert, restarts
            if time.time() > deadline_s:
                raise AssertionError(f"{ALERT} pending since {pending['activeAt']} not firing "
                                     f"after {timing.firing_s:.0f} s ({timing})")
            time.sleep(POLL_S)
            continue
        target = Target.since(prometheus, instance, first_s)
        what = (f"{ALERT} pending since {pending['activeAt']} "
                f"{'left' if alert is None else 'started again at ' + alert['activeAt']} "
                f"before its `for`: {target}")
        if not target.scrape_failed_gauge_held or len(restarts) == MAX_RESTARTS:
            raise AssertionError(what + (f" after {len(restarts)} restarts: {restarts}"
                                         if restarts else ""))
        restarts.append(what)
        pending = alert or wait_until(lambda: _alert(prometheus, instance),
                                      timeout_s=timing.pending_s,
                                      what=f"{ALERT} pending again", interval_s=POLL_S)


def _stalled(instance: str) -> float | None:
    got = http_get(f"http://{instance}/metrics")
    return None if got is None else metric(got[1], "fence_partitions_stalled")


def test_the_timing_is_read_from_the_rule_and_the_config(prometheus: Prometheus) -> None:
    timing = Timing.read(prometheus.settings)
    assert timing.for_s > 0 and timing.evaluation_interval_s > 0
    assert 0 < timing.scrape_timeout_s <= timing.scrape_interval_s and timing.discovery_s > 0
    assert duration_s("1m30s") == 90.0 and duration_s("500ms") == 0.5
    with pytest.raises(ValueError):
        duration_s("1 m")


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
    timing = Timing.read(prometheus.settings)
    with tempfile.TemporaryDirectory() as hold_dir:
        hold = Path(hold_dir) / "hold"
        hold.write_text("hold")
        produce(services.kafka_bootstrap, records)
        worker = start_worker(topic=topic, group=group, schema=schema, http_port=port,
                              setup=PATIENT, env={"FENCE_TEST_HOLD_DIR": hold_dir},
                              extra=FROZEN)
        try:
            stack_prometheus.write_targets(prometheus.settings, target, [instance])
            wait_until(lambda: _stalled(instance) == 2, timeout_s=timing.stalled_s,
                       what="the worker counting both partitions stalled", interval_s=POLL_S)
            wait_until(lambda: prometheus.target_up(instance), timeout_s=timing.scraped_s,
                       what="Prometheus scraping the worker", interval_s=POLL_S)
            pending = wait_until(lambda: _alert(prometheus, instance),
                                 timeout_s=timing.pending_s, what=f"{ALERT} pending",
                                 interval_s=POLL_S)
            assert pending["state"] == "pending", pending
            firing, restarts = _wait_firing(prometheus, instance, pending, timing)
            seen_firing_s = time.time()
            active_s = datetime.fromisoformat(firing["activeAt"]).timestamp()
            assert seen_firing_s - active_s >= timing.for_s  # pending for the whole `for`
            scraped = Target.since(prometheus, instance, active_s)
            assert scraped.stalled_min == 2, scraped  # the worker's gauge held all along
            # a measurement, not a bound (the waits above are the bounds)
            print(f"{ALERT}: firing seen {seen_firing_s - active_s:.1f} s after its activeAt "
                  f"(bound {timing.firing_s:.1f} s), slowest scrape {scraped.scrape_max_s} s "
                  f"(timeout {timing.scrape_timeout_s} s), {len(restarts)} restart(s) "
                  f"{restarts}")
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
            # the retries commit at the next backoff (<= 0.5 s), the gauge drops at the next
            # lag sample, the next scrape and evaluation take the alert out
            wait_until(lambda: _alert(prometheus, instance) is None,
                       timeout_s=timing.pending_s + 2 * LAG_INTERVAL_S,
                       what=f"{ALERT} resolved", interval_s=POLL_S)
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
