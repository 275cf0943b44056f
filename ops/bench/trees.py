"""``python -m ops.bench.trees``: the same runs from two trees, alternating: before and after.

``--before COMMIT`` checks the commit out into a temporary ``git worktree`` (removed at the
end) and runs each ``--only`` run (entries of ``ops.bench.worker.RUNS``) from it and from
this tree in turn, ``--pairs`` times, on one produced topic per kind, with the harness of
``make bench`` (``ops.bench.runs.execute``: same clock, same quiesce, CPU and steal per
try). Both trees run under this tree's virtualenv and database migrations: a run that
handles fewer records than its topic holds (a tree refusing this tree's schema version)
stops the comparison with that reason. Prints and
writes (``--out``, default ``artifacts/bench/trees.json``) every try and, per run and tree,
the summary ``make bench`` gives a run (``ops.bench.worker.summarize``: the median rate and
CPU per record): how a change is measured before it is called faster.
Alternating in one process is what makes the pair comparable on a shared VM, where single
tries move by ±15% (docs/benchmarks.md).

``--latency reference|sink --rates R,R`` compares latency instead: the steady run of
``ops.bench.latency`` (one member under a paced producer) from both trees, and from this
tree with each ``--also`` flag set, alternating ``--pairs`` times per rate (default out
``artifacts/bench/trees-latency.json``).
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

from ops.bench.latency import steady
from ops.bench.provenance import provenance
from ops.bench.runs import ROOT, delete_topics, execute
from ops.bench.sources import produce_topics
from ops.bench.worker import RUNS, summarize

OUT = ROOT / "artifacts" / "bench" / "trees.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.trees")
    p.add_argument("--before", required=True, help="the commit to compare this tree with")
    p.add_argument("--only", default="", help="comma-separated run names of make bench")
    p.add_argument("--latency", choices=["reference", "sink"], default=None,
                   help="compare latency under a paced producer instead (see the docstring)")
    p.add_argument("--rates", default="300,1000", help="--latency: records/s, comma-separated")
    p.add_argument("--also", action="append", default=[],
                   help="--latency: also this tree with these fencectl run flags (repeatable)")
    p.add_argument("--seconds", type=float, default=8.0, help="--latency: seconds measured")
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--count", type=int, default=200_000)
    p.add_argument("--single-count", type=int, default=6_000,
                   help="records of the batch-1 run's topic, as make bench")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    if a.latency is not None:
        return _latency(a, argv)
    names = [n for n in a.only.split(",") if n]
    if not names:
        p.error("--only: the runs to compare (or --latency KIND)")
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
                        if got["records"] < total:
                            raise SystemExit(
                                f"{r.name} from {label} handled {got['records']} of {total} "
                                f"records (exit {got['exit']}; its stderr above says why); "
                                "a tree whose schema version differs from this tree's cannot "
                                "run here: run make bench's runs from each tree instead")
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


def _latency(a: argparse.Namespace, argv: list[str] | None) -> int:
    out = a.out if a.out != OUT else OUT.with_name("trees-latency.json")
    dsn = os.environ["FENCE_DSN"]
    measured = provenance("python -m ops.bench.trees " + " ".join(
        sys.argv[1:] if argv is None else argv))
    tries: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-trees-") as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before),
                        a.before], check=True, stdout=subprocess.DEVNULL)
        variants = [(f"before ({a.before})", before, ()), ("this tree", ROOT, ()),
                    *((f"this tree {x}", ROOT, tuple(x.split())) for x in a.also)]
        try:
            for rate in (float(r) for r in a.rates.split(",")):
                for i in range(a.pairs):
                    for label, root, extra in variants:
                        got = steady(a.latency, rate, seconds=a.seconds, warmup_s=2.0,
                                     dsn=dsn, partitions=a.partitions, root=root, extra=extra)
                        tries.append({"tree": label, "try": i + 1,
                                      "load_average_1m": round(os.getloadavg()[0], 1), **got})
                        c = got["commit_ms"]
                        print(f"{rate:g}/s #{i + 1} {label}: p50 {c['p50']} p95 {c['p95']} "
                              f"p99 {c['p99']} max {c['max']} ms, batch {got['mean_batch']}, "
                              f"CPU {got['cpu_us_per_record']} µs per record", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(before)], check=False)
            delete_topics()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"provenance": measured, "before": a.before, "kind": a.latency,
                               "pairs": a.pairs, "tries": tries}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
