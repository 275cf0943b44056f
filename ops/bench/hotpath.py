"""``python -m ops.bench.hotpath``: ns per record of the worker's own per-record steps.

No services: synthetic confluent-kafka ``Message`` objects (100-byte values, one header,
as ``fencectl produce``) go through the steps the worker runs for every record outside the
handler: translation (``consumer.kafka.adapter.to_record``) and the partition buffer
(``PartitionBuffer.add`` then ``take_batch`` in 500-record batches); the table sink's
per-record conversion (``fencing.postgres.sink.rows.convert``) of the benchmark's 100-byte
JSON values (``ops.bench.sink.sink_value``) into the layout of the table it creates with a
key column (upsert on ``id``); and the reference handler's parse
(``ops.reference.domain.parse_batch``) of the records ``make bench`` produces. Best of
``--repeat`` rounds. Optimisations of these steps quote this command before and after.
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
from fencing.postgres.sink.rows import Column, Layout, converter
from fencing.types import SourceRecord
from ops.bench.sink import sink_value
from ops.reference.domain import parse_batch
from ops.reference.generate import generate, to_source_records

#: the layout ``fencing.postgres.sink.catalog.create_ddl`` gives a table with key ``id``
SINK_LAYOUT = Layout((Column("id", "text", True), Column("payload", "jsonb", True),
                      Column("kafka_topic", "text", True), Column("kafka_partition", "int4", True),
                      Column("kafka_offset", "int8", True), Column("kafka_key", "text"),
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

    out = {name: round(min(timeit.repeat(fn, number=1, repeat=a.repeat)) / a.records * 1e9)
           for name, fn in (("to_record_ns", translate), ("buffer_add_take_ns", buffer),
                            ("sink_convert_ns", sink_convert),
                            ("reference_parse_ns", reference_parse))}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
