"""``python -m ops.bench.lanes`` (``make bench-lanes``; the last part of ``make bench``):
what key-ordered lanes buy a handler that waits.

Rules
- The handler (``ops.bench.lanes:waiting``) sleeps ``wait_ms`` (20) per call, standing for
  an external call, then accepts every record (the fence rows and completion sets still
  move). One member, ``--batch-max-records 10``, ``--db-concurrency`` lanes x partitions
  (at most 64: each lane in flight holds a connection, its transaction open across the
  wait).
- For 1 and 6 partitions and ``--lanes`` 1, 4, 16, 64: a fresh topic of keyed records
  (``fencectl produce --class valid``: keys are document ids), the member started, and the
  records per second from the moment every partition is claimed until every record is
  below the effective frontier (the partition rows extended by the lanes' spans); beside
  it, the ideal: N times the same run's one lane.
- ``--quick``: lanes 1 and 4 only, fewer records (the smoke test's mode).
- Prints the table and writes ``artifacts/bench/lanes.json`` (with provenance).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fencing.handler import HandlerContext, handler, handler_factory
from fencing.lanes import Completion
from fencing.store import HandlerFn
from fencing.types import ACCEPT, SourceRecord, Verdict
from ops.bench.paced import create_topic
from ops.bench.provenance import provenance
from ops.bench.runs import PY, ROOT, env, fresh_schema, new_topic, uid
from ops.bench.sources import produce
from ops.operator.db import connection

__all__ = ["main", "waiting"]

OUT = ROOT / "artifacts" / "bench" / "lanes.json"
# this module's name also when run as ``python -m`` (where ``__name__`` is ``__main__``)
_MODULE = __spec__.name if __spec__ is not None else __name__
WAIT_MS = 20
BATCH = 10
LANES = (1, 4, 16, 64)
PARTITIONS = (1, 6)


@handler_factory()
def waiting(context: HandlerContext) -> HandlerFn:
    """Sleeps ``wait_ms`` per call (an external call), then accepts every record."""
    wait_s = float(context.settings.get("wait_ms", WAIT_MS)) / 1000

    @handler(durability="durable-critical", effects="transactional")
    async def wait(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
        await asyncio.sleep(wait_s)
        return [ACCEPT] * len(records)

    return wait


async def _done(dsn: str, schema: str, group: str) -> tuple[int, int]:
    """(partitions claimed, records below the effective frontiers)."""
    async with connection(dsn) as conn:
        rows = await conn.fetch(
            f'SELECT p.partition, p.frontier, c.first, c.last FROM "{schema}".partitions p '
            f'LEFT JOIN "{schema}".completions c ON c.group_id = p.group_id '
            "AND c.topic = p.topic AND c.partition = p.partition WHERE p.group_id = $1",
            group)
    found: dict[int, tuple[int, list[tuple[int, int]]]] = {}
    for r in rows:
        spans = found.setdefault(r["partition"], (r["frontier"], []))[1]
        if r["first"] is not None:
            spans.extend(zip(r["first"], r["last"], strict=True))
    return len(found), sum(Completion.of(b, s).frontier for b, s in found.values())


def one(dsn: str, partitions: int, lanes: int, records: int) -> dict[str, Any]:
    """One run (see the module Rules)."""
    topic, group, schema = new_topic("lanes"), uid("glanes"), fresh_schema(dsn)
    create_topic(topic, partitions)
    produce(topic, records, partitions, seed=5)
    concurrency = min(64, max(4, lanes * partitions))
    argv = [PY, "-m", "ops.cli", "run", "--topic", topic, "--group", group, "--schema", schema,
            "--log-level", "WARNING", "--handler", f"{_MODULE}:{waiting.__name__}",
            "--handler-setting", f"wait_ms={WAIT_MS}", "--lanes", str(lanes),
            "--batch-max-records", str(BATCH), "--db-concurrency", str(concurrency)]
    log = OUT.parent / f"lanes-{partitions}-{lanes}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env(), cwd=ROOT, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 120
        while asyncio.run(_done(dsn, schema, group))[0] < partitions:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"lanes bench: {topic} not claimed (exit {proc.poll()}; "
                                   f"see {log})")
            time.sleep(0.1)
        start, before = time.monotonic(), asyncio.run(_done(dsn, schema, group))[1]
        while (done := asyncio.run(_done(dsn, schema, group))[1]) < records:
            if time.monotonic() - start > 900 or proc.poll() is not None:
                raise RuntimeError(f"lanes bench: {done} of {records} records after "
                                   f"{time.monotonic() - start:.0f} s (exit {proc.poll()})")
            time.sleep(0.1)
        seconds = time.monotonic() - start
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"partitions": partitions, "lanes": lanes, "records": records - before,
            "seconds": round(seconds, 2), "rate": round((records - before) / seconds, 1),
            "db_concurrency": concurrency}


def table(runs: Sequence[dict[str, Any]]) -> str:
    """The markdown table: records/s, x one lane, the ideal and the share of it."""
    lines = ["| partitions | --lanes | records/s | x one lane | ideal (lanes x one lane) | "
             "of the ideal |", "|---|---|---|---|---|---|"]
    for r in runs:
        base = next(x["rate"] for x in runs if x["partitions"] == r["partitions"]
                    and x["lanes"] == 1)
        ideal = base * r["lanes"]
        lines.append(f"| {r['partitions']} | {r['lanes']} | {r['rate']:,.0f} | "
                     f"{r['rate'] / base:.1f} | {ideal:,.0f} | {r['rate'] / ideal:.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.lanes", description=__doc__)
    p.add_argument("--quick", action="store_true", help="lanes 1 and 4, fewer records")
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    dsn = os.environ["FENCE_DSN"]
    lanes = LANES[:2] if args.quick else LANES
    per_lane_s = 1.0 if args.quick else 4.0  # how long one lane of one partition runs
    runs = []
    for partitions in PARTITIONS:
        for n in lanes:
            ideal_rate = BATCH / (WAIT_MS / 1000) * n * partitions
            records = int(min(ideal_rate, 8_000) * per_lane_s) + BATCH * n * partitions
            runs.append(one(dsn, partitions, n, records))
            print(json.dumps(runs[-1]), flush=True)
    text = table(runs)
    print(f"\nlanes: a handler that waits {WAIT_MS} ms per call of up to {BATCH} records\n")
    print(text, flush=True)
    out = {"runs": runs, "wait_ms": WAIT_MS, "batch_max_records": BATCH, "table": text,
           "provenance": provenance(command="make bench-lanes" + (" BENCH_ARGS=--quick"
                                                                  if args.quick else ""))}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
