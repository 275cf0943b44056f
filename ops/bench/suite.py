"""The test suite's own cost: ``make test``'s wall time and its slowest tests, from the JUnit
XML pytest wrote, into ``docs/bench/suite.json``; ``docs/testing.md`` shows the table
(``ops.bench.tables``, region ``suite-slowest``).

Rules
- ``python -m ops.bench.suite JUNIT --wall-s S --command CMD`` keeps the run's counts
  (passed, failed, skipped), its wall time as measured by the caller (``time``: the
  install and the services included) and the ``SLOWEST`` slowest tests with their seconds
  (setup, call and teardown: what the test costs the suite, less the waits it recorded
  that are not its own: ``WAITS``).
- Each of those tests is shown with what it proves — its docstring's first sentence, else
  its module's — and why it takes its time: ``WHY`` holds one line per test function, and
  ``why_missing`` names a slowest test that has none, so the page never shows a figure
  without its reason (tests/bench/test_suite.py).
- Pure past reading the XML and the test files: the same XML gives the same JSON.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ops.bench.provenance import provenance

__all__ = ["SLOWEST", "WHY", "render", "report", "why_missing"]

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "bench" / "suite.json"
SLOWEST = 30

#: waits a test records that are not its own (tests/conftest.py): the suite lock of the
#: xdist workers, and the session's wait for Jaeger's and Prometheus's builds
WAITS = ("suite_lock_wait_s", "go_build_wait_s")
#: test function -> why it takes its time (what it waits for, how long and why it must)
WHY: dict[str, str] = {}


def _function(test_id: str) -> str:
    """``test_name`` of ``tests/x.py::test_name[param]``."""
    return test_id.split("::")[-1].split("[")[0]


def _first_sentence(text: str | None) -> str:
    if not text:
        return ""
    flat = " ".join(text.strip().split())
    end = flat.find(". ")
    return flat if end < 0 else flat[:end + 1]


def proves(test_id: str, root: Path = ROOT) -> str:
    """The first sentence of the test function's docstring, else of its module's."""
    path = root / test_id.split("::")[0]
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return ""
    name = _function(test_id)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            own = _first_sentence(ast.get_docstring(node))
            if own:
                return own
    return _first_sentence(ast.get_docstring(tree))


def _test_id(case: ET.Element) -> str:
    """``tests/x/y.py::name`` of a JUnit testcase (classname ``tests.x.y``)."""
    module = (case.get("classname") or "").replace(".", "/")
    return f"{module}.py::{case.get('name')}"


def report(junit: Path, *, wall_s: float, command: str, root: Path = ROOT) -> dict[str, Any]:
    """What ``suite.json`` holds for the run that wrote ``junit``."""
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    timed = []
    for case in cases:
        outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
                   else "skipped" if case.find("skipped") is not None else "passed")
        counts[outcome] += 1
        waits = sum(float(prop.get("value") or 0.0) for prop in case.iter("property")
                    if prop.get("name") in WAITS)
        timed.append((max(0.0, float(case.get("time") or 0.0) - waits), _test_id(case)))
    timed.sort(key=lambda t: (-t[0], t[1]))
    return {
        "provenance": provenance(command),
        "wall_s": round(wall_s, 1),
        "tests": counts,
        "slowest": [{"test": test_id, "seconds": round(seconds, 1),
                     "proves": proves(test_id, root)}
                    for seconds, test_id in timed[:SLOWEST]],
    }


def why_missing(data: dict[str, Any]) -> list[str]:
    """The slowest tests of ``data`` whose function has no line in ``WHY``."""
    return sorted({_function(row["test"]) for row in data["slowest"]} - set(WHY))


def render(data: dict[str, Any]) -> list[str]:
    """The table of the slowest tests (the region ``suite-slowest`` of docs/testing.md)."""
    lines = ["| # | test | s | what it proves | why it takes its time |", "|---:|---|---:|---|---|"]
    for i, row in enumerate(data["slowest"], 1):
        why = WHY.get(_function(row["test"]), "**no reason recorded**")
        lines.append(f"| {i} | `{row['test']}` | {row['seconds']:.1f} | {row['proves']} "
                     f"| {why} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.suite",
                                description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("junit", type=Path, help="the JUnit XML of the make test run")
    p.add_argument("--wall-s", type=float, required=True, help="the run's wall time")
    p.add_argument("--command", required=True, help="what was run, as typed")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    data = report(a.junit, wall_s=a.wall_s, command=a.command)
    a.out.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    missing = why_missing(data)
    if missing:
        print(f"no reason in ops.bench.suite.WHY for: {', '.join(missing)}", file=sys.stderr)
        return 1
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
