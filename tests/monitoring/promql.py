"""Test support for the monitoring tests: the metric names a PromQL expression selects (by
Prometheus's own parser, ``/api/v1/parse_query``), the expressions of the Grafana dashboard
and of the rule file, and a worker's exported names."""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "GRAFANA_RANGES",
    "dashboard_queries",
    "exported_names",
    "rule_exprs",
    "selected_names",
]

# Grafana's interval variables, as PromQL durations for parsing
GRAFANA_RANGES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}


def _selectors(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if node.get("type") in ("vectorSelector", "matrixSelector"):
            yield node
        for value in node.values():
            yield from _selectors(value)
    elif isinstance(node, list):
        for value in node:
            yield from _selectors(value)


def selected_names(prometheus_url: str, expr: str) -> set[str]:
    """The metric names of every selector in ``expr``, parsed by Prometheus; a selector
    without a plain metric name (``{__name__=~"..."}``) raises ``AssertionError``."""
    body = urllib.parse.urlencode({"query": expr}).encode()
    with urllib.request.urlopen(f"{prometheus_url}/api/v1/parse_query", body,
                                timeout=10) as resp:
        ast = json.loads(resp.read())
    assert ast["status"] == "success", (expr, ast)
    names = set()
    for selector in _selectors(ast["data"]):
        assert selector.get("name"), f"a selector without a metric name in {expr!r}"
        names.add(selector["name"])
    return names


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """``(where, PromQL)`` for every panel target and every query variable, Grafana's
    interval variables replaced by durations and ``label_values(selector, label)``
    reduced to its selector."""
    out: list[tuple[str, str]] = []

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            out.append((f"panel {panel.get('title')!r} {target.get('refId')}", target["expr"]))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            got = re.fullmatch(r"label_values\((.+),\s*\w+\)", query.strip())
            assert got, f"variable {var['name']}: not label_values(selector, label): {query}"
            out.append((f"variable {var['name']}", got.group(1)))
    substituted = []
    for where, expr in out:
        for variable, duration in GRAFANA_RANGES.items():
            expr = expr.replace(variable, duration)
        substituted.append((where, expr))
    return substituted


def rule_exprs(path: Path) -> tuple[list[tuple[str, str]], set[str]]:
    """``(rule name, expr)`` of every rule of the file, and the names it records."""
    doc = yaml.safe_load(path.read_text())
    exprs, recorded = [], set()
    for group in doc["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule["record"]
            exprs.append((name, rule["expr"]))
            if "record" in rule:
                recorded.add(rule["record"])
    return exprs, recorded


def exported_names(metrics_text: str) -> set[str]:
    """Sample names and family names of a ``/metrics`` answer (``x_total`` and ``x``,
    ``h_bucket`` and ``h``)."""
    names = set()
    for family in text_string_to_metric_families(metrics_text):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names
