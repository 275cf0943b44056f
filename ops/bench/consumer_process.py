"""(e''): what a consumer in its own process would leave of the in-process consumption cost.

``python -m ops.bench.baselines memory-consume-process`` runs (e) while this module, as a
child process (``python -m ops.bench.consumer_process BOOTSTRAP GROUP TOPIC TOTAL``),
consumes the topic as the worker's Kafka thread does (the worker's prefetch, 1,000 records
per ``consume()``) and writes each result to its stdout as one frame: a 4-byte length and
a pickled list of rows, one per record, each already the field values of ``SourceRecord``
(``ROW_FIELDS``). The parent's loop reads the frames (``read_frames``), unpickles them and
builds the ``SourceRecord`` objects (``records_of``) — what a worker whose consumer ran in
another process would still do under its own GIL — and drops them, paced like (e'): at
most one queue bound per partition ahead of the records applied (it stops reading; the
pipe fills; the child blocks and stops consuming, so librdkafka stops fetching).

A measurement of the design alternative for "why (c) stays below (e)" (docs/benchmarks.md),
not a worker component: the worker keeps its consumer in-process. Its consumer is
``ops.bench.subscribe.subscribed``, the baselines' own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import sys
from collections.abc import Callable
from typing import Any

from fencing.types import SourceRecord
from ops.bench.subscribe import subscribed

#: a row's fields: ``SourceRecord``'s, in order
ROW_FIELDS = tuple(f.name for f in dataclasses.fields(SourceRecord))
_SET = tuple(getattr(SourceRecord, name).__set__ for name in ROW_FIELDS)


def row_of(msg: Any) -> tuple[Any, ...]:
    """A confluent-kafka ``Message`` as ``SourceRecord``'s field values, read as
    ``to_record`` reads them (without building the record the parent builds again; the unit
    test holds the two equal)."""
    ts_type, ts = msg.timestamp()
    headers = msg.headers()
    return (msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
            tuple(headers) if headers else (), ts if ts_type else None)


def records_of(rows: list[tuple[Any, ...]]) -> list[SourceRecord]:
    """``SourceRecord`` objects filled from rows as ``to_record`` fills them (the slots
    directly, no ``__init__``; unrolled: this runs per record on the handler's loop, and a
    row of another length fails the unpacking)."""
    st, sp, so, sk, sv, sh, sts = _SET
    out = []
    for topic, partition, offset, key, value, headers, ts in rows:
        rec: SourceRecord = object.__new__(SourceRecord)
        st(rec, topic)
        sp(rec, partition)
        so(rec, offset)
        sk(rec, key)
        sv(rec, value)
        sh(rec, headers)
        sts(rec, ts)
        out.append(rec)
    return out


async def read_frames(stream: asyncio.StreamReader, total: int,
                      ahead: Callable[[int], bool], progressed: asyncio.Event) -> int:
    """Read frames until ``total`` records arrived, building their records and dropping
    them; before each frame, while ``ahead(received)`` (the pacing), wait for
    ``progressed`` (set when a batch was applied). Records received."""
    got = 0
    while got < total:
        while ahead(got):
            progressed.clear()
            await progressed.wait()
        head = await stream.readexactly(4)
        rows = pickle.loads(await stream.readexactly(int.from_bytes(head, "big")))
        got += len(records_of(rows))
    return got


def child_main(argv: list[str]) -> int:
    bootstrap, group, topic, total = argv[0], argv[1], argv[2], int(argv[3])
    out = sys.stdout.buffer
    c = subscribed(bootstrap, group, topic)
    sent = 0
    try:
        while sent < total:
            rows = [row_of(m) for m in c.consume(1000, 0.05) if m.error() is None]
            if rows:
                data = pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL)
                out.write(len(data).to_bytes(4, "big") + data)
                out.flush()
                sent += len(rows)
    except BrokenPipeError:  # the parent is done and closed its end
        pass
    finally:
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
