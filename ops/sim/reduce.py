"""Reducer: shrink a failing trace while it stays valid and fails the same way.

Rules
- The failure is a string from a deterministic predicate over a trace (for the corpus:
  ``failure_of(run_trace(trace))``: status and the first violation's text, unmasked);
  ``None`` means "passes".
- Steps are deleted one at a time (last first), then fault selectors one at a time; a
  deletion is kept only if the result still parses (so lifetime dependencies hold:
  a start, or the fault that reserves a replacement, cannot go while a later step uses
  its lifetime) and reproduces exactly the same failure string. Passes repeat until a
  fixed point.
- ``save_failure`` writes the original first, then the reduced trace, under
  ``FENCE_ARTIFACT_DIR`` (default ``artifacts``)/failures and returns the replay commands.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ops.sim.trace import Trace, TraceError, dumps, parse

__all__ = ["Predicate", "artifact_dir", "expected", "failure_of", "reduce_trace", "save_failure",
           "save_trace"]

Predicate = Callable[[Trace], str | None]
_PLACE = re.compile(r"^[^:]*: ")


def expected(report: Mapping[str, Any]) -> bool:
    """True for the outcome a generated run must have: PASS; PASS_WITH_EXCLUSIONS when its
    config accepts retention gaps (the records the operator gave up are excluded); BLOCKED
    by a ``RecreatedTopic`` refusal when the topic was recreated before the drain (an
    operator must choose where it restarts); BLOCKED by a ``RetentionGap`` refusal when
    Kafka deleted records mid-run and the config does not accept retention gaps (an
    operator must re-produce them or accept the loss)."""
    status = report["status"]
    if status == "BLOCKED" and report.get("topic_recreated_before_drain"):
        return any("RecreatedTopic" in d for d in report["diagnostics"])
    if status == "BLOCKED" and report.get("expired_mid_run") and not report[
            "allow_retention_gap"]:
        return any("RetentionGap" in d for d in report["diagnostics"])
    return status == "PASS" or (
        status == "PASS_WITH_EXCLUSIONS" and report["allow_retention_gap"])


def failure_of(report: Mapping[str, Any]) -> str | None:
    """The failure string of a report: status and first violation without its place
    (``None`` when the run is ``expected``). Deleting a step may renumber attempts; the
    violation text itself (epochs, offsets, lifetimes) must stay the same."""
    if expected(report):
        return None
    first = (report["violations"] or report["diagnostics"] or [""])[0]
    return f"{report['status']}: {_PLACE.sub('', first, count=1)}"


def _valid(trace: Trace) -> Trace | None:
    try:
        return parse(dumps(trace))
    except TraceError:
        return None


def _without_step(trace: Trace, i: int) -> Trace:
    return replace(trace, steps=trace.steps[:i] + trace.steps[i + 1:])


def _without_fault(trace: Trace, i: int, j: int) -> Trace:
    step = trace.steps[i]
    fewer = replace(step, faults=step.faults[:j] + step.faults[j + 1:])
    return replace(trace, steps=(*trace.steps[:i], fewer, *trace.steps[i + 1:]))


def reduce_trace(trace: Trace, failure: Predicate) -> Trace:
    """A trace reduced by single deletions to a fixed point, failing exactly like ``trace``."""
    target = failure(trace)
    if target is None:
        raise ValueError("reduce_trace: the trace does not fail")
    current = trace

    def keep(cand: Trace) -> bool:
        nonlocal current
        valid = _valid(cand)
        if valid is not None and failure(valid) == target:
            current = valid
            return True
        return False

    progress = True
    while progress:
        progress = False
        for i in reversed(range(len(current.steps))):
            progress |= keep(_without_step(current, i))
        for i in reversed(range(len(current.steps))):
            for j in reversed(range(len(current.steps[i].faults))):
                progress |= keep(_without_fault(current, i, j))
    return current


def artifact_dir() -> Path:
    return Path(os.environ.get("FENCE_ARTIFACT_DIR", "artifacts"))


def save_trace(trace: Trace, name: str, *, cli: str = "fencectl") -> str:
    """Write ``trace`` under the failures folder; return its replay command, the CLI named
    as ``cli`` (``fencectl sim-worker`` passes ``ops.hints.fencectl()``)."""
    folder = artifact_dir() / "failures"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(dumps(trace), encoding="utf-8")
    return f"{cli} sim-worker --replay {path}"


def save_failure(original: Trace, failure: Predicate, name: str, *,
                 cli: str = "fencectl") -> list[str]:
    """Write the original trace first (it survives a crash or an interrupted reduction),
    then reduce it and write the reduced trace; return the replay commands (``save_trace``)."""
    commands = [save_trace(original, name, cli=cli)]
    commands.append(save_trace(reduce_trace(original, failure), f"{name}-reduced", cli=cli))
    return commands
