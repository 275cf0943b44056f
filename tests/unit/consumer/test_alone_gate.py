"""The process-wide gate: shared entries side by side, a record tried alone with nothing else
in flight, alone requests first, waits that end once stopped."""

from __future__ import annotations

import asyncio

from consumer.alone_gate import AloneGate


async def test_alone_waits_for_shared_and_new_shared_waits_for_alone() -> None:
    gate = AloneGate(poll_s=0.01)
    assert gate.try_shared() and gate.try_shared()
    alone = asyncio.create_task(gate.alone(lambda: False))
    await asyncio.sleep(0.02)
    assert not alone.done() and gate.alone_busy
    assert not gate.try_shared()  # an alone request waits: no new shared entry
    late_shared = asyncio.create_task(gate.shared(lambda: False))
    gate.release_shared()
    await asyncio.sleep(0.02)
    assert not alone.done()  # one shared entry is still in
    gate.release_shared()
    assert await asyncio.wait_for(alone, 1) is True
    await asyncio.sleep(0.02)
    assert not late_shared.done()  # nothing starts while the record is alone
    gate.release_alone()
    assert await asyncio.wait_for(late_shared, 1) is True
    gate.release_shared()
    assert not gate.alone_busy and gate.try_shared()


async def test_two_alone_requests_take_turns() -> None:
    gate = AloneGate(poll_s=0.01)
    inside: list[int] = []
    peak = 0

    async def one(n: int) -> None:
        nonlocal peak
        assert await gate.alone(lambda: False)
        inside.append(n)
        peak = max(peak, len(inside))
        await asyncio.sleep(0.01)
        inside.remove(n)
        gate.release_alone()

    await asyncio.wait_for(asyncio.gather(*(one(n) for n in range(4))), 2)
    assert peak == 1


async def test_waits_end_once_stopped_and_a_given_up_alone_lets_shared_go_on() -> None:
    gate = AloneGate(poll_s=0.01)
    assert gate.try_shared()
    stop = {"alone": False}
    alone = asyncio.create_task(gate.alone(lambda: stop["alone"]))
    await asyncio.sleep(0.02)
    assert not gate.try_shared()
    stop["alone"] = True
    assert await asyncio.wait_for(alone, 1) is False  # not entered
    assert gate.try_shared()  # nothing waits any more
    gate.release_shared()
    gate.release_shared()
    assert await gate.alone(lambda: False)
    assert await asyncio.wait_for(gate.shared(lambda: True), 1) is False
    gate.release_alone()


async def test_alone_requests_are_served_in_turn_so_no_window_starves() -> None:
    """Two partitions each try records alone in a loop: the one that asks again right after
    its attempt queues behind the other, so they alternate."""
    gate = AloneGate(poll_s=0.01)
    order: list[int] = []

    async def window(p: int) -> None:
        for _ in range(5):
            assert await gate.alone(lambda: False)
            order.append(p)
            await asyncio.sleep(0)
            gate.release_alone()

    await asyncio.wait_for(asyncio.gather(window(0), window(1)), 2)
    assert order == [0, 1] * 5
