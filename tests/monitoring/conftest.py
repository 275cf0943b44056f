"""Fixtures of the monitoring tests: promtool, and the local stack's Prometheus.

``prometheus`` is always the local stack's (``ops.stack.prometheus``), whichever way the
session found Kafka and PostgreSQL: it scrapes worker subprocesses on 127.0.0.1 at the
targets a test writes (``write_targets``). Started here only when not running; then under
a lease like the rest of the local stack (``ops.stack.lease``), so it stops with the last
test session. One that was running is made to reload, so it evaluates this checkout's
rules as they are now.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ops.stack import control as stack
from ops.stack import lease as stack_lease
from ops.stack import prometheus as stack_prometheus
from ops.stack.config import Service, StackError, StackSettings, settings_from


@dataclass(frozen=True, slots=True)
class Prometheus:
    """The running Prometheus: its API base URL and the stack settings (for targets)."""

    url: str
    settings: StackSettings

    def api(self, path: str, **params: str) -> Any:
        """``data`` of ``GET /api/v1/<path>?<params>``; asserts ``status`` success."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def alerts(self, alertname: str, **labels: str) -> list[dict[str, Any]]:
        """The active (pending or firing) alerts named ``alertname`` with ``labels``."""
        return [a for a in self.api("alerts")["alerts"]
                if a["labels"].get("alertname") == alertname
                and all(a["labels"].get(k) == v for k, v in labels.items())]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now."""
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def target_up(self, instance: str) -> bool:
        """Whether the target ``instance`` is scraped and its last scrape succeeded."""
        return any(t["labels"].get("instance") == instance and t["health"] == "up"
                   for t in self.api("targets", state="active")["activeTargets"])


def _say(line: str) -> None:
    print(f"[fencectl stack] {line}", file=sys.stderr, flush=True)


@pytest.fixture(scope="session")
def promtool(_go_services_started: None) -> Path:
    """promtool of the pinned Prometheus, built through the Go module proxy when missing."""
    try:
        return stack_prometheus.promtool(settings_from())
    except StackError as exc:
        pytest.fail(f"promtool: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def prometheus(_go_services_started: None) -> Iterator[Prometheus]:
    settings = settings_from()
    rows = {row.service: row for row in stack.status(settings)}
    if rows[Service.PROMETHEUS].state is stack.ServiceState.UP:
        try:
            stack_prometheus.reload(settings)
        except StackError as exc:
            pytest.fail(str(exc), pytrace=False)
        yield Prometheus(stack_prometheus.url(settings), settings)
        return
    stack_lease.acquire(settings)
    try:
        try:
            report = stack.up(settings, services=[Service.PROMETHEUS], out=_say)
        except StackError as exc:
            pytest.fail(f"could not start the local stack's Prometheus: {exc}", pytrace=False)
        if not os.environ.get("FENCE_KEEP_STACK"):
            stack_lease.record_started(settings, report.started)
        yield Prometheus(stack_prometheus.url(settings), settings)
    finally:
        stack_lease.release(settings, out=_say)
