"""The crash matrix's table of ``docs/crash-matrix.md`` (region ``crash-matrix``; its
recovery summary, region ``crash-recovery``, on ``docs/benchmarks.md``), rendered
from ``docs/bench/crash-matrix.json``: the JSON ``make crash-matrix`` writes
(``tests/crash/report.py``) and publishes once every cell passed.

Rendering is pure: rows are family x point in the order the cells ran, columns the three
group protocols, each cell PASS/FAIL with its recovery seconds (A's death to the
successor's first commit on A's partitions; none for a tool family, whose tool is run
again by the operator, or where A left nothing to do).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PROTOCOLS", "crash_matrix", "recovery"]

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
    lines = [f"Measured by `{p.get('command', '?')}` at commit {p.get('commit', '?')} on "
             f"{p.get('date', '?')} (`docs/bench/crash-matrix.json`): "
             f"{report['passed']}/{report['total']} cells PASS; the run (with the "
             f"broken-successor test) took {report.get('wall_s', 0) / 60:.0f} min.", "",
             "| family | point | " + " | ".join(PROTOCOLS) + " |",
             "|---|---|" + "---|" * len(PROTOCOLS)]
    lines += [f"| {f} | {pt} | " + " | ".join(_cell(by.get((f, pt, g))) for g in PROTOCOLS)
              + " |" for f, pt in rows]
    rec = report.get("recovery_s") or {}
    if rec.get("count"):
        lines += ["", f"Recovery over the {rec['count']} cells that have one: min "
                      f"{rec['min']:.2f} s, median {rec['median']:.2f} s, p90 {rec['p90']:.2f} s,"
                      f" max {rec['max']:.2f} s."]
    return lines


def recovery(report: dict[str, Any]) -> list[str]:
    """The matrix's verdict and its recovery seconds, as a table (without the provenance)."""
    rec = report.get("recovery_s") or {}
    lines = ["| cells PASS | cells with a recovery | min | median | p90 | max |",
             "|---:|---:|---:|---:|---:|---:|"]
    if not rec.get("count"):
        return [*lines, f"| {report['passed']}/{report['total']} | 0 | — | — | — | — |"]
    return [*lines, f"| {report['passed']}/{report['total']} | {rec['count']} "
                    + "".join(f"| {rec[k]:.2f} s " for k in ("min", "median", "p90", "max"))
                    + "|"]
