"""Leases on the local stack for concurrent test sessions.

Rules:
- Every session using the local stack holds a lease (``.stack/leases/<pid>``) from
  before it calls ``up`` until it is done.
- Services a session had to start are recorded as *session-started*
  (``.stack/leases/started``); services that were already running (e.g. started
  with ``fencectl stack up``) are never recorded, so never stopped by a session.
- When the last live lease is released, the session-started services are stopped.
  Leases of dead pids are ignored, so a killed session cannot pin the stack forever.
- A ``scope`` keeps its own leases and its own record (``.stack/leases-<scope>/``): the
  three-node Kafka cluster (scope ``kafka-cluster``) is started by the tests that need it
  and stopped when the last session holding it releases it, apart from the stack's lease.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from ops.stack import control as stack
from ops.stack.config import Service, StackSettings
from ops.stack.procs import alive, file_lock

__all__ = ["acquire", "record_started", "release"]


def _dir(settings: StackSettings, scope: str = "") -> Path:
    return settings.paths.root / (f"leases-{scope}" if scope else "leases")


def _started_file(settings: StackSettings, scope: str = "") -> Path:
    return _dir(settings, scope) / "started"


def acquire(settings: StackSettings, *, pid: int | None = None, scope: str = "") -> None:
    """Register a lease for ``pid`` (default: this process) in ``scope``."""
    folder = _dir(settings, scope)
    with file_lock(folder / "lock"):
        (folder / str(pid or os.getpid())).write_text("")


def record_started(settings: StackSettings, services: Iterable[Service], *,
                   scope: str = "") -> None:
    """Remember that a session started ``services`` (they stop with the scope's last lease)."""
    folder = _dir(settings, scope)
    with file_lock(folder / "lock"):
        path = _started_file(settings, scope)
        known = set(path.read_text().split()) if path.exists() else set()
        known.update(s.value for s in services)
        path.write_text("\n".join(sorted(known)) + "\n")


def _live_leases(folder: Path) -> list[int]:
    pids = []
    for entry in folder.iterdir():
        if entry.name.isdigit():
            if alive(int(entry.name)):
                pids.append(int(entry.name))
            else:
                entry.unlink(missing_ok=True)
    return pids


def release(
    settings: StackSettings, *, pid: int | None = None, out: Callable[[str], None] = print,
    scope: str = "",
) -> list[Service]:
    """Drop the lease of ``pid`` in ``scope``; if no live lease remains there, stop the
    services sessions started in it and return them (else return [])."""
    folder = _dir(settings, scope)
    with file_lock(folder / "lock"):
        (folder / str(pid or os.getpid())).unlink(missing_ok=True)
        if _live_leases(folder):
            return []
        path = _started_file(settings, scope)
        names = set(path.read_text().split()) if path.exists() else set()
        services = [s for s in Service if s.value in names]
        if services:
            stack.down(settings, services=services, out=out)
        path.unlink(missing_ok=True)
        return services
