"""Named crash points in the production code path, inert unless armed.

It lives in ``fencing`` (not ``consumer``) because three points sit in the PostgreSQL store
(``in-handler``, ``commit-in-flight``, ``after-attempt-count``) and one in the guarded skip
(``in-gap-skip``), and
the fence may not import the worker; the worker and its Kafka adapter import it from here.

Rules
- Armed by ``FENCE_CRASH_AT=<point>[@<n>]`` in the environment at import: the n-th time
  (default 1) ``crash_point(<point>, ...)`` is reached in this process it fires. Unarmed,
  ``crash_point`` is one module-level ``None`` check: no I/O, no allocation beyond the call.
- Firing appends one JSON line (point, n, pid, wall time, the call's fields: partition,
  offsets, epoch, ...) to ``FENCE_CRASH_MARKER`` (default ``fence-crash-marker.jsonl``),
  then at once sends the process ``FENCE_CRASH_SIGNAL``: ``KILL`` (default; no cleanup,
  no flush, no atexit) or ``STOP`` (the zombie: the process freezes at the point and goes
  on from it after SIGCONT). No fsync between: what a process wrote survives its kill (the
  kernel's page cache holds it), and an fsync would leave the process's other threads
  milliseconds to write to the database after the marker's time (a heartbeat on the loop
  while the Kafka thread fires in a revoke callback, seen under load).
- A malformed ``FENCE_CRASH_AT`` or an unknown point never silently disarms: ``armed()``
  raises ``ConfigError`` naming it (``fencectl run`` calls it at start: exit 2).
- ``parse_spec`` is pure; the only I/O is ``fire``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fencing.errors import ConfigError

__all__ = [
    "POINTS",
    "TOOL_POINTS",
    "CrashSpec",
    "armed",
    "crash_point",
    "is_armed_for",
    "parse_spec",
]

#: every point and where it sits (docs/crash-matrix.md)
POINTS: Mapping[str, str] = {
    "after-validate": "consumer.lifecycle: validation passed, nothing claimed",
    "after-claim": "consumer.lifecycle: claim committed, tokens retained, before seek",
    "after-seek": "consumer.kafka.adapter: assigned at the durable frontiers, nothing fetched",
    "in-handler": "fencing.postgres.store: handler effects and quarantine written, before COMMIT",
    "commit-in-flight": "fencing.postgres.store: COMMIT written to the socket, reply not read",
    "after-commit": "consumer.lifetime_run: batch committed, before the Kafka offset commit",
    "after-kafka-commit": "consumer.kafka.adapter: Kafka acknowledged the offset commit",
    "in-revoke": "consumer.lifecycle: revoke started (mutex held), before settle and release",
    "in-gap-skip": "fencing.guarded: gap-skip committed, before the token is retained",
    "in-heartbeat": "consumer.observability.heartbeat: member row written",
    "in-shutdown": "consumer.lifetime_run: after SIGTERM, fetching stopped, batches in flight",
    "after-attempt-count": "fencing.postgres.store: a retry's attempt count committed, before "
                           "the retry runs",
    "in-bisection-probe": "consumer.failure_run: a bisection probe's handler returned inside "
                          "its transaction, before COMMIT",
}
#: points in the operator tools and the table sink's evolution, armed the same way; each is
#: proven by its own tests (not by the worker's crash matrix, which covers ``POINTS``)
TOOL_POINTS: Mapping[str, str] = {
    "sink-after-alter": "fencing.postgres.sink.evolving: the columns added over FENCE_DDL_DSN "
                        "(committed), before the batch is rolled back and retried",
    "relay-after-ack": "ops.commands.relay: the broker acknowledged the dead letters, before "
                       "their rows are marked relayed",
    "in-replay": "ops.operator.quarantine: a replayed record applied and its row marked, "
                 "before the replay's COMMIT",
    "in-reset": "ops.commands.reset: the partition rows moved and journaled under the "
                "operation id, before the reset's COMMIT",
}

_SIGNALS = {"KILL": signal.SIGKILL, "STOP": signal.SIGSTOP}


@dataclass(frozen=True, slots=True)
class CrashSpec:
    """An armed point: fire at its ``nth`` reach with ``signal_name`` (KILL or STOP)."""

    point: str
    nth: int = 1
    signal_name: str = "KILL"
    marker: str = "fence-crash-marker.jsonl"


def parse_spec(at: str, *, signal_name: str = "KILL",
               marker: str = "fence-crash-marker.jsonl") -> CrashSpec:
    """``<point>[@<n>]`` -> ``CrashSpec``; ``ValueError`` names what is wrong."""
    point, sep, nth_text = at.strip().partition("@")
    if point not in POINTS and point not in TOOL_POINTS:
        raise ValueError(f"unknown crash point {point!r}; known: "
                         f"{', '.join([*POINTS, *TOOL_POINTS])}")
    nth = 1
    if sep:
        if not nth_text.isdigit() or int(nth_text) < 1:
            raise ValueError(f"crash point {at!r}: @<n> needs a positive integer")
        nth = int(nth_text)
    if signal_name.upper() not in _SIGNALS:
        raise ValueError(f"FENCE_CRASH_SIGNAL {signal_name!r}: use KILL or STOP")
    return CrashSpec(point, nth, signal_name.upper(), marker)


@dataclass(slots=True)
class _Armed:
    spec: CrashSpec
    reached: dict[str, int] = field(default_factory=dict)


def _arm(env: Mapping[str, str]) -> tuple[_Armed | None, str | None]:
    at = env.get("FENCE_CRASH_AT", "")
    if not at:
        return None, None
    try:
        spec = parse_spec(at, signal_name=env.get("FENCE_CRASH_SIGNAL", "KILL"),
                          marker=env.get("FENCE_CRASH_MARKER") or "fence-crash-marker.jsonl")
    except ValueError as exc:
        return None, f"FENCE_CRASH_AT {at!r}: {exc}"
    return _Armed(spec), None


_ARMED, _ARMING_ERROR = _arm(os.environ)


def armed() -> CrashSpec | None:
    """The armed point (None when unarmed); ``ConfigError`` if ``FENCE_CRASH_AT`` is bad."""
    if _ARMING_ERROR is not None:
        raise ConfigError(_ARMING_ERROR)
    return None if _ARMED is None else _ARMED.spec


def is_armed_for(point: str) -> bool:
    """True when ``point`` is the armed one (for a point that needs a different code shape)."""
    return _ARMED is not None and _ARMED.spec.point == point


def crash_point(point: str, **fields: Any) -> None:
    """Fire if ``point`` is armed and this is its n-th reach (see the module Rules)."""
    if _ARMED is None or _ARMED.spec.point != point:
        return
    n = _ARMED.reached.get(point, 0) + 1
    _ARMED.reached[point] = n
    if n == _ARMED.spec.nth:
        fire(_ARMED.spec, n, fields)


def fire(spec: CrashSpec, n: int, fields: Mapping[str, Any]) -> None:
    """Append the marker line, signal this process (KILL does not return)."""
    line = json.dumps({"point": spec.point, "n": n, "pid": os.getpid(), "at": time.time(),
                       "signal": spec.signal_name, **fields}, default=str, sort_keys=True)
    fd = os.open(spec.marker, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
    os.kill(os.getpid(), _SIGNALS[spec.signal_name])
