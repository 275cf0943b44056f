"""``--lanes`` on the worker's loop side (in-memory store, the fake Kafka thread of
``test_worker``): lanes of one partition run side by side, each key's records in offset
order, each record applied once; Kafka gets the effective frontier; a successor without
lanes skips what the lanes applied above the durable frontier."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from consumer.exits import ExitCode
from fencing.errors import ConfigError
from fencing.handler import handler
from fencing.lanes import lane_of
from fencing.memory.store import MemoryFenceStore
from fencing.types import ACCEPT, SourceRecord, Verdict
from tests.polling import until_async
from tests.unit.consumer.test_worker import TP0, make


def keyed(start: int, count: int, keys: int, gap_every: int = 0) -> list[SourceRecord]:
    """Records with keys k0..k{keys-1}, offsets from ``start`` (every ``gap_every``-th offset
    missing: Kafka's gaps)."""
    out: list[SourceRecord] = []
    offset = start
    while len(out) < count:
        if gap_every and offset % gap_every == gap_every - 1:
            offset += 1
            continue
        out.append(SourceRecord(TP0.topic, TP0.partition, offset, b"k%d" % (offset % keys),
                                b"v"))
        offset += 1
    return out


class Recording:
    """A handler that waits a little per call (an external call) and records what ran."""

    def __init__(self, wait_s: float = 0.02) -> None:
        self.wait_s = wait_s
        self.applied: list[tuple[bytes | None, int]] = []
        self.in_flight = 0
        self.most = 0

    async def __call__(self, conn: Any, recs: Sequence[SourceRecord]) -> list[Verdict]:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(self.wait_s)
        finally:
            self.in_flight -= 1
        table = conn.table("effects")
        for r in recs:
            assert (r.partition, r.offset) not in table
            table[(r.partition, r.offset)] = r.key
        self.applied.extend((r.key, r.offset) for r in recs)
        return [ACCEPT] * len(recs)


async def test_lanes_run_side_by_side_in_key_order_and_apply_each_record_once() -> None:
    handler = Recording()
    worker, store, fakes = make(handler, lanes=8, db_concurrency=8, batch_max_records=10)
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    kafka = fakes[0]
    await asyncio.to_thread(kafka.rb.assigned, [TP0])
    sent = keyed(0, 400, keys=16, gap_every=7)
    await asyncio.to_thread(kafka.deliver, sent)
    last = sent[-1].offset + 1
    await until_async(lambda: kafka.committed(TP0) == last, timeout_s=20)
    assert handler.most > 1  # lanes of one partition ran side by side
    assert sorted(o for _, o in handler.applied) == [r.offset for r in sent]  # each once
    seen: dict[bytes | None, int] = {}
    for key, offset in handler.applied:  # in apply order: a key never overtakes itself
        assert offset > seen.get(key, -1)
        seen[key] = offset
    commits = [f for c, t, f in kafka.commands if c == "commit" and t == TP0]
    assert commits == sorted(commits)  # the effective frontier only moves forward
    # caught up: the lanes' contiguous prefix is folded into the partition row
    await until_async(lambda: store.token_of(TP0).frontier == last)  # type: ignore[union-attr]
    worker.request_stop()
    assert await run is ExitCode.OK
    got = (await store.completions([TP0]))[TP0]
    assert got is not None and (got.base, got.spans) == (last, ())


async def test_a_successor_without_lanes_skips_what_the_lanes_applied() -> None:
    store = MemoryFenceStore("g")
    never = asyncio.Event()
    first = Recording(wait_s=0)

    async def one_key_waits(conn: Any, recs: Sequence[SourceRecord]) -> list[Verdict]:
        if any(r.key == b"k0" for r in recs):
            await never.wait()  # key k0's lane never ends; the others run ahead
        return await first(conn, recs)

    worker, _, fakes = make(one_key_waits, store=store, lanes=4, db_concurrency=4,
                            batch_max_records=2)
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    await asyncio.to_thread(fakes[0].rb.assigned, [TP0])
    sent = keyed(0, 40, keys=4)
    await asyncio.to_thread(fakes[0].deliver, sent)
    held = lane_of(b"k0", 4)  # k0's lane holds, with the other keys of that lane behind it
    others = [r.offset for r in sent if lane_of(r.key, 4) != held]
    assert others and len(others) < len(sent)
    await until_async(lambda: sorted(o for _, o in first.applied) == others, timeout_s=3)
    assert fakes[0].committed(TP0) == -1  # offset 0 (key k0) is not applied: no frontier yet
    worker.request_stop()  # k0's batch is stuck: the shutdown bound abandons it
    assert await run is ExitCode.SHUTDOWN_TIMEOUT

    second = Recording(wait_s=0)
    worker2, _, fakes2 = make(second, store=store)  # --lanes 1: the completion set rules
    run2 = asyncio.create_task(worker2.run())
    await until_async(lambda: bool(fakes2))
    positions = await asyncio.to_thread(fakes2[0].rb.assigned, [TP0])
    assert positions == {TP0: 0}
    await asyncio.to_thread(fakes2[0].deliver, sent)
    await until_async(lambda: fakes2[0].committed(TP0) == 40, timeout_s=10)
    assert sorted(o for _, o in second.applied) == [r.offset for r in sent
                                                    if lane_of(r.key, 4) == held]
    assert sorted((*first.applied, *second.applied), key=lambda a: a[1]) == [
        (r.key, r.offset) for r in sent]
    worker2.request_stop()
    assert await run2 is ExitCode.OK


async def test_a_full_window_holds_the_other_lanes_back_and_nothing_is_lost() -> None:
    release = asyncio.Event()
    handler = Recording(wait_s=0)

    async def first_waits(conn: Any, recs: Sequence[SourceRecord]) -> list[Verdict]:
        if recs[0].offset == 0:
            await release.wait()  # the frontier cannot move past offset 0 meanwhile
        return await handler(conn, recs)

    worker, _store, fakes = make(first_waits, lanes=8, db_concurrency=8, batch_max_records=1,
                                lanes_window=6)
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    await asyncio.to_thread(fakes[0].rb.assigned, [TP0])
    sent = keyed(0, 60, keys=60)  # every record its own key: only the window holds them
    await asyncio.to_thread(fakes[0].deliver, sent)
    await until_async(lambda: len(handler.applied) == 5)
    await asyncio.sleep(0.2)
    assert sorted(o for _, o in handler.applied) == [1, 2, 3, 4, 5]  # 6 offsets from 0
    release.set()
    await until_async(lambda: fakes[0].committed(TP0) == 60)
    assert sorted(o for _, o in handler.applied) == list(range(60))
    worker.request_stop()
    assert await run is ExitCode.OK


async def test_a_held_lane_holds_its_partitions_progress_back_and_is_reported_busy() -> None:
    """One key's lane waits on its handler while the other lanes apply everything else: the
    partition's progress (what the stall detection reads) stays at the moment the held lane
    became busy, though commits go on; ``lanes()`` reports it busy and the offsets
    dispatched past the oldest unfinished one. Once it settles, both move on."""
    release = asyncio.Event()
    handler = Recording(wait_s=0)

    async def k0_waits(conn: Any, recs: Sequence[SourceRecord]) -> list[Verdict]:
        if recs[0].key == b"k0":
            await release.wait()
        return await handler(conn, recs)

    worker, _store, fakes = make(k0_waits, lanes=4, db_concurrency=4, batch_max_records=5)
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    await asyncio.to_thread(fakes[0].rb.assigned, [TP0])
    sent = keyed(0, 40, keys=8)
    held = lane_of(b"k0", 4)
    others = [r.offset for r in sent if lane_of(r.key, 4) != held]
    await asyncio.to_thread(fakes[0].deliver, sent)
    await until_async(lambda: sorted(o for _, o in handler.applied) == others)
    lifetime = worker.current
    assert lifetime is not None
    stuck_since = lifetime.progress()[TP0]
    await asyncio.sleep(0.2)
    assert lifetime.progress()[TP0] == stuck_since  # commits went on; the held lane did not
    busy, used = lifetime.lanes()[TP0]
    assert busy == 1 and used == 40  # offset 0 unfinished, 40 offsets dispatched from it
    release.set()
    await until_async(lambda: fakes[0].committed(TP0) == 40)
    await until_async(lambda: lifetime.lanes()[TP0] == (0, 0))
    assert lifetime.progress()[TP0] > stuck_since
    worker.request_stop()
    assert await run is ExitCode.OK


def test_an_outcome_uncertain_handler_runs_no_lanes() -> None:
    @handler(durability="durable-critical", effects="outcome-uncertain")
    async def uncertain(conn: Any, recs: Sequence[SourceRecord]) -> list[Verdict]:
        return [ACCEPT] * len(recs)

    with pytest.raises(ConfigError, match="--lanes 4: an outcome-uncertain handler"):
        make(uncertain, lanes=4)
