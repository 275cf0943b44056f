"""Test support for the observability integration tests: Jaeger, HTTP probes, metrics, CLI.

Everything talks to the real services and real ``fencectl`` subprocesses; polling is bounded.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.workers import ROOT, GroupSetup, WorkerProc
from tests.polling import wait_until

__all__ = [
    "FAST_EAGER",
    "Span",
    "free_port",
    "http_get",
    "jaeger_spans",
    "jaeger_trace",
    "metric",
    "readyz",
    "run_fencectl",
    "start_worker",
    "unique_service",
    ]

# eager range assignment, 2 s sessions (the local broker allows them), 1 s heartbeats
FAST_EAGER = GroupSetup("obs-eager", ("--group-protocol", "classic", "--assignment-strategy",
                                      "range", "-X", "session.timeout.ms=2000", "-X",
                                      "heartbeat.interval.ms=300"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, *, timeout_s: float = 5.0) -> tuple[int, str] | None:
    """``(status, body)``; None when nothing listens (yet)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def readyz(base: str) -> tuple[int, dict[str, Any]] | None:
    got = http_get(base + "/readyz")
    return None if got is None else (got[0], json.loads(got[1]))


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0.0 when none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def start_worker(*, topic: str, group: str, schema: str, setup: GroupSetup = FAST_EAGER,
                 http_port: int | None = None, service: str | None = None,
                 env: dict[str, str] | None = None, extra: Sequence[str] = (),
                 name: str = "w") -> WorkerProc:
    """A ``fencectl run`` subprocess exporting spans as ``service`` (none when None)."""
    full_env = {"OTEL_TRACES_EXPORTER": "otlp" if service else "none",
                "OTEL_SERVICE_NAME": service or "fenceworker-test"}
    full_env.update(env or {})
    args = ["--heartbeat-interval-s", "1", *extra]
    if http_port is not None:
        args += ["--http-port", str(http_port)]
    return WorkerProc(topic=topic, group=group, schema=schema, setup=setup, extra=args,
                      env=full_env, name=name)


def run_fencectl(*args: str, env: dict[str, str] | None = None,
                 timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "ops.cli", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout_s, check=False)


def unique_service(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class Span:
    trace_id: str
    span_id: str
    name: str
    service: str
    tags: dict[str, Any]
    refs: tuple[tuple[str, str, str], ...]  # (refType, traceID, spanID)

    @property
    def parent(self) -> str | None:
        return next((sid for kind, _t, sid in self.refs if kind == "CHILD_OF"), None)

    def links(self) -> set[tuple[str, str]]:
        return {(tid, sid) for kind, tid, sid in self.refs if kind == "FOLLOWS_FROM"}


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _spans_of(traces: list[dict[str, Any]]) -> list[Span]:
    out: list[Span] = []
    for tr in traces:
        procs = {k: v["serviceName"] for k, v in (tr.get("processes") or {}).items()}
        for s in tr["spans"]:
            out.append(Span(
                trace_id=s["traceID"].rjust(32, "0"), span_id=s["spanID"].rjust(16, "0"),
                name=s["operationName"], service=procs.get(s.get("processID"), ""),
                tags={t["key"]: t["value"] for t in s.get("tags", [])},
                refs=tuple((r["refType"], r["traceID"].rjust(32, "0"), r["spanID"].rjust(16, "0"))
                           for r in s.get("references", []))))
    return out


def jaeger_spans(query_url: str, service: str, *, until: Callable[[list[Span]], bool],
                 timeout_s: float = 30.0, operation: str | None = None) -> list[Span]:
    """Every span of ``service`` (Jaeger query API), polled until ``until(spans)`` holds."""
    params = {"service": service, "limit": "1000", "lookback": "1h"}
    if operation is not None:
        params["operation"] = operation
    url = f"{query_url}/api/traces?{urllib.parse.urlencode(params)}"
    last: list[Span] = []

    def ready() -> bool:
        nonlocal last
        try:
            last = _spans_of(list(_get_json(url).get("data") or []))
        except (urllib.error.URLError, ValueError):
            return False
        return until(last)

    try:
        wait_until(ready, timeout_s=timeout_s, what=f"spans of {service} in Jaeger",
                 interval_s=0.5)
    except AssertionError as exc:
        names = sorted({s.name for s in last})
        raise AssertionError(f"{exc}; spans seen: {names}") from None
    return last


def jaeger_trace(query_url: str, trace_id: str) -> list[Span]:
    return _spans_of(list(_get_json(f"{query_url}/api/traces/{trace_id}").get("data") or []))
