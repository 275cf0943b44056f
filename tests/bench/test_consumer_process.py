"""(e'')'s consumer process sends records as rows the parent turns into the very
``SourceRecord`` objects the worker's ``to_record`` builds, through its frame format."""

from __future__ import annotations

import asyncio
import pickle

from confluent_kafka import Message

from consumer.kafka.adapter import to_record
from ops.bench.consumer_process import read_frames, records_of, row_of


def _messages() -> list[Message]:
    return [Message(topic="t", partition=i % 3, offset=i, key=b"k%d" % i, value=b"v" * i,
                    headers=[("traceparent", b"00-abc")] if i % 2 else None,
                    timestamp=(1, 1_700_000_000_000 + i) if i % 4 else (0, -1))
            for i in range(12)]


def test_rows_become_the_records_to_record_builds() -> None:
    msgs = _messages()
    rows = pickle.loads(pickle.dumps([row_of(m) for m in msgs]))  # across the pipe
    assert records_of(rows) == [to_record(m) for m in msgs]


def test_read_frames_reads_every_frame_and_waits_while_ahead() -> None:
    async def main() -> tuple[int, list[int]]:
        stream = asyncio.StreamReader()
        for chunk in ([row_of(m) for m in _messages()[:5]], [row_of(m) for m in _messages()[5:]]):
            data = pickle.dumps(chunk)
            stream.feed_data(len(data).to_bytes(4, "big") + data)
        progressed, seen, applied = asyncio.Event(), [], 0

        def ahead(got: int) -> bool:
            seen.append(got)
            return got - applied >= 5  # one frame ahead at most

        async def apply_later() -> None:
            nonlocal applied
            await asyncio.sleep(0.05)
            applied = 5
            progressed.set()

        task = asyncio.create_task(apply_later())
        got = await read_frames(stream, 12, ahead, progressed)
        await task
        return got, seen

    got, seen = asyncio.run(main())
    assert got == 12
    assert seen == [0, 5, 5]  # held after the first frame until 5 were applied
