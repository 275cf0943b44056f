"""Prometheus for the local stack: built through the Go module proxy, the alert rules loaded.

Rules:
- ``prometheus`` and ``promtool`` are ``<cache>/bin/{prometheus,promtool}-<version>``, built
  once per machine by one ``go install`` of both commands (the module has no ``replace``
  directive, so ``go install pkg@version`` works) with the shared Go caches
  (``ops.stack.gobuild``). The ``remove_all_sd`` tag leaves out every service discovery
  but file and HTTP; without ``builtinassets`` the web UI's assets are absent, the HTTP API
  is complete. A file lock keeps builds single.
- ``start`` writes ``.stack/prometheus/prometheus.yml``: listen on
  ``127.0.0.1:$FENCE_PROMETHEUS_PORT`` only, scrape every 2 s and evaluate every second, load
  ``ops/monitoring/fenceworker.rules.yml``, and scrape job ``fenceworker`` at the targets
  named by the files ``.stack/prometheus/targets/*.json`` (file_sd; Prometheus re-reads a
  file when it changes). ``write_targets`` writes such a file atomically.
- The rule file is read at start; ``reload`` (``POST /-/reload``, enabled by
  ``--web.enable-lifecycle`` on the loopback-only port) re-reads it and the config.
- Healthy means ``GET /-/ready`` answers 200 and ``GET /api/v1/rules`` lists the
  ``fenceworker`` rule group.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ops.monitoring import RULES
from ops.stack.config import HOST, PROMETHEUS_VERSION, Service, StackError, StackSettings
from ops.stack.gobuild import go_env, go_executable, run_logged
from ops.stack.procs import file_lock, spawn

__all__ = [
    "JOB",
    "RELEASE",
    "STOP_SIGNAL",
    "binary",
    "check",
    "config",
    "marker",
    "promtool",
    "reload",
    "start",
    "targets_dir",
    "url",
    "write_targets",
]

STOP_SIGNAL = signal.SIGTERM
JOB = "fenceworker"  # the scrape job of the workers (the rules' FenceWorkerDown selects it)
# the local stack's scrape interval (and timeout) and rule evaluation interval: a scrape that
# times out marks the target's series stale, which resets every pending alert of it, so a
# loaded machine needs some room
SCRAPE_INTERVAL = "2s"
EVALUATION_INTERVAL = "1s"
RULE_GROUP = "fenceworker"
_MODULE = "github.com/prometheus/prometheus"
_VERSION_FLAG = "github.com/prometheus/common/version.Version"
_GO_VERSION = "1.26.7"  # the go directive of the module's go.mod
RELEASE = "3.16.0"  # the Prometheus release of PROMETHEUS_VERSION (its VERSION file)


def marker(settings: StackSettings) -> str:
    """A string Prometheus's command line contains (its config under ``.stack/``)."""
    return str(settings.paths.service_dir(Service.PROMETHEUS) / "prometheus.yml")


def targets_dir(settings: StackSettings) -> Path:
    """The folder of file_sd target files (``*.json``) of job ``fenceworker``."""
    return settings.paths.service_dir(Service.PROMETHEUS) / "targets"


def url(settings: StackSettings) -> str:
    """The base URL of the HTTP API."""
    return f"http://{HOST}:{settings.ports.prometheus}"


def _build(settings: StackSettings) -> None:
    paths = settings.paths
    go = go_executable(paths.prometheus_binary, go_version=_GO_VERSION,
                       rerun=f"{settings.cli} stack up")
    stage = paths.cache / "prometheus" / PROMETHEUS_VERSION
    stage.mkdir(parents=True, exist_ok=True)
    with file_lock(stage.parent / "build.lock"):
        if paths.prometheus_binary.exists() and paths.promtool_binary.exists():
            return  # another process built them while we waited
        run_logged(
            [go, "install", "-tags", "remove_all_sd", "-trimpath",
             f"-ldflags=-s -w -X {_VERSION_FLAG}={RELEASE}",
             f"{_MODULE}/cmd/prometheus@{PROMETHEUS_VERSION}",
             f"{_MODULE}/cmd/promtool@{PROMETHEUS_VERSION}"],
            cwd=stage, env={**go_env(settings), "GOBIN": str(stage)},
            log=stage.parent / "build.log", what=f"Prometheus {PROMETHEUS_VERSION}")
        paths.prometheus_binary.parent.mkdir(parents=True, exist_ok=True)
        (stage / "promtool").replace(paths.promtool_binary)
        (stage / "prometheus").replace(paths.prometheus_binary)


def binary(settings: StackSettings) -> Path:
    """The Prometheus server, built with promtool when missing; raises StackError."""
    if not settings.paths.prometheus_binary.exists():
        _build(settings)
    return settings.paths.prometheus_binary


def promtool(settings: StackSettings) -> Path:
    """promtool of the same version, built with the server when missing; raises StackError."""
    if not settings.paths.promtool_binary.exists():
        _build(settings)
    return settings.paths.promtool_binary


def config(settings: StackSettings) -> dict[str, Any]:
    """The configuration ``start`` writes (JSON is YAML)."""
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_INTERVAL,
                   "evaluation_interval": EVALUATION_INTERVAL},
        "rule_files": [str(RULES)],
        "scrape_configs": [{
            "job_name": JOB,
            "file_sd_configs": [{"files": [str(targets_dir(settings) / "*.json")],
                                 "refresh_interval": "5s"}],
        }],
    }


def write_targets(settings: StackSettings, name: str, targets: Sequence[str],
                  labels: Mapping[str, str] | None = None) -> Path:
    """Write ``targets`` (``host:port`` of workers' ``--http-port``) as the file_sd file
    ``<name>.json`` (replaced atomically; an empty ``targets`` removes the file)."""
    folder = targets_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    if not targets:
        path.unlink(missing_ok=True)
        return path
    tmp = folder / f".{name}.tmp"  # outside the *.json pattern until renamed
    tmp.write_text(json.dumps([{"targets": list(targets), "labels": dict(labels or {})}]))
    os.replace(tmp, path)
    return path


def start(settings: StackSettings) -> int:
    """Build if needed, write the config under ``.stack/``, start Prometheus detached;
    return its pid."""
    exe = binary(settings)
    svc = settings.paths.service_dir(Service.PROMETHEUS)
    targets_dir(settings).mkdir(parents=True, exist_ok=True)
    path = Path(marker(settings))
    path.write_text(json.dumps(config(settings), indent=2) + "\n")
    return spawn(
        [str(exe), f"--config.file={path}",
         f"--web.listen-address={HOST}:{settings.ports.prometheus}",
         f"--storage.tsdb.path={svc / 'data'}", "--storage.tsdb.retention.time=1d",
         "--web.enable-lifecycle"],
        log_path=settings.paths.log_file(Service.PROMETHEUS),
        pid_path=settings.paths.pid_file(Service.PROMETHEUS),
        cwd=svc,
    )


def reload(settings: StackSettings, *, timeout_s: float = 10.0) -> None:
    """Make the running Prometheus re-read its config and the rule file; StackError when it
    refuses (e.g. a rule file that does not parse: the old rules stay loaded)."""
    request = urllib.request.Request(f"{url(settings)}/-/reload", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            pass
    except urllib.error.HTTPError as exc:
        raise StackError(f"Prometheus refused to reload {RULES}: {exc.read().decode()!r:.300}"
                         ) from None
    except (urllib.error.URLError, OSError) as exc:
        raise StackError(f"POST {url(settings)}/-/reload failed: {exc}") from exc


def _get_json(address: str, timeout_s: float) -> object:
    with urllib.request.urlopen(address, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def check(settings: StackSettings, *, timeout_s: float = 5.0) -> str | None:
    """Probe readiness and the loaded rules; None when healthy, else the reason."""
    base = url(settings)
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=timeout_s) as resp:
            if resp.status != 200:
                return f"GET {base}/-/ready answered {resp.status}"
        body = _get_json(f"{base}/api/v1/rules", timeout_s)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"GET {base} failed: {exc}"
    groups = body.get("data", {}).get("groups", []) if isinstance(body, dict) else []
    if not any(g.get("name") == RULE_GROUP for g in groups):
        return f"rule group {RULE_GROUP!r} of {RULES} is not loaded (see the log)"
    return None
