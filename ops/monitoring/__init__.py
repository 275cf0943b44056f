"""Monitoring files operators drop into their own Prometheus and Grafana.

- ``fenceworker.rules.yml``: the alert rules (Prometheus rule file), each alert with a
  summary and a runbook link into ``docs/monitoring.md``.
- ``fenceworker.rules.test.yml``: their unit tests for ``promtool test rules``.
- ``fenceworker-dashboard.json``: the Grafana dashboard (a Prometheus data source chosen on
  import).

The local stack's Prometheus (``ops.stack.prometheus``) loads ``RULES``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DASHBOARD", "RULES", "RULE_TESTS"]

_HERE = Path(__file__).resolve().parent
RULES = _HERE / "fenceworker.rules.yml"
RULE_TESTS = _HERE / "fenceworker.rules.test.yml"
DASHBOARD = _HERE / "fenceworker-dashboard.json"
