"""Jaeger v2 for the local stack: built through the Go module proxy, in-memory storage.

Rules:
- The binary is ``<cache>/bin/jaeger-<version>``, built once per machine in the
  scratch module ``<cache>/jaeger/build`` with the shared Go caches (``ops.stack.gobuild``;
  ``go install ...@version`` fails on the module's ``replace`` directive, hence
  ``go get -tool`` then ``go build``). A file lock keeps builds single.
- ``ops/stack/jaeger-config.yaml`` binds OTLP gRPC/HTTP, the query API and the health
  check to 127.0.0.1; ports reach it as ``FENCE_*_PORT`` environment variables.
- Healthy means ``GET /api/services`` answers JSON with a ``data`` key and both
  OTLP ports accept connections.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import urllib.error
import urllib.request
from pathlib import Path

from ops.stack.config import HOST, JAEGER_VERSION, PORT_ENV, Service, StackSettings
from ops.stack.gobuild import go_env, go_executable, run_logged
from ops.stack.procs import file_lock, spawn

__all__ = ["CONFIG", "STOP_SIGNAL", "binary", "check", "marker", "start"]

STOP_SIGNAL = signal.SIGTERM
CONFIG = Path(__file__).resolve().parent / "jaeger-config.yaml"
_MODULE = "github.com/jaegertracing/jaeger"


def marker(settings: StackSettings) -> str:
    """A string Jaeger's command line contains (its config copy under ``.stack/``)."""
    return str(settings.paths.service_dir(Service.JAEGER) / "config.yaml")


def binary(settings: StackSettings) -> Path:
    """The Jaeger binary, built through the Go module proxy when missing; raises StackError."""
    target = settings.paths.jaeger_binary
    if target.exists():
        return target
    go = go_executable(target, go_version="1.24", rerun=f"{settings.cli} stack up")
    build = settings.paths.cache / "jaeger" / "build"
    build.mkdir(parents=True, exist_ok=True)
    with file_lock(build.parent / "build.lock"):
        if target.exists():  # another process built it while we waited
            return target
        env, log = go_env(settings), build.parent / "build.log"
        what = f"Jaeger {JAEGER_VERSION}"
        if not (build / "go.mod").exists():
            run_logged([go, "mod", "init", "fenceworker-jaeger-build"], cwd=build, env=env,
                       log=log, what=what)
        run_logged([go, "get", "-tool", f"{_MODULE}/cmd/jaeger@{JAEGER_VERSION}"], cwd=build,
                   env=env, log=log, what=what)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        run_logged([go, "build", "-o", str(tmp), f"{_MODULE}/cmd/jaeger"], cwd=build, env=env,
                   log=log, what=what)
        tmp.replace(target)
    return target


def start(settings: StackSettings) -> int:
    """Build if needed, copy the config under ``.stack/``, start Jaeger detached; return pid."""
    exe = binary(settings)
    svc = settings.paths.service_dir(Service.JAEGER)
    svc.mkdir(parents=True, exist_ok=True)
    config = Path(marker(settings))
    shutil.copyfile(CONFIG, config)
    env = {**os.environ}
    for field, (name, _default) in PORT_ENV.items():
        env[name] = str(getattr(settings.ports, field))
    return spawn(
        [str(exe), "--config", str(config)],
        log_path=settings.paths.log_file(Service.JAEGER),
        pid_path=settings.paths.pid_file(Service.JAEGER),
        env=env,
        cwd=svc,
    )


def check(settings: StackSettings, *, timeout_s: float = 5.0) -> str | None:
    """Call the query API and probe the OTLP ports; None when healthy, else the reason."""
    url = f"http://{HOST}:{settings.ports.jaeger_query}/api/services"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"GET {url} failed: {exc}"
    if not isinstance(body, dict) or "data" not in body:
        return f"GET {url} answered without a data field: {body!r:.200}"
    for port in (settings.ports.otlp_grpc, settings.ports.otlp_http):
        try:
            socket.create_connection((HOST, port), timeout=timeout_s).close()
        except OSError as exc:
            return f"OTLP port {HOST}:{port} refused: {exc}"
    return None
