"""An operator's reset is picked up by the running owner (DESIGN.md, Liveness): the worker
claims the partition again and continues from the new frontier without ending its lifetime;
a fence by another member still ends it (exit 3). Worker + lifecycle + in-memory store,
with the fake Kafka thread of ``test_worker``."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any

from consumer.exits import ExitCode
from fencing.types import (
    ACCEPT,
    ClaimRequest,
    SourceFacts,
    SourceRecord,
    TopicPartition,
    Verdict,
)
from tests.polling import until_async
from tests.unit.consumer.test_worker import TP0, TP1, make, records


def _seen() -> tuple[list[int], Any]:
    seen: list[int] = []

    async def handler(conn: Any, recs: Sequence[SourceRecord]) -> list[Verdict]:
        seen.extend(r.offset for r in recs if r.partition == 0)
        return [ACCEPT] * len(recs)

    return seen, handler


async def test_a_busy_partition_reset_backwards_is_claimed_again_and_replayed(
        caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    seen, handler = _seen()
    worker, store, fakes = make(handler, batch_max_records=10)
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    kafka = fakes[0]
    await asyncio.to_thread(kafka.rb.assigned, [TP0, TP1])
    await asyncio.to_thread(kafka.deliver, records(TP0, 0, 30))
    await until_async(lambda: kafka.committed(TP0) == 30)
    reset = store.reset_by_operator(TP0, frontier=10)
    await asyncio.to_thread(kafka.deliver, records(TP0, 30, 5))  # fenced by the reset
    await until_async(lambda: ("reposition", TP0, 10) in kafka.commands)
    await until_async(lambda: TP0 in worker.progress())  # the fresh runner (after the seek)
    row = store.rows[TP0]
    assert (row.epoch, row.frontier, row.owner) == (reset.epoch + 1, 10, worker.lifetimes[0])
    await asyncio.to_thread(kafka.deliver, records(TP0, 10, 25))  # from the new frontier
    await until_async(lambda: store.rows[TP0].frontier == 35)
    assert seen == [*range(30), *range(10, 35)]  # 10..29 again, 30..34 once
    await asyncio.to_thread(kafka.deliver, records(TP1, 0, 4))  # the sibling went on
    await until_async(lambda: kafka.committed(TP1) == 4)
    worker.request_stop()
    assert await run is ExitCode.OK
    assert worker.lifetimes == [worker.lifetimes[0]]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "claimed again after an operator's reset" in caplog.text


async def test_an_idle_partition_is_claimed_again_when_a_heartbeat_sees_the_reset() -> None:
    seen, handler = _seen()
    worker, store, fakes = make(handler)
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    kafka = fakes[0]
    await asyncio.to_thread(kafka.rb.assigned, [TP0])
    await asyncio.to_thread(kafka.deliver, records(TP0, 0, 20))
    await until_async(lambda: kafka.committed(TP0) == 20)
    store.reset_by_operator(TP0, frontier=5)
    owned = await store.heartbeat(lifetime="lt-x", member_id=None, host="h", pid=1,
                                  state="running")
    assert owned == {TP0}
    worker.operator_owned(owned)  # what the member heartbeat hands on
    await until_async(lambda: ("reposition", TP0, 5) in kafka.commands)
    await until_async(lambda: TP0 in worker.progress())
    assert store.rows[TP0].owner == worker.lifetimes[0]
    assert await store.heartbeat(lifetime="lt-x", member_id=None, host="h", pid=1,
                                 state="running") == frozenset()
    await asyncio.to_thread(kafka.deliver, records(TP0, 5, 15))
    await until_async(lambda: store.rows[TP0].frontier == 20)
    assert seen == [*range(20), *range(5, 20)]
    worker.request_stop()
    assert await run is ExitCode.OK


async def test_a_reset_after_another_members_claim_still_retires_the_zombie() -> None:
    worker, store, fakes = make()
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    kafka = fakes[0]
    await asyncio.to_thread(kafka.rb.assigned, [TP0])
    await asyncio.to_thread(kafka.deliver, records(TP0, 0, 5))
    await until_async(lambda: kafka.committed(TP0) == 5)
    await store.claim([ClaimRequest(TP0, 0, "tid")], lifetime="intruder")
    store.reset_by_operator(TP0, frontier=0)
    worker.operator_owned({TP0})
    assert await asyncio.wait_for(run, 10) is ExitCode.RETIRED
    assert ("reposition", TP0, 0) not in kafka.commands
    assert store.rows[TP0].owner == "operator:test@host"  # the zombie claimed nothing


async def test_a_hint_for_a_partition_still_held_changes_nothing_durable() -> None:
    worker, store, fakes = make()
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    kafka = fakes[0]
    await asyncio.to_thread(kafka.rb.assigned, [TP0])
    await asyncio.to_thread(kafka.deliver, records(TP0, 0, 5))
    await until_async(lambda: kafka.committed(TP0) == 5)
    epoch = store.rows[TP0].epoch
    worker.operator_owned({TP0, TP1})  # a stale read: TP0 is ours, TP1 not assigned here
    await until_async(lambda: ("reposition", TP0, 5) in kafka.commands)
    await until_async(lambda: TP0 in worker.progress())
    assert store.rows[TP0].epoch == epoch
    await asyncio.to_thread(kafka.deliver, records(TP0, 5, 5))
    await until_async(lambda: kafka.committed(TP0) == 10)
    worker.request_stop()
    assert await run is ExitCode.OK


async def test_a_revoke_during_the_reclaim_starts_no_runner() -> None:
    """The partition leaves (revoke) while the reclaim waits for Kafka's facts: the reclaim
    ends without a claim, a seek or a runner, and the lifetime goes on."""
    worker, store, fakes = make()
    release = threading.Event()
    asked = threading.Event()
    plain_facts = worker.source.facts

    def slow_facts(tps: list[TopicPartition]) -> dict[TopicPartition, SourceFacts]:
        if tps == [TP0] and store.rows[TP0].owner == "operator:test@host":
            asked.set()
            assert release.wait(10)
        return plain_facts(tps)

    worker.source.facts = slow_facts  # type: ignore[method-assign]
    run = asyncio.create_task(worker.run())
    await until_async(lambda: bool(fakes))
    kafka = fakes[0]
    await asyncio.to_thread(kafka.rb.assigned, [TP0, TP1])
    await asyncio.to_thread(kafka.deliver, records(TP0, 0, 5))
    await until_async(lambda: kafka.committed(TP0) == 5)
    reset = store.reset_by_operator(TP0, frontier=0)
    worker.operator_owned({TP0})
    await asyncio.to_thread(asked.wait, 10)
    await asyncio.to_thread(kafka.rb.revoked, [TP0])  # the group moves TP0 elsewhere
    release.set()
    await asyncio.sleep(0.3)
    assert not [c for c in kafka.commands if c[0] == "reposition"]
    assert store.rows[TP0].epoch == reset.epoch  # not claimed by this lifetime
    await asyncio.to_thread(kafka.deliver, records(TP1, 0, 3))
    await until_async(lambda: kafka.committed(TP1) == 3)
    worker.request_stop()
    assert await run is ExitCode.OK
