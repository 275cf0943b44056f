"""Where the local stack lives and which loopback ports it uses.

Rules:
- Data directories, logs and pid files live under ``.stack/`` in the checkout
  (override: ``FENCE_STACK_DIR``).
- Resolved jars, the Jaeger and Prometheus binaries, the schema registry's app and build
  caches live in a user-level cache (``FENCE_CACHE_DIR``, else ``$XDG_CACHE_HOME/fenceworker``, else
  ``~/.cache/fenceworker``) so a fresh clone on the same machine reuses them.
- Every port binds 127.0.0.1 and can be overridden by an environment variable
  (see ``PORT_ENV``); nothing here reads the clock or starts a process.
- Kafka runs as one node (``Service.KAFKA``, the default) or as a three-node cluster
  (``KAFKA_NODES``: ``kafka-1`` .. ``kafka-3``, each broker + controller) on ports of its
  own, so both can run side by side (the test suite keeps the one-node cluster for most
  tests and starts the three nodes only for the failover tests). ``FENCE_KAFKA_NODES``
  (1 or 3; ``fencectl stack up --kafka-nodes``) chooses which one ``up`` starts and
  ``env`` points at.

Long because every service's ports, paths and environment names are declared here, in
one place the other stack modules read.
"""

from __future__ import annotations

import enum
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DB_NAME",
    "DB_USER",
    "HOST",
    "JAEGER_VERSION",
    "KAFKA_NODES",
    "KAFKA_NODE_COUNTS",
    "KAFKA_VERSION",
    "PORT_ENV",
    "PROMETHEUS_VERSION",
    "REGISTRY_VERSION",
    "SERVICE_ENV",
    "SERVICE_PORTS",
    "Service",
    "ServiceSettings",
    "StackError",
    "StackPaths",
    "StackPorts",
    "StackSettings",
    "connection_env",
    "default_services",
    "env_lines",
    "kafka_bootstrap",
    "node_number",
    "settings_from",
]

HOST = "127.0.0.1"
KAFKA_VERSION = "4.1.1"
JAEGER_VERSION = "v1.76.0"  # same commit as Jaeger v2.13.0; newest reachable by semver
# the Go module version of Prometheus 3.16.0 (its VERSION file): the newest non-rc version the
# Go module proxy serves; its go.mod has no replace directive and wants Go >= 1.26.7
PROMETHEUS_VERSION = "v0.316.0"
#: Apicurio Registry: its runnable app is on Maven Central (seen to serve confluent-kafka's
#: Avro, Protobuf and JSON Schema serdes through /apis/ccompat/v7)
REGISTRY_VERSION = "3.3.3"
DB_NAME = "fenceworker"
DB_USER = "fenceworker"


class StackError(Exception):
    """The local stack could not be prepared, started or checked; the message names the fix."""


class Service(enum.Enum):
    """The services of the local stack, in start order: Kafka is either ``KAFKA`` (one
    node) or the three nodes ``KAFKA_1`` .. ``KAFKA_3`` of a cluster."""

    POSTGRES = "postgres"
    KAFKA = "kafka"
    KAFKA_1 = "kafka-1"
    KAFKA_2 = "kafka-2"
    KAFKA_3 = "kafka-3"
    JAEGER = "jaeger"
    PROMETHEUS = "prometheus"
    REGISTRY = "registry"  # the schema registry (Confluent-compatible REST API)
    CONNECT = "connect"  # Kafka Connect with Debezium's PostgreSQL connector (opt-in)


#: the nodes of the three-node Kafka cluster, node 1 first
KAFKA_NODES: tuple[Service, ...] = (Service.KAFKA_1, Service.KAFKA_2, Service.KAFKA_3)
#: the Kafka node counts the stack runs (``FENCE_KAFKA_NODES``, ``--kafka-nodes``)
KAFKA_NODE_COUNTS = (1, 3)


def node_number(service: Service) -> int:
    """1..3 for a node of the three-node cluster; raises ValueError for any other service."""
    return KAFKA_NODES.index(service) + 1


def default_services(kafka_nodes: int) -> tuple[Service, ...]:
    """What ``up`` starts: PostgreSQL, Kafka with ``kafka_nodes`` nodes, Jaeger, Prometheus,
    the schema registry."""
    kafka = (Service.KAFKA,) if kafka_nodes == 1 else KAFKA_NODES
    return (Service.POSTGRES, *kafka, Service.JAEGER, Service.PROMETHEUS, Service.REGISTRY)


#: port field -> (environment variable, default)
PORT_ENV: dict[str, tuple[str, int]] = {
    "postgres": ("FENCE_PG_PORT", 55432),
    "kafka": ("FENCE_KAFKA_PORT", 19092),
    "kafka_controller": ("FENCE_KAFKA_CONTROLLER_PORT", 19093),
    "kafka_1": ("FENCE_KAFKA_1_PORT", 19192),
    "kafka_1_controller": ("FENCE_KAFKA_1_CONTROLLER_PORT", 19193),
    "kafka_2": ("FENCE_KAFKA_2_PORT", 19194),
    "kafka_2_controller": ("FENCE_KAFKA_2_CONTROLLER_PORT", 19195),
    "kafka_3": ("FENCE_KAFKA_3_PORT", 19196),
    "kafka_3_controller": ("FENCE_KAFKA_3_CONTROLLER_PORT", 19197),
    "otlp_grpc": ("FENCE_OTLP_GRPC_PORT", 4317),
    "otlp_http": ("FENCE_OTLP_HTTP_PORT", 4318),
    "jaeger_query": ("FENCE_JAEGER_QUERY_PORT", 16686),
    "jaeger_query_grpc": ("FENCE_JAEGER_QUERY_GRPC_PORT", 16685),
    "jaeger_health": ("FENCE_JAEGER_HEALTH_PORT", 13133),
    "prometheus": ("FENCE_PROMETHEUS_PORT", 9090),
    "schema_registry": ("FENCE_SCHEMA_REGISTRY_PORT", 18081),
    "schema_registry_management": ("FENCE_SCHEMA_REGISTRY_MANAGEMENT_PORT", 18082),
    "connect": ("FENCE_CONNECT_PORT", 18083),
}


#: service -> the ``StackPorts`` fields it listens on, the client-facing one first
SERVICE_PORTS: dict[Service, tuple[str, ...]] = {
    Service.POSTGRES: ("postgres",),
    Service.KAFKA: ("kafka", "kafka_controller"),
    Service.KAFKA_1: ("kafka_1", "kafka_1_controller"),
    Service.KAFKA_2: ("kafka_2", "kafka_2_controller"),
    Service.KAFKA_3: ("kafka_3", "kafka_3_controller"),
    Service.JAEGER: ("jaeger_query", "otlp_grpc", "otlp_http", "jaeger_query_grpc",
                     "jaeger_health"),
    Service.PROMETHEUS: ("prometheus",),
    Service.REGISTRY: ("schema_registry", "schema_registry_management"),
    Service.CONNECT: ("connect",),
}


@dataclass(frozen=True, slots=True)
class StackPorts:
    """Loopback TCP ports of the stack; defaults and overrides in ``PORT_ENV``."""

    postgres: int
    kafka: int
    kafka_controller: int
    kafka_1: int
    kafka_1_controller: int
    kafka_2: int
    kafka_2_controller: int
    kafka_3: int
    kafka_3_controller: int
    otlp_grpc: int
    otlp_http: int
    jaeger_query: int
    jaeger_query_grpc: int
    jaeger_health: int
    prometheus: int
    schema_registry: int
    schema_registry_management: int
    connect: int

    def of(self, service: Service) -> tuple[int, ...]:
        """All ports ``service`` listens on, the client-facing one first."""
        return tuple(getattr(self, field) for field in SERVICE_PORTS[service])


@dataclass(frozen=True, slots=True)
class StackPaths:
    """Filesystem layout: ``root`` is ``.stack/``; ``cache`` is the user-level cache."""

    root: Path
    cache: Path

    def service_dir(self, service: Service) -> Path:
        return self.root / service.value

    def pid_file(self, service: Service) -> Path:
        return self.service_dir(service) / f"{service.value}.pid"

    def log_file(self, service: Service) -> Path:
        return self.service_dir(service) / f"{service.value}.log"

    @property
    def lock_file(self) -> Path:
        return self.root / "stack.lock"

    @property
    def pg_password_file(self) -> Path:
        return self.service_dir(Service.POSTGRES) / "password"

    @property
    def kafka_cache(self) -> Path:
        return self.cache / f"kafka-{KAFKA_VERSION}"

    @property
    def jaeger_binary(self) -> Path:
        return self.cache / "bin" / f"jaeger-{JAEGER_VERSION}"

    @property
    def prometheus_binary(self) -> Path:
        return self.cache / "bin" / f"prometheus-{PROMETHEUS_VERSION}"

    @property
    def promtool_binary(self) -> Path:
        return self.cache / "bin" / f"promtool-{PROMETHEUS_VERSION}"

    @property
    def registry_app(self) -> Path:
        return self.cache / f"apicurio-registry-{REGISTRY_VERSION}"

    @property
    def connect_cache(self) -> Path:
        return self.cache / f"connect-{KAFKA_VERSION}"


@dataclass(frozen=True, slots=True)
class StackSettings:
    """Everything the stack needs to know, resolved once from the environment."""

    paths: StackPaths
    ports: StackPorts
    cli: str = "fencectl"
    """How a hint names the CLI ("run `<cli> stack up`"): the caller passes it in
    (``fencectl stack`` gives ``ops.hints.fencectl()``; the stack imports nothing of it)."""
    kafka_nodes: int = 1
    """Kafka nodes ``up`` starts and ``env`` points at: 1 or 3 (``FENCE_KAFKA_NODES``)."""
    kafka_nodes_chosen: bool = False
    """True when ``FENCE_KAFKA_NODES`` (or ``--kafka-nodes``) chose ``kafka_nodes``."""

    @property
    def kafka_services(self) -> tuple[Service, ...]:
        """The Kafka services of the chosen node count."""
        return (Service.KAFKA,) if self.kafka_nodes == 1 else KAFKA_NODES


def _checkout_root() -> Path:
    return Path(__file__).resolve().parents[2]


def _port(env: Mapping[str, str], field: str) -> int:
    name, default = PORT_ENV[field]
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise StackError(f"{name}={raw!r} is not a port number; unset it or give 1-65535") from None
    if not 0 < value < 65536:
        raise StackError(f"{name}={value} is out of range; give 1-65535")
    return value


def settings_from(env: Mapping[str, str] | None = None, *, cli: str = "fencectl") -> StackSettings:
    """Resolve paths and ports from ``env`` (default ``os.environ``); raises StackError.
    ``cli`` is how hints name the command line (``StackSettings.cli``)."""
    env = os.environ if env is None else env
    root = Path(env.get("FENCE_STACK_DIR") or _checkout_root() / ".stack")
    cache_env = env.get("FENCE_CACHE_DIR")
    if cache_env:
        cache = Path(cache_env)
    else:
        xdg = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
        cache = Path(xdg) / "fenceworker"
    ports = StackPorts(**{field: _port(env, field) for field in PORT_ENV})
    if len({getattr(ports, f) for f in PORT_ENV}) != len(PORT_ENV):
        raise StackError(f"two stack ports are equal ({ports}); change the FENCE_*_PORT overrides")
    raw_nodes = env.get("FENCE_KAFKA_NODES", "").strip()
    nodes = 1
    if raw_nodes:
        if raw_nodes not in {str(n) for n in KAFKA_NODE_COUNTS}:
            raise StackError(f"FENCE_KAFKA_NODES={raw_nodes!r}: give 1 (one node) or 3 (a "
                             "three-node cluster)")
        nodes = int(raw_nodes)
    return StackSettings(
        paths=StackPaths(root=root.absolute(), cache=cache.absolute()), ports=ports, cli=cli,
        kafka_nodes=nodes, kafka_nodes_chosen=bool(raw_nodes),
    )


def kafka_bootstrap(ports: StackPorts, services: tuple[Service, ...]) -> str:
    """Bootstrap servers of the Kafka ``services`` (``KAFKA`` or the three nodes)."""
    return ",".join(f"{HOST}:{ports.of(s)[0]}" for s in services)


def connection_env(ports: StackPorts, *, pg_password: str,
                   kafka: tuple[Service, ...] = (Service.KAFKA,)) -> dict[str, str]:
    """The local stack's client-facing settings, keyed by ``SERVICE_ENV`` names; Kafka's
    bootstrap lists every node of ``kafka``."""
    return ServiceSettings(
        kafka_bootstrap=kafka_bootstrap(ports, kafka),
        dsn=f"postgresql://{DB_USER}:{pg_password}@{HOST}:{ports.postgres}/{DB_NAME}",
        otlp_endpoint=f"http://{HOST}:{ports.otlp_grpc}",
        jaeger_query_url=f"http://{HOST}:{ports.jaeger_query}",
        schema_registry_url=f"http://{HOST}:{ports.schema_registry}/apis/ccompat/v7",
    ).as_env()


#: the environment variables that locate the services, in ``ServiceSettings`` field order
SERVICE_ENV: tuple[str, ...] = (
    "KAFKA_BOOTSTRAP_SERVERS",
    "FENCE_DSN",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "JAEGER_QUERY_URL",
    "SCHEMA_REGISTRY_URL",
)


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    """Where the services are, whoever runs them (local stack, compose, testcontainers)."""

    kafka_bootstrap: str  #: Kafka bootstrap servers, host:port[,host:port]
    dsn: str  #: PostgreSQL URL, postgresql://user:password@host:port/db
    otlp_endpoint: str  #: OTLP gRPC endpoint, http://host:port
    jaeger_query_url: str  #: Jaeger query API base URL, http://host:port
    schema_registry_url: str  #: Confluent-compatible schema registry, http://host:port/path

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ServiceSettings | None:
        """Settings from ``SERVICE_ENV`` variables, or None unless every one is set."""
        values = [env.get(name, "").strip() for name in SERVICE_ENV]
        return cls(*values) if all(values) else None

    def as_env(self) -> dict[str, str]:
        """The settings keyed by ``SERVICE_ENV`` names."""
        values = (self.kafka_bootstrap, self.dsn, self.otlp_endpoint, self.jaeger_query_url,
                  self.schema_registry_url)
        return dict(zip(SERVICE_ENV, values, strict=True))


def env_lines(values: Mapping[str, str]) -> list[str]:
    """``export NAME=value`` lines, shell-quoted, for ``eval "$(fencectl stack env)"``."""
    return [f"export {name}={shlex.quote(value)}" for name, value in values.items()]
