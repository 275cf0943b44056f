"""The simulator's report and its status rules (pure).

Status precedence (first that applies):
1. ERROR: any oracle or invariant violation (or an internal error).
2. BLOCKED: drain was requested and could not finish the source (even when the run was
   already INCOMPLETE before the drain: a drain that cannot finish outranks it).
3. INCOMPLETE: no drain and the final boundary is below the end of the source; never
   turned into a PASS.
4. PASS_WITH_EXCLUSIONS: passed, but records deleted by retention were skipped (the
   operator's ``allow_retention_gap``) and excluded from the comparison; or, without a
   drain, complete while a lifetime was stopped or retired with a call in flight and no
   live successor holds the current epoch of that call's partitions (the interrupted
   call is left to a successor no run started: the report lists it under ``lifetimes``
   and in ``diagnostics``). A takeover in the run (a replacement that goes on) is such a
   successor.
5. PASS.
``before_drain`` is the same rule applied to the state before the drain (ERROR,
INCOMPLETE or PASS). ``lifetimes`` is every lifetime's end state: ``live``, ``stopped``,
``retiring`` or ``retired``, the reason it left LIVE, and the attempt whose call it was
in (``ended_in_flight``: attempt, actor, partitions, ``followed_up_by``; None for a
lifetime still live or stopped between calls).
"""

from __future__ import annotations

import enum
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ops.sim.trace import IMPLEMENTATION, Trace, config_digest

__all__ = ["LABEL", "Status", "build_report", "dumps_report", "final_status"]

LABEL = "production-worker-lifecycle; memory I/O and logical time"


class Status(enum.Enum):
    PASS = "PASS"
    PASS_WITH_EXCLUSIONS = "PASS_WITH_EXCLUSIONS"
    INCOMPLETE = "INCOMPLETE"
    BLOCKED = "BLOCKED"
    ERROR = "ERROR"


def final_status(*, violations: int, drain: bool, blocked: bool, complete: bool,
                 excluded: int, ended_in_flight: int = 0) -> Status:
    """The status of a run by the precedence in the module doc."""
    if violations:
        return Status.ERROR
    if drain and blocked:
        return Status.BLOCKED
    if not drain and not complete:
        return Status.INCOMPLETE
    if excluded or (not drain and ended_in_flight):
        return Status.PASS_WITH_EXCLUSIONS
    return Status.PASS


def build_report(trace: Trace, *, attempts: Sequence[Mapping[str, Any]],
                 events: Sequence[Mapping[str, Any]], violations: Sequence[str],
                 violations_before: int, complete_before: bool,
                 boundary_before: Mapping[str, Any], boundary: Mapping[str, Any],
                 drained: bool, blocked: bool, excluded: int, diagnostics: Sequence[str],
                 checks: int, lifetimes: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    complete = bool(boundary) and all(
        (b["frontier"] or 0) >= b["end"] for b in boundary.values())
    in_flight = [lt for lt in lifetimes if lt.get("ended_in_flight") is not None
                 and lt["ended_in_flight"].get("followed_up_by") is None]
    status = final_status(violations=len(violations), drain=trace.drain, blocked=blocked,
                          complete=complete, excluded=excluded, ended_in_flight=len(in_flight))
    before = final_status(violations=violations_before, drain=False, blocked=False,
                          complete=complete_before, excluded=0)
    diags = list(diagnostics)
    if status is Status.PASS_WITH_EXCLUSIONS and not trace.drain:
        diags.extend(f"lifetime {lt['lifetime']} ended {lt['state']} with a call in flight "
                     f"(attempt {lt['ended_in_flight']['attempt']}, "
                     f"{lt['ended_in_flight']['actor']}): no drain followed it up"
                     for lt in in_flight)
    if status is Status.INCOMPLETE:
        diags.extend(f"partition {p}: durable frontier {b['frontier']}, source ends at "
                     f"{b['end']}" for p, b in sorted(boundary.items())
                     if (b["frontier"] or 0) < b["end"])
    selected = Counter(f"{e['operation']}:{e['selected']}" for e in events
                       if e["selected"] is not None)
    return {
        "label": LABEL, "implementation": IMPLEMENTATION, "seed": trace.seed,
        "class": trace.config.klass, "config_digest": config_digest(trace.config),
        "status": status.value, "before_drain": before.value, "drain": trace.drain,
        "drained": drained, "allow_retention_gap": trace.config.allow_retention_gap,
        "topic_recreated_before_drain": trace.config.topic_recreated_before_drain,
        "expired_mid_run": any(s.actor == "expire" for s in trace.steps),
        "boundary_before_drain": dict(boundary_before),
        "boundary": dict(boundary), "excluded_records": excluded,
        "lifetimes": [dict(lt) for lt in lifetimes],
        "violations": list(violations), "diagnostics": diags, "oracle_checks": checks,
        "fault_counts": {"selected": sum(selected.values()), **dict(sorted(selected.items()))},
        "results": dict(sorted(Counter(a["result"] for a in attempts).items())),
        "attempts": list(attempts), "events": list(events),
    }


def dumps_report(report: Mapping[str, Any]) -> str:
    """Canonical JSON text of a report (byte-identical for identical runs)."""
    return json.dumps(report, sort_keys=True, indent=1, ensure_ascii=True) + "\n"
