"""Helpers for hand-written simulator traces (tests only)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fencing.memory.faults import Fault, FaultOutcome, Interleave, Operation
from fencing.types import SourceRecord
from ops.sim import dumps, parse, run_trace
from ops.sim.trace import SimConfig, Step, Trace, toolchain

TOPIC = "sim"


def rec(partition: int, offset: int, doc: str, kind: str = "put", rev: int = 1,
        body: str = "b") -> SourceRecord:
    value = {"kind": kind, "rev": rev, "body": body}
    return SourceRecord(TOPIC, partition, offset, doc.encode(), json.dumps(value).encode())


def puts(partition: int, offsets: list[int]) -> list[SourceRecord]:
    return [rec(partition, off, f"d{partition}-{off}") for off in offsets]


def fault(op: str, call: int = 1, outcome: str = "commit", *, delay_ms: int = 0,
          at: str | None = None, stop: bool = False, replacement: int | None = None,
          revoke: bool = False, lost: bool = False) -> Fault:
    il = None if at is None else Interleave(at, stop, replacement, revoke, lost)
    return Fault(Operation(op), call, FaultOutcome(outcome), delay_ms, il)


def step(actor: str, worker: int, partition: int | None = None, *faults: Fault) -> Step:
    if partition is None and actor in ("assign", "seek", "process", "revoke"):
        partition = 0
    return Step(actor, worker, partition, tuple(faults))


def make(records: list[SourceRecord], steps: list[Step], *, partitions: int = 1,
         drain: bool = False, batch_max: int = 4, lows: tuple[int, ...] | None = None,
         allow_gap: bool = False, klass: str = "valid", lanes: int = 1,
         lanes_window: int = 10_000, fold_every: int = 1) -> Trace:
    config = SimConfig(klass=klass, steps=len(steps), topic=TOPIC, partitions=partitions,
                       group_id="sim", batch_max=batch_max, budget_ms=20_000,
                       low_watermarks_before_drain=lows or (0,) * partitions,
                       allow_retention_gap=allow_gap, lanes=lanes,
                       lanes_window=lanes_window if lanes > 1 else 0,
                       fold_every=fold_every if lanes > 1 else 0)
    trace = Trace(seed=0, config=config, records=tuple(records), steps=tuple(steps),
                  drain=drain, toolchain=toolchain())
    return parse(dumps(trace))  # every hand-written trace passes the replay validation


def run(trace: Trace) -> tuple[dict[str, Any], Any]:
    keep: list[Any] = []
    report = run_trace(trace, keep=keep)
    assert keep, report["violations"]
    return report, keep[0]


def attempts(report: dict[str, Any]) -> list[dict[str, Any]]:
    return report["attempts"]


def events(report: dict[str, Any], attempt: int) -> list[dict[str, Any]]:
    return [e for e in report["events"] if e["attempt"] == attempt]


def head(worker: int = 1, partition: int = 0) -> list[Step]:
    """start, assign, seek of one lifetime on one partition (attempts 0..2)."""
    return [step("start", worker), step("assign", worker, partition),
            step("seek", worker, partition)]


@contextmanager
def quiet() -> Iterator[None]:
    """Failing heartbeats log a warning each; the tests read rows, not logs."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
