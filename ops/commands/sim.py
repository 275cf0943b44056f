"""``fencectl sim-worker``: the deterministic worker simulator.

  fencectl sim-worker --seed N [--class valid|conflict] [--steps 64] [--no-drain]
                      [--out TRACE.json] [--report REPORT.json]
  fencectl sim-worker --replay TRACE.json [--report REPORT.json]
  fencectl sim-worker --sweep FIRST..LAST [--steps 64] [--jobs N] [--manifest SUMMARY.json]
  fencectl sim-worker --corpus [--manifest MANIFEST.json]

Exit codes (``EXITS``): --seed and --replay exit 0 only for a strict PASS and 1 for any
other status (PASS_WITH_EXCLUSIONS, INCOMPLETE, BLOCKED, ERROR) or a rejected trace. --sweep
and --corpus exit 0 when every run ended with its expected status (``ops.sim.corpus``: PASS;
PASS_WITH_EXCLUSIONS for a config that accepts retention gaps; BLOCKED by a refusal an
operator must settle), counted apart in the summary, and 1 otherwise. 2 for bad usage
(bad options, unreadable files).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from consumer.exits import Exit
from ops.hints import fencectl

__all__ = ["EXITS", "register", "run"]

PASSED = Exit(0, "`--seed`, `--replay`: a strict PASS; `--sweep`, `--corpus`: every run ended "
              "with its expected status", "nothing")
FAILED = Exit(1, "any other status (PASS_WITH_EXCLUSIONS, INCOMPLETE, BLOCKED, ERROR), a "
              "rejected trace, or a run of a sweep or the corpus with an unexpected status",
              "run the `reproduce with:` or `replay with:` command printed on stderr; the "
              "report names the failed check")
USAGE = Exit(2, "bad options; unreadable files", "fix what the line on stderr names")
EXITS = (PASSED, FAILED, USAGE)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sim-worker", help="deterministic simulation of the worker lifecycle",
        description="Drive the production lifecycle through the in-memory store with logical "
                    "time, from a seed or a saved trace.")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--seed", type=int, help="generate the schedule of this seed and run it")
    mode.add_argument("--replay", type=Path, metavar="TRACE", help="run a saved trace as saved")
    mode.add_argument("--sweep", metavar="FIRST..LAST", help="run both classes of many seeds")
    mode.add_argument("--corpus", action="store_true",
                      help="seeds 1-8, 9 and 16 x both classes, twice")
    p.add_argument("--class", dest="klass", choices=("valid", "conflict"), default="valid",
                   help="source class for --seed (default valid)")
    p.add_argument("--steps", type=int, default=64, help="steps before fair recovery (64)")
    p.add_argument("--no-drain", action="store_true", help="skip fair recovery (--seed)")
    p.add_argument("--out", type=Path, metavar="TRACE", help="write the trace (--seed)")
    p.add_argument("--report", type=Path, metavar="REPORT", help="write the report JSON")
    p.add_argument("--manifest", type=Path, help="write the corpus manifest (--corpus), or "
                   "the sweep's summary with provenance (--sweep)")
    p.add_argument("--jobs", type=int, default=1, help="processes for --sweep (1)")
    p.set_defaults(func=run, exits=EXITS)


def _usage(message: str) -> int:
    print(f"fencectl sim-worker: {message}", file=sys.stderr)
    return USAGE.code


def _write(path: Path | None, text: str) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def run(args: argparse.Namespace) -> int:
    from ops.sim import dumps, dumps_report, make_trace, parse, run_trace
    from ops.sim.trace import TraceError

    # the production code's log lines (e.g. a gap-skip warning) are events of the report
    # here, not output: keep Python's last-resort handler from printing them
    logging.getLogger("fenceworker").addHandler(logging.NullHandler())

    if args.steps < 0:
        return _usage("--steps must be >= 0")
    if args.sweep is not None:
        return _sweep(args)
    if args.corpus:
        return _corpus(args)
    if args.replay is not None:
        if args.out is not None or args.no_drain:
            return _usage("--out and --no-drain apply to --seed only")
        try:
            raw = args.replay.read_bytes()
        except OSError as exc:
            return _usage(f"cannot read {args.replay}: {exc.strerror}")
    else:
        raw = dumps(make_trace(args.seed, klass=args.klass, steps=args.steps,
                               drain=not args.no_drain)).encode()
        _write(args.out, raw.decode())
    try:
        trace = parse(raw)
    except TraceError as exc:
        print(f"fencectl sim-worker: trace rejected: {exc}", file=sys.stderr)
        return FAILED.code
    report = run_trace(trace)
    text = dumps_report(report)
    _write(args.report, text)
    sys.stdout.write(text)
    if report["status"] != "PASS" and args.replay is None:
        print(f"reproduce with: {fencectl()} sim-worker --seed {args.seed} --class {args.klass} "
              f"--steps {args.steps}{' --no-drain' if args.no_drain else ''}", file=sys.stderr)
    return (PASSED if report["status"] == "PASS" else FAILED).code


def _sweep(args: argparse.Namespace) -> int:
    from ops.sim.corpus import sweep

    first_s, sep, last_s = args.sweep.partition("..")
    if not sep or not first_s.isdigit() or not last_s.isdigit() or int(last_s) < int(first_s):
        return _usage(f"--sweep {args.sweep!r}: expected FIRST..LAST with FIRST <= LAST")
    if args.jobs < 1:
        return _usage("--jobs must be >= 1")
    summary = sweep(int(first_s), int(last_s), now=time.perf_counter, steps=args.steps,
                    jobs=args.jobs)
    text = json.dumps(summary, indent=1, sort_keys=True) + "\n"
    if args.manifest is not None:
        from ops.sim.trace import IMPLEMENTATION, VERSION, toolchain
        _write(args.manifest, json.dumps(
            {**summary, "implementation": IMPLEMENTATION, "trace_version": VERSION,
             "toolchain": toolchain(), "command": f"fencectl sim-worker --sweep {args.sweep} "
             f"--steps {args.steps} --jobs {args.jobs}"}, indent=1, sort_keys=True) + "\n")
    sys.stdout.write(text)
    return (PASSED if summary["unexpected"] == 0 else FAILED).code


def _corpus(args: argparse.Namespace) -> int:
    from ops.sim.corpus import run_corpus

    manifest = run_corpus(steps=args.steps, cli=fencectl())
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    _write(args.manifest, text)
    sys.stdout.write(text)
    for entry in manifest["runs"]:
        for command in entry["replay"]:
            print(f"replay with: {command}", file=sys.stderr)
    return (PASSED if manifest["passed"] == manifest["total"] else FAILED).code
