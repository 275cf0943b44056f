"""Handler failures that blame the right record, with real Kafka, PostgreSQL and
``fencectl run`` processes restarted by a supervisor (``tests.integration.handlers``).

- Killers, poison and flaky records on a 5,000-record topic over 3 partitions, two members:
  every good record applied once; only the killers (``ProcessDeath``) and the poison records
  (``ValueError``) quarantined; no death counted against an innocent record.
- An ``outcome-uncertain`` handler making one external effect per record over its own
  connection, process-killing records and SIGKILLs of the members: no external effect made
  twice; every record applied once or quarantined as outcome unknown.

``make test`` runs each scenario once (cooperative-sticky; the uncertain one with KIP-848);
``make test-handler-blame`` (``FENCE_BLAME_RUNS=5``) runs the first one 5 times under each of
the three group protocols and the second 5 times. Each run's counts go to
``artifacts/handler-blame/<scenario>.jsonl``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from confluent_kafka import Producer

from tests.integration.workers import (
    GROUP_SETUPS,
    GroupSetup,
    WorkerProc,
    create_topic,
    durable_rows,
    fresh_schema,
    unique,
    wait_until,
)

pytestmark = pytest.mark.integration

RUNS = int(os.environ.get("FENCE_BLAME_RUNS", "0"))  # 0: the representative subset
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "handler-blame"
SETUPS = {s.name: s for s in GROUP_SETUPS}

PARTITIONS, TOTAL = 3, 5000
KILLERS = {(0, 700), (2, 1210)}
POISON = {(0, 40), (0, 901), (1, 5), (1, 777), (1, 1500), (2, 0), (2, 333), (2, 1209),
          (2, 1600)}
FLAKY = {(0, 1000), (1, 250), (1, 1400), (2, 60), (2, 1300)}
MAX_ATTEMPTS = 3


def _cases(default: list[str], runs: int) -> list[Any]:
    if not runs:
        return [pytest.param(name, 0, id=name) for name in default]
    return [pytest.param(name, n, id=f"{name}-run{n}") for name in SETUPS for n in range(runs)]


def _produce(bootstrap: str, topic: str, per_partition: dict[int, int]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                  "linger.ms": 5})
    for part, count in per_partition.items():
        for o in range(count):
            while True:
                try:
                    p.produce(topic, f"v{o}".encode(), f"k{o}".encode(), partition=part)
                    break
                except BufferError:
                    p.poll(0.05)
    assert p.flush(60) == 0


def _split(total: int) -> dict[int, int]:
    base, extra = divmod(total, PARTITIONS)
    return {p: base + (1 if p < extra else 0) for p in range(PARTITIONS)}


async def _fetch(dsn: str, sql: str, *args: Any) -> list[Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


def _counts(dsn: str, schema: str, table: str, topic: str) -> dict[tuple[int, int], int]:
    rows = asyncio.run(_fetch(dsn, f'SELECT partition, "offset", n FROM "{schema}".{table} '
                                   "WHERE topic = $1", topic))
    return {(r["partition"], r["offset"]): r["n"] for r in rows}


def _quarantine(dsn: str, schema: str, group: str) -> dict[tuple[int, int], Any]:
    rows = asyncio.run(_fetch(dsn, f'SELECT partition, "offset", reason, error_type FROM '
                                   f'"{schema}".quarantine WHERE group_id = $1', group))
    return {(r["partition"], r["offset"]): r for r in rows}


def _left(dsn: str, schema: str, table: str, group: str) -> int:
    return len(asyncio.run(_fetch(dsn, f'SELECT 1 FROM "{schema}".{table} WHERE group_id = $1',
                                  group)))


def _report(scenario: str, entry: dict[str, Any]) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with open(ARTIFACTS / f"{scenario}.jsonl", "a") as out:
        out.write(json.dumps(entry) + "\n")


# A member's ends a supervisor restarts besides its deaths: 3 (retired: e.g. fenced after a
# session timeout of a starved process) and 5 (Kafka or PostgreSQL unavailable). Any other
# end (1: a bug or a handler declared to stop; 2, 4, 6) fails the test.
RESTARTABLE = (3, 5)


@dataclass
class Supervisor:
    """Two members; a member that ended is started again ``restart_s`` later (as systemd's
    ``Restart=always`` would). SIGKILLs are its deaths; other ends are ``RESTARTABLE`` or
    fail the test."""

    services: Any
    topic: str
    group: str
    schema: str
    setup: GroupSetup
    extra: tuple[str, ...]
    restart_s: float = 1.0
    members: dict[str, WorkerProc] = field(default_factory=dict)
    dead_since: dict[str, float] = field(default_factory=dict)
    deaths: list[tuple[str, float]] = field(default_factory=list)
    other_ends: list[int] = field(default_factory=list)
    started: int = 0

    def start(self, name: str) -> None:
        self.members[name] = WorkerProc(topic=self.topic, group=self.group, schema=self.schema,
                                        setup=self.setup, name=f"{name}{self.started}",
                                        extra=self.extra)
        self.started += 1

    def tick(self) -> None:
        now = time.monotonic()
        for name, w in list(self.members.items()):
            if name in self.dead_since:
                if now - self.dead_since[name] >= self.restart_s:
                    del self.dead_since[name]
                    self.start(name)
            elif not w.alive():
                code = w.wait(1)
                if code == -signal.SIGKILL:
                    self.deaths.append((name, now))
                else:
                    assert code in RESTARTABLE, f"{name} exited {code}: {w.log()[-4000:]}"
                    self.other_ends.append(code)
                self.dead_since[name] = now

    def kill(self, name: str) -> None:
        """SIGKILL ``name`` and count its death now: a kill in the poll that also sees every
        partition complete must not leave ``stop_all`` a dead member to wait for."""
        w = self.members[name]
        w.kill()
        w.wait(10)
        self.deaths.append((name, time.monotonic()))
        self.dead_since[name] = time.monotonic()

    def stop_all(self) -> None:
        """SIGTERM every running member once it is up (a process killed before it installed
        its handlers would end -15), then each must exit 0."""
        for name, w in self.members.items():
            if name not in self.dead_since:
                wait_until(partial(_up, w), timeout_s=60, what=f"{name} started")
        for name, w in self.members.items():
            if w.alive() and name not in self.dead_since:
                w.terminate()
        for name, w in self.members.items():
            if name not in self.dead_since:
                code = w.wait(30)
                assert code == 0, f"{name} exited {code}: {w.log()[-4000:]}"

    def ensure_dead(self) -> None:
        for w in self.members.values():
            w.ensure_dead()


def _up(w: WorkerProc) -> bool:
    return "worker starting" in w.log() or not w.alive()


def _complete(services: Any, schema: str, group: str, topic: str,
              ends: dict[int, int]) -> bool:
    rows = asyncio.run(durable_rows(services.dsn, schema, group, topic))
    return {p: f for p, (_e, f) in rows.items()} == ends


@pytest.mark.parametrize("setup_name, run", _cases(["cooperative-sticky"], RUNS))
def test_killers_poison_and_flaky_records_blame_only_the_guilty(
        services: Any, setup_name: str, run: int) -> None:
    topic, group = unique("blame"), unique("gblame")
    ends = _split(TOTAL)
    create_topic(services.kafka_bootstrap, topic, PARTITIONS)
    _produce(services.kafka_bootstrap, topic, ends)
    schema = asyncio.run(fresh_schema(services.dsn))

    def at(points: set[tuple[int, int]]) -> str:
        return ",".join(f"{p}:{o}" for p, o in sorted(points))

    extra = ("--handler", "tests.integration.handlers:failing_handler",
             "--handler-setting", f"kill={at(KILLERS)}",
             "--handler-setting", f"poison={at(POISON)}",
             "--handler-setting", f"deadlock={at(FLAKY)}",
             "--max-attempts", str(MAX_ATTEMPTS), "--retry-initial-ms", "50")
    sup = Supervisor(services, topic, group, schema, SETUPS[setup_name], extra)
    t0 = time.monotonic()
    try:
        sup.start("a")
        sup.start("b")

        def done() -> bool:
            sup.tick()
            return _complete(services, schema, group, topic, ends)

        wait_until(done, timeout_s=420, what="every partition complete", interval_s=0.2)
        drained_s = time.monotonic() - t0
        sup.stop_all()
    finally:
        sup.ensure_dead()
    applied = _counts(services.dsn, schema, "applied", topic)
    quarantine = _quarantine(services.dsn, schema, group)
    _report("killers", {"setup": setup_name, "run": run, "deaths": len(sup.deaths),
                        "other_ends": sup.other_ends,
                        "processes": sup.started, "drained_s": round(drained_s, 1),
                        "quarantined": sorted(quarantine),
                        "applied_twice": sorted(k for k, n in applied.items() if n > 1)})
    bad = KILLERS | POISON
    assert sorted(quarantine) == sorted(bad), sorted(set(quarantine) ^ bad)
    for at_, q in quarantine.items():
        expected = "ProcessDeath" if at_ in KILLERS else "ValueError"
        assert q["error_type"] == expected, (at_, dict(q))
    assert all("killed the process" in quarantine[k]["reason"] for k in KILLERS)
    assert applied == {(p, o): 1 for p, n in ends.items() for o in range(n)
                       if (p, o) not in bad}
    assert _left(services.dsn, schema, "attempts", group) == 0
    # each killer: --max-attempts deaths while it was alone in flight, plus at most one in a
    # batch of several records (its partition is then suspect for every later owner)
    assert len(sup.deaths) <= len(KILLERS) * (MAX_ATTEMPTS + 1), sup.deaths


UNCERTAIN_TOTAL = 1500
UNCERTAIN_KILLERS = {(0, 120), (2, 300)}


@pytest.mark.parametrize("run", list(range(RUNS)) or [0])
def test_outcome_uncertain_effects_are_never_made_twice(services: Any, run: int) -> None:
    topic, group = unique("uncertain"), unique("guncertain")
    ends = _split(UNCERTAIN_TOTAL)
    create_topic(services.kafka_bootstrap, topic, PARTITIONS)
    _produce(services.kafka_bootstrap, topic, ends)
    schema = asyncio.run(fresh_schema(services.dsn))
    kills = ",".join(f"{p}:{o}" for p, o in sorted(UNCERTAIN_KILLERS))
    extra = ("--handler", "tests.integration.handlers:uncertain_handler",
             "--handler-setting", f"kill={kills}", "--batch-max-records", "50")
    sup = Supervisor(services, topic, group, schema, SETUPS["kip848-consumer"], extra)
    rng = random.Random(run)
    sigkills: list[int] = []
    try:
        sup.start("a")
        sup.start("b")
        marks = sorted(rng.uniform(0.15, 0.85) for _ in range(3))  # of the records applied

        def done() -> bool:
            sup.tick()
            rows = asyncio.run(durable_rows(services.dsn, schema, group, topic))
            committed = sum(f for _e, f in rows.values())
            if marks and committed >= marks[0] * UNCERTAIN_TOTAL:
                live = [n for n, w in sup.members.items()
                        if n not in sup.dead_since and w.alive()]
                if live:
                    marks.pop(0)
                    victim = rng.choice(live)
                    sup.kill(victim)
                    sigkills.append(committed)
            return {p: f for p, (_e, f) in rows.items()} == ends

        wait_until(done, timeout_s=300, what="every partition complete", interval_s=0.1)
        sup.stop_all()
    finally:
        sup.ensure_dead()
    external = _counts(services.dsn, schema, "external", topic)
    applied = _counts(services.dsn, schema, "applied", topic)
    quarantine = _quarantine(services.dsn, schema, group)
    _report("uncertain", {"run": run, "deaths": len(sup.deaths), "sigkills_at": sigkills,
                          "other_ends": sup.other_ends,
                          "quarantined": len(quarantine),
                          "external_twice": sorted(k for k, n in external.items() if n > 1)})
    assert len(sigkills) == 3
    assert sorted(k for k, n in external.items() if n > 1) == []
    everything = {(p, o) for p, n in ends.items() for o in range(n)}
    assert set(applied) | set(quarantine) == everything
    assert not set(applied) & set(quarantine)
    assert all(n == 1 for n in applied.values())
    assert UNCERTAIN_KILLERS <= set(quarantine)
    for at_, q in quarantine.items():
        assert q["error_type"] == "OutcomeUnknown" and "outcome unknown" in q["reason"], \
            (at_, dict(q))
    assert _left(services.dsn, schema, "attempts", group) == 0
