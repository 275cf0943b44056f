"""Apache Kafka for the local stack: one KRaft node (broker + controller) on loopback; the
three-node cluster's own rules are in ``ops.stack.kafka_cluster``.

Rules:
- The jars come from Maven Central through ``mvn`` and ``ops/stack/kafka-pom.xml`` (broker and
  the command-line tools, ``kafka-tools``); the resolved classpath is cached in
  ``<cache>/kafka-<version>/cp-<pom digest>.txt`` (local repo ``<cache>/m2``) and reused by
  every checkout on the machine with the same pom: a changed pom resolves afresh.
- ``ops.stack.kafka_tools`` runs Kafka's command-line tools with that classpath.
- Settings favour fast tests: no initial rebalance delay, one offsets partition,
  replication 1, and low KIP-848 (``consumer`` protocol) and classic session bounds.
- Healthy means a message produced to ``__fence_stack_health`` is fetched back.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

from ops.stack.config import HOST, KAFKA_VERSION, Service, StackError, StackSettings
from ops.stack.procs import spawn

__all__ = [
    "HEALTH_TOPIC",
    "QUIET",
    "STOP_SIGNAL",
    "broker_settings",
    "check",
    "classpath",
    "cluster_id",
    "cp_file",
    "java_binary",
    "launch",
    "marker",
    "resolve_classpath",
    "round_trip",
    "server_properties",
    "start",
]

STOP_SIGNAL = signal.SIGTERM
HEALTH_TOPIC = "__fence_stack_health"
HEAP = "512m"
# librdkafka log sink: probes against a booting broker are expected to fail noisily.
QUIET = logging.getLogger("fenceworker.stack.kafka_probe")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False
POM = Path(__file__).resolve().parent / "kafka-pom.xml"


def _svc(settings: StackSettings) -> Path:
    return settings.paths.service_dir(Service.KAFKA)


def marker(settings: StackSettings) -> str:
    """A string the broker's command line contains (its properties file)."""
    return str(_svc(settings) / "server.properties")


def broker_settings(
    *, bind_host: str, port: int, controller_port: int, advertised: str, log_dir: str
) -> dict[str, str]:
    """Broker properties of a one-node KRaft cluster tuned for fast tests (pure).

    ``advertised`` is the host:port clients are told to use. Also used for the
    apache/kafka container in ``tests/conftest.py``.
    """
    return {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{bind_host}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{advertised}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": log_dir,
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "delete.topic.enable": "true",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "share.coordinator.state.topic.num.partitions": "1",
        # classic protocol: no join delay; clients may ask for session.timeout.ms >= 1 s
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",
        # KIP-848 consumer protocol: timeouts are broker-side; bounds lowered with them
        "group.consumer.session.timeout.ms": "6000",
        "group.consumer.min.session.timeout.ms": "1000",
        "group.consumer.heartbeat.interval.ms": "500",
        "group.consumer.min.heartbeat.interval.ms": "100",
    }


def server_properties(settings: StackSettings) -> str:
    """The local broker's ``server.properties`` text for ``settings`` (pure)."""
    p = settings.ports
    lines = broker_settings(
        bind_host=HOST,
        port=p.kafka,
        controller_port=p.kafka_controller,
        advertised=f"{HOST}:{p.kafka}",
        log_dir=str(_svc(settings) / "data"),
    )
    return "".join(f"{k}={v}\n" for k, v in lines.items())


LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


def cp_file(settings: StackSettings) -> Path:
    """Where the classpath resolved from the current ``kafka-pom.xml`` is cached."""
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:12]
    return settings.paths.kafka_cache / f"cp-{digest}.txt"


def cluster_id() -> str:
    """A fresh KRaft cluster id (base64url of 16 random bytes, not starting with '-')."""
    while True:
        value = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not value.startswith("-"):
            return value


def classpath(settings: StackSettings) -> str:
    """The broker and tools classpath, resolved with mvn on first use; raises StackError
    naming the fix."""
    return resolve_classpath(settings, POM, settings.paths.kafka_cache,
                             what=f"Kafka {KAFKA_VERSION}")


def resolve_classpath(settings: StackSettings, pom: Path, cache: Path, *, what: str) -> str:
    """The runtime classpath of ``pom``'s dependencies, resolved with mvn into the stack's
    local repository on first use and cached in ``cache`` under a digest of the pom;
    raises StackError naming the fix."""
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:12]
    cached = cache / f"cp-{digest}.txt"
    if cached.exists():
        cp = cached.read_text().strip()
        if cp and all(Path(j).exists() for j in cp.split(os.pathsep)):
            return cp
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError(
            f"mvn (Apache Maven) is not on PATH; it resolves the {what} jars from Maven "
            "Central. Install it: sudo apt-get install -y maven"
        )
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f"{cached.name}.{os.getpid()}.tmp"
    argv = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(pom),
        f"-Dmaven.repo.local={settings.paths.cache / 'm2'}",
        "dependency:build-classpath",
        "-Dmdep.includeScope=runtime",
        f"-Dmdep.outputFile={tmp}",
    ]
    log = cache / "mvn.log"
    with open(log, "w") as fh:
        done = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0 or not tmp.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise StackError(
            f"Maven could not resolve {what} (exit {done.returncode}); check access "
            f"to Maven Central (proxy settings in ~/.m2/settings.xml). Log {log}:\n{tail}"
        )
    tmp.replace(cached)
    return cached.read_text().strip()


def java_binary() -> str:
    java = shutil.which("java")
    if java is None:
        raise StackError(
            "java is not on PATH; Kafka needs Java 17 or newer. Install it: "
            "sudo apt-get install -y openjdk-17-jre-headless"
        )
    return java


def _format(java: str, cp: str, props: Path, data: Path, log: Path, *,
            cluster: str | None = None) -> None:
    """Format ``data`` once: a one-node cluster with ``--standalone`` and a fresh id, a node
    of a static-voter cluster with that cluster's id ``cluster``."""
    if (data / "meta.properties").exists():
        return
    if data.exists():
        shutil.rmtree(data)  # an interrupted format; ours to remove
    mode = ["-t", cluster] if cluster is not None else ["--standalone", "-t", cluster_id()]
    argv = [java, "-Xmx256m", "-cp", cp, "kafka.tools.StorageTool", "format", *mode,
            "-c", str(props)]
    with open(log, "ab") as fh:
        done = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise StackError(f"kafka StorageTool format failed (exit {done.returncode}); see {log}")


def launch(settings: StackSettings, service: Service, properties: str, *, heap: str = HEAP,
           cluster: str | None = None) -> int:
    """Resolve jars, write ``properties`` into ``service``'s directory, format its storage
    once (see ``_format``), start the broker detached; return its pid."""
    java = java_binary()
    cp = classpath(settings)
    svc = settings.paths.service_dir(service)
    svc.mkdir(parents=True, exist_ok=True)
    props = svc / "server.properties"
    props.write_text(properties)
    log4j = svc / "log4j2.properties"
    log4j.write_text(LOG4J2)
    log = settings.paths.log_file(service)
    _format(java, cp, props, svc / "data", log, cluster=cluster)
    argv = [
        java,
        f"-Xms{heap}",
        f"-Xmx{heap}",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}",
        f"-Dkafka.logs.dir={svc}",
        "-cp",
        cp,
        "kafka.Kafka",
        str(props),
    ]
    return spawn(argv, log_path=log, pid_path=settings.paths.pid_file(service), cwd=svc)


def start(settings: StackSettings) -> int:
    """Start the one-node cluster's broker detached; return its pid."""
    return launch(settings, Service.KAFKA, server_properties(settings))


def check(settings: StackSettings, *, timeout_s: float = 10.0) -> str | None:
    """Produce one message and fetch it back; None when healthy, else the reason."""
    return round_trip(f"{HOST}:{settings.ports.kafka}", replication=1, timeout_s=timeout_s)


def round_trip(bootstrap: str, *, replication: int, timeout_s: float = 10.0) -> str | None:
    """Produce one message to ``HEALTH_TOPIC`` (created with ``replication`` replicas when
    missing; ``acks=all``) and fetch it back; None when that worked, else the reason."""
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka import TopicPartition as KTP
    from confluent_kafka.admin import AdminClient, NewTopic

    quiet: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": QUIET}
    try:
        admin = AdminClient(quiet)
        topics = admin.list_topics(timeout=timeout_s).topics
        if HEALTH_TOPIC not in topics:
            fut = admin.create_topics([NewTopic(HEALTH_TOPIC, 1, replication)],
                                      operation_timeout=timeout_s)
            try:
                fut[HEALTH_TOPIC].result(timeout=timeout_s)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
        value = uuid.uuid4().hex.encode()
        delivered: list[object] = []
        producer = Producer({**quiet, "message.timeout.ms": int(timeout_s * 1000),
                             "acks": "all"})
        producer.produce(
            HEALTH_TOPIC,
            value,
            on_delivery=lambda err, msg: delivered.append(err if err is not None else msg.offset()),
        )
        producer.flush(timeout_s)
        if not delivered or not isinstance(delivered[0], int):
            return f"produce to {HEALTH_TOPIC} failed: {delivered[0] if delivered else 'timeout'}"
        consumer = Consumer(
            {**quiet, "group.id": "__fence_stack_health", "enable.auto.commit": False}
        )
        try:
            consumer.assign([KTP(HEALTH_TOPIC, 0, delivered[0])])
            msg = consumer.poll(timeout_s)
        finally:
            consumer.close()
    except KafkaException as exc:
        return f"kafka request failed: {exc}"
    if msg is None:
        return f"fetch from {HEALTH_TOPIC} timed out"
    if msg.error() is not None:
        return f"fetch from {HEALTH_TOPIC} failed: {msg.error()}"
    if msg.value() != value:
        return f"fetched {msg.value()!r}, produced {value!r}"
    return None
