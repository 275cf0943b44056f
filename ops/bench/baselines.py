"""Baseline consumers for ``ops.bench.worker`` (each runs as its own process).

Long because every baseline the worker is compared with is here side by side, sharing one
consumer set-up, one buffer set-up and one runner pool, so that the only differences between
two runs are the ones their docstrings name.

Every mode times itself with ``ops.bench.clock`` (the same wrapper the worker runs use) and
writes its marks to ``--clock-file``; batches are cut by ``consumer.batching``'s
``PartitionBuffer`` with the worker's default bounds, so only the runtime differs.

- ``raw``: consume the topic to its end with no database (records/s of librdkafka + Python).
- ``raw-aio``: the same through ``confluent_kafka.aio.AIOConsumer`` (for comparison only).
- ``pipelined`` (b): an unfenced at-least-once consumer that fetches while it writes: one
  task consumes into per-partition buffers (pause at the queue bound, resume at half, as the
  worker), one runner per partition takes batches and applies each in its own transaction
  with the reference handler, at most ``--db-concurrency`` at once; processed offsets are
  committed to Kafka asynchronously between two consume() calls. No epochs, no frontier
  row, no quarantine: what a careful engineer writes without fencing.
- ``stop-and-wait`` (b'): consume up to 1000 records, apply them (per partition, batches
  concurrently), commit, consume again.
- ``memory`` (e): the database ceiling: the records are read from the topic into memory
  first (untimed), then the same handler runs over the same batches with the same
  concurrency, in plain transactions, with no Kafka at all.
- ``memory-consume`` (e'): (e), plus the worker's consume path in the same process while it
  runs: a thread consumes the topic again (1,000 records per ``consume()``, the worker's
  prefetch) and hands each result to the loop, which translates it (``to_record``, as the
  worker does) and drops it; the thread stays at most one queue bound per partition ahead
  of the records applied, as the worker's pause/resume keeps it. No fence, no lifecycle:
  the ceiling of any consumer whose Kafka client and handler share one Python process.
- ``memory-consume-process`` (e''): (e), plus a child process that consumes the topic as
  the worker does and sends each result over a pipe as pickled rows, which the loop turns
  into ``SourceRecord`` objects and drops, paced as (e') (``ops.bench.consumer_process``):
  what a worker whose consumer ran in its own process would still pay.

Every mode settles the heap as the worker does before it consumes
(``ops.worker.startup.settle_heap``: freeze the start-up heap, young collections every
20,000 allocations), so only the fence and the worker's frame differ; ``--default-gc``
keeps CPython's defaults (the run that shows what the setting is worth).

The handler is the reference handler, or with ``--sink TABLE [--sink-key COL]`` the table
sink (the same factory and spec the worker's sink runs build: ``ops.bench.clock.sink_spec``,
its table created in ``--schema`` before the first record).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from confluent_kafka import TopicPartition as KTP

from consumer.batching import Flow, PartitionBuffer
from consumer.config import PREFETCH, WorkerConfig
from consumer.kafka.adapter import to_record
from fencing.types import SourceRecord
from ops.bench.clock import Marks, sink_spec, wrap
from ops.bench.consumer_process import read_frames
from ops.bench.subscribe import subscribed
from ops.reference.pg import make_pg_handler
from ops.worker.startup import settle_heap

Key = tuple[str, int]
#: the worker's defaults: batch and queue bounds, concurrency, poll timeout
DEFAULTS = WorkerConfig(topics=("-",), group_id="-", bootstrap_servers="-", dsn="",
                        handler="-")  # only its batching and prefetch defaults are read


def _buffer(next_offset: int, batch_max: int, cfg: WorkerConfig) -> PartitionBuffer:
    return PartitionBuffer(next_offset=next_offset, max_records=batch_max,
                           max_bytes=cfg.batch_max_bytes,
                           queue_max_records=batch_max * cfg.queue_max_batches,
                           queue_max_bytes=cfg.queue_max_bytes)


def run_raw(a: argparse.Namespace, marks: Marks) -> None:
    c = subscribed(a.bootstrap, a.group, a.topic)
    seen = 0
    while seen < a.total:
        msgs = c.consume(1000, 0.5)
        if not msgs:
            continue
        marks.begin()
        for m in msgs:
            if m.error() is None:
                to_record(m)  # same translation cost as the worker
                seen += 1
        marks.end(len(msgs))
    marks.flush()
    c.close()


async def run_raw_aio(a: argparse.Namespace, marks: Marks) -> None:
    """Raw consumption through ``confluent_kafka.aio.AIOConsumer`` (measured, not used)."""
    from confluent_kafka.aio import AIOConsumer

    c = AIOConsumer({"bootstrap.servers": a.bootstrap, "group.id": a.group,
                     "enable.auto.commit": False, "auto.offset.reset": "earliest",
                     **PREFETCH})
    await c.subscribe([a.topic])
    seen = 0
    while seen < a.total:
        msgs = await c.consume(1000, 0.5)
        if not msgs:
            continue
        marks.begin()
        for m in msgs:
            if m.error() is None:
                to_record(m)
                seen += 1
        marks.end(len(msgs))
    marks.flush()
    await c.close()


async def _runners(buffers: dict[Key, PartitionBuffer], apply: Callable[
        [list[SourceRecord]], Awaitable[None]], concurrency: int, total: int,
        on_batch: Callable[[Key, list[SourceRecord]], None]) -> tuple[
        Callable[[Key], None], asyncio.Event]:
    """Per-partition runner tasks over ``buffers``; returns (wake(key), all-done event)."""
    slots = asyncio.Semaphore(concurrency)
    wakes: dict[Key, asyncio.Event] = {}
    done = asyncio.Event()
    processed = 0

    async def runner(key: Key) -> None:
        nonlocal processed
        buf, wake = buffers[key], wakes[key]
        while not done.is_set():
            if not len(buf):
                wake.clear()
                await wake.wait()
                continue
            async with slots:
                batch = buf.take_batch()
                await apply(batch)
            on_batch(key, batch)
            processed += len(batch)
            if processed >= total:
                done.set()
                for w in wakes.values():
                    w.set()

    tasks: list[asyncio.Task[None]] = []

    def wake(key: Key) -> None:
        if key not in wakes:
            wakes[key] = asyncio.Event()
            tasks.append(asyncio.create_task(runner(key)))
        wakes[key].set()

    return wake, done


async def run_pipelined(a: argparse.Namespace, marks: Marks, pool: Any,
                        apply: Callable[[list[SourceRecord]], Awaitable[None]]) -> None:
    cfg = DEFAULTS
    c = subscribed(a.bootstrap, a.group, a.topic)
    loop = asyncio.get_running_loop()
    buffers: dict[Key, PartitionBuffer] = {}
    to_commit: dict[Key, int] = {}
    wake, done = await _runners(buffers, apply, a.db_concurrency, a.total,
                                lambda k, b: to_commit.__setitem__(k, b[-1].offset + 1))
    while not done.is_set():
        if to_commit:
            c.commit(offsets=[KTP(t, p, o) for (t, p), o in to_commit.items()],
                     asynchronous=True)
            to_commit.clear()
        for (t, p), buf in buffers.items():
            flow = buf.flow()
            if flow is Flow.PAUSE:
                c.pause([KTP(t, p)])
            elif flow is Flow.RESUME:
                c.resume([KTP(t, p)])
        msgs = await loop.run_in_executor(None, c.consume, 1000, cfg.poll_timeout_s)
        for key, recs in _by_partition(msgs).items():
            if key not in buffers:
                buffers[key] = _buffer(recs[0].offset, a.batch_max_records, cfg)
            buffers[key].add(recs)
            wake(key)
    c.close()


def _by_partition(msgs: list[Any]) -> dict[Key, list[SourceRecord]]:
    by_tp: dict[Key, list[SourceRecord]] = defaultdict(list)
    for m in msgs:
        if m.error() is None:
            r = to_record(m)
            by_tp[(r.topic, r.partition)].append(r)
    return by_tp


async def run_stop_and_wait(a: argparse.Namespace, marks: Marks, pool: Any,
                            apply: Callable[[list[SourceRecord]], Awaitable[None]]) -> None:
    c = subscribed(a.bootstrap, a.group, a.topic)
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(a.db_concurrency)
    seen = 0

    async def bounded(batch: list[SourceRecord]) -> None:
        async with sem:
            await apply(batch)

    while seen < a.total:
        by_tp = _by_partition(await loop.run_in_executor(None, c.consume, 1000, 0.5))
        jobs = [bounded(recs[i:i + a.batch_max_records]) for recs in by_tp.values()
                for i in range(0, len(recs), a.batch_max_records)]
        await asyncio.gather(*jobs)
        if by_tp:
            c.commit(offsets=[KTP(t, p, recs[-1].offset + 1) for (t, p), recs in by_tp.items()],
                     asynchronous=True)
        seen += sum(len(v) for v in by_tp.values())
    c.close()


async def run_memory(a: argparse.Namespace, marks: Marks, pool: Any,
                     apply: Callable[[list[SourceRecord]], Awaitable[None]], *,
                     start: Callable[[int], threading.Thread | None] | None = None,
                     ) -> threading.Thread | None:
    cfg = DEFAULTS
    c = subscribed(a.bootstrap, a.group, a.topic)
    loaded: dict[Key, list[SourceRecord]] = defaultdict(list)
    seen = 0
    while seen < a.total:  # untimed: the records come from the same topic
        for key, recs in _by_partition(c.consume(1000, 0.5)).items():
            loaded[key].extend(recs)
            seen += len(recs)
    c.close()
    # the whole topic is now live objects: without freezing them, every full collection of
    # the cyclic GC would walk them all (the worker holds at most its queue bounds);
    # settle_heap collects, then freezes
    if a.default_gc:
        gc.freeze()
    else:
        settle_heap()
    buffers = {k: _buffer(v[0].offset, a.batch_max_records, cfg) for k, v in loaded.items()}
    for key, recs in loaded.items():
        buffers[key].queue_max_records = buffers[key].queue_max_bytes = 1 << 62
        buffers[key].add(recs)
    thread = None if start is None else start(len(buffers))  # (e'): consuming beside it
    wake, done = await _runners(buffers, apply, a.db_concurrency, seen, lambda k, b: None)
    for key in buffers:
        wake(key)
    await done.wait()
    return thread


def _paced_consume(a: argparse.Namespace, loop: asyncio.AbstractEventLoop,
                   applied: Callable[[], int], window: int, stop: threading.Event) -> None:
    """(e')'s Kafka thread: consume the topic, each result translated on the loop and
    dropped, never more than ``window`` records ahead of ``applied()``."""
    c = subscribed(a.bootstrap, a.group + "-consume", a.topic)
    consumed = 0
    try:
        while consumed < a.total and not stop.is_set():
            if consumed - applied() >= window:
                time.sleep(0.001)  # the worker's queues are full: it pauses
                continue
            msgs = c.consume(1000, 0.05)
            consumed += len(msgs)
            if msgs:
                loop.call_soon_threadsafe(_by_partition, msgs)
    finally:
        c.close()


async def run_memory_consume(a: argparse.Namespace, marks: Marks, pool: Any,
                             apply: Callable[[list[SourceRecord]], Awaitable[None]]) -> None:
    applied = 0
    stop = threading.Event()

    async def counted(records: list[SourceRecord]) -> None:
        nonlocal applied
        await apply(records)
        applied += len(records)

    def start(partitions: int) -> threading.Thread:
        window = partitions * a.batch_max_records * DEFAULTS.queue_max_batches
        thread = threading.Thread(target=_paced_consume, name="kafka", daemon=True, args=(
            a, asyncio.get_running_loop(), lambda: applied, window, stop))
        thread.start()
        return thread

    thread = await run_memory(a, marks, pool, counted, start=start)
    stop.set()
    if thread is not None:
        await asyncio.to_thread(thread.join)


async def run_memory_consume_process(a: argparse.Namespace, marks: Marks, pool: Any,
                                     apply: Callable[[list[SourceRecord]], Awaitable[None]]
                                     ) -> None:
    """(e''): (e) while a child process consumes the topic and sends the records over a
    pipe, which the loop reads into ``SourceRecord`` objects (``ops.bench.consumer_process``)."""

    applied = 0
    progressed = asyncio.Event()
    reader: list[asyncio.Task[int]] = []
    child: list[asyncio.subprocess.Process] = []

    async def counted(records: list[SourceRecord]) -> None:
        nonlocal applied
        await apply(records)
        applied += len(records)
        progressed.set()

    async def consume(window: int) -> int:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ops.bench.consumer_process", a.bootstrap,
            a.group + "-consume", a.topic, str(a.total), stdout=asyncio.subprocess.PIPE,
            limit=1 << 24)
        child.append(proc)
        assert proc.stdout is not None
        return await read_frames(proc.stdout, a.total, lambda got: got - applied >= window,
                                 progressed)

    def start(partitions: int) -> None:
        window = partitions * a.batch_max_records * DEFAULTS.queue_max_batches
        reader.append(asyncio.get_running_loop().create_task(consume(window)))

    await run_memory(a, marks, pool, counted, start=start)
    for task in reader:
        task.cancel()
    for proc in child:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


Mode = Callable[[argparse.Namespace, Marks, Any, Callable[[list[SourceRecord]],
                                                         Awaitable[None]]], Awaitable[Any]]
MODES: dict[str, Mode] = {"pipelined": run_pipelined, "stop-and-wait": run_stop_and_wait,
                          "memory": run_memory, "memory-consume": run_memory_consume,
                          "memory-consume-process": run_memory_consume_process}


async def _with_db(a: argparse.Namespace, marks: Marks) -> None:
    import asyncpg

    from fencing.postgres.sink import ensure_table, make_table_sink

    pool = await asyncpg.create_pool(os.environ["FENCE_DSN"], min_size=a.db_concurrency,
                                     max_size=a.db_concurrency)
    if a.sink is None:
        handler = wrap(make_pg_handler(schema=a.schema), marks)
    else:
        spec = sink_spec({"table": a.sink, **({"key": a.sink_key} if a.sink_key else {})},
                         a.schema)
        async with pool.acquire() as conn:
            await ensure_table(conn, spec)
        handler = wrap(make_table_sink(spec), marks)

    async def apply(records: list[SourceRecord]) -> None:
        async with pool.acquire() as conn, conn.transaction():
            await handler(conn, records)

    try:
        await MODES[a.mode](a, marks, pool, apply)
    finally:
        marks.flush()
        await pool.close()


def main(argv: list[str] | None = None) -> int:
    defaults = DEFAULTS
    p = argparse.ArgumentParser(prog="python -m ops.bench.baselines")
    p.add_argument("mode", choices=["raw", "raw-aio", *MODES])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--total", type=int, required=True)
    p.add_argument("--clock-file", required=True)
    p.add_argument("--schema", default="fence")
    p.add_argument("--batch-max-records", type=int, default=defaults.batch_max_records)
    p.add_argument("--db-concurrency", type=int, default=defaults.db_concurrency)
    p.add_argument("--sink", default=None, metavar="TABLE",
                   help="the table sink into TABLE (in --schema) instead of the reference handler")
    p.add_argument("--sink-key", default=None, metavar="COLUMN", help="with --sink: upsert key")
    p.add_argument("--default-gc", action="store_true",
                   help="keep CPython's collector defaults (the worker settles its heap)")
    a = p.parse_args(argv)
    if not a.default_gc:
        settle_heap()
    marks = Marks(a.clock_file)
    if a.mode == "raw":
        run_raw(a, marks)
    elif a.mode == "raw-aio":
        asyncio.run(run_raw_aio(a, marks))
    else:
        asyncio.run(_with_db(a, marks))
    print(json.dumps({"records": marks.records}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
