"""The corpus (seeds 1-8, 9 and 16 x {valid, conflict} x 64 steps, each run twice) and the
sweep. Seeds 9 (valid) and 16 (conflict) are the first whose profile runs lanes (trace
version 5), so every version is in the corpus.

Rules
- Every corpus run generates its trace twice and runs each once; the two traces and the
  two reports, and the one-pass report of ``generate_and_run``, must be byte-identical
  (nondeterminism is its own failure, saved without reduction).
- A failing corpus run saves its trace, reduces it and saves the reduced trace (see
  ``ops.sim.reduce``); the manifest lists the replay commands.
- A run passes when its status is ``expected`` (PASS, or PASS_WITH_EXCLUSIONS for a config
  that accepts retention gaps); the statuses are counted apart, never merged into PASS.
- The sweep runs both classes for every seed of a range and counts statuses, violations
  and unexpected runs; its rate is measured with the injected ``now``. Each sweep run is
  one pass (``generate_and_run``: the report of the run that chose the steps); the corpus
  replays the saved trace and requires the same report from both paths. The summary
  counts generated assign/seek/process/revoke steps that made no store call.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import multiprocessing
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ops.sim.reduce import failure_of, save_failure, save_trace
from ops.sim.report import LABEL, dumps_report
from ops.sim.runner import run_trace
from ops.sim.schedule import DEFAULT_STEPS, generate_and_run, make_trace
from ops.sim.trace import IMPLEMENTATION, Trace, dumps, parse, toolchain

__all__ = ["CLASSES", "CORPUS_SEEDS", "run_corpus", "run_one", "sweep"]

CORPUS_SEEDS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 16)
CLASSES = ("valid", "conflict")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def run_one(seed: int, klass: str, *,
            steps: int = DEFAULT_STEPS) -> tuple[str, str, dict[str, Any]]:
    """(trace text, report text, report) of one generated run, via the replay path."""
    text = dumps(make_trace(seed, klass=klass, steps=steps))
    report = run_trace(parse(text))
    return text, dumps_report(report), report


def _reduce_and_save(trace_text: str, name: str, *, deterministic: bool,
                     cli: str) -> list[str]:
    original = parse(trace_text)
    if not deterministic:  # no stable predicate to reduce by: keep the trace as it is
        return [save_trace(original, f"{name}-nondeterministic", cli=cli)]

    def failure(t: Trace) -> str | None:
        return failure_of(run_trace(t))

    return save_failure(original, failure, name, cli=cli)


def run_corpus(*, seeds: Iterable[int] = CORPUS_SEEDS, steps: int = DEFAULT_STEPS,
               cli: str = "fencectl") -> dict[str, Any]:
    """Run the corpus; return the manifest (``passed`` == ``total`` when all is well). A
    failure's replay commands name the CLI as ``cli`` (``reduce.save_trace``)."""
    runs: list[dict[str, Any]] = []
    for seed in seeds:
        for klass in CLASSES:
            trace1, report1, report = run_one(seed, klass, steps=steps)
            trace2, report2, _ = run_one(seed, klass, steps=steps)
            _, one_pass = generate_and_run(seed, klass=klass, steps=steps)
            deterministic = (trace1 == trace2 and report1 == report2
                             and dumps_report(one_pass) == report1)
            entry: dict[str, Any] = {
                "seed": seed, "class": klass, "steps": steps, "status": report["status"],
                "version": parse(trace1).version,
                "before_drain": report["before_drain"], "deterministic": deterministic,
                "trace_sha256": _sha(trace1), "report_sha256": _sha(report1),
                "attempts": len(report["attempts"]), "events": len(report["events"]),
                "oracle_checks": report["oracle_checks"],
                "selected_faults": report["fault_counts"]["selected"],
                "violations": len(report["violations"]), "replay": []}
            entry["failure"] = ("NONDETERMINISTIC: two runs of the seed differ"
                                if not deterministic else failure_of(report))
            if entry["failure"] is not None:
                entry["replay"] = _reduce_and_save(trace1, f"worker-seed-{seed}-{klass}",
                                                   deterministic=deterministic, cli=cli)
            runs.append(entry)
    passed = sum(1 for r in runs if r["failure"] is None)
    return {"implementation": IMPLEMENTATION, "label": LABEL, "toolchain": toolchain(),
            "runs": runs, "passed": passed, "total": len(runs)}


_IO_ACTORS = ("assign", "seek", "process", "revoke")
_Result = tuple[int, str, str, int, str | None, int, int]


def no_io_steps(report: Mapping[str, Any]) -> tuple[int, int]:
    """(generated assign/seek/process/revoke steps, those that made no store call)."""
    with_io = {e["attempt"] for e in report["events"]}
    mine = [a for a in report["attempts"]
            if not a["fair_recovery"] and a["actor"] in _IO_ACTORS]
    return len(mine), sum(1 for a in mine if a["index"] not in with_io)


def _sweep_one(seed: int, klass: str, steps: int) -> tuple[str, int, str | None, int, int]:
    try:
        _, report = generate_and_run(seed, klass=klass, steps=steps)
    except Exception:  # an internal error: the replay path turns it into an ERROR report
        _, _, report = run_one(seed, klass, steps=steps)
    return (report["status"], len(report["violations"]), failure_of(report),
            *no_io_steps(report))


def _sweep_chunk(args: tuple[int, int, int]) -> list[_Result]:
    first, last, steps = args
    return [(seed, klass, *_sweep_one(seed, klass, steps))
            for seed in range(first, last + 1) for klass in CLASSES]


def sweep(first: int, last: int, *, now: Callable[[], float], steps: int = DEFAULT_STEPS,
          jobs: int = 1, chunk: int = 25) -> dict[str, Any]:
    """Both classes of every seed in [first, last]; summary with seeds per second. ``jobs``
    processes share the seeds in chunks; results are merged in seed order, so the summary
    (apart from the timing) does not depend on ``jobs``."""
    with _quiet_logs():
        return _sweep(first, last, now=now, steps=steps, jobs=jobs, chunk=chunk)


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """The production code's operator warnings (failed heartbeats, skipped gaps: thousands
    in a long sweep) are off while a sweep runs (its workers fork with this setting); the
    summary is the sweep's output. ERROR and above still show."""
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(before)


def _sweep(first: int, last: int, *, now: Callable[[], float], steps: int, jobs: int,
           chunk: int) -> dict[str, Any]:
    started = now()
    statuses: Counter[str] = Counter()
    violations = unexpected = 0
    failing: list[dict[str, Any]] = []
    chunks = [(a, min(a + chunk - 1, last), steps) for a in range(first, last + 1, chunk)]
    if jobs > 1:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            results = [r for part in pool.imap(_sweep_chunk, chunks) for r in part]
    else:
        results = [r for c in chunks for r in _sweep_chunk(c)]
    io_steps = idle_steps = 0
    for seed, klass, status, count, failure, n_io, n_idle in results:
        io_steps, idle_steps = io_steps + n_io, idle_steps + n_idle
        statuses[status] += 1
        violations += count
        if failure is not None:
            unexpected += 1
            if len(failing) < 20:
                failing.append({"seed": seed, "class": klass, "failure": failure,
                                "command": f"fencectl sim-worker --seed {seed} --class {klass}"
                                           f" --steps {steps}"})
    elapsed_s = max(now() - started, 1e-9)
    seeds = last - first + 1
    return {"seeds": seeds, "runs": seeds * len(CLASSES), "steps": steps, "jobs": jobs,
            "statuses": dict(sorted(statuses.items())), "violations": violations,
            "failing": failing, "unexpected": unexpected,
            "steps_without_io": {"steps": io_steps, "without_io": idle_steps,
                                 "percent": round(100 * idle_steps / max(io_steps, 1), 2)},
            "elapsed_s": round(elapsed_s, 3),
            "seeds_per_s": round(seeds / elapsed_s, 2),
            "runs_per_s": round(seeds * len(CLASSES) / elapsed_s, 2)}
