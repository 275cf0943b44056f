"""The production files in ``compose/`` (docs/production.md) are accepted by ``fencectl`` as
written and keep the page's rules; no services needed.

- ``compose/kubernetes/*.yaml``: the StatefulSet's arguments are a ``fencectl run`` command
  line (the image's ENTRYPOINT) that the real parser and the worker's own configuration
  checks accept, librdkafka included; its ``--instance-id`` is the pod name (``fieldRef``
  ``metadata.name``); its probes ask ``/healthz`` and ``/readyz`` on the port ``--http-port``
  names, on an interface other than loopback, and the real HTTP server answers those paths;
  ``terminationGracePeriodSeconds`` covers the drain (``--shutdown-timeout-s`` +
  ``--call-budget-s`` + 20 s, the bound ``fencectl run --processes`` gives its members); the
  startup probe outlasts a start-up outage of Kafka and then of PostgreSQL
  (``--outage-bound-s`` each); no secret in any argument, ``FENCE_DSN`` from a Secret; every
  file a setting names is mounted from the Secret that holds it; the migrate Job grants
  the role the worker's DSN logs in as.
- ``compose/systemd/fenceworker.service``: ``ExecStart`` is such a command line, the unit
  restarts exactly the exits the project's own supervisor restarts
  (``ops.worker.supervisor.restartable``), ``TimeoutStopSec`` covers the drain, secrets sit
  only in the EnvironmentFile; ``systemd-analyze verify`` accepts it where installed.
- ``compose/Dockerfile``: ENTRYPOINT ``fencectl`` (the project's console script), a numeric
  USER equal to the pods' ``runAsUser``, and the files it copies hold every package
  ``pyproject.toml`` installs and import every command.

Each check is a function returning its problems; doctored copies show each rule can fail.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.error import HTTPError
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from consumer.exits import ExitCode
from fencing.errors import ConfigError
from ops.cli import COMMAND_MODULES, build_parser
from ops.worker import supervisor

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
K8S = COMPOSE / "kubernetes"
UNIT = COMPOSE / "systemd" / "fenceworker.service"
ENV_EXAMPLE = COMPOSE / "systemd" / "fenceworker.env.example"
DOCKERFILE = COMPOSE / "Dockerfile"
PAGE = ROOT / "docs" / "production.md"

POD_NAME = "fenceworker-0"  # what $(POD_NAME) is in the first pod of the StatefulSet
HOST_NAME = "worker-host-1"  # what systemd's %H is on some host
BOOTSTRAP = "127.0.0.1:9"  # the settings are built, never connected

#: a librdkafka property or handler setting whose value is a secret (-X sasl.password=...)
_SECRET_SETTING = re.compile(r"(?i)^[\w.-]*(password|secret|token|credential)[\w.-]*=")
#: a URL that carries a password (postgresql://user:password@host/db)
_URL_PASSWORD = re.compile(r"://[^/@\s:]+:[^@\s]+@")
#: an environment variable whose value is a secret
_SECRET_ENV = re.compile(r"(?i)(password|secret|token|credential|dsn)")


# ---- fencectl ----------------------------------------------------------------------------------


def parse_fencectl(argv: list[str]) -> tuple[argparse.Namespace | None, str]:
    """``argv`` (after ``fencectl``) parsed by the real parser, or None and its complaint."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(argv), ""
    except SystemExit:
        return None, err.getvalue().strip().splitlines()[-1]


def drain_bound_s(args: argparse.Namespace) -> float:
    """What a stop may take: in-flight batches (``--shutdown-timeout-s``), then leaving the
    group (a revoke within ``--call-budget-s`` + 10 s) and closing (telemetry, pool): the
    grace ``ops.commands.run.main`` gives the members of ``--processes``."""
    return float(args.shutdown_timeout_s) + float(args.call_budget_s) + 20


def secrets_in(argv: list[str]) -> list[str]:
    return [a for a in argv if _SECRET_SETTING.search(a) or _URL_PASSWORD.search(a)]


def run_problems(argv: list[str], env: Mapping[str, str], tmp: Path) -> tuple[
        argparse.Namespace | None, list[str]]:
    """A ``fencectl run`` command line checked as the worker checks it before it connects:
    the parser, ``config_from_args``, the HTTP options, ``kafka_settings`` and librdkafka
    building a consumer from them (certificate files replaced by a generated pair)."""
    from consumer.config import kafka_settings
    from consumer.kafka.adapter import check_consumer_settings
    from ops.commands.run import config_from_args
    from ops.worker.observability import options_from_args

    args, complaint = parse_fencectl(argv)
    if args is None:
        return None, [f"fencectl {shlex.join(argv)}: {complaint}"]
    if args.command != "run":
        return None, [f"fencectl {argv[0]}: expected `fencectl run`"]
    problems = [f"secret in the command line: {s}" for s in secrets_in(argv)]
    try:
        cfg = config_from_args(args, {**env, "KAFKA_BOOTSTRAP_SERVERS": BOOTSTRAP})
        options_from_args(args, env)
        settings = kafka_settings(cfg)
        check_consumer_settings(_with_generated_files(settings, tmp))
    except ConfigError as exc:
        problems.append(f"fencectl run refuses it: {exc}")
    return args, problems


def _with_generated_files(settings: dict[str, str], tmp: Path) -> dict[str, str]:
    """``settings`` with every ``*.location`` file replaced by a self-signed certificate or
    its key, so librdkafka reads real PEM files (without openssl to make them: the
    ``*.location`` properties left out, the others still checked)."""
    located = [k for k in settings if k.endswith(".location")]
    if not located:
        return settings
    if shutil.which("openssl") is None:
        return {k: v for k, v in settings.items() if k not in located}
    cert, key = tmp / "test.crt", tmp / "test.key"
    if not cert.exists():
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                        "1", "-subj", "/CN=fenceworker-test", "-keyout", str(key), "-out",
                        str(cert)], check=True, capture_output=True, timeout=60)
    return {**settings, **{k: str(key if k.endswith("key.location") else cert)
                           for k in located}}


# ---- Kubernetes ---------------------------------------------------------------------------------


def k8s_objects(folder: Path = K8S) -> list[dict[str, Any]]:
    return [doc for path in sorted(folder.glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def _one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind
             and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in {K8S}"
    return found[0]


def _secret_data(objects: list[dict[str, Any]], name: str) -> dict[str, str]:
    """The example Secret ``name``'s data; {} when there is none of that name."""
    found = [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == name]
    return dict(found[0].get("stringData", {})) if found else {}


def _expand(arg: str, env: dict[str, dict[str, Any]]) -> tuple[str, list[str]]:
    """``$(NAME)`` references expanded as the kubelet does: POD_NAME-like fieldRefs to the
    sample pod name; any other reference is a problem (a secret would land in argv)."""
    problems: list[str] = []

    def value(m: re.Match[str]) -> str:
        entry = env.get(m.group(1))
        field = (entry or {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if field == "metadata.name":
            return POD_NAME
        problems.append(f"argument {arg!r}: $({m.group(1)}) is not the pod name")
        return m.group(0)

    return re.sub(r"\$\((\w+)\)", value, arg), problems


def _port_number(container: dict[str, Any], port: Any) -> Any:
    named = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    return named.get(port, port)


def _mounted(container: dict[str, Any], pod: dict[str, Any], objects: list[dict[str, Any]],
             path: str) -> str | None:
    """None when ``path`` is a file of a Secret volume mounted in ``container``, else why not."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        where = PurePosixPath(mount["mountPath"])
        if PurePosixPath(path).parent != where:
            continue
        secret = volumes.get(mount["name"], {}).get("secret")
        if secret is None:
            return f"{path}: volume {mount['name']} is not a Secret"
        if PurePosixPath(path).name not in _secret_data(objects, secret["secretName"]):
            return f"{path}: Secret {secret['secretName']} has no key {PurePosixPath(path).name}"
        return None
    return f"{path}: no volume mounted at {PurePosixPath(path).parent}"


def _dsn_problems(dsn: str, where: str) -> list[str]:
    query = parse_qs(urlsplit(dsn).query)
    problems = []
    if query.get("sslmode") != ["verify-full"]:
        problems.append(f"{where}: FENCE_DSN has sslmode {query.get('sslmode')}, not verify-full")
    if not query.get("sslrootcert"):
        problems.append(f"{where}: FENCE_DSN names no sslrootcert")
    return problems


def _env_secret_problems(container: dict[str, Any]) -> list[str]:
    problems = []
    for entry in container.get("env", []):
        if _SECRET_ENV.search(entry["name"]) and "value" in entry:
            problems.append(f"env {entry['name']} is a literal value, not from a Secret")
    dsn = {e["name"]: e for e in container.get("env", [])}.get("FENCE_DSN")
    if dsn is None or "secretKeyRef" not in dsn.get("valueFrom", {}):
        problems.append("FENCE_DSN does not come from a Secret (env valueFrom.secretKeyRef)")
    return problems


def statefulset_problems(objects: list[dict[str, Any]], tmp: Path) -> list[str]:
    """What is wrong with the StatefulSet, its Service and its Secrets (see the module)."""
    sts = _one(objects, "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    problems: list[str] = []
    if "command" in container:
        problems.append("the container overrides the image's ENTRYPOINT (fencectl)")
    env = {e["name"]: e for e in container.get("env", [])}
    argv = []
    for arg in container.get("args", []):
        expanded, bad = _expand(str(arg), env)
        argv.append(expanded)
        problems += bad
    problems += _env_secret_problems(container)
    secret_ref = env.get("FENCE_DSN", {}).get("valueFrom", {}).get("secretKeyRef", {})
    dsn = _secret_data(objects, secret_ref.get("name", "")).get(secret_ref.get("key", ""), "")
    problems += _dsn_problems(dsn, "Secret " + secret_ref.get("name", "?"))
    args, found = run_problems(argv, {"FENCE_DSN": dsn}, tmp)
    problems += found
    if args is None:
        return problems
    if args.instance_id != POD_NAME:
        problems.append(f"--instance-id is {args.instance_id!r}, not the pod name "
                        "($(POD_NAME) from fieldRef metadata.name)")
    if args.processes is not None:
        problems.append("--processes in a pod: one member per pod, each its own instance id")
    if args.http_host in ("127.0.0.1", "localhost", "::1"):
        problems.append(f"--http-host {args.http_host}: the kubelet's probes cannot reach it")
    expected = {"startupProbe": "/healthz", "livenessProbe": "/healthz",
                "readinessProbe": "/readyz"}
    for probe, path in expected.items():
        get = container.get(probe, {}).get("httpGet", {})
        if get.get("path") != path:
            problems.append(f"{probe} asks {get.get('path')!r}, not {path}")
        if _port_number(container, get.get("port")) != args.http_port:
            problems.append(f"{probe} port {get.get('port')!r} is not --http-port "
                            f"{args.http_port}")
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace < drain_bound_s(args):
        problems.append(f"terminationGracePeriodSeconds {grace} < the drain bound "
                        f"{drain_bound_s(args):g} s (--shutdown-timeout-s "
                        f"{args.shutdown_timeout_s:g} + --call-budget-s {args.call_budget_s:g}"
                        " + 20)")
    startup = container.get("startupProbe", {})
    budget = (startup.get("initialDelaySeconds", 0)
              + startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3))
    if budget <= 2 * args.outage_bound_s:
        problems.append(f"startupProbe allows {budget} s, not more than a start-up outage of "
                        f"Kafka and of PostgreSQL (2 x --outage-bound-s {args.outage_bound_s:g})")
    files = [v for k, v in args_x(args).items() if k.endswith(".location")]
    files += parse_qs(urlsplit(dsn).query).get("sslrootcert", [])
    problems += [p for f in files if (p := _mounted(container, pod, objects, f))]
    service = _one(objects, "Service", sts["spec"].get("serviceName"))
    if service["spec"].get("clusterIP") != "None":
        problems.append(f"Service {service['metadata']['name']} is not headless")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    if not service["spec"]["selector"].items() <= labels.items():
        problems.append("the Service's selector does not select the pods")
    for port in service["spec"].get("ports", []):
        if _port_number(container, port.get("targetPort")) != args.http_port:
            problems.append(f"Service port {port.get('name')} does not reach --http-port")
    return problems


def args_x(args: argparse.Namespace) -> dict[str, str]:
    from consumer.config import parse_x_options

    return parse_x_options(args.x)


def job_problems(objects: list[dict[str, Any]]) -> list[str]:
    """The migrate Job: ``fencectl migrate --grant-worker ROLE`` as the owner, ROLE being the
    user of the worker's FENCE_DSN."""
    job = _one(objects, "Job")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    problems = _env_secret_problems(container)
    argv = [str(a) for a in container.get("args", [])]
    problems += [f"secret in the command line: {s}" for s in secrets_in(argv)]
    args, complaint = parse_fencectl(argv)
    if args is None:
        return [*problems, f"fencectl {shlex.join(argv)}: {complaint}"]
    if args.command != "migrate" or not args.grant_worker:
        return [*problems, f"fencectl {shlex.join(argv)}: not migrate --grant-worker ROLE"]
    sts = _one(objects, "StatefulSet")
    (worker,) = sts["spec"]["template"]["spec"]["containers"]
    refs = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef", {})
            for e in worker.get("env", [])}
    worker_ref = refs.get("FENCE_DSN", {})
    worker_dsn = _secret_data(objects, worker_ref.get("name", "")).get(
        worker_ref.get("key", ""), "")
    if urlsplit(worker_dsn).username != args.grant_worker:
        problems.append(f"--grant-worker {args.grant_worker} is not the user of the worker's "
                        f"FENCE_DSN ({urlsplit(worker_dsn).username})")
    job_ref = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef", {})
               for e in container.get("env", [])}.get("FENCE_DSN", {})
    if job_ref.get("name") == worker_ref.get("name"):
        problems.append("the Job migrates with the worker's own Secret, not the owner's")
    owner_dsn = _secret_data(objects, job_ref.get("name", "")).get(job_ref.get("key", ""), "")
    problems += _dsn_problems(owner_dsn, "Secret " + str(job_ref.get("name")))
    files = parse_qs(urlsplit(owner_dsn).query).get("sslrootcert", [])
    problems += [p for f in files if (p := _mounted(container, pod, objects, f))]
    return problems


# ---- systemd ------------------------------------------------------------------------------------


def unit_entries(text: str) -> dict[str, list[tuple[str, str]]]:
    """A unit file's sections as (key, value) lists, in order, repeated keys kept; a line
    ending in a backslash continues on the next (comment lines in between are skipped)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(("#", ";")) or (not line and not pending):
            continue
        line = f"{pending} {line}".strip() if pending else line
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        pending = ""
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"not a unit file line: {raw!r}"
        current.append((key.strip(), value.strip()))
    return sections


def _unit_value(sections: dict[str, list[tuple[str, str]]], section: str, key: str) -> str | None:
    values = [v for k, v in sections.get(section, []) if k == key]
    return values[-1] if values else None


def _specifiers(word: str) -> tuple[str, list[str]]:
    problems: list[str] = []

    def value(m: re.Match[str]) -> str:
        if m.group(1) == "H":
            return HOST_NAME
        if m.group(1) == "%":
            return "%"
        problems.append(f"specifier %{m.group(1)} in {word!r}")
        return m.group(0)

    return re.sub(r"%(.)", value, word), problems


def env_file_entries(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines()
                if line.strip() and not line.lstrip().startswith("#"))


def systemd_problems(unit_text: str, env_text: str, tmp: Path) -> list[str]:
    """What is wrong with the unit and its environment file (see the module)."""
    sections = unit_entries(unit_text)
    problems: list[str] = []
    env = env_file_entries(env_text)
    problems += _dsn_problems(env.get("FENCE_DSN", ""), ENV_EXAMPLE.name)
    for key, value in sections.get("Service", []):
        if key == "Environment" and (_SECRET_ENV.search(value) or _URL_PASSWORD.search(value)):
            problems.append(f"Environment={value}: a secret belongs in the EnvironmentFile")
    if not _unit_value(sections, "Service", "EnvironmentFile"):
        problems.append("no EnvironmentFile: where does FENCE_DSN come from?")
    if _unit_value(sections, "Service", "User") in (None, "root"):
        problems.append("the worker runs as root")
    exec_start = _unit_value(sections, "Service", "ExecStart") or ""
    words = []
    for word in shlex.split(exec_start):
        expanded, bad = _specifiers(word)
        words.append(expanded)
        problems += bad
    if not words or not words[0].startswith("/") or not words[0].endswith("/fencectl"):
        return [*problems, f"ExecStart={exec_start}: not an absolute path to fencectl"]
    args, found = run_problems(words[1:], {"FENCE_DSN": env.get("FENCE_DSN", "")}, tmp)
    problems += found
    if args is None:
        return problems
    if args.instance_id != HOST_NAME:
        problems.append(f"--instance-id {args.instance_id!r} is not the host name (%H)")
    timeout = _unit_value(sections, "Service", "TimeoutStopSec")
    if timeout is None or not timeout.isdigit() or int(timeout) < drain_bound_s(args):
        problems.append(f"TimeoutStopSec={timeout}: below the drain bound "
                        f"{drain_bound_s(args):g} s")
    if (_unit_value(sections, "Service", "KillSignal") or "SIGTERM") != "SIGTERM":
        problems.append("KillSignal is not SIGTERM: the worker drains on SIGTERM")
    if _unit_value(sections, "Service", "Restart") != "on-failure":
        problems.append("Restart is not on-failure (restart on 3, 5 and a kill by a signal)")
    kept_down = {int(c) for c in (_unit_value(sections, "Service", "RestartPreventExitStatus")
                                  or "").split()}
    expected = {int(c) for c in ExitCode if c and not supervisor.restartable(int(c))}
    if kept_down != expected:
        problems.append(f"RestartPreventExitStatus={sorted(kept_down)}: the supervisor keeps "
                        f"{sorted(expected)} down and restarts the others")
    return problems


# ---- Dockerfile ---------------------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        line = f"{pending} {line}".strip() if pending else line
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        pending = ""
        word, _sep, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def copied_sources(text: str) -> list[str]:
    """The context paths (globs) the Dockerfile's COPY instructions name."""
    sources = []
    for word, rest in dockerfile_instructions(text):
        if word == "COPY":
            parts = [p for p in shlex.split(rest) if not p.startswith("--")]
            sources += parts[:-1]
    return sources


def installed_packages() -> list[str]:
    """The top-level packages ``pip install .`` installs (pyproject's package find)."""
    import setuptools

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted({p.split(".")[0] for p in setuptools.find_packages(str(ROOT), include=include)})


def dockerfile_problems(text: str, *, run_as: str) -> list[str]:
    instructions = dockerfile_instructions(text)
    problems: list[str] = []
    entry = [rest for word, rest in instructions if word == "ENTRYPOINT"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    if not entry or json.loads(entry[-1]) != ["fencectl"] or "fencectl" not in project["scripts"]:
        problems.append(f"ENTRYPOINT {entry[-1] if entry else None}: not [\"fencectl\"]")
    user = [rest for word, rest in instructions if word == "USER"]
    if not user or user[-1] != run_as:
        problems.append(f"USER {user[-1] if user else None}: not {run_as} (the pods' "
                        "runAsUser:runAsGroup, numeric so runAsNonRoot can check it)")
    sources = copied_sources(text)
    copied = {p for s in sources for p in ROOT.glob(s)}
    problems += [f"{p}/ is installed by pyproject.toml but not copied"
                 for p in installed_packages() if ROOT / p not in copied]
    if ROOT / project["readme"] not in copied:
        problems.append(f"{project['readme']} (pyproject's readme) is not copied")
    if ROOT / "pyproject.toml" not in copied:
        problems.append("pyproject.toml is not copied")
    return problems


def _pod_user(objects: list[dict[str, Any]]) -> str:
    ctx = _one(objects, "StatefulSet")["spec"]["template"]["spec"]["securityContext"]
    return f"{ctx['runAsUser']}:{ctx['runAsGroup']}"


# ---- the files as they are ----------------------------------------------------------------------


def test_the_statefulset_is_a_fencectl_run_the_worker_accepts(tmp_path: Path) -> None:
    assert statefulset_problems(k8s_objects(), tmp_path) == []


def test_the_migrate_job_grants_the_workers_role() -> None:
    assert job_problems(k8s_objects()) == []


def test_every_pod_runs_as_the_images_user() -> None:
    objects = k8s_objects()
    users = {f"{o['spec']['template']['spec']['securityContext']['runAsUser']}:"
             f"{o['spec']['template']['spec']['securityContext']['runAsGroup']}"
             for o in objects if o["kind"] in ("StatefulSet", "Job")}
    assert users == {_pod_user(objects)}
    assert dockerfile_problems(DOCKERFILE.read_text(), run_as=_pod_user(objects)) == []


def test_the_systemd_unit_is_a_fencectl_run_the_worker_accepts(tmp_path: Path) -> None:
    assert systemd_problems(UNIT.read_text(), ENV_EXAMPLE.read_text(), tmp_path) == []


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # the unit as installed, its ExecStart pointing at this checkout's fencectl
    text = UNIT.read_text().replace("/opt/fenceworker/bin/fencectl",
                                    str(Path(sys.executable).parent / "fencectl"))
    (tmp_path / UNIT.name).write_text(text)
    done = subprocess.run([analyze, "verify", str(tmp_path / UNIT.name)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert UNIT.name not in done.stderr, done.stderr


def test_the_probes_paths_are_answered_by_the_workers_http_server() -> None:
    import time

    from prometheus_client import CollectorRegistry

    from consumer.observability.readiness import (
        ChecksPassed,
        LoopHeartbeat,
        Positioned,
        ReadinessHolder,
    )
    from ops.worker.http import start_http_server

    (container,) = _one(k8s_objects(), "StatefulSet")["spec"]["template"]["spec"]["containers"]
    paths = {p: container[p]["httpGet"]["path"]
             for p in ("startupProbe", "livenessProbe", "readinessProbe")}
    readiness = ReadinessHolder()
    server = start_http_server(registry=CollectorRegistry(), readiness=readiness,
                               heartbeat=LoopHeartbeat(clock=time.monotonic, bound_s=15))

    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(f"{server.url}{path}", timeout=5) as answer:
                return int(answer.status)
        except HTTPError as exc:
            return int(exc.code)

    try:
        assert status("/no-such-path") == 404
        assert {p: status(path) for p, path in paths.items()} == {
            "startupProbe": 200, "livenessProbe": 200, "readinessProbe": 503}
        readiness.apply_all([ChecksPassed(), Positioned()])
        assert status(paths["readinessProbe"]) == 200
    finally:
        server.close()


def test_the_page_names_every_production_file() -> None:
    text = PAGE.read_text(encoding="utf-8")
    files = [DOCKERFILE, *sorted((COMPOSE / "systemd").iterdir()), *sorted(K8S.iterdir())]
    missing = [str(f.relative_to(ROOT)) for f in files if str(f.relative_to(ROOT)) not in text]
    assert not missing, f"docs/production.md does not name {missing}"


def test_the_images_files_import_every_command(tmp_path: Path) -> None:
    """The files the Dockerfile copies, alone on the import path (no checkout, no tests/),
    import ``ops.cli`` and every command module; the dependencies come from this venv."""
    context = tmp_path / "app"
    context.mkdir()
    for source in copied_sources(DOCKERFILE.read_text()):
        for path in ROOT.glob(source):
            if path.is_dir():
                shutil.copytree(path, context / path.name,
                                ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(path, context / path.name)
    script = ("import importlib, ops.cli\n"
              f"assert ops.cli.__file__.startswith({str(context)!r}), ops.cli.__file__\n"
              f"for name in {list(COMMAND_MODULES)!r}:\n"
              "    importlib.import_module(name)\n"
              "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", script], cwd=context, capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**env, "PYTHONPATH": str(context)})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


# ---- each rule can fail -------------------------------------------------------------------------


def _container(objects: list[dict[str, Any]], kind: str = "StatefulSet") -> dict[str, Any]:
    return _one(objects, kind)["spec"]["template"]["spec"]["containers"][0]


def _set_arg(objects: list[dict[str, Any]], flag: str, value: str) -> None:
    args = _container(objects)["args"]
    args[args.index(flag) + 1] = value


_K8S_DOCTORED: dict[str, tuple[Callable[[list[dict[str, Any]]], None], str]] = {
    "a SASL password in argv": (
        lambda o: _container(o)["args"].extend(["-X", "sasl.password=hunter2"]),
        "secret in the command line: sasl.password=hunter2"),
    "a flag fencectl run lacks": (
        lambda o: _container(o)["args"].append("--no-such-flag"),
        "unrecognized arguments: --no-such-flag"),
    "a librdkafka property that does not exist": (
        lambda o: _container(o)["args"].extend(["-X", "securty.protocol=SSL"]),
        "No such configuration property"),
    "a fixed instance id": (
        lambda o: _set_arg(o, "--instance-id", "worker"),
        "--instance-id is 'worker', not the pod name"),
    "an instance id from another variable": (
        lambda o: _set_arg(o, "--instance-id", "$(HOSTNAME)"),
        "$(HOSTNAME) is not the pod name"),
    "a grace shorter than the drain": (
        lambda o: _one(o, "StatefulSet")["spec"]["template"]["spec"].update(
            terminationGracePeriodSeconds=30),
        "terminationGracePeriodSeconds 30 < the drain bound 55 s"),
    "a longer shutdown timeout than the grace covers": (
        lambda o: _set_arg(o, "--shutdown-timeout-s", "45"),
        "terminationGracePeriodSeconds 60 < the drain bound 85 s"),
    "a readiness probe on /healthz": (
        lambda o: _container(o)["readinessProbe"]["httpGet"].update(path="/healthz"),
        "readinessProbe asks '/healthz', not /readyz"),
    "a probe on another port": (
        lambda o: _container(o)["livenessProbe"]["httpGet"].update(port=8080),
        "livenessProbe port 8080 is not --http-port 9464"),
    "HTTP on loopback": (
        lambda o: _set_arg(o, "--http-host", "127.0.0.1"),
        "--http-host 127.0.0.1: the kubelet's probes cannot reach it"),
    "a startup probe shorter than two outages": (
        lambda o: _container(o)["startupProbe"].update(failureThreshold=12),
        "startupProbe allows 60 s"),
    "FENCE_DSN as a literal": (
        lambda o: _container(o)["env"].append(
            {"name": "FENCE_DSN", "value": "postgresql://fence_worker:pw@db/app"}),
        "env FENCE_DSN is a literal value, not from a Secret"),
    "a DSN without certificate checks": (
        lambda o: _one(o, "Secret", "fenceworker")["stringData"].update(
            FENCE_DSN="postgresql://fence_worker:pw@db/app?sslmode=require"),
        "FENCE_DSN has sslmode ['require'], not verify-full"),
    "a certificate file no volume holds": (
        lambda o: _container(o)["volumeMounts"].pop(0),
        "/etc/fenceworker/tls/kafka-ca.crt: no volume mounted at /etc/fenceworker/tls"),
    "a certificate file the Secret lacks": (
        lambda o: _one(o, "Secret", "fenceworker-tls")["stringData"].pop("kafka-client.key"),
        "Secret fenceworker-tls has no key kafka-client.key"),
    "a Service that is not headless": (
        lambda o: _one(o, "Service")["spec"].update(clusterIP="10.0.0.1"),
        "is not headless"),
}


@pytest.mark.parametrize("case", list(_K8S_DOCTORED))
def test_each_statefulset_rule_can_fail(case: str, tmp_path: Path) -> None:
    doctor, expected = _K8S_DOCTORED[case]
    objects = copy.deepcopy(k8s_objects())
    doctor(objects)
    problems = statefulset_problems(objects, tmp_path)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(("doctor", "expected"), [
    (lambda o: _container(o, "Job")["args"].__setitem__(2, "someone_else"),
     "--grant-worker someone_else is not the user of the worker's FENCE_DSN"),
    (lambda o: _container(o, "Job")["env"][0]["valueFrom"]["secretKeyRef"].update(
        name="fenceworker"),
     "the Job migrates with the worker's own Secret"),
    (lambda o: _container(o, "Job")["args"].pop(),
     "expected one argument"),
], ids=["another role", "the worker's secret", "no role"])
def test_each_job_rule_can_fail(doctor: Callable[[list[dict[str, Any]]], None],
                                expected: str) -> None:
    objects = copy.deepcopy(k8s_objects())
    doctor(objects)
    problems = job_problems(objects)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("RestartPreventExitStatus=1 2 4 6", "RestartPreventExitStatus=2 4",
     "RestartPreventExitStatus=[2, 4]: the supervisor keeps [1, 2, 4, 6] down"),
    ("Restart=on-failure", "Restart=always", "Restart is not on-failure"),
    ("TimeoutStopSec=60", "TimeoutStopSec=30", "TimeoutStopSec=30: below the drain bound 55 s"),
    ("--instance-id %H", "--instance-id %n", "specifier %n"),
    ("--shutdown-timeout-s 15", "--shutdown-timeout-s 15 -X sasl.password=hunter2",
     "secret in the command line: sasl.password=hunter2"),
    ("--shutdown-timeout-s 15", "--shutdown-grace-s 15",
     "unrecognized arguments: --shutdown-grace-s"),
    ("EnvironmentFile=/etc/fenceworker/fenceworker.env",
     "Environment=FENCE_DSN=postgresql://fence_worker:pw@db/app",
     "a secret belongs in the EnvironmentFile"),
    ("User=fenceworker", "User=root", "the worker runs as root"),
    ("/opt/fenceworker/bin/fencectl run", "/opt/fenceworker/bin/fencectl migrate",
     "unrecognized arguments: --topic"),
])
def test_each_systemd_rule_can_fail(old: str, new: str, expected: str, tmp_path: Path) -> None:
    text = UNIT.read_text()
    assert old in text
    problems = systemd_problems(text.replace(old, new), ENV_EXAMPLE.read_text(), tmp_path)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(("old", "new", "expected"), [
    ('ENTRYPOINT ["fencectl"]', 'ENTRYPOINT ["python", "-m", "ops.cli"]', "ENTRYPOINT"),
    ("USER 10001:10001", "USER fence", "USER fence: not 10001:10001"),
    ("COPY fencing ./fencing\n", "", "fencing/ is installed by pyproject.toml but not copied"),
    ("COPY pyproject.toml README.md* ./", "COPY pyproject.toml ./",
     "README.md (pyproject's readme) is not copied"),
])
def test_each_dockerfile_rule_can_fail(old: str, new: str, expected: str) -> None:
    text = DOCKERFILE.read_text()
    assert old in text
    problems = dockerfile_problems(text.replace(old, new), run_as="10001:10001")
    assert any(expected in p for p in problems), problems
