"""Kafka Connect with Debezium's PostgreSQL connector for the local stack (opt-in:
``fencectl stack up --with debezium``), reading a source database on the stack's PostgreSQL.

Rules:
- The jars come from Maven Central through ``mvn`` and ``ops/stack/connect-pom.xml`` (Kafka
  Connect's runtime at the stack's Kafka version, Debezium's PostgreSQL connector); the
  classpath is cached like Kafka's (``ops.stack.kafka.resolve_classpath``).
- One distributed worker (``org.apache.kafka.connect.cli.ConnectDistributed``, group
  ``fence-connect``): Kafka Connect's JSON converters with schemas; connector configs,
  source offsets (flushed every second) and status in Kafka topics (``__fence_connect_*``),
  so a connector outlives the worker; the REST API on 127.0.0.1 (``FENCE_CONNECT_PORT``,
  ``KAFKA_CONNECT_URL`` in ``fencectl stack env``). No connector is made at start: one is
  registered through the REST API (``PUT /connectors/NAME/config``). A worker killed and
  started again resumes from the offsets last flushed: events after them are delivered
  again (at least once, as Debezium promises).
- The source: the database ``source`` and its owner ``source_cdc`` (``LOGIN
  REPLICATION``, the stack's PostgreSQL password; ``FENCE_SOURCE_DSN``), made when the
  worker starts. The stack's PostgreSQL always runs with ``wal_level=logical``
  (``ops.stack.postgres``), so Debezium's ``pgoutput`` plugin and a publication work.
- Its command line carries the service directory (``-Dfenceworker.stack=...``) as the pid
  marker. Healthy means ``GET /`` answers Connect's version.
- Apicurio Registry's Avro converter (``AVRO_CONVERTER``, ``ops/stack/converter-pom.xml``)
  sits in the worker's ``plugin.path`` (its own class loader): a connector configured with
  ``avro_converter_config`` writes its keys and values in Avro through the stack's registry,
  in Confluent's wire format, which the table sink reads with ``--sink-format avro``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import urllib.error
import urllib.request
from pathlib import Path

from ops.stack import kafka as stack_kafka
from ops.stack import postgres as stack_postgres
from ops.stack.config import HOST, Service, StackSettings
from ops.stack.procs import spawn

__all__ = ["AVRO_CONVERTER", "SOURCE_DB", "SOURCE_USER", "STOP_SIGNAL", "avro_converter_config",
           "check", "classpath", "marker", "source_dsn", "start", "url"]

STOP_SIGNAL = signal.SIGTERM
POM = Path(__file__).resolve().parent / "connect-pom.xml"
CONVERTER_POM = Path(__file__).resolve().parent / "converter-pom.xml"
AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
#: jars of the converter's tree that Connect's own class loader provides (its API)
_FROM_CONNECT = ("kafka-clients-", "connect-api-", "slf4j-api-")
HEAP = "384m"
SOURCE_DB = "source"
SOURCE_USER = "source_cdc"
_MAIN = "org.apache.kafka.connect.cli.ConnectDistributed"


def url(settings: StackSettings) -> str:
    """The REST API's base URL (``KAFKA_CONNECT_URL``)."""
    return f"http://{HOST}:{settings.ports.connect}"


def source_dsn(settings: StackSettings, password: str) -> str:
    """The source database's URL (``FENCE_SOURCE_DSN``)."""
    return f"postgresql://{SOURCE_USER}:{password}@{HOST}:{settings.ports.postgres}/{SOURCE_DB}"


def _svc(settings: StackSettings) -> Path:
    return settings.paths.service_dir(Service.CONNECT)


def marker(settings: StackSettings) -> str:
    """A string the worker's command line contains (its service directory)."""
    return f"-Dfenceworker.stack={_svc(settings)}"


def classpath(settings: StackSettings) -> str:
    """Connect's runtime and Debezium's connector, resolved with mvn on first use."""
    return stack_kafka.resolve_classpath(settings, POM, settings.paths.connect_cache,
                                         what="Kafka Connect and Debezium")


def avro_converter_config(registry_url: str, *, key: bool = True) -> dict[str, str]:
    """A connector's settings that make it write Avro through the registry at
    ``registry_url`` (the stack's ``.../apis/ccompat/v7``; the converter speaks Apicurio's
    own API beside it) in Confluent's wire format: a zero byte and the schema's 4-byte id,
    the id the Confluent-compatible API serves, under the subject ``<topic>-value``
    (``-key``)."""
    base = registry_url.split("/apis/")[0] + "/apis/registry/v2"
    out: dict[str, str] = {}
    for side in ("key", "value") if key else ("value",):
        out |= {f"{side}.converter": AVRO_CONVERTER,
                f"{side}.converter.apicurio.registry.url": base,
                f"{side}.converter.apicurio.registry.auto-register": "true",
                f"{side}.converter.apicurio.registry.find-latest": "true",
                f"{side}.converter.apicurio.registry.as-confluent": "true",
                f"{side}.converter.apicurio.registry.headers.enabled": "false",
                f"{side}.converter.apicurio.registry.id-handler":
                    "io.apicurio.registry.serde.Legacy4ByteIdHandler",
                f"{side}.converter.apicurio.registry.use-id": "contentId"}
    return out


def _plugins(settings: StackSettings) -> Path:
    """The worker's plugin.path: Apicurio's Avro converter resolved on first use, its jars
    copied into a plugin directory of their own."""
    cp = stack_kafka.resolve_classpath(settings, CONVERTER_POM, settings.paths.connect_cache,
                                       what="Apicurio Registry's Avro converter")
    plugins = _svc(settings) / "plugins"
    target = plugins / "apicurio-avro-converter"
    target.mkdir(parents=True, exist_ok=True)
    for jar in map(Path, cp.split(os.pathsep)):
        if not jar.name.startswith(_FROM_CONNECT) and not (target / jar.name).exists():
            shutil.copy2(jar, target / jar.name)
    return plugins


def worker_properties(settings: StackSettings, plugins: Path | None = None) -> str:
    """The worker's configuration (pure); ``plugins``: its plugin.path."""
    props = {
        "bootstrap.servers": ",".join(f"{HOST}:{settings.ports.of(s)[0]}"
                                      for s in settings.kafka_services),
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "true",
        "value.converter.schemas.enable": "true",
        "group.id": "fence-connect",
        "config.storage.topic": "__fence_connect_configs",
        "offset.storage.topic": "__fence_connect_offsets",
        "status.storage.topic": "__fence_connect_status",
        "config.storage.replication.factor": "1",
        "offset.storage.replication.factor": "1",
        "status.storage.replication.factor": "1",
        "offset.flush.interval.ms": "1000",
        "listeners": f"http://{HOST}:{settings.ports.connect}",
        "plugin.discovery": "only_scan",
        **({"plugin.path": str(plugins)} if plugins is not None else {}),
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


def _provision_source(settings: StackSettings) -> None:
    """The source database and its replication role (idempotent)."""
    secret = stack_postgres.password(settings)
    stack_postgres.run_sql(settings, f"""
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{SOURCE_USER}') THEN
    CREATE ROLE {SOURCE_USER} LOGIN REPLICATION PASSWORD '{secret}';
  ELSE
    ALTER ROLE {SOURCE_USER} LOGIN REPLICATION PASSWORD '{secret}';
  END IF;
END $$;
SELECT 'CREATE DATABASE {SOURCE_DB} OWNER {SOURCE_USER}'
 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{SOURCE_DB}')\\gexec
""")


def start(settings: StackSettings) -> int:
    """Resolve the jars, make the source database, start the worker detached; its pid."""
    java = stack_kafka.java_binary()
    cp = classpath(settings)
    _provision_source(settings)
    svc = _svc(settings)
    svc.mkdir(parents=True, exist_ok=True)
    plugins = _plugins(settings)
    props = svc / "worker.properties"
    props.write_text(worker_properties(settings, plugins))
    log4j = svc / "log4j2.properties"
    log4j.write_text(stack_kafka.LOG4J2)
    argv = [java, f"-Xms{HEAP}", f"-Xmx{HEAP}", "-XX:+UseSerialGC",
            "-Djava.awt.headless=true", marker(settings),
            f"-Dlog4j2.configurationFile={log4j}", f"-Dkafka.logs.dir={svc}",
            "-cp", cp, _MAIN, str(props)]
    return spawn(argv, log_path=settings.paths.log_file(Service.CONNECT),
                 pid_path=settings.paths.pid_file(Service.CONNECT), cwd=svc)


def check(settings: StackSettings) -> str | None:
    """None when ``GET /`` answers Connect's version, else the reason."""
    try:
        with urllib.request.urlopen(url(settings) + "/", timeout=5) as resp:
            body = json.loads(resp.read())
    except (OSError, ValueError, urllib.error.URLError) as exc:
        return f"no answer from {url(settings)}: {exc}"
    return None if isinstance(body, dict) and body.get("version") else f"unexpected: {body}"
