"""Kafka's own command-line tools, run from the stack's jars (``ops/kafka-pom.xml``).

Rules
- The classpath is the stack's (``ops.stack.kafka.classpath``: the broker plus
  ``org.apache.kafka:kafka-tools``, resolved with mvn once per pom). log4j2 logs warnings to
  stderr only, like the release's ``config/tools-log4j2.yaml``, so stdout carries only the
  tool's own output.
- ``describe_group`` runs ``kafka-consumer-groups --describe --group G`` (the script's
  class ``ConsumerGroupCommand``) and parses its offsets table with ``parse_describe``
  (pure). Kafka 4.1.1 describes classic and KIP-848 (``consumer``) groups with the same
  columns; a group without members also prints "Consumer group 'G' has no active members."
  on stderr.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ops.stack import kafka as stack_kafka
from ops.stack.config import StackError, StackSettings, settings_from

__all__ = [
    "CONSUMER_GROUPS",
    "TOOLS_LOG4J2",
    "GroupOffsetRow",
    "describe_group",
    "parse_describe",
    "tool_argv",
]

CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"

TOOLS_LOG4J2 = """\
status = warn
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
"""


@dataclass(frozen=True, slots=True)
class GroupOffsetRow:
    """One partition row of ``kafka-consumer-groups --describe`` (None where it prints -)."""

    group: str
    topic: str
    partition: int
    current_offset: int | None  # the group's committed offset
    log_end_offset: int | None  # the high watermark
    lag: int | None
    consumer_id: str | None  # the member that owns it now


def _log4j_file(settings: StackSettings) -> Path:
    path = settings.paths.kafka_cache / "tools-log4j2.properties"
    if not path.exists() or path.read_text() != TOOLS_LOG4J2:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(TOOLS_LOG4J2)
        tmp.replace(path)
    return path


def tool_argv(settings: StackSettings, main_class: str, *args: str) -> list[str]:
    """``java`` argv running a Kafka tool class; resolves the jars first if needed."""
    cp = stack_kafka.classpath(settings)
    return [stack_kafka.java_binary(), "-Xmx256m", "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={_log4j_file(settings)}",
            "-cp", cp, main_class, *args]


def _value(text: str) -> int | None:
    return None if text == "-" else int(text)


def parse_describe(stdout: str) -> list[GroupOffsetRow]:
    """Pure: the offset rows of ``--describe`` output (every table with CURRENT-OFFSET)."""
    rows: list[GroupOffsetRow] = []
    header: list[str] | None = None
    for line in stdout.splitlines():
        cells = line.split()
        if not cells:
            header = None
        elif cells[0] == "GROUP":
            header = cells if "CURRENT-OFFSET" in cells else None
        elif header is not None:
            col: Mapping[str, str] = dict(zip(header, cells, strict=False))
            consumer = col.get("CONSUMER-ID", "-")
            rows.append(GroupOffsetRow(
                group=col["GROUP"], topic=col["TOPIC"], partition=int(col["PARTITION"]),
                current_offset=_value(col["CURRENT-OFFSET"]),
                log_end_offset=_value(col["LOG-END-OFFSET"]), lag=_value(col["LAG"]),
                consumer_id=None if consumer == "-" else consumer))
    return rows


def describe_group(bootstrap: str, group: str, *, settings: StackSettings | None = None,
                   timeout_s: float = 120.0) -> tuple[list[GroupOffsetRow], str]:
    """Run ``kafka-consumer-groups --describe --group`` and return its rows and raw stdout;
    raises ``StackError`` with the tool's stderr when it fails."""
    argv = tool_argv(settings or settings_from(), CONSUMER_GROUPS,
                     "--bootstrap-server", bootstrap, "--describe", "--group", group)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise StackError(f"kafka-consumer-groups --describe --group {group} exited "
                         f"{done.returncode}: {done.stderr.strip()[-2000:]}")
    return parse_describe(done.stdout), done.stdout
