"""The local service stack: PostgreSQL, Kafka (KRaft), Jaeger v2 and a schema registry
(Apicurio Registry, Confluent-compatible API) without Docker.

Rules:
- ``up`` is idempotent: a service whose tracked pid is alive is only health-checked;
  the rest are started detached (they outlive the caller). It returns only when
  every service answered a real request (a query, a produced-and-fetched message,
  an API call) and raises StackError naming the fix otherwise, after stopping what
  that same call started.
- ``down`` stops exactly the pids recorded under ``.stack/`` (verified against their
  command line), never by name; SIGKILL after ``grace_s``.
- ``up`` and ``down`` hold ``.stack/stack.lock``, so concurrent callers serialise.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType

from ops.hints import fencectl
from ops.stack import jaeger as stack_jaeger
from ops.stack import kafka as stack_kafka
from ops.stack import postgres as stack_postgres
from ops.stack import registry as stack_registry
from ops.stack.config import (
    PORT_ENV,
    SERVICE_PORTS,
    Service,
    StackError,
    StackSettings,
    connection_env,
    settings_from,
)
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
    "status",
    "up",
]

_MODULES: dict[Service, ModuleType] = {
    Service.POSTGRES: stack_postgres,
    Service.KAFKA: stack_kafka,
    Service.JAEGER: stack_jaeger,
    Service.REGISTRY: stack_registry,
}
#: seconds each service may take from start to its first healthy answer
HEALTH_TIMEOUT_S: dict[Service, float] = {
    Service.POSTGRES: 60.0,
    Service.KAFKA: 90.0,
    Service.JAEGER: 60.0,
    Service.REGISTRY: 120.0,  # a JVM app: ~9-20 s to its first answer here, more under load
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
    reason: str | None = _MODULES[service].check(settings)
    return reason


def _first_time_note(settings: StackSettings, service: Service) -> str:
    cache = settings.paths.cache
    if service is Service.JAEGER and not settings.paths.jaeger_binary.exists():
        return f" (building Jaeger once into {cache}, several minutes; log {cache}/jaeger)"
    if service is Service.KAFKA and not stack_kafka.cp_file(settings).exists():
        return f" (resolving the Kafka jars with mvn once into {cache}/m2)"
    if service is Service.REGISTRY and not settings.paths.registry_app.exists():
        return (f" (fetching {stack_registry.ARTIFACT}, ~160 MB, with mvn once into "
                f"{settings.paths.registry_app})")
    return ""


def _ensure_ports_free(settings: StackSettings, service: Service) -> None:
    for field in SERVICE_PORTS[service]:
        port = getattr(settings.ports, field)
        if not port_free(port):
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
            f"`{fencectl()} stack down && {fencectl()} stack up`. {log}:\n{log_tail(log)}"
        )


def up(
    settings: StackSettings | None = None,
    *,
    services: Iterable[Service] = tuple(Service),
    out: Callable[[str], None] = _stderr,
) -> UpReport:
    """Start what is not running, then wait until every service is healthy; raises StackError."""
    settings = settings or settings_from()
    wanted = [s for s in Service if s in set(services)]
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
    for service in reversed([s for s in Service if s in set(services)]):
        pid = _tracked(settings, service)
        if pid is not None:
            graceful = stop_pid(pid, sig=_MODULES[service].STOP_SIGNAL, grace_s=grace_s)
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
    """Each service's state: down (no live tracked pid), up (answers), or unhealthy."""
    settings = settings or settings_from()
    result = []
    for service in Service:
        port = settings.ports.of(service)[0]
        pid = _tracked(settings, service)
        if pid is None:
            result.append(ServiceStatus(service, ServiceState.DOWN, None, port))
            continue
        reason = _MODULES[service].check(settings)
        state = ServiceState.UP if reason is None else ServiceState.UNHEALTHY
        result.append(ServiceStatus(service, state, pid, port, reason or ""))
    return result


def env(settings: StackSettings | None = None) -> dict[str, str]:
    """Connection settings of the local stack, keyed by environment variable name."""
    settings = settings or settings_from()
    return connection_env(settings.ports, pg_password=stack_postgres.password(settings))
