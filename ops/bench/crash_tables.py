"""The crash matrix's table of ``docs/crash-matrix.md`` (region ``crash-matrix``), rendered
from ``docs/bench/crash-matrix.json``: the JSON ``make crash-matrix`` writes
(``tests/crash/report.py``) and publishes once every cell passed.

Rendering is pure: rows are family x point in the order the cells ran, columns the three
group protocols, each cell PASS/FAIL with its recovery seconds (A's death to the
successor's first commit on A's partitions; none for a tool family, whose tool is run
again by the operator, or where A left nothing to do).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PROTOCOLS", "crash_matrix"]

PROTOCOLS = ("eager-range", "cooperative-sticky", "kip848-consumer")


def _cell(c: dict[str, Any] | None) -> str:
    if c is None:
        return "-"
    status = "PASS" if c["passed"] else "FAIL"
    return f"{status} {c['recovery_s']:.1f}s" if c.get("recovery_s") is not None else status


def crash_matrix(report: dict[str, Any]) -> list[str]:
    p = report.get("provenance") or {}
    cells = [c for c in report["cells"] if not c.get("three_nodes")]
    rows: list[tuple[str, str]] = []
    by: dict[tuple[str, str, str], dict[str, Any]] = {}
    for c in cells:
        row = (c.get("family", "reference"), c["point"])
        if row not in rows:
            rows.append(row)
        by[(*row, c["protocol"])] = c
    rec = report.get("recovery_s") or {}
    lines = [f"`{p.get('command', '?')}` on {p.get('date', '?')} at commit "
             f"{p.get('commit', '?')} (`docs/bench/crash-matrix.json`): "
             f"{report['passed']}/{report['total']} cells PASS; the run (with the "
             f"broken-successor test) took {report.get('wall_s', 0) / 60:.0f} min, load "
             f"average {p.get('load_average_1m_at_start', '?')} at its start.", "",
             "| family | point | " + " | ".join(PROTOCOLS) + " |",
             "|---|---|" + "---|" * len(PROTOCOLS)]
    lines += [f"| {f} | {pt} | " + " | ".join(_cell(by.get((f, pt, g))) for g in PROTOCOLS)
              + " |" for f, pt in rows]
    if rec.get("count"):
        lines += ["", f"Recovery over the {rec['count']} cells that have one: min "
                      f"{rec['min']:.2f} s, median {rec['median']:.2f} s, p90 {rec['p90']:.2f} s,"
                      f" max {rec['max']:.2f} s."]
    return lines
