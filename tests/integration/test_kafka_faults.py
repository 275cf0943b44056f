"""Kafka faults on the three-node cluster under load, per group protocol (``tests/faults``).

Every scenario: a 6-partition topic (replication 3, min ISR 2) with a backlog, three real
``fencectl run`` members, a fault while they process. The failover scenarios (a SIGKILL of
the group's coordinator, of the active controller, of partition 0's leader; a rolling
restart; a short failover watched by ``fencectl status``) assert that no member exits, the
group drains, effects equal the fold (no duplicate, no loss: the oracle and the handler's
own application counts) and -- once every node is back -- Kafka's own consumer-groups tool
shows lag 0 on every partition. ``two-nodes-down`` asserts the opposite end: past
``--outage-bound-s`` every member exits 5 naming the cluster, and a member started once the
cluster is back resumes exactly at the durable frontier. Each run is recorded
(``tests.faults.report``). ``make test-kafka-faults`` (``FENCE_KAFKA_FAULTS=full``) runs
every scenario under every protocol; ``make test`` runs ``CI_CELLS``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.faults.group import FaultGroup, fault_groups
from tests.faults.report import PROTOCOLS, record
from tests.integration.workers import FENCECTL, ROOT, wait_until

pytestmark = pytest.mark.integration

FULL = os.environ.get("FENCE_KAFKA_FAULTS") == "full"
SCENARIOS = ("coordinator-kill", "controller-kill", "leader-kill", "rolling-restart",
             "short-failover", "two-nodes-down")
BOUND_S = 20  # --outage-bound-s of the two-nodes-down members
#: make test: the coordinator kill and the rolling restart, each under a protocol of its own
#: (make test-kafka-faults runs every scenario under every protocol)
CI_CELLS = (("coordinator-kill", "kip848-consumer"), ("rolling-restart", "cooperative-sticky"))
CELLS = [(s, p) for s in SCENARIOS for p in PROTOCOLS] if FULL else list(CI_CELLS)


@pytest.fixture
def groups(services: Any, cluster: Any) -> Iterator[Callable[..., FaultGroup]]:
    """Makes ``FaultGroup``s on the cluster; stops their members by pid afterwards."""
    with fault_groups(services, cluster) as make:
        yield make


def _kill_role(g: FaultGroup, role: Callable[[], int]) -> dict[str, Any]:
    """SIGKILL the node that has ``role`` now; the group drains without it, then it is
    started again. Returns the measurements."""
    node = role()
    roles = {"coordinator": g.cluster.coordinator(g.group), "leader_p0": g.cluster.leader(
        g.topic, 0)}
    t0 = time.monotonic()
    g.cluster.kill(node)
    drain_s = g.wait_drained(since=t0)
    g.cluster.start(node)
    return {"node": node, "roles": roles, "drain_s": drain_s}


def _rolling_restart(g: FaultGroup) -> dict[str, Any]:
    """Every node stopped (SIGTERM) and started again, one at a time, each healthy and in
    sync before the next, while records keep arriving; the drain time is measured from the
    last node's return."""
    t0 = time.monotonic()
    with g.feeding():
        for node in (1, 2, 3):
            g.cluster.stop(node)
            g.cluster.start(node)
            gone = g.exited()
            assert not gone, f"members exited during the rolling restart: {gone}\n" \
                             f"{g.tails(gone)}"
    restart_s = round(time.monotonic() - t0, 1)
    drain_s = g.wait_drained(since=time.monotonic())
    return {"drain_s": drain_s, "restart_s": restart_s}


def _status(g: FaultGroup) -> dict[str, Any]:
    """``fencectl status --json`` of the group, Kafka facts from the cluster."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KAFKA_BOOTSTRAP_SERVERS": g.cluster.bootstrap}
    done = subprocess.run([*FENCECTL, "status", "--json", "--group", g.group, "--schema",
                           g.schema, "--kafka-timeout-s", "2"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def _short_failover(g: FaultGroup) -> dict[str, Any]:
    """SIGKILL of partition 0's leader; ``fencectl status`` right after it (before Kafka
    elected a new leader) shows what it could not read as unknown, not as lag 0; the
    failover is shorter than the members' stall timeout, which stays silent."""
    node = g.cluster.leader(g.topic, 0)
    t0 = time.monotonic()
    g.cluster.kill(node)
    doc = _status(g)
    status_s = round(time.monotonic() - t0, 1)
    rows = [p for p in doc["partitions"] if p["topic"] == g.topic]
    assert not doc["kafka"]["answered"], doc["kafka"]
    assert rows and all(p["lag"] is None and p["high_watermark"] is None for p in rows), rows
    assert any(t["lag"] is None for t in doc["topics"] if t["topic"] == g.topic), doc["topics"]
    drain_s = g.wait_drained(since=t0)
    g.cluster.start(node)
    stalled = [n for n, w in g.members.items() if "stalled" in w.log()]
    assert not stalled, f"stall detection fired in {stalled}:\n{g.tails(stalled)}"
    return {"node": node, "status_s": status_s, "drain_s": drain_s}


def _two_nodes_down(g: FaultGroup) -> dict[str, Any]:
    """Two of three nodes SIGKILLed for longer than the bound: every member exits 5 naming
    the cluster; once the nodes are back a fresh member resumes exactly at the durable
    frontier (it applies every offset from there, none below it)."""
    survivor = g.cluster.coordinator(g.group) % 3 + 1  # any; not the coordinator
    down = [n for n in (1, 2, 3) if n != survivor]
    t0 = time.monotonic()
    for node in down:
        g.cluster.kill(node)
    wait_until(lambda: len(g.exited()) == len(g.members), timeout_s=BOUND_S + 120,
               what="every member ending past the outage bound", interval_s=1.0)
    exit_s = round(time.monotonic() - t0, 1)
    assert not g.drained(), "the backlog drained before the outage: nothing left to resume"
    codes = g.exited()
    assert set(codes.values()) == {5}, f"{codes}\n{g.tails(codes)}"
    for name, w in g.members.items():
        ended = [ln for ln in w.log().splitlines() if "lifetime ends (exit 5" in ln]
        assert ended and "Kafka did not answer for" in ended[0] \
            and g.cluster.bootstrap in ended[0], f"{name} does not name the cluster:\n{ended}"
    frontiers, before = g.frontiers(), g.applied_offsets()
    g.cluster.start_all()
    g.members.clear()  # the ended members are not part of the drain
    t1 = time.monotonic()
    g.start("d", extra=("--batch-max-records", "500"), env={"FENCE_TEST_BATCH_DELAY_S": "0"})
    drain_s = g.wait_drained(since=t1)
    new = g.applied_offsets() - before
    for p, f in frontiers.items():
        mine = sorted(o for q, o in new if q == p)
        assert not mine or mine[0] == f, f"partition {p}: resumed at {mine[0]}, frontier {f}"
    return {"down": down, "exit_s": exit_s, "drain_s": drain_s, "member_codes": codes}


@pytest.mark.parametrize(("scenario", "protocol"), CELLS, ids=[f"{s}-{p}" for s, p in CELLS])
def test_kafka_fault_under_load(groups: Callable[..., FaultGroup], scenario: str,
                                protocol: str) -> None:
    # a node is killed once every member owns partitions and committed: members started one
    # by one on an idle machine process ~4,000 records by then, so a kill needs a backlog
    # well past twice that to land under load
    kill = {"records": 15000}
    sizes: dict[str, dict[str, Any]] = {
        "coordinator-kill": kill, "controller-kill": kill, "leader-kill": kill,
        "short-failover": kill,
        "rolling-restart": {"records": 3000, "feed": 60000},
        # more than the members can process within the bound (prefetched records are
        # processed while two nodes are down)
        "two-nodes-down": {"records": 30000, "batch": 10, "delay_s": 0.2}}
    g = groups(scenario.split("-")[0], protocol, **sizes.get(scenario, {}))
    measured: dict[str, Any] = {}
    problems: list[str] = []
    exits: dict[str, int] = {}
    dup = lost = None
    try:
        g.prepare()
        bound = ("--outage-bound-s", str(BOUND_S)) if scenario == "two-nodes-down" else ()
        g.start_one_by_one(("a", "b", "c"), extra=bound)
        g.wait_committing()
        if scenario == "coordinator-kill":
            measured = _kill_role(g, lambda: g.cluster.coordinator(g.group))
        elif scenario == "controller-kill":
            measured = _kill_role(g, g.cluster.controller)
        elif scenario == "leader-kill":
            measured = _kill_role(g, lambda: g.cluster.leader(g.topic, 0))
        elif scenario == "short-failover":
            measured = _short_failover(g)
        elif scenario == "two-nodes-down":
            measured = _two_nodes_down(g)
        else:
            measured = _rolling_restart(g)
        exits = g.exited()
        assert not exits, f"members exited: {exits}\n{g.tails(exits)}"
        measured["kafka_lags"] = g.wait_kafka_lag_zero()
        stopped = g.stop_all()
        assert all(code == 0 for code in stopped.values()), stopped
        dup, lost = g.applications()
        problems = g.oracle()
        assert (dup, lost) == (0, 0), f"duplicates {dup}, losses {lost}"
        assert problems == [], problems[:10]
    except Exception as exc:
        problems = [f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}", *problems]
        raise
    finally:
        record(scenario, g.protocol, passed=not problems and not exits,
               member_exits=exits, drain_s=measured.get("drain_s"), duplicates=dup,
               losses=lost, problems=problems,
               **{k: v for k, v in measured.items() if k not in ("drain_s", "kafka_lags")})
