"""``fencectl run`` refuses invalid configuration with exit 2 and a message naming the
setting, before joining any group; the DSN's password never appears in its output. A
service that does not answer at start is not a configuration mistake: it is retried within
``--outage-bound-s`` and then ends with exit 5 naming it (docs/kafka-failures.md)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.integration.workers import ROOT, create_topic, fresh_schema, unique

pytestmark = pytest.mark.integration


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "OTEL_TRACES_EXPORTER": "none", **env}
    return subprocess.run([sys.executable, "-m", "ops.cli", "run", *args], env=full,
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def target(services: Any) -> tuple[str, str]:
    topic = unique("cfg")
    create_topic(services.kafka_bootstrap, topic, 1)
    return topic, asyncio.run(fresh_schema(services.dsn))


@pytest.mark.parametrize("extra, named", [
    (["--handler", "no_such_module:fn"], "--handler"),
    (["--handler", "ops.reference.pg:nope"], "--handler"),
    (["-X", "enable.auto.commit=true"], "enable.auto.commit"),
    (["--group-protocol", "consumer", "-X", "session.timeout.ms=3000"], "session.timeout.ms"),
    (["-X", "group.protocol=consumer"], "group.protocol"),
    (["--batch-max-records", "0"], "--batch-max-records"),
])
def test_invalid_settings_exit_2_naming_them(target: tuple[str, str], extra: list[str],
                                             named: str) -> None:
    topic, schema = target
    done = run(["--topic", topic, "--group", unique("g"), "--schema", schema, *extra], {})
    assert done.returncode == 2, done.stderr[-2000:]
    assert named in done.stderr


def test_unreachable_bootstrap_exits_5_past_the_bound(target: tuple[str, str]) -> None:
    topic, schema = target
    done = run(["--topic", topic, "--group", unique("g"), "--schema", schema,
                "--outage-bound-s", "2"], {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9"})
    assert done.returncode == 5, done.stderr[-2000:]
    assert "KAFKA_BOOTSTRAP_SERVERS 127.0.0.1:9: Kafka did not answer for" in done.stderr


def test_unreachable_dsn_exits_5_past_the_bound_without_password(
        target: tuple[str, str]) -> None:
    topic, schema = target
    secret = "Sup3rSecretPw"
    done = run(["--topic", topic, "--group", unique("g"), "--schema", schema,
                "--outage-bound-s", "2"],
               {"FENCE_DSN": f"postgresql://fenceworker:{secret}@127.0.0.1:9/fenceworker"})
    assert done.returncode == 5, done.stderr[-2000:]
    assert "FENCE_DSN: PostgreSQL did not answer or dropped the connection" in done.stderr
    assert secret not in done.stderr + done.stdout


def test_unknown_schema_exits_2_asking_for_migrate(target: tuple[str, str]) -> None:
    topic, _schema = target
    done = run(["--topic", topic, "--group", unique("g"), "--schema", unique("nomig")], {})
    assert done.returncode == 2
    assert "fencectl migrate" in done.stderr


def test_missing_topic_exits_2(target: tuple[str, str]) -> None:
    _topic, schema = target
    done = run(["--topic", unique("absent"), "--group", unique("g"), "--schema", schema], {})
    assert done.returncode == 2
    assert "--topic" in done.stderr
