"""The local service stack: PostgreSQL, Kafka (KRaft), Jaeger v2, Prometheus and a schema
registry (Apicurio Registry, Confluent-compatible API) without Docker.

Long because up, down, status and the cluster's stop-node/start-node share one lock, one
table of service modules and one health wait; each service's own start and check live in
its module (``ops.stack.postgres``, ``kafka``, ``kafka_cluster``, ``jaeger``, ...).

Rules:
- ``up`` is idempotent: a service whose tracked pid is alive is only health-checked;
  the rest are started detached (they outlive the caller). It returns only when
  every service answered a real request (a query, a produced-and-fetched message,
  an API call) and raises StackError naming the fix otherwise, after stopping what
  that same call started.
- ``down`` stops exactly the pids recorded under ``.stack/`` (verified against their
  command line), never by name; SIGKILL after ``grace_s``.
- ``up`` and ``down`` hold ``.stack/stack.lock``, so concurrent callers serialise.
- Kafka is one node or the three nodes of ``ops.stack.kafka_cluster`` (``settings.
  kafka_nodes``); ``stop_node``/``start_node`` stop (SIGTERM, or SIGKILL as a crash) and
  start one node of the cluster, ``start_node`` returning once it is healthy and in sync.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import signal
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from ops.stack import connect as stack_connect
from ops.stack import jaeger as stack_jaeger
from ops.stack import kafka as stack_kafka
from ops.stack import postgres as stack_postgres
from ops.stack import prometheus as stack_prometheus
from ops.stack import registry as stack_registry
from ops.stack.config import (
    KAFKA_NODES,
    PORT_ENV,
    SERVICE_PORTS,
    Service,
    StackError,
    StackSettings,
    connection_env,
    default_services,
    settings_from,
)
from ops.stack.kafka_cluster import NodeOps
from ops.stack.procs import alive, file_lock, log_tail, port_free, stop_pid, tracked_pid, wait_until

__all__ = [
    "HEALTH_TIMEOUT_S",
    "Service",
    "ServiceState",
    "ServiceStatus",
    "StackError",
    "StackSettings",
    "UpReport",
    "down",
    "env",
    "start_node",
    "status",
    "stop_node",
    "up",
]


class _ServiceOps(Protocol):
    """What this module calls on a service (a module such as ``ops.stack.postgres``)."""

    @property
    def STOP_SIGNAL(self) -> signal.Signals: ...
    def marker(self, settings: StackSettings) -> str: ...
    def start(self, settings: StackSettings) -> int: ...
    def check(self, settings: StackSettings) -> str | None: ...


_MODULES: dict[Service, _ServiceOps] = {
    Service.POSTGRES: stack_postgres,
    Service.KAFKA: stack_kafka,
    **{node: NodeOps(node) for node in KAFKA_NODES},
    Service.JAEGER: stack_jaeger,
    Service.PROMETHEUS: stack_prometheus,
    Service.REGISTRY: stack_registry,
    Service.CONNECT: stack_connect,
}
#: seconds each service may take from start to its first healthy answer
HEALTH_TIMEOUT_S: dict[Service, float] = {
    Service.POSTGRES: 60.0,
    Service.KAFKA: 90.0,
    **{node: 120.0 for node in KAFKA_NODES},
    Service.JAEGER: 60.0,
    Service.PROMETHEUS: 60.0,
    Service.REGISTRY: 120.0,  # a JVM app: ~9-20 s to its first answer here, more under load
    Service.CONNECT: 180.0,  # a JVM app that scans its classpath for plugins first
}


class ServiceState(enum.Enum):
    """What ``status`` found for one service."""

    UP = "up"
    DOWN = "down"
    UNHEALTHY = "unhealthy"


@dataclass(frozen=True, slots=True)
class ServiceStatus:
    """One service's state, its tracked pid (or None), client port and why it is unhealthy."""

    service: Service
    state: ServiceState
    pid: int | None
    port: int
    detail: str = ""


@dataclass(frozen=True, slots=True)
class UpReport:
    """Which services ``up`` started and which were already running."""

    started: tuple[Service, ...]
    already_running: tuple[Service, ...]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _tracked(settings: StackSettings, service: Service) -> int | None:
    marker = _MODULES[service].marker(settings)
    return tracked_pid(settings.paths.pid_file(service), marker=marker)


def _check(settings: StackSettings, service: Service) -> str | None:
    if service is Service.POSTGRES:
        try:
            stack_postgres.provision(settings)
        except StackError as exc:
            return str(exc)
    return _MODULES[service].check(settings)


def _first_time_note(settings: StackSettings, service: Service) -> str:
    cache, paths = settings.paths.cache, settings.paths
    for go, name, binary in ((Service.JAEGER, "Jaeger", paths.jaeger_binary),
                             (Service.PROMETHEUS, "Prometheus and promtool",
                              paths.prometheus_binary)):
        if service is go and not binary.exists():
            return f" (building {name} once into {cache}, several minutes; log {cache}/{go.value})"
    if service in (Service.KAFKA, *KAFKA_NODES) and not stack_kafka.cp_file(settings).exists():
        return f" (resolving the Kafka jars with mvn once into {cache}/m2)"
    if service is Service.CONNECT and not any(settings.paths.connect_cache.glob("cp-*.txt")):
        return f" (resolving Kafka Connect's and Debezium's jars with mvn once into {cache}/m2)"
    if service is Service.REGISTRY and not settings.paths.registry_app.exists():
        return (f" (fetching {stack_registry.ARTIFACT}, ~160 MB, with mvn once into "
                f"{settings.paths.registry_app})")
    return ""


#: how long a port may stay bound after its process was stopped (a SIGKILLed JVM's threads
#: close their sockets after the main thread already shows as a zombie)
PORT_RELEASE_S = 10.0


def _ensure_ports_free(settings: StackSettings, service: Service) -> None:
    for field in SERVICE_PORTS[service]:
        port = getattr(settings.ports, field)
        if not wait_until(functools.partial(port_free, port), timeout_s=PORT_RELEASE_S,
                          poll_s=0.2):
            name = PORT_ENV[field][0]
            raise StackError(
                f"{service.value}: port 127.0.0.1:{port} is taken by another process "
                f"(see `ss -ltnp 'sport = :{port}'`); stop that process or choose another "
                f"port, e.g. `export {name}={port + 10000 if port < 55000 else port - 10000}`"
            )


def _wait_healthy(settings: StackSettings, service: Service, pid: int) -> None:
    reasons: list[str] = []

    def healthy() -> bool:
        if not alive(pid):
            return True  # reported below
        reason = _check(settings, service)
        if reason is not None:
            reasons.append(reason)
        return reason is None

    bound = HEALTH_TIMEOUT_S[service]
    ok = wait_until(healthy, timeout_s=bound, poll_s=0.5)
    log = settings.paths.log_file(service)
    if not alive(pid):
        raise StackError(
            f"{service.value} (pid {pid}) exited during start-up; see {log}:\n{log_tail(log)}"
        )
    if not ok:
        last = reasons[-1] if reasons else "no answer"
        raise StackError(
            f"{service.value} (pid {pid}) did not become healthy within {bound:.0f} s "
            f"(last check: {last}). Fix the cause in its log, then run "
            f"`{settings.cli} stack down && {settings.cli} stack up`. {log}:\n{log_tail(log)}"
        )


def up(
    settings: StackSettings | None = None,
    *,
    services: Iterable[Service] | None = None,
    out: Callable[[str], None] = _stderr,
) -> UpReport:
    """Start what is not running, then wait until every service is healthy; raises StackError.

    ``services`` default: ``default_services(settings.kafka_nodes)``."""
    settings = settings or settings_from()
    chosen = set(default_services(settings.kafka_nodes) if services is None else services)
    wanted = [s for s in Service if s in chosen]
    started: list[Service] = []
    already: list[Service] = []
    with file_lock(settings.paths.lock_file):
        try:
            pids: dict[Service, int] = {}
            for service in wanted:
                pid = _tracked(settings, service)
                if pid is not None:
                    already.append(service)
                else:
                    _ensure_ports_free(settings, service)
                    settings.paths.pid_file(service).unlink(missing_ok=True)
                    out(f"{service.value}: starting" + _first_time_note(settings, service))
                    pid = _MODULES[service].start(settings)
                    started.append(service)
                pids[service] = pid
            for service in wanted:
                _wait_healthy(settings, service, pids[service])
                state = "started" if service in started else "already running"
                out(f"{service.value}: healthy ({state}, pid {pids[service]})")
        except BaseException:
            _stop(settings, started, grace_s=20.0, out=out)
            raise
    return UpReport(started=tuple(started), already_running=tuple(already))


def _stop(
    settings: StackSettings,
    services: Iterable[Service],
    *,
    grace_s: float,
    out: Callable[[str], None],
) -> list[tuple[Service, int]]:
    stopped: list[tuple[Service, int]] = []
    order = list(reversed([s for s in Service if s in set(services)]))
    # the cluster's nodes are signalled together: stopped one at a time, the last one has no
    # quorum left for its controlled shutdown and waits out the grace (38.7 s for three nodes
    # stopped in turn, 8.0 s signalled together, all graceful)
    nodes = {s: pid for s in order if s in KAFKA_NODES
             and (pid := _tracked(settings, s)) is not None}
    for service, pid in nodes.items():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, _MODULES[service].STOP_SIGNAL)
    for service in order:
        pid = _tracked(settings, service) if service not in nodes else nodes[service]
        if pid is not None:
            graceful = stop_pid(pid, sig=_MODULES[service].STOP_SIGNAL, grace_s=grace_s,
                                signalled=service in nodes)
            out(f"{service.value}: stopped pid {pid}" + ("" if graceful else " (SIGKILL)"))
            stopped.append((service, pid))
        settings.paths.pid_file(service).unlink(missing_ok=True)
    return stopped


def down(
    settings: StackSettings | None = None,
    *,
    services: Iterable[Service] = tuple(Service),
    grace_s: float = 30.0,
    out: Callable[[str], None] = _stderr,
) -> list[tuple[Service, int]]:
    """Stop the tracked pids of ``services``; return (service, pid) for each one stopped."""
    settings = settings or settings_from()
    with file_lock(settings.paths.lock_file):
        return _stop(settings, services, grace_s=grace_s, out=out)


def status(settings: StackSettings | None = None) -> list[ServiceStatus]:
    """Each service's state: down (no live tracked pid), up (answers), or unhealthy: the
    services of ``settings.kafka_nodes``, and any other Kafka that runs (per node)."""
    settings = settings or settings_from()
    result = []
    chosen = set(default_services(len(_kafka_in_use(settings))))
    if any(_tracked(settings, node) is not None for node in KAFKA_NODES):
        chosen.update(KAFKA_NODES)  # a cluster node runs: show every node, down ones too
    for service in Service:
        port = settings.ports.of(service)[0]
        pid = _tracked(settings, service)
        if service not in chosen and pid is None:
            continue
        if pid is None:
            result.append(ServiceStatus(service, ServiceState.DOWN, None, port))
            continue
        reason = _MODULES[service].check(settings)
        state = ServiceState.UP if reason is None else ServiceState.UNHEALTHY
        result.append(ServiceStatus(service, state, pid, port, reason or ""))
    return result


def env(settings: StackSettings | None = None) -> dict[str, str]:
    """Connection settings of the local stack, keyed by environment variable name. Kafka's
    is the chosen node count's (``FENCE_KAFKA_NODES``); when none was chosen and only the
    three-node cluster runs, the cluster's."""
    settings = settings or settings_from()
    password = stack_postgres.password(settings)
    return {**connection_env(settings.ports, pg_password=password,
                             kafka=_kafka_in_use(settings)),
            # Kafka Connect and the source database of `fencectl stack up --with debezium`
            "KAFKA_CONNECT_URL": stack_connect.url(settings),
            "FENCE_SOURCE_DSN": stack_connect.source_dsn(settings, password)}


def _kafka_in_use(settings: StackSettings) -> tuple[Service, ...]:
    """The chosen node count's Kafka services; when no count was chosen and only the
    three-node cluster runs, its nodes."""
    if not settings.kafka_nodes_chosen and _tracked(settings, Service.KAFKA) is None \
            and any(_tracked(settings, node) is not None for node in KAFKA_NODES):
        return KAFKA_NODES
    return settings.kafka_services


def _node(number: int) -> Service:
    if not 1 <= number <= len(KAFKA_NODES):
        raise StackError(f"kafka node {number}: the cluster has nodes 1 to {len(KAFKA_NODES)}")
    return KAFKA_NODES[number - 1]


def stop_node(number: int, *, settings: StackSettings | None = None, kill: bool = False,
              grace_s: float = 30.0, out: Callable[[str], None] = _stderr) -> int | None:
    """Stop node ``number`` of the three-node cluster: SIGTERM (a controlled shutdown; SIGKILL
    after ``grace_s``) or, with ``kill``, SIGKILL at once (a crash). Returns the pid stopped,
    None when the node was not running."""
    settings = settings or settings_from()
    service = _node(number)
    with file_lock(settings.paths.lock_file):
        pid = _tracked(settings, service)
        if pid is None:
            return None
        graceful = stop_pid(pid, sig=signal.SIGKILL if kill else _MODULES[service].STOP_SIGNAL,
                            grace_s=grace_s)
        how = "killed (SIGKILL)" if kill else ("stopped" if graceful else "stopped (SIGKILL)")
        out(f"{service.value}: {how} pid {pid}")
        settings.paths.pid_file(service).unlink(missing_ok=True)
        return pid


def start_node(number: int, *, settings: StackSettings | None = None,
               out: Callable[[str], None] = _stderr) -> UpReport:
    """Start node ``number`` of the three-node cluster (if it is not running) and return
    once it is healthy and in the ISR of every partition it replicates; raises StackError."""
    settings = settings or settings_from()
    return up(settings, services=[_node(number)], out=out)
