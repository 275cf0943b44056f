"""consumer.observability.heartbeat:
writes are bounded in rate and carry their own availability bound."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from consumer.observability.heartbeat import (
    MemberHeartbeat,
    MemberIdentity,
    MemberState,
    heartbeat_delay_s,
    state_for_phase,
)
from consumer.observability.readiness import Phase
from fencing.errors import ReadFailed

R, W = MemberState.RUNNING, MemberState.WAITING


@pytest.mark.parametrize(("kw", "expected"), [
    ({"last_write_s": None, "written": None, "wanted": R}, 0.0),
    ({"last_write_s": 99.0, "written": R, "wanted": R}, 4.0),
    ({"last_write_s": 95.0, "written": R, "wanted": R}, 0.0),
    ({"last_write_s": 99.8, "written": R, "wanted": W}, 0.3),
    ({"last_write_s": 99.0, "written": R, "wanted": W}, 0.0),
    ({"last_write_s": 99.0, "written": R, "wanted": W, "failed": True}, 4.0),
])
def test_delay(kw: dict[str, Any], expected: float) -> None:
    got = heartbeat_delay_s(now_s=100.0, interval_s=5.0, min_gap_s=0.5, **kw)
    assert got == pytest.approx(expected)


def test_every_phase_has_a_member_state() -> None:
    assert {state_for_phase(p) for p in Phase} >= {R, W, MemberState.RETIRED}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class RecordingStore:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.fail = False

    async def heartbeat(self, *, lifetime: str, member_id: str | None, host: str, pid: int,
                        state: str, detail: Mapping[str, Any] | None = None) -> None:
        if self.fail:
            raise ReadFailed("down")
        self.rows.append({"lifetime": lifetime, "member_id": member_id, "host": host, "pid": pid,
                          "state": state, "detail": dict(detail or {})})


async def test_writes_only_when_due() -> None:
    clock, store = Clock(), RecordingStore()
    hb = MemberHeartbeat(store=store, identity=MemberIdentity("lt-1", "h", 42), clock=clock,
                         member_id=lambda: "m-1", interval_s=5.0, min_gap_s=0.5)
    assert await hb.tick()  # first write at once
    for _ in range(40):  # a loop ticking every 0.1 s for 4 s writes nothing more
        clock.now += 0.1
        assert not await hb.tick()
    hb.set_state(R)
    assert await hb.tick()  # a state change is written (0.5 s gap passed)
    hb.set_state(W)
    clock.now += 0.2
    assert not await hb.tick()  # ...but never sooner than min_gap_s after the previous write
    clock.now += 0.3
    assert await hb.tick()
    clock.now += 5.0
    assert await hb.tick()  # the interval refreshes last_seen
    assert [r["state"] for r in store.rows] == ["starting", "running", "waiting", "waiting"]
    first = store.rows[0]
    assert first["detail"] == {"heartbeat_interval_s": 5.0, "unavailable_after_s": 15.0}
    assert (first["lifetime"], first["member_id"], first["host"], first["pid"]) == \
        ("lt-1", "m-1", "h", 42)


async def test_failure_backs_off_for_an_interval_and_close_is_final() -> None:
    clock, store = Clock(), RecordingStore()
    hb = MemberHeartbeat(store=store, identity=MemberIdentity("lt-2", "h", 1), clock=clock,
                         interval_s=2.0, min_gap_s=0.1)
    store.fail = True
    assert not await hb.tick()
    hb.set_state(R)
    clock.now += 1.0
    assert not await hb.tick() and hb.delay_s() == pytest.approx(1.0)  # no retry storm
    store.fail = False
    clock.now += 1.0
    assert await hb.tick()
    await hb.close(MemberState.RETIRED, reason="fenced")
    await hb.close()
    hb.set_state(R)
    clock.now += 10
    assert not await hb.tick()
    assert [r["state"] for r in store.rows] == ["running", "retired"]
    assert store.rows[-1]["detail"]["reason"] == "fenced"


async def test_live_detail_is_read_at_each_write() -> None:
    clock, store = Clock(), RecordingStore()
    live: dict[str, Any] = {}
    hb = MemberHeartbeat(store=store, identity=MemberIdentity("lt-3", "h", 1), clock=clock,
                         interval_s=1.0, min_gap_s=0.1, detail={"handler": {"spec": "m:f"}},
                         live_detail=lambda: dict(live))
    assert await hb.tick()
    live["sink_unknown_fields"] = {"s.t": {"records": 2, "fields": ["x"]}}
    clock.now += 1.0
    assert await hb.tick()
    assert "sink_unknown_fields" not in store.rows[0]["detail"]
    assert store.rows[1]["detail"]["sink_unknown_fields"]["s.t"]["records"] == 2
    assert store.rows[1]["detail"]["handler"] == {"spec": "m:f"}
