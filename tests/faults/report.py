"""The Kafka fault scenarios' outcomes: one JSON line per run, and the table rendered from them.

Rules
- ``record`` appends one line to ``artifacts/kafka-faults/results.jsonl`` per scenario run,
  passed or not, with the commit it ran at; nothing else writes there.
- ``render`` (pure) folds the lines into the fault x protocol table: runs, member exits,
  drain seconds (median and max), duplicates and losses (sums); ``python -m
  tests.faults.report [--docs docs/kafka-failures.md]`` prints it, or writes it between the
  page's ``<!-- kafka-faults:begin -->`` / ``<!-- kafka-faults:end -->`` markers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["PROTOCOLS", "RESULTS", "load", "record", "render"]

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "artifacts" / "kafka-faults" / "results.jsonl"
PROTOCOLS = ("eager-range", "cooperative-sticky", "kip848-consumer")
BEGIN, END = "<!-- kafka-faults:begin -->", "<!-- kafka-faults:end -->"


def _commit() -> str:
    """The commit the run's code is at (``FENCE_TEST_COMMIT`` for a run from an export)."""
    if os.environ.get("FENCE_TEST_COMMIT"):
        return os.environ["FENCE_TEST_COMMIT"]
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def record(scenario: str, protocol: str, *, passed: bool, member_exits: Mapping[str, int],
           drain_s: float | None, duplicates: int | None, losses: int | None,
           problems: Sequence[str] = (), **extra: Any) -> None:
    """Append one run's outcome (see Rules)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    line = {"scenario": scenario, "protocol": protocol, "passed": passed,
            "member_exits": dict(member_exits), "drain_s": drain_s, "duplicates": duplicates,
            "losses": losses, "problems": list(problems)[:10], "commit": _commit(),
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}
    with open(RESULTS, "a") as fh:
        fh.write(json.dumps(line, sort_keys=True) + "\n")


def load(path: Path = RESULTS) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _cell(runs: Sequence[Mapping[str, Any]]) -> str:
    if not runs:
        return "-"
    passed = sum(bool(r["passed"]) for r in runs)
    exits = sum(len(r["member_exits"]) for r in runs)
    drains = [r["drain_s"] for r in runs if r.get("drain_s") is not None]
    dup = sum(r["duplicates"] or 0 for r in runs)
    lost = sum(r["losses"] or 0 for r in runs)
    drain = (f"{statistics.median(drains):.1f} / {max(drains):.1f} s" if drains else "-")
    return f"{passed}/{len(runs)} pass; exits {exits}; drain {drain}; dup {dup}; lost {lost}"


def _pause_cell(runs: Sequence[Mapping[str, Any]]) -> str:
    if not runs:
        return "-"
    passed = sum(bool(r["passed"]) for r in runs)
    xs = [r["pause_s"] for r in runs if r.get("pause_s") is not None]
    pause = f"{statistics.median(xs):.1f} / {max(xs):.1f} s" if xs else "-"
    return f"{passed}/{len(runs)} pass; {pause}"


def render(lines: Iterable[Mapping[str, Any]]) -> str:
    """The fault x protocol table, then the restart x protocol table, in Markdown (pure)."""
    by: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    commits: set[str] = set()
    for r in lines:
        by.setdefault((r["scenario"], r["protocol"]), []).append(r)
        commits.add(r["commit"])
    scenarios = list(dict.fromkeys(s for s, _p in by))
    restarts = [s for s in scenarios
                if any("pause_s" in r for (s2, _p), runs in by.items() if s2 == s for r in runs)]
    faults = [s for s in scenarios if s not in restarts]
    head = "|---|" + "---|" * len(PROTOCOLS)
    out = ["| fault | " + " | ".join(PROTOCOLS) + " |", head]
    out += [f"| {s} | " + " | ".join(_cell(by.get((s, p), [])) for p in PROTOCOLS) + " |"
            for s in faults]
    out += ["", "Each cell: runs passed / runs; member exits (a member that ended by itself "
            "where none may: the two-nodes-down members are expected to exit 5 and are not "
            "counted); drain seconds median / max (from the kill; from the last node's return "
            "after a rolling restart; of the fresh member after two-nodes-down); duplicated "
            "and lost applications summed over the runs."]
    if restarts:
        out += ["", "| member restart | " + " | ".join(PROTOCOLS) + " |", head]
        out += [f"| {s} | " + " | ".join(_pause_cell(by.get((s, p), [])) for p in PROTOCOLS)
                + " |" for s in restarts]
        out += ["", "Each cell: runs passed / runs; seconds median / max until the restarted "
                "member's partitions (kill + restart), or after each of the three restarts "
                "every partition (rolling restart, summed), committed again."]
    out += ["", f"Commits: {', '.join(sorted(commits)) or '-'}."]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--docs", type=Path, default=None,
                        help="write the table between the page's kafka-faults markers")
    args = parser.parse_args(argv)
    table = render(load(args.results))
    if args.docs is None:
        print(table)
        return 0
    text = args.docs.read_text()
    head, sep, rest = text.partition(BEGIN)
    _old, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"{args.docs}: no {BEGIN} ... {END} markers")
    args.docs.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
