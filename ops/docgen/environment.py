"""The environment variables the code reads, declared once: ``VARIABLES`` (and the local
stack's port overrides, ``ops.stack.config.PORT_ENV``), rendered as ``docs/environment.md``.

Rules
- ``read_in_code()`` finds the variables the code names (an AST scan of ``consumer/``,
  ``fencing/`` and ``ops/``): a string of a known prefix (``FENCE_``, ``KAFKA_``, ``OTEL_``,
  ``SCHEMA_REGISTRY_``, ``JAEGER_``) outside ``__all__`` and not assigned into a mapping
  (an environment the code writes for a child), and any name read with ``environ.get``,
  ``env.get``, ``getenv`` or ``environ[...]``. ``undeclared()`` lists those ``VARIABLES``
  and ``PORT_ENV`` lack: ``python -m ops.docgen --check`` and the docs tests fail on one.
- A secret (``FENCE_DSN``, ``FENCE_DDL_DSN``, ``SCHEMA_REGISTRY_URL`` may carry credentials)
  is read from the environment only, never from a flag.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GROUPS", "VARIABLES", "Variable", "read_in_code", "render", "undeclared"]

ROOT = Path(__file__).resolve().parents[2]
_PREFIXED = re.compile(r"^(FENCE|KAFKA|OTEL|SCHEMA_REGISTRY|JAEGER)_[A-Z0-9_]+$")
_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


@dataclass(frozen=True, slots=True)
class Variable:
    """One variable: who reads it, what it sets, its default (``—``: none)."""

    name: str
    group: str
    read_by: str
    meaning: str
    default: str = "—"


GROUPS = ("Services", "The worker", "Telemetry", "The local stack", "Tests and tools")

VARIABLES: tuple[Variable, ...] = (
    Variable("FENCE_DSN", "Services", "run, migrate, status, reset, quarantine, sink plan",
             "the PostgreSQL connection (libpq URL or key=value; `sslmode`, `sslrootcert` "
             "... for TLS); a secret: never a flag, never logged"),
    Variable("FENCE_DDL_DSN", "Services", "run `--sink-evolve add-columns`, quarantine replay "
             "`--sink`", "the connection that runs the table sink's `ALTER TABLE`, as a role "
             "that owns the table; a secret"),
    Variable("FENCE_SCHEMA", "Services", "run, migrate, status, reset, quarantine",
             "the PostgreSQL schema of the fence tables (`--schema`)", "fence"),
    Variable("KAFKA_BOOTSTRAP_SERVERS", "Services", "run, status, reset, topic, produce, "
             "quarantine relay", "Kafka's bootstrap servers (`--bootstrap-servers`)"),
    Variable("FENCE_KAFKA_CONFIG", "Services", "run, status, reset, topic, produce, "
             "quarantine relay", "a file of librdkafka properties, `key=value` lines, for "
             "every Kafka client of the command (SASL and key passwords stay out of argv); "
             "`-X` wins over it"),
    Variable("SCHEMA_REGISTRY_URL", "Services", "run `--sink`, sink plan, quarantine replay "
             "`--sink`", "the schema registry of a schema'd `--sink-format` (avro, protobuf, "
             "json-schema); may carry credentials, so never a flag"),
    Variable("JAEGER_QUERY_URL", "Services", "trace", "Jaeger's query API (`--jaeger-url`)"),
    Variable("KAFKA_CONNECT_URL", "Services", "stack env", "Kafka Connect's REST API of "
             "`fencectl stack up --with debezium` (printed by `fencectl stack env`; read by "
             "the tests and the replication tutorial)"),
    Variable("FENCE_SOURCE_DSN", "Services", "stack env", "the source database that "
             "Debezium's connector reads in the local stack (`--with debezium`); printed by "
             "`fencectl stack env`"),
    Variable("FENCE_LOG_LEVEL", "The worker", "run, status, topic, produce",
             "log level (`--log-level`): debug, info, warning, error, critical", "info"),
    Variable("FENCE_HTTP_PORT", "The worker", "run", "the port of `/metrics`, `/healthz`, "
             "`/readyz` (`--http-port`; 0: any free port; member i of `--processes` serves "
             "port + i)", "off"),
    Variable("FENCE_HTTP_HOST", "The worker", "run", "the address the HTTP port binds "
             "(`--http-host`)", "127.0.0.1"),
    Variable("FENCE_INSTANCE_ID", "The worker", "run", "the static group membership id "
             "(`--instance-id`; member i of `--processes` joins as ID-i)"),
    Variable("FENCE_SINK_EVOLVE", "The worker", "run", "the table sink's schema evolution "
             "(`--sink-evolve`): none or add-columns", "none"),
    Variable("FENCE_MEMBER_INDEX", "The worker", "run", "set by `fencectl run --processes` "
             "for each member it starts (0..N-1): the process runs as a member, never as "
             "another set; not set by hand"),
    Variable("FENCE_MEMBERS", "The worker", "run", "set by `fencectl run --processes` for "
             "each member: the set's size; not set by hand"),
    Variable("OTEL_SERVICE_NAME", "Telemetry", "run, trace", "the service name of the "
             "worker's spans (`fencectl trace --service`)", "fenceworker"),
    Variable("OTEL_EXPORTER_OTLP_ENDPOINT", "Telemetry", "run, produce",
             "where spans go over OTLP; unset (and no `OTEL_TRACES_EXPORTER`): no export",
             "no export"),
    Variable("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "Telemetry", "run, produce",
             "the same for traces only; wins over `OTEL_EXPORTER_OTLP_ENDPOINT`"),
    Variable("OTEL_EXPORTER_OTLP_PROTOCOL", "Telemetry", "run", "grpc (Jaeger's 4317) or "
             "http/protobuf (4318)", "grpc"),
    Variable("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "Telemetry", "run", "the same for traces "
             "only; wins over `OTEL_EXPORTER_OTLP_PROTOCOL`"),
    Variable("OTEL_TRACES_EXPORTER", "Telemetry", "run", "span exporters: otlp, console, "
             "none (a list)", "otlp when an endpoint is set"),
    Variable("OTEL_SDK_DISABLED", "Telemetry", "run, produce", "true: no span is exported "
             "(metrics stay on `/metrics`)", "false"),
    Variable("OTEL_RESOURCE_ATTRIBUTES", "Telemetry", "run", "resource attributes of the "
             "spans, merged by the OpenTelemetry SDK"),
    Variable("FENCE_STACK_DIR", "The local stack", "stack", "the stack's data, logs and pid "
             "files", "`.stack/` in the checkout"),
    Variable("FENCE_CACHE_DIR", "The local stack", "stack", "the user-level cache of the "
             "stack's builds (Kafka's jars, Jaeger, Prometheus, the schema registry)",
             "`$XDG_CACHE_HOME/fenceworker`"),
    Variable("XDG_CACHE_HOME", "The local stack", "stack", "where `FENCE_CACHE_DIR` defaults "
             "to (`fenceworker` under it)", "`$HOME/.cache`"),
    Variable("HOME", "The local stack", "stack", "where `XDG_CACHE_HOME` defaults to"),
    Variable("FENCE_KAFKA_NODES", "The local stack", "stack", "Kafka nodes `stack up` starts "
             "and `stack env` points at: 1, or 3 for a three-node cluster "
             "(`--kafka-nodes`)", "1"),
    Variable("JAVA_HOME", "The local stack", "stack", "the Java (21 or newer) that runs the "
             "schema registry; else the first `java` on `PATH`"),
    Variable("PATH", "The local stack", "stack", "where `java` is looked for without "
             "`JAVA_HOME`"),
    Variable("FENCE_CRASH_AT", "Tests and tools", "run, reset, quarantine", "arms a crash "
             "point (`POINT[@N]`) of the crash-point matrix: the process kills itself there; "
             "a bad value exits 2"),
    Variable("FENCE_CRASH_SIGNAL", "Tests and tools", "run, reset, quarantine", "the signal "
             "of an armed crash point: KILL or STOP", "KILL"),
    Variable("FENCE_CRASH_MARKER", "Tests and tools", "run, reset, quarantine", "the file an "
             "armed crash point appends its marker line to", "`fence-crash-marker.jsonl`"),
    Variable("FENCE_ARTIFACT_DIR", "Tests and tools", "the simulator's seed reduction",
             "where failing simulation seeds are written", "`artifacts`"),
    Variable("FENCE_BENCH_COMMAND", "Tests and tools", "make bench", "the command a bench "
             "JSON's provenance names (the Makefile sets it)"),
)


def _port_variables() -> list[Variable]:
    from ops.stack.config import PORT_ENV

    return [Variable(name, "The local stack", "stack", f"the local `{field}` port "
                     "(loopback)", str(default)) for field, (name, default) in PORT_ENV.items()]


def _strings(path: Path) -> Iterable[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            skip |= {id(n) for n in ast.walk(node)}
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            skip |= {id(n) for n in ast.walk(node.slice)}  # written for a child process
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and _PREFIXED.match(node.value) and id(node) not in skip:
            yield node.value
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "getenv") \
                and ast.unparse(node.func.value).split(".")[-1] in ("environ", "env", "os"):
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) \
                    and _NAME.match(first.value):
                yield first.value
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                and ast.unparse(node.value).split(".")[-1] in ("environ", "env") \
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str) \
                and _NAME.match(node.slice.value):
            yield node.slice.value


def read_in_code(root: Path = ROOT) -> dict[str, list[str]]:
    """Each variable the code names (see Rules) with the files that name it."""
    found: dict[str, list[str]] = {}
    for package in ("consumer", "fencing", "ops"):
        for path in sorted((root / package).rglob("*.py")):
            for name in dict.fromkeys(_strings(path)):
                found.setdefault(name, []).append(path.relative_to(root).as_posix())
    return found


def undeclared(root: Path = ROOT) -> list[str]:
    """Variables the code names that the page would not list, each with where it is read."""
    declared = {v.name for v in (*VARIABLES, *_port_variables())}
    return [f"{name} ({', '.join(files)})" for name, files in sorted(read_in_code(root).items())
            if name not in declared]


def render() -> list[str]:
    """The page's tables: one per group, then the stack's port overrides."""
    out: list[str] = []
    for group in GROUPS:
        out += [f"### {group}", "", "| variable | read by | what it sets | default |",
                "|---|---|---|---|"]
        out += [f"| `{v.name}` | {v.read_by} | {v.meaning} | {v.default} |"
                for v in VARIABLES if v.group == group]
        if group == "The local stack":
            out += [f"| `{v.name}` | {v.read_by} | {v.meaning} | {v.default} |"
                    for v in _port_variables()]
        out.append("")
    return out[:-1]
