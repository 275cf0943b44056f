"""ops.stack.kafka_tools: the tool's offsets table parses; the pom resolves kafka-tools too."""

from __future__ import annotations

from pathlib import Path

from ops.stack import kafka as stack_kafka
from ops.stack import kafka_tools
from ops.stack.config import settings_from
from ops.stack.kafka_tools import GroupOffsetRow, parse_describe

# Kafka 4.1.1 `kafka-consumer-groups --describe --group G`, a KIP-848 group with members
KIP848_ACTIVE = """
GROUP           TOPIC           PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG             CONSUMER-ID            HOST            CLIENT-ID
G  T   0          69              69              0               Cn6EoEBPT2yU3lHuDkhK1Q /127.0.0.1      rdkafka
G  T   2          129             130             1               Z5ZWYNk0S1G8dOACrBGsRQ /127.0.0.1      rdkafka
"""  # noqa: E501

# ... and a group without members, one partition never committed
EMPTY = """
GROUP           TOPIC           PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG             CONSUMER-ID     HOST            CLIENT-ID
glive_56713957  live_844288c1   3          310             2454            2144            -               -               -
glive_56713957  live_844288c1   1          -               2487            -               -               -               -
"""  # noqa: E501

STATE = """
GROUP           COORDINATOR (ID)          ASSIGNMENT-STRATEGY  STATE                #MEMBERS
G  127.0.0.1:19092  (1)      uniform              Stable               2
"""


def test_offsets_rows_parse_with_and_without_members() -> None:
    assert parse_describe(KIP848_ACTIVE) == [
        GroupOffsetRow("G", "T", 0, 69, 69, 0, "Cn6EoEBPT2yU3lHuDkhK1Q"),
        GroupOffsetRow("G", "T", 2, 129, 130, 1, "Z5ZWYNk0S1G8dOACrBGsRQ")]
    assert parse_describe(EMPTY) == [
        GroupOffsetRow("glive_56713957", "live_844288c1", 3, 310, 2454, 2144, None),
        GroupOffsetRow("glive_56713957", "live_844288c1", 1, None, 2487, None, None)]


def test_tables_without_offsets_are_ignored() -> None:
    assert parse_describe(STATE) == []
    assert parse_describe("") == []


def test_the_pom_resolves_the_tools_and_its_digest_names_the_cache(tmp_path: Path) -> None:
    pom = stack_kafka.POM.read_text()
    assert "<artifactId>kafka-tools</artifactId>" in pom
    assert pom.count("<version>4.1.1</version>") == 2  # broker and tools pinned together
    s = settings_from({"FENCE_CACHE_DIR": str(tmp_path), "HOME": str(tmp_path)})
    cp = stack_kafka.cp_file(s)
    assert cp.parent == s.paths.kafka_cache and cp.name.startswith("cp-")
    assert kafka_tools.CONSUMER_GROUPS.endswith("ConsumerGroupCommand")
    assert "rootLogger.level = WARN" in kafka_tools.TOOLS_LOG4J2
    assert "SYSTEM_ERR" in kafka_tools.TOOLS_LOG4J2
