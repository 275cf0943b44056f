"""The Grafana dashboard's shape: it imports with any Prometheus data source, every variable
a query uses is defined, and it covers what an operator watches (its metric names are
checked against a running worker in test_names.py)."""

from __future__ import annotations

import json
import re
from typing import Any

from ops.monitoring import DASHBOARD


def _panels() -> list[dict[str, Any]]:
    return list(json.loads(DASHBOARD.read_text())["panels"])


def test_every_query_uses_the_chosen_data_source_and_defined_variables() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert "datasource" in variables
    (source,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert source["query"] == "prometheus"
    panels = [p for p in _panels() if p["type"] != "row"]
    assert len({p["id"] for p in _panels()}) == len(_panels())
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= variables, (panel["title"], used - variables)


def test_the_panels_cover_what_an_operator_watches() -> None:
    titles = " | ".join(p["title"].lower() for p in _panels())
    for topic in ("records committed", "lag per partition", "batch commit latency",
                  "quarantined", "retries", "lifetimes retired", "kafka offset", "ready",
                  "stalled", "without an owner", "handler failures"):
        assert topic in titles, topic


def test_panels_do_not_overlap() -> None:
    cells: set[tuple[int, int]] = set()
    for panel in _panels():
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, panel["title"]
                cells.add((x, y))
