"""Run one cell of a worker family of the crash-point matrix (``tests.crash.families``:
``reference``, ``sink``, ``failures``) against real services.

Long because the five phases share one cell's processes, proxy and deadlines; the judgement
lives in ``tests.crash.verdict`` and the reads in ``tests.crash.facts``.

Rules
- A cell is fresh: its own topic (3 partitions), group and schema (with the audit trigger of
  ``tests.crash.facts``), and its family's seeded source: for ``reference`` of class
  ``conflict`` (stale and skipped revisions, duplicates, malformed records), for ``sink``
  and ``failures`` that of ``tests.crash.oracles``; A and B run with the family's flags and
  the family's oracle judges the effects.
- Phases run in order, each under its own deadline (``DEADLINES_S``): ``setup``, ``crash``
  (A armed, brought to its point, marker written, A dead or frozen), ``restart`` (a fresh
  process B commits), ``drain`` (every frontier at its high watermark; the zombie is then
  continued and must end), ``assert`` (B stopped with SIGTERM, rows read, oracle). A phase
  past its deadline ends the cell as FAIL naming the phase; nothing waits without a bound.
- Processes are the cell's own, stopped by pid (``WorkerProc.ensure_dead``) whatever happens.
- A failed cell keeps its folder under ``artifacts/crash-matrix/cells/``: both workers' logs,
  the marker and ``cell.json``; a passed cell's folder is removed.
- On the three-node cluster (``cluster``: the matrix's three-node column) the topic has
  replication 3, both workers use the cluster, and the node coordinating the cell's group is
  SIGKILLed as soon as A's marker is written: B takes over during the coordinator's
  failover. The node is started again after the drain (and in ``close`` whatever happens).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient

from consumer.kafka.source import KafkaSource
from fencing.errors import SourceUnavailable
from fencing.postgres.store import PgFenceStore
from fencing.testing.pgproxy import Action
from fencing.types import ClaimRequest, SourceRecord, TopicPartition
from tests.crash.facts import (
    CellFacts,
    install_audit,
    read_completions,
    read_markers,
    read_partitions,
    read_rows,
)
from tests.crash.families import FAILURES, LANES, REFERENCE, SINK, UNCERTAIN, Family
from tests.crash.oracles import (
    UNCERTAIN_FLAGS,
    failing_flags,
    failing_records,
    failures_problems,
    sink_problems,
    sink_records,
    sink_setup,
    uncertain_problems,
)
from tests.crash.plans import CellPlan, Trigger
from tests.crash.verdict import judge
from tests.integration.workers import (
    FENCECTL,
    GROUP_SETUPS,
    ProxyThread,
    WorkerProc,
    create_topic,
    exactly_once_problems,
    fresh_schema,
    generated,
    produce,
    unique,
    wait_until,
)

__all__ = ["BROKEN", "CORRECT", "DEADLINES_S", "CellResult", "Successor", "run_cell"]

ROOT = Path(__file__).resolve().parents[2]
CELLS = ROOT / "artifacts" / "crash-matrix" / "cells"
DEADLINES_S = {"setup": 90.0, "crash": 60.0, "restart": 60.0, "drain": 120.0, "assert": 60.0}
PARTITIONS, RECORDS, SEED = 3, 1200, 11
GAP_TO = 150  # partition 0 of a retention-gap cell loses offsets 0..149
COMMON = ("--batch-max-records", "40")
#: the lanes family: 8 lanes per partition, batches of 5 so several lanes are in flight
LANES_FLAGS = ("--lanes", "8", "--db-concurrency", "8", "--batch-max-records", "5")
SETUP_LIFETIME = "crash-setup"


@dataclass(frozen=True, slots=True)
class Successor:
    """The process started as B: the real ``fencectl`` or a deliberately broken one."""

    name: str
    command: tuple[str, ...]


CORRECT = Successor("fencectl", tuple(FENCECTL))
BROKEN = Successor("kafka-offsets", (sys.executable, "-m", "tests.crash.broken_worker"))


@dataclass(frozen=True, slots=True)
class CellResult:
    point: str
    protocol: str
    passed: bool
    recovery_s: float | None
    problems: tuple[str, ...]
    phase_s: dict[str, float] = field(default_factory=dict)
    bookkeeping: tuple[str, ...] = ()
    kept: str | None = None  # the folder kept for a failed cell
    successor: str = "fencectl"
    three_nodes: bool = False  # the three-node column: a broker killed at the crash point
    family: str = "reference"


class PhaseFailed(Exception):
    """A phase of the cell could not finish (timeout or a process that ended early)."""


class _Clock:
    def __init__(self) -> None:
        self.phase_s: dict[str, float] = {}
        self._deadline = 0.0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        self._deadline = start + DEADLINES_S[name]
        try:
            yield
        except AssertionError as exc:  # wait_until's timeout names what it waited for
            raise PhaseFailed(f"phase {name}: {exc}") from exc
        finally:
            self.phase_s[name] = round(time.monotonic() - start, 2)
        if time.monotonic() > self._deadline:
            raise PhaseFailed(f"phase {name}: over its {DEADLINES_S[name]:.0f} s deadline")

    def left(self) -> float:
        return max(0.5, self._deadline - time.monotonic())


def _db(coro: Any, timeout_s: float) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout=timeout_s)
    return asyncio.run(bounded())


async def _with_conn(dsn: str, fn: Callable[[Any], Any]) -> Any:
    conn = await asyncpg.connect(dsn)
    try:
        return await fn(conn)
    finally:
        await conn.close()


class _Cell:
    """The state of one running cell (see the module Rules)."""

    def __init__(self, services: Any, family: Family, plan: CellPlan, protocol: str,
                 successor: Successor, cluster: Any = None):
        self.s, self.family, self.plan, self.successor = services, family, plan, successor
        self.cluster = cluster
        self.bootstrap = services.kafka_bootstrap if cluster is None else cluster.bootstrap
        self.killed_node: int | None = None  # killed and not yet started again
        self.killed: int | None = None  # the node killed at the crash point, for the record
        self.setup = next(g for g in GROUP_SETUPS if g.name == protocol)
        self.topic, self.group = unique("crash"), unique("gcrash")
        broken = "" if successor is CORRECT else f"--broken-{successor.name}"
        column = protocol if cluster is None else f"3nodes-{protocol}"
        self.dir = CELLS / (f"{family.name}--{plan.point}--{column}{broken}--"
                            f"{uuid.uuid4().hex[:6]}")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.marker = self.dir / "marker.jsonl"
        self.clock = _Clock()
        self.a: WorkerProc | None = None
        self.b: WorkerProc | None = None
        self.proxy: ProxyThread | None = None
        self.rule: Any = None
        self.schema = ""
        self.source: list[SourceRecord] = []
        self.expected: Any = None  # the sink family's fold
        self.gaps: dict[int, int] = {}
        self.a_stopped = False
        self.at_death: tuple[Any, ...] = ()
        self.lanes_at_death: dict[int, Any] = {}

    # -- phases ----------------------------------------------------------------------------
    def prepare(self) -> None:
        create_topic(self.bootstrap, self.topic, PARTITIONS,
                     replication=1 if self.cluster is None else -1)
        if self.family is SINK:
            recs, self.expected = sink_records(self.topic, count=RECORDS, partitions=PARTITIONS)
        elif self.family in (FAILURES, UNCERTAIN):
            recs = failing_records(self.topic)
        else:
            recs, self.source = generated(self.topic, count=RECORDS, partitions=PARTITIONS,
                                          klass="conflict", seed=SEED)
        produce(self.bootstrap, recs)
        self.schema = _db(fresh_schema(self.s.dsn), self.clock.left())
        if self.family is SINK:
            _db(_with_conn(self.s.dsn, lambda c: sink_setup(c, self.schema)), self.clock.left())
        _db(_with_conn(self.s.dsn, lambda c: install_audit(c, self.schema)), self.clock.left())
        if self.plan.retention_gap:
            _db(self._pre_claim(), self.clock.left())
            admin = AdminClient({"bootstrap.servers": self.bootstrap})
            for fut in admin.delete_records([KafkaTP(self.topic, 0, GAP_TO)]).values():
                fut.result(timeout=self.clock.left())
            self.gaps = {0: GAP_TO}
            self.source = [r for r in self.source if r.partition != 0 or r.offset >= GAP_TO]
        if self.plan.hold_commit_reply:
            self.proxy = ProxyThread(self.s.dsn)
            self.rule = self.proxy.add_rule("COMMIT", Action.HOLD_REPLY, times=1, exact=True)

    async def _pre_claim(self) -> None:
        """Rows at frontier 0 before the records below ``GAP_TO`` are deleted: a real gap."""
        store = await PgFenceStore.connect(self.s.dsn, group_id=self.group, schema=self.schema)
        try:
            await store.claim([ClaimRequest(TopicPartition(self.topic, p), 0)
                               for p in range(PARTITIONS)], lifetime=SETUP_LIFETIME)
        finally:
            await store.close()

    def _flags(self) -> tuple[str, ...]:
        own: tuple[str, ...] = ()
        if self.family is SINK:
            own = ("--sink", f"table={self.schema}.acct", "--sink-key", "id")
        elif self.family is FAILURES:
            own = failing_flags()
        elif self.family is UNCERTAIN:
            own = UNCERTAIN_FLAGS
        elif self.family is LANES:
            own = LANES_FLAGS
        return (*COMMON, *own, *(("--allow-retention-gap",) if self.plan.retention_gap
                                 else ()))

    def _kafka_env(self) -> dict[str, str]:
        return {} if self.cluster is None else {"KAFKA_BOOTSTRAP_SERVERS": self.bootstrap}

    def start_a(self) -> None:
        env = {"FENCE_CRASH_AT": self.plan.arm, "FENCE_CRASH_SIGNAL": self.plan.signal_name,
               "FENCE_CRASH_MARKER": str(self.marker), **dict(self.plan.a_env),
               **self._kafka_env()}
        if self.proxy is not None:
            env["FENCE_DSN"] = self.proxy.dsn
        self.a = WorkerProc(topic=self.topic, group=self.group, schema=self.schema,
                            setup=self.setup, extra=(*self._flags(), *self.plan.a_extra),
                            env=env, name="A", log_dir=self.dir)

    def start_b(self) -> None:
        self.b = WorkerProc(topic=self.topic, group=self.group, schema=self.schema,
                            setup=self.setup, extra=self._flags(), name="B", log_dir=self.dir,
                            command=self.successor.command, env=self._kafka_env())

    def _frontiers(self) -> dict[int, int]:
        rows = _db(_with_conn(self.s.dsn, lambda c: read_partitions(
            c, self.schema, self.group, self.topic)), 10)
        return {r.partition: r.frontier for r in rows}

    def crash(self) -> None:
        self.start_a()
        a = self.a
        assert a is not None
        if self.plan.trigger in (Trigger.JOIN, Trigger.SIGTERM):
            wait_until(lambda: sum(self._frontiers().values()) > 0 or self.marker.exists(),
                       timeout_s=self.clock.left(), what="A committing a batch")
            if self.plan.trigger is Trigger.JOIN:
                self.start_b()
            else:
                a.terminate()
        wait_until(lambda: _complete(self.marker) or not a.alive(),
                   timeout_s=self.clock.left(), what=f"A reaching {self.plan.arm}")
        if not _complete(self.marker):
            raise PhaseFailed(f"phase crash: A ended ({a.proc.returncode}) without firing "
                              f"{self.plan.arm}")
        if self.cluster is not None:  # the broker kill at the crash point
            self.killed = self.killed_node = self.cluster.coordinator(self.group)
            self.cluster.kill(self.killed_node)
        if self.plan.signal_name == "STOP":
            self.a_stopped = bool(wait_until(lambda: _proc_state(a.pid) == "T",
                                             timeout_s=5, what="A frozen"))
        else:
            a.wait(self.clock.left())
        self.at_death = _db(_with_conn(self.s.dsn, lambda c: read_partitions(
            c, self.schema, self.group, self.topic)), self.clock.left())
        if self.family is LANES:
            self.lanes_at_death = _db(_with_conn(self.s.dsn, lambda c: read_completions(
                c, self.schema, self.group, self.topic)), self.clock.left())
        if self.rule is not None:
            wait_until(lambda: self.rule.fired.is_set(), timeout_s=min(10, self.clock.left()),
                       what="the proxy holding the COMMIT reply")

    def restart(self) -> None:
        if self.b is None:
            self.start_b()
        assert self.b is not None
        before = sum(r.frontier for r in self.at_death)
        total = sum(self._high_watermarks().values())
        wait_until(lambda: self._b_ok() and (sum(self._frontiers().values()) > before
                                             or before >= total),
                   timeout_s=self.clock.left(), what="B's first commit")

    def _b_ok(self) -> bool:
        assert self.b is not None
        if not self.b.alive() and self.b.proc.returncode != 0:
            raise PhaseFailed(f"B ended early with {self.b.proc.returncode}")
        return True

    def drain(self) -> None:
        hw = self._high_watermarks()
        wait_until(lambda: self._b_ok() and self._frontiers() == hw,
                   timeout_s=self.clock.left(), what=f"frontiers at the high watermarks {hw}")
        if self.plan.trigger is Trigger.ZOMBIE:
            assert self.a is not None
            self.a.signal(signal.SIGCONT)
            self.a.wait(self.clock.left())
        self._restart_node()

    def _restart_node(self) -> None:
        if self.cluster is not None and self.killed_node is not None:
            self.cluster.start(self.killed_node)
            self.killed_node = None

    def _high_watermarks(self) -> dict[int, int]:
        """The topic's high watermarks; on the three-node column read again while a leader
        is still moving (Kafka answers no offset for a leaderless partition meanwhile)."""
        source = KafkaSource({"bootstrap.servers": self.bootstrap})
        tps = [TopicPartition(self.topic, p) for p in range(PARTITIONS)]
        got: dict[TopicPartition, Any] = {}

        def read() -> bool:
            nonlocal got
            try:
                got = source.facts(tps)
            except SourceUnavailable:
                if self.cluster is None:
                    raise
                return False
            return True
        wait_until(read, timeout_s=self.clock.left(), what="the topic's high watermarks",
                   interval_s=1.0)
        return {tp.partition: f.high_watermark for tp, f in got.items()}

    def _b_running(self) -> bool:
        assert self.b is not None
        rows = _db(_with_conn(self.s.dsn, lambda c: read_rows(
            c, self.schema, self.group, self.topic)), 10)["members"]
        return any(m.pid == self.b.pid and m.state == "running" for m in rows)

    def gather(self) -> CellFacts:
        assert self.a is not None and self.b is not None
        # B joined and owns its assignment before it is asked to stop (even when A had
        # left nothing to do): a stop during start-up would say nothing about B
        wait_until(lambda: self._b_ok() and self._b_running(), timeout_s=self.clock.left(),
                   what="B running (member row)")
        self.b.terminate()
        b_exit = self.b.wait(min(30, self.clock.left()))
        oracle = _db(self._oracle(), self.clock.left())
        rows = _db(_with_conn(self.s.dsn, lambda c: read_rows(
            c, self.schema, self.group, self.topic)), self.clock.left())
        final = _db(_with_conn(self.s.dsn, lambda c: read_partitions(
            c, self.schema, self.group, self.topic)), self.clock.left())
        return CellFacts(
            markers=read_markers(self.marker), a_pid=self.a.pid, b_pid=self.b.pid,
            a_exit=self.a.proc.poll(), a_stopped_at_marker=self.a_stopped, b_exit=b_exit,
            at_death=self.at_death, final=final, high_watermarks=self._high_watermarks(),
            lanes_at_death=self.lanes_at_death,
            oracle_problems=tuple(oracle), setup_lifetimes=frozenset({SETUP_LIFETIME}),
            commit_reply_held=None if self.rule is None else self.rule.fired.is_set(), **rows)

    async def _oracle(self) -> list[str]:
        if self.family in (REFERENCE, LANES):
            return await exactly_once_problems(self.s.dsn, self.schema, self.group, self.topic,
                                               self.source)
        conn = await asyncpg.connect(self.s.dsn)
        try:
            if self.family is SINK:
                return await sink_problems(conn, self.schema, self.group, self.expected)
            if self.family is UNCERTAIN:
                return await uncertain_problems(conn, self.schema, self.group, self.topic)
            return await failures_problems(conn, self.schema, self.group, self.topic)
        finally:
            await conn.close()

    def close(self) -> None:
        for w in (self.a, self.b):
            if w is not None:
                w.ensure_dead()
        if self.proxy is not None:
            self.proxy.close()
        self._restart_node()


def run_cell(services: Any, point: str, protocol: str, *, family: Family = REFERENCE,
             successor: Successor = CORRECT, cluster: Any = None) -> CellResult:
    """Run one cell of a worker family (on ``cluster``, the three-node column); never raises
    for a failing cell (its problems say why)."""
    plan = family.plan(point)
    cell = _Cell(services, family, plan, protocol, successor, cluster)
    problems: list[str] = []
    recovery: float | None = None
    bookkeeping: tuple[str, ...] = ()
    facts: CellFacts | None = None
    try:
        for name, step in (("setup", cell.prepare), ("crash", cell.crash),
                           ("restart", cell.restart), ("drain", cell.drain)):
            with cell.clock.phase(name):
                step()
        with cell.clock.phase("assert"):
            facts = cell.gather()
            verdict = judge(plan, facts, gap_partitions=cell.gaps)
        problems.extend(verdict.problems)
        if family is LANES and plan.batch_state and not any(
                m.fields.get("lane") for m in facts.markers):
            problems.append("the lanes family's point fired outside a lane transaction")
        recovery, bookkeeping = verdict.recovery_s, verdict.bookkeeping
    except PhaseFailed as exc:
        problems.append(str(exc))
    except Exception as exc:  # a broken cell is a failed cell, with its reason
        problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        cell.close()
    passed = not problems
    kept = None
    if passed:
        shutil.rmtree(cell.dir, ignore_errors=True)
    else:
        kept = str(cell.dir.relative_to(ROOT))
        (cell.dir / "cell.json").write_text(json.dumps({
            "family": family.name, "point": point, "protocol": protocol,
            "three_nodes": cluster is not None,
            "killed_node": cell.killed, "topic": cell.topic, "group": cell.group,
            "schema": cell.schema, "problems": problems, "phase_s": cell.clock.phase_s,
            "facts": None if facts is None else _jsonable(asdict(facts))}, indent=1,
            default=str))
    return CellResult(point, protocol, passed, None if recovery is None else round(recovery, 2),
                      tuple(problems), dict(cell.clock.phase_s), bookkeeping, kept,
                      successor.name, three_nodes=cluster is not None, family=family.name)


def _complete(marker: Path) -> bool:
    return marker.exists() and marker.read_text().endswith("\n")


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, Sequence) and not isinstance(obj, str):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, frozenset):
        return sorted(obj)
    return obj

