"""``python -m ops.bench.trees``: the same runs from two trees, alternating: before and after.

``--before COMMIT`` checks the commit out into a temporary ``git worktree`` (removed at the
end) and runs each ``--only`` run (entries of ``ops.bench.worker.RUNS``) from it and from
this tree in turn, ``--pairs`` times, on one produced topic per kind, with the harness of
``make bench`` (``ops.bench.runs.execute``: same clock, same quiesce, CPU and steal per
try). Both trees run under this tree's virtualenv and database migrations. Prints and
writes (``--out``, default ``artifacts/bench/trees.json``) every try and, per run and tree,
the summary ``make bench`` gives a run (``ops.bench.worker.summarize``: the median rate and
CPU per record): how a change is measured before it is called faster.
Alternating in one process is what makes the pair comparable on a shared VM, where single
tries move by ±15% (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ops.bench.runs import ROOT, delete_topics, execute
from ops.bench.worker import RUNS, produce_topics, summarize

OUT = ROOT / "artifacts" / "bench" / "trees.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.trees")
    p.add_argument("--before", required=True, help="the commit to compare this tree with")
    p.add_argument("--only", required=True, help="comma-separated run names of make bench")
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--count", type=int, default=200_000)
    p.add_argument("--single-count", type=int, default=6_000,
                   help="records of the batch-1 run's topic, as make bench")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n]
    chosen = [r for r in RUNS if r.name in names]
    if unknown := sorted(set(names) - {r.name for r in chosen}):
        p.error(f"unknown runs {unknown}; known: {', '.join(r.name for r in RUNS)}")
    dsn = os.environ["FENCE_DSN"]
    with tempfile.TemporaryDirectory(prefix="bench-trees-") as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before),
                        a.before], check=True, stdout=subprocess.DEVNULL)
        try:
            trees = {f"before ({a.before})": before, "this tree": ROOT}
            topics = produce_topics((r.topic for r in chosen), a.count, a.single_count,
                                    a.partitions)
            tries: dict[str, dict[str, list[dict[str, Any]]]] = {
                r.name: {t: [] for t in trees} for r in chosen}
            for i in range(a.pairs):
                for label, root in trees.items():
                    for r in chosen:
                        topic, total = topics[r.topic]
                        got = execute(r, topic, total, dsn, root=root)
                        tries[r.name][label].append(got)
                        print(f"{r.name} #{i + 1} {label}: {got['records_per_s']} records/s, "
                              f"{got['cpu_us_per_record']} CPU µs per record", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(before)], check=False)
            delete_topics()
    result = {"before": a.before, "count": a.count, "pairs": a.pairs,
              "runs": {n: {t: {**summarize(v), "tries": v} for t, v in by_tree.items()}
                       for n, by_tree in tries.items()}}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    for n, by_tree in result["runs"].items():
        for t, s in by_tree.items():
            print(f"{n} {t}: median {s['records_per_s']} records/s {s['all_records_per_s']}, "
                  f"CPU {s['median_cpu_us_per_record']} µs per record")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
