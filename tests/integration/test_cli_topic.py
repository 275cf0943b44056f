"""``fencectl topic create|list|describe`` against the real broker (which does not create
topics on first use): a user can make the topic the worker and a producer need."""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from tests.cli_output import one_line
from tests.integration.observability_support import run_fencectl
from tests.integration.workers import create_topic, unique

pytestmark = pytest.mark.integration


def _partitions(bootstrap: str, topic: str) -> int | None:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    found = meta.get(topic)
    return None if found is None else len(found.partitions)


def test_create_makes_a_usable_topic_then_refuses_it_again(services: Any) -> None:
    name = unique("orders")
    done = run_fencectl("topic", "create", name, "--partitions", "3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"created topic {name}: 3 partition(s), replication 1"
    assert done.stderr == ""
    assert _partitions(services.kafka_bootstrap, name) == 3
    again = run_fencectl("topic", "create", name, "--partitions", "3")
    assert again.returncode == 1
    assert one_line(again) == f"fencectl topic: topic {name} already exists with 3 partition(s)"
    same = run_fencectl("topic", "create", name, "--partitions", "2", "--if-not-exists")
    assert same.returncode == 0, same.stderr
    assert "(unchanged)" in same.stdout
    described = run_fencectl("topic", "describe", name, "--json")
    assert described.returncode == 0, described.stderr
    info = json.loads(described.stdout)
    assert info["partitions"] == 3 and info["replication"] == 1 and info["topic_id"]
    listed = run_fencectl("topic", "list", "--json")
    assert {"topic": name, "partitions": 3} in json.loads(listed.stdout)
    assert not any(t["topic"].startswith("__") for t in json.loads(listed.stdout))


@pytest.mark.parametrize(("name", "why"), [
    ("orders/eu", "holds characters Kafka does not allow ('/')"),
    ("..", "is not allowed as a topic name"),
    ("x" * 250, "at most 249 characters"),
    ("ordres ", "holds characters Kafka does not allow (' ')"),
])
def test_a_name_kafka_refuses_is_exit_2_before_anything_is_sent(
        services: Any, name: str, why: str) -> None:
    done = run_fencectl("topic", "create", name, "--partitions", "1")
    assert done.returncode == 2, done.stderr
    line = one_line(done)
    assert line.startswith(f"fencectl topic: topic create {name}: ") and why in line, line
    assert _partitions(services.kafka_bootstrap, name) is None


def test_bad_partitions_and_unreachable_kafka_are_exit_2(services: Any) -> None:
    zero = run_fencectl("topic", "create", unique("t"), "--partitions", "0")
    assert zero.returncode == 2
    assert one_line(zero) == "fencectl topic: --partitions 0: use 1 or more"
    nowhere = run_fencectl("topic", "list", "--bootstrap-servers", "127.0.0.1:1",
                           "--timeout-s", "2")
    assert nowhere.returncode == 2
    assert one_line(nowhere).startswith("fencectl topic: --bootstrap-servers 127.0.0.1:1: "
                                        "cannot reach Kafka")


def test_describe_of_a_missing_topic_is_exit_1(services: Any) -> None:
    name = unique("missing")
    done = run_fencectl("topic", "describe", name)
    assert done.returncode == 1
    assert one_line(done) == f"fencectl topic: topic {name} does not exist"


def test_create_then_describe_shows_every_partition_with_a_leader(services: Any) -> None:
    name = unique("t")
    create_topic(services.kafka_bootstrap, name, 2)
    done = run_fencectl("topic", "describe", name)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"topic {name}: 2 partition(s), replication 1, id ")
    assert [ln.split(":")[0].strip() for ln in lines[1:]] == ["partition 0", "partition 1"]
    assert all("leader -1" not in ln for ln in lines[1:])
