"""``python -m ops.bench.hotpath``: ns per record of the worker's own per-record steps.

No services: synthetic confluent-kafka ``Message`` objects (100-byte values, one header,
as ``fencectl produce``) go through the steps the worker runs for every record outside the
handler: translation (``consumer.kafka.adapter.to_record``) and the partition buffer
(``PartitionBuffer.add`` then ``take_batch`` in 500-record batches); the table sink's
per-record conversion (``fencing.postgres.sink.rows.convert``) of the benchmark's 100-byte
JSON values (``ops.bench.sink.sink_value``) into the layout of the table it creates with a
key column (upsert on ``id``); and the reference handler's parse
(``ops.reference.domain.parse_batch``) of the records ``make bench`` produces; and a batch's
conversion by the sink (``fencing.postgres.sink.convert.convert_batch``, 2,000 per batch)
into the typed table of ``make bench-cdc`` (``ops.bench.sink.TYPED_DDL``): the 100-byte
rows (``typed_convert_ns``) beside the same rows as Debezium's change events without
schemas (``ops.bench.cdc_events.cdc_value``: ``cdc_convert_ns``, the ``source`` block
unread as the sink reads it; ``cdc_source_read_convert_ns``, read as with
``--sink-version-from source.lsn``) and with them (``cdc_schemas_convert_ns``). Best of
``--repeat`` rounds, the steps alternating round by round. Optimisations of these steps
quote this command before and after.
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from typing import Any

from confluent_kafka import Message

from consumer.batching import PartitionBuffer
from consumer.kafka.adapter import to_record
from fencing.postgres.sink.catalog import Method, SinkSpec, Target
from fencing.postgres.sink.convert import convert_batch
from fencing.postgres.sink.debezium import JsonEvents
from fencing.postgres.sink.rows import Column, Layout, converter
from fencing.postgres.sink.writer import Writer
from fencing.types import SourceRecord
from ops.bench.cdc_events import cdc_schemas_value, cdc_value
from ops.bench.sink import sink_value
from ops.reference.domain import parse_batch
from ops.reference.generate import generate, to_source_records
from ops.worker.startup import settle_heap

#: the layout ``fencing.postgres.sink.catalog.create_ddl`` gives a table with key ``id``
SINK_LAYOUT = Layout((Column("id", "text", True), Column("payload", "jsonb", True),
                      Column("kafka_topic", "text", True), Column("kafka_partition", "int4", True),
                      Column("kafka_offset", "int8", True), Column("kafka_key", "text"),
                      Column("kafka_timestamp", "timestamptz")), keys=("id",))

#: the layout of ``TYPED_DDL``'s table (key ``id``), as the sink reads it from the catalog
TYPED_LAYOUT = Layout((Column("id", "text", True), Column("amount", "int8", True),
                       Column("status", "text", True), Column("note", "text", True),
                       Column("kafka_topic", "text", True),
                       Column("kafka_partition", "int4", True),
                       Column("kafka_offset", "int8", True),
                       Column("kafka_timestamp", "timestamptz")), keys=("id",))


def messages(n: int) -> list[Any]:
    return [Message(topic="bench", partition=0, offset=i, key=b"doc-%07d" % (i % 1000),
                    value=b"x" * 100, headers=[("traceparent", b"0" * 55)],
                    timestamp=(1, 1_700_000_000_000 + i)) for i in range(n)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.hotpath")
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=7)
    a = p.parse_args(argv)
    msgs = messages(a.records)
    records = [to_record(m) for m in msgs]

    def translate() -> None:
        for m in msgs:
            to_record(m)

    def buffer() -> None:
        buf = PartitionBuffer(next_offset=0, max_records=500, max_bytes=1 << 20,
                              queue_max_records=1 << 40, queue_max_bytes=1 << 40)
        for i in range(0, len(records), 1000):
            buf.add(records[i:i + 1000])
            while len(buf) >= 500:
                buf.take_batch()

    values = [SourceRecord("bench", 0, i, b"o%d" % i, sink_value(i),
                           timestamp_ms=1_700_000_000_000 + i)
              for i in range(a.records)]

    def sink_convert() -> None:
        convert = converter(SINK_LAYOUT, epoch_ms=True)  # once per layout, as the staged upsert
        for r in values:
            convert(r)

    reference = to_source_records(generate(1, count=a.records, partitions=6, klass="valid",
                                           topic="bench"))  # as ``fencectl produce``

    def reference_parse() -> None:
        for i in range(0, len(reference), 500):
            parse_batch(reference[i:i + 500])

    writer = Writer(Target("public", "bench_sink_typed", TYPED_LAYOUT,
                           frozenset(c.name for c in TYPED_LAYOUT.columns)), Method.COPY)
    plain = SinkSpec(table="bench_sink_typed", keys=("id",))
    changes = SinkSpec(table="bench_sink_typed", keys=("id",), envelope="debezium")

    def batches(value: Any, spec: SinkSpec, events: JsonEvents | None = None) -> Any:
        rows = [SourceRecord("bench", 0, i, b"o%d" % i, value(i),
                             timestamp_ms=1_700_000_000_000 + i) for i in range(a.records)]

        def run() -> None:
            for i in range(0, len(rows), 2_000):
                convert_batch(writer, rows[i:i + 2_000], None, None, spec, events)
        return run

    steps = (("to_record_ns", translate), ("buffer_add_take_ns", buffer),
             ("sink_convert_ns", sink_convert), ("reference_parse_ns", reference_parse),
             ("typed_convert_ns", batches(sink_value, plain)),
             ("cdc_convert_ns", batches(cdc_value, changes, JsonEvents())),
             ("cdc_source_read_convert_ns", batches(cdc_value, changes,
                                                    JsonEvents(source=True))),
             ("cdc_schemas_convert_ns", batches(cdc_schemas_value, changes, JsonEvents())))
    settle_heap()  # the collector as the worker runs it
    best = dict.fromkeys((name for name, _ in steps), float("inf"))
    for _ in range(a.repeat):
        for name, fn in steps:
            best[name] = min(best[name], timeit.timeit(fn, number=1))
    print(json.dumps({name: round(s / a.records * 1e9) for name, s in best.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
