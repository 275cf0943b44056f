"""ops.stack.control without services:
settings, rendered configs, failure messages, empty status."""

from __future__ import annotations

import base64
import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ops.monitoring import RULES
from ops.stack import control as stack
from ops.stack import jaeger as stack_jaeger
from ops.stack import kafka as stack_kafka
from ops.stack import kafka_cluster
from ops.stack import prometheus as stack_prometheus
from ops.stack.config import (
    KAFKA_NODES,
    PORT_ENV,
    SERVICE_ENV,
    Service,
    ServiceSettings,
    StackError,
    connection_env,
    env_lines,
    settings_from,
)
from ops.stack.procs import alive, spawn, stop_pid, tracked_pid, wait_until

# ports nobody uses in these tests' environment, distinct from the shared stack's
_ISOLATED_PORTS = {name: str(41000 + i) for i, (name, _d) in enumerate(PORT_ENV.values())}


def _isolated_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "FENCE_STACK_DIR": str(tmp_path / "stack"),
        "FENCE_CACHE_DIR": str(tmp_path / "cache"),
        "HOME": str(tmp_path),
        **_ISOLATED_PORTS,
        **extra,
    }


def test_defaults_are_the_documented_loopback_ports() -> None:
    s = settings_from({"HOME": "/home/u"})
    assert (s.ports.postgres, s.ports.kafka, s.ports.kafka_controller) == (55432, 19092, 19093)
    assert (s.ports.otlp_grpc, s.ports.otlp_http, s.ports.jaeger_query) == (4317, 4318, 16686)
    assert s.ports.prometheus == 9090
    assert s.paths.cache == Path("/home/u/.cache/fenceworker")
    assert s.paths.root.name == ".stack"


def test_cache_dir_prefers_fence_cache_dir_then_xdg() -> None:
    both = {"FENCE_CACHE_DIR": "/c/f", "XDG_CACHE_HOME": "/c/x", "HOME": "/h"}
    assert settings_from(both).paths.cache == Path("/c/f")
    assert settings_from({"XDG_CACHE_HOME": "/c/x"}).paths.cache == Path("/c/x/fenceworker")


def test_port_overrides_apply_and_bad_values_raise() -> None:
    assert settings_from({"FENCE_KAFKA_PORT": "29092"}).ports.kafka == 29092
    with pytest.raises(StackError, match="FENCE_PG_PORT"):
        settings_from({"FENCE_PG_PORT": "five"})
    with pytest.raises(StackError, match="out of range"):
        settings_from({"FENCE_PG_PORT": "70000"})
    with pytest.raises(StackError, match="equal"):
        settings_from({"FENCE_PG_PORT": "19092"})


def test_env_lines_round_trip_through_a_shell() -> None:
    values = connection_env(settings_from({}).ports, pg_password="p'w $x")
    script = "\n".join(env_lines(values)) + '\nprintf \'%s\\n\' "$FENCE_DSN" "$JAEGER_QUERY_URL"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [values["FENCE_DSN"], values["JAEGER_QUERY_URL"]]
    assert list(values) == list(SERVICE_ENV)
    assert values["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4317"
    assert values["KAFKA_BOOTSTRAP_SERVERS"] == "127.0.0.1:19092"


def test_service_settings_need_every_variable() -> None:
    full = {name: f"v{i}" for i, name in enumerate(SERVICE_ENV)}
    got = ServiceSettings.from_env(full)
    assert got == ServiceSettings("v0", "v1", "v2", "v3", "v4")
    assert got.as_env() == full
    assert ServiceSettings.from_env({**full, "FENCE_DSN": " "}) is None


def test_kafka_properties_bind_loopback_and_lower_group_bounds(tmp_path: Path) -> None:
    s = settings_from(_isolated_env(tmp_path))
    text = stack_kafka.server_properties(s)
    props = dict(line.split("=", 1) for line in text.splitlines())
    port, ctl = s.ports.kafka, s.ports.kafka_controller
    assert props["listeners"] == f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{ctl}"
    assert props["advertised.listeners"] == f"PLAINTEXT://127.0.0.1:{port}"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["offsets.topic.replication.factor"] == "1"
    session, heartbeat = (
        int(props[f"group.consumer.{k}"]) for k in ("session.timeout.ms", "heartbeat.interval.ms")
    )
    # broker defaults of the max bounds are 60000 / 15000; the values must lie inside
    assert int(props["group.consumer.min.session.timeout.ms"]) <= session <= 60000
    assert int(props["group.consumer.min.heartbeat.interval.ms"]) <= heartbeat <= 15000
    assert heartbeat < session
    assert int(props["group.min.session.timeout.ms"]) <= 6000


def test_cluster_id_is_16_bytes_base64url() -> None:
    for _ in range(50):
        cid = stack_kafka.cluster_id()
        assert len(cid) == 22 and not cid.startswith("-")
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


def test_jaeger_config_binds_only_loopback() -> None:
    text = stack_jaeger.CONFIG.read_text()
    endpoints = re.findall(r"endpoint:\s*\"?([^\"\s]+)", text)
    assert len(endpoints) == 5
    assert all(e.startswith("127.0.0.1:") for e in endpoints), endpoints
    for name, _default in PORT_ENV.values():
        if "OTLP" in name or "JAEGER" in name:
            assert f"${{env:{name}:-" in text


def test_missing_go_mvn_java_name_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings_from(_isolated_env(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(StackError, match=r"`go` is not on PATH"):
        stack_jaeger.binary(s)
    with pytest.raises(StackError, match="mvn"):
        stack_kafka.classpath(s)
    with pytest.raises(StackError, match="java"):
        stack_kafka.start(s)
    with pytest.raises(StackError, match=r"`go` is not on PATH.*Go 1\.26\.7 or newer"):
        stack_prometheus.promtool(s)


def test_up_refuses_a_taken_port_and_names_the_override(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        s = settings_from(_isolated_env(tmp_path, FENCE_JAEGER_HEALTH_PORT=str(port)))
        with pytest.raises(
            StackError, match=rf"port 127.0.0.1:{port} is taken.*FENCE_JAEGER_HEALTH_PORT"
        ):
            stack.up(s, services=[Service.JAEGER], out=lambda _line: None)
    assert not s.paths.pid_file(Service.JAEGER).exists()


def test_status_and_down_of_an_empty_stack(tmp_path: Path) -> None:
    s = settings_from(_isolated_env(tmp_path))
    rows = stack.status(s)
    assert [r.service for r in rows] == [Service.POSTGRES, Service.KAFKA, Service.JAEGER,
                                         Service.PROMETHEUS, Service.REGISTRY]
    assert all(r.state is stack.ServiceState.DOWN and r.pid is None for r in rows)
    assert [r.port for r in rows] == [s.ports.postgres, s.ports.kafka, s.ports.jaeger_query,
                                      s.ports.prometheus, s.ports.schema_registry]
    assert stack.down(s, out=lambda _line: None) == []


def test_env_creates_one_stable_private_password(tmp_path: Path) -> None:
    s = settings_from(_isolated_env(tmp_path))
    first, second = stack.env(s), stack.env(s)
    assert first == second
    assert s.paths.pg_password_file.stat().st_mode & 0o077 == 0
    password = s.paths.pg_password_file.read_text().strip()
    assert first["FENCE_DSN"] == (
        f"postgresql://fenceworker:{password}@127.0.0.1:{s.ports.postgres}/fenceworker"
    )


def test_tracked_but_silent_process_is_unhealthy_and_down_stops_it(tmp_path: Path) -> None:
    """A live pid whose command line carries the service marker, but no service behind
    its port: status says unhealthy with that pid; down stops exactly that pid."""
    s = settings_from(_isolated_env(tmp_path))
    marker = stack_jaeger.marker(s)
    pid_file = s.paths.pid_file(Service.JAEGER)
    pid_file.parent.mkdir(parents=True)
    pid = spawn(
        [sys.executable, "-c", "import time; time.sleep(60)", marker],
        log_path=s.paths.log_file(Service.JAEGER),
        pid_path=pid_file,
    )
    try:
        # the kernel fills /proc/<pid>/cmdline a moment after Popen returns (see
        # test_stack_procs.py): under load the marker may not be there yet
        assert wait_until(lambda: tracked_pid(pid_file, marker=marker) == pid, timeout_s=10)
        rows = {r.service: r for r in stack.status(s)}
        jaeger = rows[Service.JAEGER]
        assert (jaeger.state, jaeger.pid, jaeger.port) == (
            stack.ServiceState.UNHEALTHY,
            pid,
            s.ports.jaeger_query,
        )
        assert "/api/services" in jaeger.detail
        assert rows[Service.KAFKA].state is stack.ServiceState.DOWN
        assert stack.down(s, grace_s=10, out=lambda _line: None) == [(Service.JAEGER, pid)]
        assert not alive(pid)
        assert not pid_file.exists()
    finally:
        stop_pid(pid, sig=signal.SIGKILL, grace_s=1)


def test_prometheus_config_binds_loopback_loads_the_rules_and_reads_target_files(
        tmp_path: Path) -> None:
    s = settings_from(_isolated_env(tmp_path, FENCE_PROMETHEUS_PORT="41990"))
    config = stack_prometheus.config(s)
    assert config["rule_files"] == [str(RULES)]
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "fenceworker"
    assert job["file_sd_configs"] == [{"files": [str(stack_prometheus.targets_dir(s) / "*.json")],
                                       "refresh_interval": "5s"}]
    assert stack_prometheus.url(s) == "http://127.0.0.1:41990"
    path = stack_prometheus.write_targets(s, "w1", ["127.0.0.1:9464"], {"env": "test"})
    assert json.loads(path.read_text()) == [{"targets": ["127.0.0.1:9464"],
                                             "labels": {"env": "test"}}]
    assert [p.name for p in stack_prometheus.targets_dir(s).iterdir()] == ["w1.json"]
    stack_prometheus.write_targets(s, "w1", [])
    assert not path.exists()
def test_three_node_cluster_properties(tmp_path: Path) -> None:
    """Every node broker + controller with the same static voters, its own ports and data,
    replication 3 / min ISR 2 for internal and default topics, offsets on 3 partitions."""
    s = settings_from(_isolated_env(tmp_path))
    props = [kafka_cluster.node_settings(s, node) for node in KAFKA_NODES]
    voters = {p["controller.quorum.voters"] for p in props}
    assert voters == {",".join(f"{n}@127.0.0.1:{s.ports.of(node)[1]}"
                               for n, node in enumerate(KAFKA_NODES, start=1))}
    assert [p["node.id"] for p in props] == ["1", "2", "3"]
    assert len({p["listeners"] for p in props}) == 3
    assert len({p["log.dirs"] for p in props}) == 3
    for p in props:
        assert p["process.roles"] == "broker,controller"
        assert "controller.quorum.bootstrap.servers" not in p
        assert (p["default.replication.factor"], p["min.insync.replicas"]) == ("3", "2")
        assert p["offsets.topic.replication.factor"] == "3"
        assert p["offsets.topic.num.partitions"] == "3"
        assert p["transaction.state.log.min.isr"] == "2"
        assert p["share.coordinator.state.topic.min.isr"] == "2"
        assert p["unclean.leader.election.enable"] == "false"
        assert p["group.initial.rebalance.delay.ms"] == "0"


def test_kafka_nodes_choose_services_and_bootstrap(tmp_path: Path) -> None:
    one = settings_from(_isolated_env(tmp_path))
    three = settings_from(_isolated_env(tmp_path, FENCE_KAFKA_NODES="3"))
    assert (one.kafka_nodes, three.kafka_nodes) == (1, 3)
    assert one.kafka_services == (Service.KAFKA,)
    assert three.kafka_services == KAFKA_NODES
    env = connection_env(three.ports, pg_password="pw", kafka=three.kafka_services)
    assert env["KAFKA_BOOTSTRAP_SERVERS"] == ",".join(
        f"127.0.0.1:{three.ports.of(node)[0]}" for node in KAFKA_NODES)
    with pytest.raises(StackError, match="FENCE_KAFKA_NODES"):
        settings_from(_isolated_env(tmp_path, FENCE_KAFKA_NODES="2"))
    with pytest.raises(StackError, match="equal"):
        settings_from({"FENCE_KAFKA_2_PORT": "19092"})
    with pytest.raises(StackError, match="kafka node 4"):
        stack.stop_node(4, settings=one, out=lambda _line: None)


def test_stop_node_of_a_cluster_that_does_not_run(tmp_path: Path) -> None:
    s = settings_from(_isolated_env(tmp_path, FENCE_KAFKA_NODES="3"))
    assert stack.stop_node(2, settings=s, kill=True, out=lambda _line: None) is None
    rows = stack.status(s)
    assert [r.service for r in rows] == [Service.POSTGRES, *KAFKA_NODES, Service.JAEGER,
                                         Service.PROMETHEUS, Service.REGISTRY]
    assert all(r.state is stack.ServiceState.DOWN for r in rows)
