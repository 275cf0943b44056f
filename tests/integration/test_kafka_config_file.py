"""``FENCE_KAFKA_CONFIG`` reaches the real clients: a worker whose client properties come
from the file (no -X) joins its group under the ``client.id`` the file names, as Kafka's
own description of the group shows; the operator commands take the same file."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from tests.integration.observability_support import run_fencectl
from tests.integration.workers import (
    GROUP_SETUPS,
    WorkerProc,
    create_topic,
    fresh_schema,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration


def _member_client_ids(bootstrap: str, group: str) -> list[str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(timeout=10)
    return sorted(m.client_id for m in described.members)


def test_the_worker_and_the_operator_commands_take_the_file(services: Any,
                                                            tmp_path: Path) -> None:
    topic, group = unique("kcfg"), unique("gkcfg")
    create_topic(services.kafka_bootstrap, topic, 2)
    schema = asyncio.run(fresh_schema(services.dsn))
    config = tmp_path / "client.properties"
    config.write_text("# as a Secret mounted in a pod would hold it\n"
                      "client.id=fence-from-file\nsocket.keepalive.enable=true\n")
    worker = WorkerProc(topic=topic, group=group, schema=schema, setup=GROUP_SETUPS[1],
                        env={"FENCE_KAFKA_CONFIG": str(config)})
    try:
        wait_until(lambda: _member_client_ids(services.kafka_bootstrap, group)
                   == ["fence-from-file"], timeout_s=60, what="the member's client.id")
        status = run_fencectl("status", "--group", group, "--schema", schema,
                              env={"FENCE_KAFKA_CONFIG": str(config)})
        assert status.returncode == 0, status.stderr
        assert f"{topic}  0" in status.stdout, status.stdout
    finally:
        worker.terminate()
        assert worker.wait(60) == 0, worker.log()[-3000:]
    config.write_text("security.protocol=bogus\n")
    refused: subprocess.CompletedProcess[str] = run_fencectl(
        "status", "--group", group, "--schema", schema, env={"FENCE_KAFKA_CONFIG": str(config)})
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.strip() == (
        f"fencectl status: FENCE_KAFKA_CONFIG {config}: librdkafka refused it: Invalid value "
        '"bogus" for configuration property "security.protocol"')
