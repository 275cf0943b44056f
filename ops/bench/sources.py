"""The records a benchmark run reads: one fresh topic per kind of ``Run.topic`` asked,
produced before the runs (``ops.bench.worker``, ``ops.bench.trees``, ``ops.bench.profile``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable

from ops.bench.cdc_events import cdc_schemas_value, cdc_value
from ops.bench.runs import ROOT, env, new_topic
from ops.bench.sink import produce_avro_values, produce_values

__all__ = ["produce", "produce_topics"]

PY = sys.executable


def produce(topic: str, count: int, partitions: int, seed: int) -> None:
    subprocess.run([PY, "-m", "ops.cli", "produce", "--topic", topic, "--count", str(count),
                    "--seed", str(seed), "--class", "valid", "--partitions", str(partitions)],
                   check=True, env=env(), cwd=ROOT, stdout=subprocess.DEVNULL)


def produce_topics(kinds: Iterable[str], count: int, single_count: int,
                   partitions: int) -> dict[str, tuple[str, int]]:
    """A fresh topic per kind of ``Run.topic`` asked (``main``: ``count`` reference records;
    ``single``: the batch-1 subset, ``single_count`` of another seed; ``sink``: ``count``
    100-byte JSON values; ``sink_avro``: the same records in Avro; ``sink_cdc``: the same
    rows as Debezium's change events (``cdc_value``), ``sink_cdc_schemas`` with their
    schema in each (``cdc_schemas_value``); ``sink_routed``: three
    topics of ``count // 3`` such values, ``partitions // 3`` partitions each), produced:
    kind -> (topic, or the topics joined by ``,``; records)."""
    prefixes = {"main": "bench", "single": "bench1", "sink": "benchsink",
                "sink_avro": "benchsinkavro", "sink_routed": "benchroute",
                "sink_cdc": "benchsinkcdc", "sink_cdc_schemas": "benchsinkcdcs"}
    topics = {kind: (",".join(new_topic(prefixes[kind]) for _ in range(
        3 if kind == "sink_routed" else 1)), single_count if kind == "single" else
        3 * (count // 3) if kind == "sink_routed" else count) for kind in sorted(set(kinds))}
    for kind, (name, n) in topics.items():
        print(f"producing {n} records to {name} ...", flush=True)
        if kind == "sink_routed":
            for one in name.split(","):
                produce_values(one, n // 3, max(1, partitions // 3),
                               os.environ["KAFKA_BOOTSTRAP_SERVERS"])
        elif kind == "sink":
            produce_values(name, n, partitions, os.environ["KAFKA_BOOTSTRAP_SERVERS"])
        elif kind in ("sink_cdc", "sink_cdc_schemas"):
            produce_values(name, n, partitions, os.environ["KAFKA_BOOTSTRAP_SERVERS"],
                           value=cdc_value if kind == "sink_cdc" else cdc_schemas_value)
        elif kind == "sink_avro":
            produce_avro_values(name, n, partitions, os.environ["KAFKA_BOOTSTRAP_SERVERS"],
                                os.environ["SCHEMA_REGISTRY_URL"])
        else:
            produce(name, n, partitions, 1 if kind == "main" else 2)
    return topics
