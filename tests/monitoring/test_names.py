"""Every metric name the dashboard, the alert rules and docs/monitoring.md use is one a
running worker exports.

A worker commits a few batches in two lanes per partition (so its histograms, the lag
gauge and the lanes gauges exist too), and a table sink worker the same records twice
(the sink's own metrics; the second time with a version guard); their ``/metrics`` give
the exported names. Each dashboard query and rule
expression is parsed by Prometheus (``/api/v1/parse_query``), so every selector's name is
found wherever it sits in the expression.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from ops.monitoring import DASHBOARD, RULES
from ops.stack.config import ServiceSettings
from tests.integration.observability_support import (
    free_port,
    http_get,
    metric,
    readyz,
    start_worker,
)
from tests.integration.pg_helpers import execute
from tests.integration.workers import create_topic, fresh_schema, generated, produce, unique
from tests.monitoring.conftest import Prometheus
from tests.monitoring.promql import (
    dashboard_queries,
    exported_names,
    rule_exprs,
    selected_names,
)
from tests.polling import wait_until

pytestmark = pytest.mark.integration

DOCS = Path(__file__).resolve().parents[2] / "docs" / "monitoring.md"
# series Prometheus makes itself, not the worker
PROMETHEUS_OWN = {"up", "ALERTS"}


@pytest.fixture(scope="module")
def exported(services: ServiceSettings) -> set[str]:
    """The names of a worker's ``/metrics`` after it committed records of 2 partitions."""
    topic, group = unique("names"), unique("g-names")
    schema = asyncio.run(fresh_schema(services.dsn))
    create_topic(services.kafka_bootstrap, topic, 2)
    records, _source = generated(topic, count=40, partitions=2)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    worker = start_worker(topic=topic, group=group, schema=schema, http_port=port,
                          extra=["--stall-timeout-s", "3", "--lanes", "2"])

    def scrape() -> str:
        got = http_get(base + "/metrics")
        assert got is not None and got[0] == 200
        return got[1]

    try:
        wait_until(lambda: (r := readyz(base)) is not None and r[0] == 200, timeout_s=60,
                   what="worker ready")
        produce(services.kafka_bootstrap, records)
        wait_until(lambda: metric(scrape(), "fence_records_processed_total") == 40,
                   timeout_s=60, what="40 records counted")
        wait_until(lambda: "fence_partition_lag{" in scrape(), timeout_s=30,
                   what="the lag gauge sampled")
        wait_until(lambda: "fence_lanes_busy{" in scrape(), timeout_s=30,
                   what="the lanes gauges sampled")
        names = exported_names(scrape())
        worker.terminate()
        assert worker.wait(30) == 0, worker.log()[-3000:]
        worker = start_worker(topic=topic, group=f"{group}-sink", schema=schema,
                              http_port=port, extra=["--sink", f"table={schema}.names"])
        wait_until(lambda: (r := readyz(base)) is not None and r[0] == 200, timeout_s=60,
                   what="sink worker ready")
        wait_until(lambda: metric(scrape(), "fence_records_processed_total") == 40,
                   timeout_s=60, what="40 records written by the sink")
        names |= exported_names(scrape())
        worker.terminate()
        assert worker.wait(30) == 0, worker.log()[-3000:]
        # the version guard's counter, exported from a guarded table's first batch on
        asyncio.run(execute(services.dsn, f'CREATE TABLE "{schema}".guarded (doc text '
                                           "PRIMARY KEY, kind text, rev int8, body text)"))
        worker = start_worker(topic=topic, group=f"{group}-guarded", schema=schema,
                              http_port=port, extra=[
                                  "--sink", f"table={schema}.guarded", "--sink-key", "doc",
                                  "--sink-version-column", "rev"])
        wait_until(lambda: (r := readyz(base)) is not None and r[0] == 200, timeout_s=60,
                   what="guarded sink worker ready")
        wait_until(lambda: metric(scrape(), "fence_records_processed_total") == 40,
                   timeout_s=60, what="40 records written by the guarded sink")
        names |= exported_names(scrape())
        worker.terminate()
        assert worker.wait(30) == 0, worker.log()[-3000:]
    finally:
        worker.ensure_dead()
    return names


def test_every_dashboard_query_selects_exported_metrics(exported: set[str],
                                                        prometheus: Prometheus) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 15
    missing = {}
    for where, expr in queries:
        names = selected_names(prometheus.url, expr)
        assert names, f"{where}: selects no metric: {expr}"
        if unknown := names - exported - PROMETHEUS_OWN:
            missing[where] = sorted(unknown)
    assert missing == {}


def test_every_rule_selects_exported_or_recorded_metrics(exported: set[str],
                                                         prometheus: Prometheus) -> None:
    exprs, recorded = rule_exprs(RULES)
    missing = {}
    for name, expr in exprs:
        if unknown := selected_names(prometheus.url, expr) - exported - recorded - {"up"}:
            missing[name] = sorted(unknown)
    assert missing == {}


def test_every_metric_name_in_the_monitoring_page_is_exported(exported: set[str]) -> None:
    _exprs, recorded = rule_exprs(RULES)
    mentioned = set(re.findall(r"\b(?:fence|process)_[a-z_]+[a-z]\b", DOCS.read_text()))
    assert len(mentioned) >= 10
    assert sorted(mentioned - exported - recorded) == []
