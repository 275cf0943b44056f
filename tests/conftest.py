"""Session-wide service settings for integration tests.

The ``services`` fixture yields one ``ServiceSettings``, chosen in this order:

1. all of KAFKA_BOOTSTRAP_SERVERS, FENCE_DSN, OTEL_EXPORTER_OTLP_ENDPOINT,
   JAEGER_QUERY_URL and SCHEMA_REGISTRY_URL set in the environment (an existing stack,
   e.g. ``compose/`` or ``eval "$(fencectl stack env)"``);
2. testcontainers when a Docker engine answers (Kafka, PostgreSQL, Jaeger, Apicurio
   Registry);
3. the local stack (``ops.stack.control``), started once for the session. Services a test
   session started stop when the last concurrent session ends (``ops.stack.lease``;
   set FENCE_KEEP_STACK=1 to keep them); services that were already running, e.g.
   from ``fencectl stack up``, are left alone. Jaeger and Prometheus, which a new machine
   builds from Go sources for minutes, are built in the background and started for the
   tests that ask for ``go_services`` (traces read from Jaeger, ``fencectl stack up``, the
   monitoring tests); those tests run after the others.

The chosen settings are exported into ``os.environ`` for the session, so worker
subprocesses (``.venv/bin/fencectl run ...``) inherit them. A missing service
never skips a test: the fixture starts it or fails saying why.

The ``kafka_cluster`` fixture is the local stack's three-node Kafka cluster
(``ops.stack.kafka_cluster``; always local: it needs java and mvn like the one-node stack),
started on first use beside whatever Kafka ``services`` chose and held by a lease of its own
(scope ``kafka-cluster``). The tests that use it run first (``pytest_collection_modifyitems``):
alone, while a new machine builds Jaeger and Prometheus in the background.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ops.stack.config import Service, ServiceSettings

__all__ = ["ServiceSettings"]

CLUSTER_FIXTURE = "kafka_cluster"
CLUSTER_SCOPE = "kafka-cluster"
#: the modules of long scenarios (kills, rebalances, session timeouts, three nodes, the
#: bench): marked ``slow``, so ``make check`` (``-m "not slow"``) leaves them to ``make test``
SLOW_MODULES = frozenset({
    "integration/test_bench_smoke", "integration/test_claim_unblocks",
    "integration/test_cdc", "integration/test_cli_untruths", "integration/test_crash_matrix",
    "integration/test_doc_pages", "integration/test_durability_classes",
    "integration/test_handler_blame", "integration/test_kafka_facts_failover",
    "integration/test_kafka_faults", "integration/test_observability_status",
    "integration/test_processes", "integration/test_produce", "integration/test_quarantine_relay",
    "integration/test_reset_pickup", "integration/test_sink_evolve",
    "integration/test_sink_rebalance", "integration/test_sink_registry_outage",
    "integration/test_sink_routing", "integration/test_slow_handlers",
    "integration/test_startup_outage", "integration/test_static_membership",
    "integration/test_worker_exits", "integration/test_worker_failures",
    "integration/test_worker_idle", "integration/test_worker_kafka_facts",
    "integration/test_worker_liveness", "integration/test_worker_lostcommit",
    "integration/test_worker_offset_mirror", "integration/test_worker_rebalance",
    "integration/test_worker_zombie", "monitoring/test_member_killed",
    "monitoring/test_spare_member", "monitoring/test_stall_alert",
})
#: built from Go sources when missing, in the background (``_GoBuilds``)
GO_BUILT = (Service.JAEGER, Service.PROMETHEUS)
#: fixtures of tests that need Jaeger or Prometheus (run after the others: ``_GoBuilds``)
GO_FIXTURES = ("go_services", "_go_services_started", "prometheus", "promtool")

# Redpanda (the first choice) has no KIP-848 `consumer` group protocol
# (redpanda-data/redpanda#29223), which the suite exercises; use Apache Kafka.
KAFKA_IMAGE = os.environ.get("FENCE_TEST_KAFKA_IMAGE", "apache/kafka:4.1.1")
POSTGRES_IMAGE = os.environ.get("FENCE_TEST_POSTGRES_IMAGE", "postgres:15")
JAEGER_IMAGE = os.environ.get("FENCE_TEST_JAEGER_IMAGE", "jaegertracing/jaeger:2.13.0")
REGISTRY_IMAGE = os.environ.get("FENCE_TEST_REGISTRY_IMAGE", "apicurio/apicurio-registry:3.3.3")
_READY_TIMEOUT_S = 120.0


def _docker_engine_answers() -> bool:
    """True when a Docker engine answers a ping; any DockerException means no."""
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except DockerException:
        return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http_json(url: str, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                json.loads(resp.read())
                return
        except (OSError, ValueError) as exc:
            last = exc
            time.sleep(1.0)
    pytest.fail(f"{url} did not answer within {timeout_s:.0f} s: {last}")


@contextmanager
def _containers() -> Iterator[ServiceSettings]:
    """Kafka (KRaft), PostgreSQL, Jaeger and schema registry containers for the session."""
    from testcontainers.community.postgres import PostgresContainer
    from testcontainers.core.container import DockerContainer

    from ops.stack.kafka import broker_settings, cluster_id

    with ExitStack() as stack:
        pg = stack.enter_context(
            PostgresContainer(
                POSTGRES_IMAGE,
                username="fenceworker",
                password="fenceworker",
                dbname="fenceworker",
                driver=None,
            )
        )
        kafka_port = _free_port()
        props = broker_settings(
            bind_host="0.0.0.0",
            port=9092,
            controller_port=9093,
            advertised=f"127.0.0.1:{kafka_port}",
            log_dir="/tmp/kraft-logs",
        )
        # the image formats storage without --standalone: a static voter set is needed
        del props["controller.quorum.bootstrap.servers"]
        props["controller.quorum.voters"] = "1@127.0.0.1:9093"
        kafka = DockerContainer(KAFKA_IMAGE).with_bind_ports(9092, kafka_port)
        kafka.with_env("CLUSTER_ID", cluster_id())
        for key, value in props.items():
            kafka.with_env("KAFKA_" + key.upper().replace(".", "_"), value)
        stack.enter_context(kafka)
        jaeger = DockerContainer(JAEGER_IMAGE).with_exposed_ports(4317, 16686)
        stack.enter_context(jaeger)
        registry = DockerContainer(REGISTRY_IMAGE).with_exposed_ports(8080)
        stack.enter_context(registry)
        host = jaeger.get_container_host_ip()
        registry_url = (f"http://{registry.get_container_host_ip()}:"
                        f"{registry.get_exposed_port(8080)}/apis/ccompat/v7")
        settings = ServiceSettings(
            kafka_bootstrap=f"127.0.0.1:{kafka_port}",
            dsn=pg.get_connection_url(),
            otlp_endpoint=f"http://{host}:{jaeger.get_exposed_port(4317)}",
            jaeger_query_url=f"http://{host}:{jaeger.get_exposed_port(16686)}",
            schema_registry_url=registry_url,
        )
        _wait_http_json(settings.jaeger_query_url + "/api/services", timeout_s=_READY_TIMEOUT_S)
        _wait_http_json(registry_url + "/subjects", timeout_s=_READY_TIMEOUT_S)
        _wait_kafka(settings.kafka_bootstrap, timeout_s=_READY_TIMEOUT_S)
        yield settings


def _wait_kafka(bootstrap: str, *, timeout_s: float) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        pytest.fail(f"Kafka container {bootstrap} did not answer within {timeout_s:.0f} s: {exc}")


def _progress_printer(config: pytest.Config) -> Callable[[str], None]:
    """Stack progress straight to the terminal, past pytest's capture: a first run
    builds Jaeger for minutes and should not look hung."""
    capman = config.pluginmanager.getplugin("capturemanager")

    def show(line: str) -> None:
        with capman.global_and_fixture_disabled() if capman else nullcontext():
            print(f"[fencectl stack] {line}", file=sys.stderr, flush=True)

    return show


class _GoBuilds:
    """Jaeger's and Prometheus's binaries, built from Go sources when missing (minutes on a new
    machine) in a thread of their own at a lower CPU priority (nice 10, which the ``go``
    processes inherit), while the tests that need neither run; ``started()`` waits for them,
    then starts both services under the session's lease."""

    def __init__(self, settings: Any, progress: Callable[[str], None]) -> None:
        import threading

        self.settings = settings
        self.progress = progress
        self.error: Exception | None = None
        self.done = False
        self.thread = threading.Thread(target=self._build, name="go-builds", daemon=True)
        self.thread.start()

    def _build(self) -> None:
        import threading

        from ops.stack import jaeger, prometheus

        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        try:
            for path, build in ((self.settings.paths.jaeger_binary, jaeger.binary),
                                (self.settings.paths.prometheus_binary, prometheus.promtool)):
                if not path.exists():
                    self.progress(f"building {path.name} in the background (minutes, once)")
                    build(self.settings)
        except Exception as exc:  # reported to the tests that need these services
            self.error = exc

    def started(self) -> None:
        """Both services built, running and healthy; fails the calling test otherwise."""
        from ops.stack import control as stack
        from ops.stack import lease as stack_lease

        self.thread.join()
        if self.error is not None:
            pytest.fail(f"could not build Jaeger or Prometheus: {self.error}", pytrace=False)
        if self.done:
            return
        try:
            report = stack.up(self.settings, services=GO_BUILT, out=self.progress)
        except stack.StackError as exc:
            pytest.fail(f"could not start Jaeger or Prometheus: {exc}", pytrace=False)
        if not os.environ.get("FENCE_KEEP_STACK"):
            stack_lease.record_started(self.settings, report.started)
        self.done = True


#: the local stack's Go-built services (``_GoBuilds``); None for services from elsewhere
_GO_BUILDS: _GoBuilds | None = None


#: seconds the session waited for Jaeger and Prometheus, until a test reports it
_GO_WAIT_S: list[float] = []
#: seconds the session waited for its services to start, until a test reports it
_SERVICES_WAIT_S: list[float] = []


@pytest.fixture(scope="session")
def _go_services_started(services: ServiceSettings) -> None:
    """Jaeger and Prometheus started for the session (built first when missing)."""
    asked = time.monotonic()
    if _GO_BUILDS is not None:
        _GO_BUILDS.started()
    _GO_WAIT_S.append(time.monotonic() - asked)


@pytest.fixture
def go_services(services: ServiceSettings, _go_services_started: None) -> ServiceSettings:
    """The session's services with Jaeger and Prometheus running: a test that reads traces
    from Jaeger, or runs ``fencectl stack up`` itself, asks for this fixture (such tests run
    after the others, so a new machine builds both while those run)."""
    return services


@contextmanager
def _local_stack(progress: Callable[[str], None]) -> Iterator[ServiceSettings]:
    """The local stack of ``fencectl stack``, held by a lease (``ops.stack.lease``):
    services some test session started stop when the last session ends; services
    that were already running are left alone."""
    from ops.stack import control as stack
    from ops.stack import lease as stack_lease
    from ops.stack.config import settings_from

    global _GO_BUILDS
    settings: ServiceSettings | None = None
    failure = ""
    try:
        stack_settings = settings_from()
        stack_lease.acquire(stack_settings)
    except stack.StackError as exc:
        pytest.fail(f"local stack misconfigured: {exc}", pytrace=False)
    try:
        try:
            _GO_BUILDS = _GoBuilds(stack_settings, progress)
            core = [s for s in stack.default_services(stack_settings.kafka_nodes)
                    if s not in GO_BUILT]
            report = stack.up(stack_settings, services=core, out=progress)
            if not os.environ.get("FENCE_KEEP_STACK"):
                stack_lease.record_started(stack_settings, report.started)
            settings = ServiceSettings.from_env(stack.env(stack_settings))
        except stack.StackError as exc:
            failure = f"could not start the local stack (fencectl stack up): {exc}"
        if failure:
            pytest.fail(failure, pytrace=False)
        assert settings is not None
        yield settings
    finally:
        stack_lease.release(stack_settings, out=progress)


@contextmanager
def _exported(settings: ServiceSettings) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in settings.as_env()}
    os.environ.update(settings.as_env())
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="session")
def services(request: pytest.FixtureRequest) -> Iterator[ServiceSettings]:
    """Where Kafka, PostgreSQL, Jaeger and the schema registry are for this session (see the
    module docstring)."""
    asked = time.monotonic()
    with ExitStack() as stack:
        settings = ServiceSettings.from_env(os.environ)
        if settings is None and _docker_engine_answers():
            settings = stack.enter_context(_containers())
        if settings is None:
            settings = stack.enter_context(_local_stack(_progress_printer(request.config)))
        stack.enter_context(_exported(settings))
        _SERVICES_WAIT_S.append(time.monotonic() - asked)
        yield settings


# -- PostgreSQL for the store's integration and contract tests (helpers: integration/pg_helpers.py)
@pytest.fixture(scope="session")
def pg_dsn(request: pytest.FixtureRequest) -> str:
    """``FENCE_DSN`` when set, else the session's services' DSN (its repr hides the password)."""
    from tests.integration.pg_helpers import Dsn

    return Dsn(os.environ.get("FENCE_DSN") or str(request.getfixturevalue("services").dsn))


@pytest.fixture
async def fence_schema(pg_dsn: str) -> AsyncIterator[str]:
    """A freshly migrated fence schema with an ``effects`` table for the test handler."""
    from tests.integration.pg_helpers import create_fence_schema, drop_schema

    schema = await create_fence_schema(pg_dsn)
    try:
        yield schema
    finally:
        await drop_schema(pg_dsn, schema)


@pytest.fixture
async def schema(pg_dsn: str) -> AsyncIterator[str]:
    """A freshly migrated fence schema without test tables (the table sink's tests), dropped
    after the test."""
    import asyncpg

    from fencing.postgres.schema import migrate

    name = f"sink_t_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(pg_dsn)
    try:
        await migrate(conn, name)
        yield name
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        await conn.close()


@pytest.fixture
async def pg_store(pg_dsn: str, fence_schema: str) -> AsyncIterator[Any]:
    """A ``PgFenceStore`` on ``fence_schema`` with a group id of its own."""
    from fencing.postgres.store import PgFenceStore

    store = await PgFenceStore.connect(pg_dsn, group_id=f"g-{uuid.uuid4().hex[:8]}",
                                       schema=fence_schema, pool_max=4)
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture(autouse=True)
def _alone_or_beside(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under pytest-xdist (``make test``), an ``exclusive`` test or one on the three-node
    cluster runs alone; every other test of the shared services beside the others
    (``tests.suite_lock``); a test of no shared service never waits."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    exclusive = (request.node.get_closest_marker("exclusive") is not None
                 or CLUSTER_FIXTURE in request.fixturenames)
    _record_session_waits(request.node)
    shared = {"services", "pg_dsn"} & set(request.fixturenames)
    if run_id is None or not (exclusive or shared):
        yield  # one process, or a test of no shared service: nothing to wait for
        _record_session_waits(request.node)  # services it asked for while it ran
        return
    from tests.suite_lock import folder_for_run, holding

    asked = time.monotonic()
    with holding(folder_for_run(run_id), exclusive=exclusive):
        # the wait is the lock's, not the test's: ops.bench.suite subtracts it
        request.node.user_properties.append(("suite_lock_wait_s",
                                             round(time.monotonic() - asked, 3)))
        yield
    _record_session_waits(request.node)


def _record_session_waits(item: pytest.Item) -> None:
    """The session's waits for its services and the Go builds, as the test that set them up
    (asked for them, also from within the test) records them: not its own time."""
    while _GO_WAIT_S:
        item.user_properties.append(("go_build_wait_s", round(_GO_WAIT_S.pop(), 3)))
    while _SERVICES_WAIT_S:
        item.user_properties.append(("services_start_wait_s", round(_SERVICES_WAIT_S.pop(), 3)))


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by the ``protocols`` mark added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``kafka_faults`` only under ``FENCE_KAFKA_FAULTS=full`` (``make
    test-kafka-faults``; ``make test`` runs a subset of the Kafka fault scenarios), those
    marked ``full_only`` only under ``FENCE_ALL_PROTOCOLS=full``; a test
    parametrized over the group protocols under one of them unless ``FENCE_ALL_PROTOCOLS=full``
    (``tests.protocol_rotation``; ``make test-protocols`` runs them all); the tests on the
    three-node cluster first, the other exclusive tests after the tests that run beside
    one another, the tests of Jaeger and Prometheus last, each group in its collected order
    (see the module docstring)."""
    if os.environ.get("FENCE_KAFKA_FAULTS") != "full":
        deselected = [i for i in items if i.get_closest_marker("kafka_faults") is not None]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [i for i in items if i.get_closest_marker("kafka_faults") is None]
    if os.environ.get("FENCE_ALL_PROTOCOLS") != "full":
        deselected = [i for i in items if i.get_closest_marker("full_only") is not None]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [i for i in items if i.get_closest_marker("full_only") is None]
    _one_protocol_each(config, items)
    tests = Path(__file__).resolve().parent
    for item in items:
        module = Path(str(item.fspath)).resolve()
        if module.is_relative_to(tests) and \
                module.relative_to(tests).with_suffix("").as_posix() in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
    # the three-node cluster's tests first (they run alone while a new machine builds Jaeger
    # and Prometheus), then the tests beside one another, then the other exclusive tests
    # (alone, after the Go builds: beside them the quick bench took 176-205 s on a new
    # machine, after them 85-88 s), the tests that need Jaeger and Prometheus last
    late = [i for i in items if set(GO_FIXTURES) & set(getattr(i, "fixturenames", ()))]
    on_cluster = [i for i in items if CLUSTER_FIXTURE in getattr(i, "fixturenames", ())
                  and i not in late]
    alone = [i for i in items if i.get_closest_marker("exclusive") is not None
             and i not in late and i not in on_cluster]
    if late or on_cluster or alone:
        moved = {id(i) for i in (*late, *on_cluster, *alone)}
        items[:] = [*on_cluster, *(i for i in items if id(i) not in moved), *alone, *late]


def _protocol_case(item: pytest.Item) -> tuple[str, str] | None:
    """``(test key, protocol)`` of a test parametrized by ``setup`` over the group
    protocols, else None; the key is the test's id with the protocol's name as ``*``."""
    from tests.protocol_rotation import PROTOCOLS

    callspec = getattr(item, "callspec", None)
    setup = callspec.params.get("setup") if callspec is not None else None
    name = getattr(setup, "name", None)
    if name not in PROTOCOLS:
        return None
    return item.nodeid.replace(name, "*"), name


def _one_protocol_each(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every protocol-parametrized test ``protocols``; without
    ``FENCE_ALL_PROTOCOLS=full`` keep one protocol of each (``tests.protocol_rotation``)."""
    from tests.protocol_rotation import one_protocol_each

    cases = {id(i): case for i in items if (case := _protocol_case(i)) is not None}
    per_key: dict[str, int] = {}
    for key, _ in cases.values():
        per_key[key] = per_key.get(key, 0) + 1
    for item in items:
        case = cases.get(id(item))
        if case is not None and per_key[case[0]] > 1:
            item.add_marker(pytest.mark.protocols)
    if os.environ.get("FENCE_ALL_PROTOCOLS") == "full":
        return
    keep = one_protocol_each(list(cases.values()))
    deselected = [i for i in items if id(i) in cases and cases[id(i)] not in keep]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        dropped = {id(i) for i in deselected}
        items[:] = [i for i in items if id(i) not in dropped]


@pytest.fixture(scope="session")
def kafka_cluster(services: ServiceSettings,
                  request: pytest.FixtureRequest) -> Iterator[Any]:
    """The three-node Kafka cluster (``tests.integration.cluster.Cluster``), every node
    (``cluster``: every node healthy and in sync at the start of the test)."""
    from ops.stack import control as stack
    from ops.stack import lease as stack_lease
    from ops.stack.config import KAFKA_NODES, settings_from
    from tests.integration.cluster import Cluster

    progress = _progress_printer(request.config)
    try:
        settings = settings_from()
        stack_lease.acquire(settings, scope=CLUSTER_SCOPE)
    except stack.StackError as exc:
        pytest.fail(f"local stack misconfigured: {exc}", pytrace=False)
    try:
        failure = ""
        try:
            report = stack.up(settings, services=KAFKA_NODES, out=progress)
            if not os.environ.get("FENCE_KEEP_STACK"):
                stack_lease.record_started(settings, report.started, scope=CLUSTER_SCOPE)
        except stack.StackError as exc:
            failure = f"could not start the three-node Kafka cluster: {exc}"
        if failure:
            pytest.fail(failure, pytrace=False)
        yield Cluster(settings)
    finally:
        stack_lease.release(settings, out=progress, scope=CLUSTER_SCOPE)


@dataclass
class Debezium:
    """The local stack's Kafka Connect with Debezium's PostgreSQL connector (``fencectl stack
    up --with debezium``): its REST URL, the source database, the topics, a restart."""

    settings: Any
    connect_url: str
    source_dsn: str
    bootstrap: str

    def topics(self) -> set[str]:
        from confluent_kafka.admin import AdminClient

        return set(AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(
            timeout=10).topics)

    def restart(self) -> None:
        """SIGKILL the worker (its offsets as last flushed) and start it again: Debezium then
        delivers again what it sent after those offsets."""
        import signal as signals

        from ops.stack import control as stack
        from ops.stack.procs import port_free, stop_pid, wait_until

        row = {r.service: r for r in stack.status(self.settings)}[Service.CONNECT]
        if row.pid is not None:
            # SIGKILL is asynchronous: until the JVM is gone its pid (and command line) still
            # look like a running worker, and ``stack.up`` would take it for one
            stop_pid(row.pid, sig=signals.SIGKILL, grace_s=30.0)
        wait_until(lambda: port_free(self.settings.ports.connect), timeout_s=30.0)
        stack.up(self.settings, services=[Service.CONNECT], out=lambda line: None)

    def crash_kafka(self, while_down: Any = lambda: None) -> None:
        """The stack's Kafka broker lost (SIGKILL: its log recovered at the next start),
        ``while_down`` run, then the broker started again: Kafka Connect's producer and the
        sink's members wait it out (the members within ``--outage-bound-s``)."""
        from tests.integration.workers import crash_kafka

        crash_kafka(self.settings, while_down)

    def crash_postgres(self) -> None:
        """An immediate shutdown of the stack's PostgreSQL (SIGQUIT: no checkpoint, crash
        recovery at the next start), then started again; Debezium's task reconnects by its
        own retries, the sink's members ride it out within their outage bound."""
        from tests.integration.workers import crash_postgres

        crash_postgres(self.settings)


@pytest.fixture(scope="session")
def debezium(services: ServiceSettings) -> Iterator[Debezium]:
    """Kafka Connect with Debezium's PostgreSQL connector beside the local stack, started on
    first use under a lease of its own (scope ``connect``), stopped with its last session."""
    from ops.stack import connect as stack_connect
    from ops.stack import control as stack
    from ops.stack import lease as stack_lease
    from ops.stack import postgres as stack_postgres
    from ops.stack.config import settings_from

    settings = settings_from()
    stack_lease.acquire(settings, scope="connect")
    try:
        try:
            report = stack.up(settings, services=[Service.CONNECT], out=lambda line: None)
        except stack.StackError as exc:
            pytest.fail(f"could not start Kafka Connect (stack up --with debezium): {exc}",
                        pytrace=False)
        if not os.environ.get("FENCE_KEEP_STACK"):
            stack_lease.record_started(settings, report.started, scope="connect")
        yield Debezium(settings, stack_connect.url(settings),
                       stack_connect.source_dsn(settings, stack_postgres.password(settings)),
                       services.kafka_bootstrap)
    finally:
        stack_lease.release(settings, out=lambda line: None, scope="connect")


@pytest.fixture
def cluster(kafka_cluster: Any) -> Any:
    """``kafka_cluster`` with every node running, healthy and in sync (a test before may
    have stopped one)."""
    kafka_cluster.start_all()
    return kafka_cluster
