"""The printed matrix and its JSON: rows = family x point, columns = protocols (and the
three-node column, its protocol named in the cell), cells = PASS/FAIL with recovery seconds
(A's death to the successor's first commit on A's partitions; a tool family's cell has
none: the operator runs the tool again).

``render`` is pure; ``write_json`` writes ``artifacts/crash-matrix/<name>.json``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from ops.bench.provenance import provenance
from tests.crash.cell import CellResult
from tests.crash.families import FAMILIES
from tests.crash.plans import PROTOCOLS

__all__ = ["distribution", "render", "write_json"]

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "artifacts" / "crash-matrix"


def _cell_text(r: CellResult | None) -> str:
    if r is None:
        return "-"
    status = "PASS" if r.passed else "FAIL"
    return f"{status} {r.recovery_s:.1f}s" if r.recovery_s is not None else status


def distribution(results: Sequence[CellResult]) -> dict[str, float | int]:
    """Recovery seconds of the passed cells: count, min, median, p90, max."""
    xs = sorted(r.recovery_s for r in results if r.passed and r.recovery_s is not None)
    if not xs:
        return {"count": 0}
    p90 = xs[min(len(xs) - 1, round(0.9 * (len(xs) - 1)))]
    return {"count": len(xs), "min": xs[0], "median": round(statistics.median(xs), 2),
            "p90": p90, "max": xs[-1]}


THREE = "3 nodes, coordinator killed at the point"


def render(results: Sequence[CellResult]) -> str:
    """The matrix as a Markdown table, then failures and the recovery distribution."""
    by = {(r.family, r.point, r.protocol): r for r in results if not r.three_nodes}
    three = {(r.family, r.point): r for r in results if r.three_nodes}
    lines = ["| family | point | " + " | ".join(PROTOCOLS)
             + (f" | {THREE} |" if three else " |"),
             "|---|---|" + "---|" * (len(PROTOCOLS) + bool(three))]
    for family in FAMILIES:
        for plan in family.plans:
            row = (family.name, plan.point)
            if not any((*row, g) in by for g in PROTOCOLS) and row not in three:
                continue
            extra = ""
            if three:
                r = three.get(row)
                extra = " | " + ("-" if r is None else f"{_cell_text(r)} ({r.protocol})")
            lines.append(f"| {family.name} | {plan.point} | "
                         + " | ".join(_cell_text(by.get((*row, g))) for g in PROTOCOLS)
                         + extra + " |")
    passed = sum(r.passed for r in results)
    lines.append(f"\n{passed}/{len(results)} cells PASS; recovery seconds {distribution(results)}")
    for r in results:
        if not r.passed:
            where = " on 3 nodes" if r.three_nodes else ""
            lines.append(f"FAIL {r.family} {r.point} x {r.protocol}{where} (kept {r.kept}): "
                         + "; ".join(r.problems[:5]))
    return "\n".join(lines)


def write_json(results: Sequence[CellResult], *, name: str, command: str = "",
               wall_s: float = 0.0) -> Path:
    """``artifacts/crash-matrix/<name>.json``; with ``command``, its provenance (what
    ``ops.bench.crash_tables`` prints above the published table)."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps({
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **({"provenance": provenance(command)} if command else {}),
        "wall_s": round(wall_s, 1),
        "cells": [asdict(r) for r in results],
        "recovery_s": distribution(results),
        "passed": sum(r.passed for r in results), "total": len(results)}, indent=1))
    return path
