"""Static membership (``--instance-id``, librdkafka ``group.instance.id``) per group protocol:
what a restarted member gets back and when, a frozen old process with the same id, and a
rolling restart of three members with and without it (docs/kafka-failures.md).

Classic members use a 20 s session here (``tests.faults.group.CLASSIC_SESSION``): static
membership keeps a member's partitions for it while the group waits for its session, so a
session shorter than a restart would give nothing to measure. KIP-848's session is the
broker's (6 s on the local stack). Each run is recorded (``tests.faults.report``);
``make test`` runs the static kill + restart under ``CI_PROTOCOL`` only, ``make
test-kafka-faults`` everything under every protocol.
"""

from __future__ import annotations

import ast
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.faults.group import FaultGroup, fault_groups
from tests.faults.report import PROTOCOLS, record
from tests.integration.workers import WorkerProc, wait_until

pytestmark = pytest.mark.integration

FULL = os.environ.get("FENCE_KAFKA_FAULTS") == "full"
CI_PROTOCOL = "cooperative-sticky"
RUN_PROTOCOLS = PROTOCOLS if FULL else (CI_PROTOCOL,)


@pytest.fixture
def groups(services: Any) -> Iterator[Callable[..., FaultGroup]]:
    """Makes ``FaultGroup``s on the session's one-node Kafka; stops their members by pid
    afterwards."""
    with fault_groups(services, None) as make:
        yield make


def _owned(w: WorkerProc) -> list[int]:
    """The partitions ``w`` owns now by its log: assigned, minus revoked and lost since (an
    incremental assignment logs only what it adds)."""
    owned: set[int] = set()
    for line in w.log().splitlines():
        for event in (" assigned ", " revoked ", " lost "):
            if event + "{'partitions': " in line:
                parts = ast.literal_eval(line.split(event, 1)[1])["partitions"]
                nums = {int(p.rsplit("[", 1)[1].rstrip("]")) for p in parts}
                owned = owned | nums if event == " assigned " else owned - nums
    return sorted(owned)


def _back_after(g: FaultGroup, partitions: list[int], since: float, before: dict[int, int],
                *, timeout_s: float = 120.0) -> float:
    """Seconds from ``since`` until every one of ``partitions`` committed past ``before``."""
    wait_until(lambda: all(g.frontiers().get(p, 0) > before.get(p, 0) for p in partitions),
               timeout_s=timeout_s, what=f"partitions {partitions} processing again",
               interval_s=0.2)
    return round(time.monotonic() - since, 1)


@pytest.mark.parametrize("static", [True, pytest.param(False, marks=pytest.mark.kafka_faults)],
                         ids=["static", "dynamic"])
@pytest.mark.parametrize("protocol", RUN_PROTOCOLS)
def test_a_killed_member_restarted_at_once(groups: Callable[..., FaultGroup], protocol: str,
                                           static: bool) -> None:
    """SIGKILL of a member under a backlog, restarted at once (with the same ``--instance-id``
    when static): how long its partitions stay idle. Static classic members get them back
    without waiting for the session; KIP-848 refuses the id until the broker expires the
    killed member's session (UNRELEASED_INSTANCE_ID, fatal in librdkafka), and the
    restarted worker keeps joining until then instead of exiting."""
    g = groups("restart", protocol, partitions=4, records=8000, batch=20, delay_s=0.1)
    ids = {"a": ("--instance-id", "member-a"), "b": ("--instance-id", "member-b")}
    problems: list[str] = []
    idle_s: float | None = None
    try:
        g.prepare()
        for name in ("a", "b"):
            g.start(name, extra=ids[name] if static else ())
        g.wait_committing()
        wait_until(lambda: _owned(g.members["a"]) and _owned(g.members["b"]) and set(
            _owned(g.members["a"]) + _owned(g.members["b"])) == set(range(g.partitions)),
            timeout_s=60, what="the group settled: a and b own every partition between them")
        owned = _owned(g.members["a"])
        before = g.frontiers()
        t0 = time.monotonic()
        killed = g.members.pop("a")
        killed.kill()
        killed.wait(30)
        g.start("a2", extra=ids["a"] if static else ())
        idle_s = _back_after(g, owned, t0, before)
        g.wait_drained(since=t0)
        assert g.stop_all() == {"a2": 0, "b": 0}
        assert g.applications() == (0, 0) and g.oracle() == []
        if static and protocol != "kip848-consumer":
            assert idle_s < 15, f"static member back after {idle_s} s (session 20 s)"
    except Exception as exc:
        problems.append(f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}")
        raise
    finally:
        record(f"kill+restart ({'static' if static else 'dynamic'})", protocol,
               passed=not problems, member_exits={}, drain_s=None, duplicates=None,
               losses=None, problems=problems, pause_s=idle_s)


@pytest.mark.kafka_faults
@pytest.mark.parametrize("protocol", RUN_PROTOCOLS)
def test_a_frozen_member_replaced_by_its_instance_id_is_fenced_twice(
        groups: Callable[..., FaultGroup], protocol: str) -> None:
    """A member frozen (SIGSTOP) mid-backlog and replaced by a process with the same
    ``--instance-id``: the replacement processes; the frozen one, continued, applies nothing
    more (the epoch fences its batch) and ends with exit 3 (Kafka fences its id too)."""
    g = groups("frozen", protocol, partitions=2, records=4000, batch=20, delay_s=0.1,
               extra=("--db-idle-in-transaction-timeout-s", "2"))
    g.prepare()
    old = g.start("old", extra=("--instance-id", "member-x"))
    g.wait_committing()
    old.signal(signal.SIGSTOP)
    t0 = time.monotonic()
    new = g.start("new", extra=("--instance-id", "member-x"))
    before = g.frontiers()
    _back_after(g, [0, 1], t0, before, timeout_s=120)
    old.signal(signal.SIGCONT)
    code = old.wait(60)
    assert code == 3, g.tails(["old"])
    assert "InstanceFenced" in old.log() or "Fenced" in old.log(), g.tails(["old"])
    g.members.pop("old")
    g.wait_drained(since=t0)
    assert new.alive(), g.tails(["new"])
    new.terminate()
    assert new.wait(30) == 0
    assert g.applications() == (0, 0) and g.oracle() == []


@pytest.mark.kafka_faults
def test_kip848_refuses_an_instance_id_in_use_and_the_worker_waits_for_it(
        groups: Callable[..., FaultGroup]) -> None:
    """A second process with the id of a live KIP-848 member: the broker answers
    UNRELEASED_INSTANCE_ID (fatal in librdkafka); the worker joins again with a fresh
    consumer, logging why, and past --outage-bound-s ends with exit 5 naming the id; the
    first member is undisturbed."""
    g = groups("dupid", "kip848-consumer", partitions=2, records=4000, batch=20, delay_s=0.1)
    g.prepare()
    first = g.start("first", extra=("--instance-id", "member-dup"))
    g.wait_committing()
    t0 = time.monotonic()
    second = g.start("second", extra=("--instance-id", "member-dup", "--outage-bound-s", "8"))
    code = second.wait(120)
    took_s = time.monotonic() - t0
    log = second.log()
    assert code == 5, g.tails(["second"])
    assert log.count("is still held by an earlier member") >= 2, g.tails(["second"])
    assert "--instance-id member-dup: still held by another member of the group" in log
    assert took_s >= 8
    assert first.alive()
    g.members.pop("second")
    g.wait_drained(since=t0)
    assert g.stop_all() == {"first": 0}
    assert g.applications() == (0, 0)


def _rolling(g: FaultGroup, static: bool) -> float:
    """Restart a, b, c one at a time (SIGTERM, then the same process again); the pause of
    each restart is the time until every partition committed past where it was at the
    SIGTERM; returns their sum."""
    total = 0.0
    for name in ("a", "b", "c"):
        w = g.members.pop(name)
        before = g.frontiers()
        t0 = time.monotonic()
        w.terminate()
        assert w.wait(60) == 0, w.log()[-3000:]
        g.start(name, extra=("--instance-id", f"member-{name}") if static else ())
        total += _back_after(g, list(range(g.partitions)), t0, before)
    return round(total, 1)


@pytest.mark.kafka_faults
@pytest.mark.parametrize("static", [True, False], ids=["static", "dynamic"])
@pytest.mark.parametrize("protocol", RUN_PROTOCOLS)
def test_rolling_restart_of_three_members(groups: Callable[..., FaultGroup], protocol: str,
                                          static: bool) -> None:
    g = groups("deploy", protocol, partitions=6, records=3000, feed=60000, batch=20,
               delay_s=0.1)
    problems: list[str] = []
    pause = None
    exits: dict[str, int] = {}
    try:
        g.prepare()
        for name in ("a", "b", "c"):
            g.start(name, extra=("--instance-id", f"member-{name}") if static else ())
        g.wait_committing()
        with g.feeding():
            pause = _rolling(g, static)
        g.wait_drained(since=time.monotonic())
        exits = g.exited()
        assert not exits, g.tails(exits)
        assert all(c == 0 for c in g.stop_all().values())
        assert g.applications() == (0, 0) and g.oracle() == []
    except Exception as exc:
        problems.append(f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}")
        raise
    finally:
        record(f"rolling restart of members ({'static' if static else 'dynamic'})", protocol,
               passed=not problems, member_exits=exits, drain_s=None, duplicates=None,
               losses=None, problems=problems, pause_s=pause)
