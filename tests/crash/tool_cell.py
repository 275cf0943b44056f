"""Run one cell of a tool family (``replay``, ``reset``; ``tests.crash.families``): the
operator tool is killed inside its transaction, then run again.

Rules
- A cell is fresh: its own topic (3 partitions of ``RECORDS`` records), group and schema
  (with the audit trigger of ``tests.crash.facts``). Worker W (the failing handler of
  ``tests.crash.oracles``, the cell's group protocol) drains it and keeps running: the
  operator acts on a live group.
- ``replay``: W quarantines ``REPLAY_POISON``; the operator replays the group's quarantine
  with the handler fixed for the first record only (``--handler-setting poison=`` the
  second). Killed at ``in-replay`` (the first record applied and its row marked, before
  COMMIT); then the same command twice.
- ``reset``: ``fencectl reset frontier`` of partition 0 back to ``RESET_TO`` under one
  ``--operation-id``, killed at ``in-reset`` (rows moved and journaled, before COMMIT); then
  the same command twice. W, running, claims the partition again and re-applies from
  ``RESET_TO``.
- Phases and deadlines as ``tests.crash.cell``; ``judge_tool`` is pure over ``ToolFacts``.
- What PASS means: the point fired once, in the tool, which died by SIGKILL; nothing of its
  transaction is durable at its death; the first run again applies it (replay: exit 1, the
  second record fails again; reset: exit 0), the second run applies nothing (replay exit 1,
  reset exit 1 "already applied"); then the family's oracle (``judge_tool``); W stops with
  exit 0, every frontier at its high watermark.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from ops.operator.reset_plan import journal_prefix
from ops.reference.generate import GeneratedRecord
from tests.crash.cell import CELLS, ROOT, CellResult, PhaseFailed, _Clock, _complete, _db
from tests.crash.facts import install_audit, read_markers, read_partitions
from tests.crash.families import Family
from tests.crash.oracles import applied_counts, counts_problems, failing_flags
from tests.integration.observability_support import run_fencectl
from tests.integration.workers import (
    GROUP_SETUPS,
    WorkerProc,
    create_topic,
    fresh_schema,
    produce,
    unique,
    wait_until,
)

__all__ = ["REPLAY_POISON", "RESET_TO", "ToolFacts", "judge_tool", "run_tool_cell"]

PARTITIONS, RECORDS = 3, 120
REPLAY_POISON = ((0, 30), (1, 40))  # the first is fixed by the replay's handler
RESET_TO = 50  # partition 0's frontier after the reset


@dataclass(frozen=True, slots=True)
class ToolFacts:
    """What ``judge_tool`` judges (rows as plain tuples)."""

    markers: int
    marker_point: str | None
    tool_exits: tuple[int, ...]  # the killed run, then the two runs again
    outputs: tuple[str, ...]
    w_exit: int | None
    frontiers: Mapping[int, int]
    high_watermarks: Mapping[int, int]
    applied_at_death: Mapping[tuple[int, int], int]
    applied: Mapping[tuple[int, int], int]
    # replay: (partition, offset) -> (state, replays, reason) at A's death and at the end
    quarantine_at_death: Mapping[tuple[int, int], tuple[str, int, str]] = field(
        default_factory=dict)
    quarantine: Mapping[tuple[int, int], tuple[str, int, str]] = field(default_factory=dict)
    replay_journal: Sequence[str] = ()  # journal 'replay' details
    # reset: the journal rows of the operation, the frontier moves back per partition
    operation_rows_at_death: int = 0
    operation_rows: int = 0
    moves_back: Mapping[int, int] = field(default_factory=dict)


def _every() -> dict[tuple[int, int], int]:
    return {(p, o): 1 for p in range(PARTITIONS) for o in range(RECORDS)}


def _expected_counts(family: str) -> dict[tuple[int, int], int]:
    every = _every()
    if family == "replay":
        every.pop(REPLAY_POISON[1])  # still failing: never applied
        return every
    return {k: n + (k[0] == 0 and k[1] >= RESET_TO) for k, n in every.items()}


def judge_tool(family: str, f: ToolFacts) -> list[str]:
    """The tool family's verdict (see the module Rules)."""
    problems: list[str] = []
    point = {"replay": "in-replay", "reset": "in-reset"}[family]
    if (f.markers, f.marker_point) != (1, point):
        problems.append(f"{f.markers} markers of {f.marker_point}, expected one of {point}")
    want = (-9, 1, 1) if family == "replay" else (-9, 0, 1)
    if f.tool_exits != want:
        problems.append(f"tool exits {f.tool_exits}, expected {want}")
    if family == "reset" and "already applied" not in (f.outputs[2:3] or ("",))[0]:
        problems.append(f"the third reset run did not say 'already applied': {f.outputs[2:]}")
    if f.w_exit != 0:
        problems.append(f"worker W ended with {f.w_exit}, expected 0")
    if dict(f.frontiers) != dict(f.high_watermarks):
        problems.append(f"frontiers {dict(f.frontiers)}, high watermarks "
                        f"{dict(f.high_watermarks)}")
    if family == "replay":
        if any(f.applied_at_death.get(k) for k in REPLAY_POISON):
            problems.append("a replayed record is applied at the tool's death (its "
                            "transaction was not committed)")
        if any(v[:2] != ("quarantined", 0) for v in f.quarantine_at_death.values()) \
                or set(f.quarantine_at_death) != set(REPLAY_POISON):
            problems.append(f"quarantine at the tool's death {dict(f.quarantine_at_death)}: "
                            "expected both rows quarantined, never replayed")
        fixed, bad = (f.quarantine.get(k) for k in REPLAY_POISON)
        if fixed is None or fixed[:2] != ("replayed", 1):
            problems.append(f"the fixed record's row {fixed}: expected replayed once")
        if bad is None or bad[:2] != ("quarantined", 2) or "ValueError" not in bad[2]:
            problems.append(f"the still failing record's row {bad}: expected quarantined "
                            "with its ValueError, replayed (and failed) twice")
        applied = [d for d in f.replay_journal
                   if d.startswith(f"offset={REPLAY_POISON[0][1]} applied")]
        if len(applied) != 1:
            problems.append(f"{len(applied)} journal rows of the fixed record applied, "
                            "expected 1")
    else:
        if f.operation_rows_at_death:
            problems.append(f"{f.operation_rows_at_death} journal rows of the operation at "
                            "the tool's death (its transaction was not committed)")
        if counts_problems(f.applied_at_death, _every()):
            problems.append("records applied again before the reset committed")
        if f.operation_rows != 1:
            problems.append(f"{f.operation_rows} journal rows of the operation, expected 1")
        if dict(f.moves_back) != {0: 1}:
            problems.append(f"frontier moved back {dict(f.moves_back)} times per partition, "
                            "expected once on partition 0")
    problems += counts_problems(f.applied, _expected_counts(family))
    return problems


class _ToolCell:
    def __init__(self, services: Any, family: Family, protocol: str) -> None:
        self.s, self.family, self.clock = services, family, _Clock()
        self.setup = next(g for g in GROUP_SETUPS if g.name == protocol)
        self.topic, self.group = unique("crasht"), unique("gcrasht")
        self.dir = CELLS / f"{family.name}--{protocol}--{uuid.uuid4().hex[:6]}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.marker = self.dir / "marker.jsonl"
        self.schema = ""
        self.w: WorkerProc | None = None
        self.operation = f"crash-{uuid.uuid4().hex[:8]}"
        self.exits: list[int] = []
        self.outputs: list[str] = []

    async def _q(self, fn: Any) -> Any:
        conn = await asyncpg.connect(self.s.dsn)
        try:
            return await fn(conn)
        finally:
            await conn.close()

    def q(self, fn: Any) -> Any:
        return _db(self._q(fn), self.clock.left())

    def frontiers(self) -> dict[int, int]:
        rows = self.q(lambda c: read_partitions(c, self.schema, self.group, self.topic))
        return {r.partition: r.frontier for r in rows}

    def high_watermarks(self) -> dict[int, int]:
        return {p: RECORDS for p in range(PARTITIONS)}

    def prepare(self) -> None:
        create_topic(self.s.kafka_bootstrap, self.topic, PARTITIONS)
        produce(self.s.kafka_bootstrap, [
            GeneratedRecord(self.topic, p, f"k{o}".encode(), f"v{o}".encode())
            for o in range(RECORDS) for p in range(PARTITIONS)])
        self.schema = _db(fresh_schema(self.s.dsn), self.clock.left())
        self.q(lambda c: install_audit(c, self.schema))
        poison = REPLAY_POISON if self.family.tool == "replay" else ()
        self.w = WorkerProc(topic=self.topic, group=self.group, schema=self.schema,
                            setup=self.setup, name="W", log_dir=self.dir,
                            extra=(*failing_flags(poison=poison, transient=()),
                                   "--batch-max-records", "40", "--heartbeat-interval-s", "1"))
        wait_until(lambda: self._w_ok() and self.frontiers() == self.high_watermarks(),
                   timeout_s=self.clock.left(), what="W draining the topic")

    def _w_ok(self) -> bool:
        assert self.w is not None
        if not self.w.alive():
            raise PhaseFailed(f"W ended early with {self.w.proc.returncode}")
        return True

    def _argv(self) -> tuple[str, ...]:
        if self.family.tool == "replay":
            return ("quarantine", "replay", "--group", self.group, "--topic", self.topic,
                    "--handler", "tests.integration.handlers:failing_handler",
                    "--handler-setting", "poison={}:{}".format(*REPLAY_POISON[1]))
        return ("reset", "frontier", "--group", self.group, "--topic", self.topic,
                "--partition", "0", "--to-offset", str(RESET_TO), "--kafka-timeout-s", "20",
                "--operation-id", self.operation, "--yes-i-understand")

    def run_tool(self, *, armed: bool) -> None:
        env = {"FENCE_SCHEMA": self.schema}
        if armed:
            env |= {"FENCE_CRASH_AT": self.family.plans[0].arm,
                    "FENCE_CRASH_MARKER": str(self.marker)}
        done = run_fencectl(*self._argv(), env=env, timeout_s=min(60, self.clock.left()))
        self.exits.append(done.returncode)
        self.outputs.append(done.stdout + done.stderr)
        (self.dir / f"tool-{len(self.exits)}.log").write_text(self.outputs[-1])
        if armed and not _complete(self.marker):
            raise PhaseFailed(f"phase crash: the tool ended ({done.returncode}) without "
                              f"firing {self.family.plans[0].arm}")

    async def rows(self, conn: Any) -> dict[str, Any]:
        s = f'"{self.schema}"'
        quarantine = await conn.fetch(
            f'SELECT partition, "offset", state, replays, reason FROM {s}.quarantine'
            " WHERE group_id = $1", self.group)
        journal = await conn.fetch(
            f"SELECT event, detail FROM {s}.journal WHERE group_id = $1 AND topic = $2",
            self.group, self.topic)
        audit = await conn.fetch(
            f"SELECT partition, old_frontier, frontier FROM {s}.crash_audit")
        moves: dict[int, int] = {}
        for r in audit:
            if r["old_frontier"] is not None and r["frontier"] < r["old_frontier"]:
                moves[r["partition"]] = moves.get(r["partition"], 0) + 1
        return {
            "applied": await applied_counts(conn, self.schema, self.topic),
            "quarantine": {(r["partition"], r["offset"]): (r["state"], r["replays"],
                                                           r["reason"]) for r in quarantine},
            "replay_journal": tuple(r["detail"] for r in journal if r["event"] == "replay"),
            "operation_rows": sum(1 for r in journal if (r["detail"] or "").startswith(
                journal_prefix(self.operation))),
            "moves_back": moves}

    def drain_again(self) -> None:
        want = _expected_counts(self.family.tool)
        wait_until(lambda: self._w_ok() and self.frontiers() == self.high_watermarks()
                   and not counts_problems(self.q(lambda c: applied_counts(
                       c, self.schema, self.topic)), want),
                   timeout_s=self.clock.left(), what="W applying from the new frontier")


def run_tool_cell(services: Any, family: Family, protocol: str) -> CellResult:
    """Run one cell of a tool family; never raises for a failing cell."""
    cell = _ToolCell(services, family, protocol)
    problems: list[str] = []
    at_death: dict[str, Any] = {}
    try:
        with cell.clock.phase("setup"):
            cell.prepare()
        with cell.clock.phase("crash"):
            cell.run_tool(armed=True)
            at_death = cell.q(cell.rows)
        with cell.clock.phase("restart"):
            cell.run_tool(armed=False)
        with cell.clock.phase("drain"):
            if family.tool == "reset":
                cell.drain_again()
            cell.run_tool(armed=False)
        with cell.clock.phase("assert"):
            assert cell.w is not None
            cell.w.terminate()
            w_exit = cell.w.wait(min(30, cell.clock.left()))
            end = cell.q(cell.rows)
            markers = read_markers(cell.marker)
            facts = ToolFacts(
                markers=len(markers), marker_point=markers[0].point if markers else None,
                tool_exits=tuple(cell.exits), outputs=tuple(cell.outputs), w_exit=w_exit,
                frontiers=cell.frontiers(), high_watermarks=cell.high_watermarks(),
                applied_at_death=at_death["applied"], applied=end["applied"],
                quarantine_at_death=at_death["quarantine"], quarantine=end["quarantine"],
                replay_journal=end["replay_journal"],
                operation_rows_at_death=at_death["operation_rows"],
                operation_rows=end["operation_rows"], moves_back=end["moves_back"])
            problems += judge_tool(family.tool, facts)
    except PhaseFailed as exc:
        problems.append(str(exc))
    except Exception as exc:  # a broken cell is a failed cell, with its reason
        problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        if cell.w is not None:
            cell.w.ensure_dead()
    passed = not problems
    kept = None
    if passed:
        shutil.rmtree(cell.dir, ignore_errors=True)
    else:
        kept = str(cell.dir.relative_to(ROOT))
        (cell.dir / "cell.json").write_text(repr({"problems": problems, "schema": cell.schema,
                                                  "group": cell.group}))
    return CellResult(family.plans[0].point, protocol, passed, None, tuple(problems),
                      dict(cell.clock.phase_s), (), kept, family=family.name)

