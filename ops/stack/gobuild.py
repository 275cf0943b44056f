"""Go builds of the local stack's services (Jaeger, Prometheus) through the Go module proxy.

Rules:
- ``GOMODCACHE`` and ``GOCACHE`` live under ``<cache>/go`` and are shared by every build, so
  modules and compiled packages common to Jaeger and Prometheus are fetched and compiled
  once per machine.
- ``run_logged`` appends the command and its output to a log and raises StackError with the
  log's tail when the command fails; nothing here decides what to build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ops.stack.config import StackError, StackSettings

__all__ = ["go_env", "go_executable", "run_logged"]


def go_env(settings: StackSettings) -> dict[str, str]:
    """The environment of a build: the caller's, with the shared module and build caches."""
    cache = settings.paths.cache / "go"
    return {
        **os.environ,
        "GOMODCACHE": str(cache / "mod"),
        "GOCACHE": str(cache / "build"),
        "GOFLAGS": "-modcacherw",
    }


def go_executable(target: Path, *, go_version: str, rerun: str) -> str:
    """``go`` on PATH; StackError naming the install when missing (``target`` is to be built,
    ``go_version`` the oldest Go that builds it, ``rerun`` the command to run afterwards)."""
    go = shutil.which("go")
    if go is None:
        raise StackError(
            f"the binary {target} is missing and `go` is not on PATH to build it. "
            f"Install Go {go_version} or newer (https://go.dev/dl/ or apt-get install -y "
            f"golang-go), then rerun `{rerun}`."
        )
    return go


def run_logged(argv: list[str], *, cwd: Path, env: dict[str, str], log: Path,
               what: str) -> None:
    """Run ``argv`` with its output appended to ``log``; StackError (building ``what``
    failed, the log's last lines) when it exits non-zero."""
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(argv)}\n")
        fh.flush()
        done = subprocess.run(
            argv, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise StackError(
            f"building {what} failed at `{' '.join(argv[:3])}` (exit "
            f"{done.returncode}); check access to the Go module proxy (GOPROXY). Log {log}:\n{tail}"
        )
