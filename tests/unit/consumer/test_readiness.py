"""consumer.observability.readiness:
the readiness state machine, the loop heartbeat and the HTTP endpoints."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from consumer.observability.instruments import Instruments
from consumer.observability.readiness import (
    ChecksPassed,
    IllegalTransition,
    LoopHeartbeat,
    Phase,
    Positioned,
    ReadinessHolder,
    ReadinessState,
    RebalanceStarted,
    Restarted,
    Retired,
    Revoked,
    Stopping,
    step,
)
from fencing.types import TopicPartition
from ops.worker.http import start_http_server
from ops.worker.telemetry import setup_telemetry

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


def _run(*events: object) -> ReadinessState:
    state = ReadinessState()
    for event in events:
        state = step(state, event)  # type: ignore[arg-type]
    return state


def test_not_ready_before_checks_and_before_first_assignment() -> None:
    assert not _run().ready
    assert _run(ChecksPassed()).phase is Phase.WAITING
    assert not _run(ChecksPassed()).ready


def test_ready_after_assignment_is_positioned() -> None:
    state = _run(ChecksPassed(), RebalanceStarted("assign"), Positioned(frozenset({A, B})))
    assert state.ready and state.assigned == {A, B}


def test_not_ready_during_rebalance_and_eager_revoke_waits_for_assign() -> None:
    ready = _run(ChecksPassed(), RebalanceStarted(), Positioned(frozenset({A, B})))
    during = step(ready, RebalanceStarted("revoke"))
    assert during.phase is Phase.REBALANCING and not during.ready
    revoked = step(during, Revoked(frozenset({A, B})))
    assert not revoked.ready and revoked.assigned == frozenset()
    again = step(step(revoked, RebalanceStarted("assign")), Positioned(frozenset({B})))
    assert again.ready and again.assigned == {B}


def test_incremental_revoke_settles_with_remaining_partitions() -> None:
    ready = _run(ChecksPassed(), RebalanceStarted(), Positioned(frozenset({A, B})))
    state = step(step(ready, RebalanceStarted("revoke")), Revoked(frozenset({A}), settled=True))
    assert state.ready and state.assigned == {B}


def test_empty_assignment_counts_as_positioned() -> None:
    assert _run(ChecksPassed(), RebalanceStarted(), Positioned()).ready


def test_retired_and_stopping_are_terminal() -> None:
    ready = _run(ChecksPassed(), RebalanceStarted(), Positioned(frozenset({A})))
    retired = step(ready, Retired("fenced"))
    assert retired.phase is Phase.RETIRED and not retired.ready and retired.assigned == frozenset()
    assert "fenced" in retired.reason
    for event in (RebalanceStarted(), Positioned(frozenset({A})), ChecksPassed()):
        with pytest.raises(IllegalTransition):
            step(retired, event)
    assert step(retired, Stopping()).phase is Phase.RETIRED
    stopping = step(ready, Stopping())
    assert stopping.phase is Phase.STOPPING
    with pytest.raises(IllegalTransition):
        step(stopping, Positioned(frozenset({A})))
    assert step(stopping, Retired("unresolved")).phase is Phase.RETIRED


def test_restart_after_retirement_waits_for_a_new_assignment() -> None:
    state = _run(ChecksPassed(), RebalanceStarted(), Positioned(frozenset({A})), Retired(),
                 Restarted())
    assert state.phase is Phase.WAITING and not state.ready


def test_illegal_events_leave_the_holder_unchanged() -> None:
    holder = ReadinessHolder()
    with pytest.raises(IllegalTransition):
        holder.apply(Positioned(frozenset({A})))
    assert holder.state == ReadinessState()
    with pytest.raises(IllegalTransition):
        holder.apply(Restarted())
    holder.apply_all([ChecksPassed(), RebalanceStarted(), Positioned(frozenset({A}))])
    assert holder.state.ready


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_loop_heartbeat_bound() -> None:
    clock = FakeClock()
    hb = LoopHeartbeat(clock=clock, bound_s=10)
    assert hb.healthy()  # startup grace
    clock.now += 10
    assert hb.healthy()
    clock.now += 0.5
    assert not hb.healthy() and hb.age_s() == pytest.approx(10.5)
    hb.beat()
    assert hb.healthy()
    hb.stop()
    assert not hb.healthy()
    with pytest.raises(ValueError):
        LoopHeartbeat(clock=clock, bound_s=0)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_http_endpoints_follow_state() -> None:
    tel = setup_telemetry(env={}, service_name="http-unit", set_global=False)
    Instruments(tel.meter()).batch_committed(A, records=4, rejects=0, duration_s=0.01)
    clock = FakeClock()
    holder = ReadinessHolder()
    hb = LoopHeartbeat(clock=clock, bound_s=5)
    server = start_http_server(registry=tel.registry, readiness=holder, heartbeat=hb, port=0)
    try:
        code, body = _get(server.url + "/readyz")
        assert code == 503 and json.loads(body)["phase"] == "starting"
        holder.apply_all([ChecksPassed(), RebalanceStarted(), Positioned(frozenset({A}))])
        code, body = _get(server.url + "/readyz")
        assert code == 200 and json.loads(body) == {
            "ready": True, "phase": "ready", "assigned": ["t[0]"], "stalled": [], "reason": ""}
        assert _get(server.url + "/healthz")[0] == 200
        clock.now += 6
        code, body = _get(server.url + "/healthz")
        assert code == 503 and json.loads(body)["healthy"] is False
        code, body = _get(server.url + "/metrics")
        assert code == 200
        assert b'fence_records_processed_total{partition="0",topic="t"} 4.0' in body
        assert _get(server.url + "/nope")[0] == 404
    finally:
        server.close()
        tel.shutdown(timeout_s=1)


def test_a_client_that_hangs_up_is_not_reported_but_a_failure_is(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A scraper past its timeout closes the connection while ``/metrics`` is written: the
    server's error hook stays quiet for that, and prints any other failure."""
    tel = setup_telemetry(env={}, service_name="hangup", set_global=False)
    server = start_http_server(registry=tel.registry, readiness=ReadinessHolder(),
                               heartbeat=LoopHeartbeat(clock=FakeClock(), bound_s=5), port=0)
    try:
        for exc in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset")):
            try:
                raise exc
            except OSError:
                server._server.handle_error(None, ("127.0.0.1", 1))
        assert capsys.readouterr().err == ""
        try:
            raise ValueError("a bug")
        except ValueError:
            server._server.handle_error(None, ("127.0.0.1", 1))
        assert "ValueError: a bug" in capsys.readouterr().err
    finally:
        server.close()
        tel.shutdown(timeout_s=1)
