"""``make demo``: the README's demo walk-through, start to finish, leaving no worker running.

Steps (each printed as it happens): migrate a fresh schema; produce the reference domain's
source (with a traceparent header per record) to a new 6-partition topic; start two workers
in one group; once both own partitions, stop one with SIGTERM (a graceful leave: the other
takes its partitions over, fenced by a new epoch); wait until every record is processed;
print ``fencectl status`` (ownership, epochs, frontiers, lag, members) and the ownership
journal; stop the last worker; print where the traces are.
Uses the environment of ``fencectl stack env`` (``make demo`` brings the stack up first).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import asyncpg

from ops.hints import fencectl
from ops.operator.db import connection

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
COUNT = 60_000
PARTITIONS = 6


def _say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def _cli(*args: str, env: dict[str, str]) -> None:
    subprocess.run([PY, "-m", "ops.cli", *args], check=True, env=env, cwd=ROOT)


async def _fetch(dsn: str, sql: str, *args: object) -> list[asyncpg.Record]:
    async with connection(dsn) as conn:
        return list(await conn.fetch(sql, *args))


async def _rows(dsn: str, schema: str, group: str) -> list[asyncpg.Record]:
    return await _fetch(dsn, f'SELECT partition, owner, epoch, frontier FROM "{schema}".partitions '
                        "WHERE group_id = $1 ORDER BY partition", group)


async def _member_states(dsn: str, schema: str, group: str) -> list[str]:
    rows = await _fetch(dsn, f'SELECT state FROM "{schema}".members WHERE group_id = $1', group)
    return [r["state"] for r in rows]


async def _journal(dsn: str, schema: str, group: str) -> list[asyncpg.Record]:
    return await _fetch(dsn, f'SELECT at, partition, event, epoch, lifetime FROM "{schema}"'
                        ".journal WHERE group_id = $1 ORDER BY id", group)


def _wait(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: timed out waiting for {what}")
        time.sleep(0.2)


def main() -> int:
    env = dict(os.environ)
    dsn = env.get("FENCE_DSN")
    if not dsn or not env.get("KAFKA_BOOTSTRAP_SERVERS"):
        print(f"demo: run `eval \"$({fencectl()} stack env)\"` first (make demo does)",
              file=sys.stderr)
        return 2
    run_id = uuid.uuid4().hex[:6]
    schema, topic, group = f"demo_{run_id}", f"demo-docs-{run_id}", f"demo-group-{run_id}"
    env.update(FENCE_SCHEMA=schema, OTEL_SERVICE_NAME="fenceworker-demo", PYTHONPATH=str(ROOT))
    logs = ROOT / "artifacts" / "demo"
    logs.mkdir(parents=True, exist_ok=True)

    _say(f"migrate schema {schema}")
    _cli("migrate", "--schema", schema, env=env)
    _say(f"produce {COUNT} records to {topic} ({PARTITIONS} partitions)")
    _cli("produce", "--topic", topic, "--count", str(COUNT), "--seed", "1", "--class",
         "conflict", "--partitions", str(PARTITIONS), env=env)

    workers: list[subprocess.Popen[bytes]] = []
    try:
        for name in ("worker-1", "worker-2"):
            log = open(logs / f"{name}.log", "wb")
            workers.append(subprocess.Popen(
                [PY, "-m", "ops.cli", "run", "--topic", topic, "--group", group,
                 "--schema", schema, "--batch-max-records", "20", "--log-level", "INFO"],
                env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
            _say(f"started {name} (pid {workers[-1].pid}, log artifacts/demo/{name}.log)")
        _wait(lambda: len({r["owner"] for r in asyncio.run(_rows(dsn, schema, group))}) == 2,
              60, "both workers owning partitions")
        done = sum(r["frontier"] for r in asyncio.run(_rows(dsn, schema, group)))
        _say(f"both workers own partitions ({done}/{COUNT} records processed); stopping "
             "worker-1 with SIGTERM (it finishes its in-flight batches and leaves the group)")
        workers[0].send_signal(signal.SIGTERM)
        print(f"worker-1 exited with {workers[0].wait(60)}")

        def finished() -> bool:
            rows = asyncio.run(_rows(dsn, schema, group))
            return (sum(r["frontier"] for r in rows) >= COUNT
                    and len({r["owner"] for r in rows}) == 1)

        _wait(finished, 180, "worker-2 owning every partition and every record processed")
        # the survivor reports `running` within its heartbeat bound once it is positioned
        _wait(lambda: "running" in asyncio.run(_member_states(dsn, schema, group)), 15,
              "worker-2 reporting itself running")
        _say("every record processed; fencectl status:")
        subprocess.run([PY, "-m", "ops.cli", "status", "--group", group, "--schema", schema],
                       env=env, cwd=ROOT, check=False)
        _say("ownership journal (claims, releases):")
        for j in asyncio.run(_journal(dsn, schema, group)):
            print(f"  {j['at']:%H:%M:%S.%f}  p{j['partition']}  {j['event']:<8} "
                  f"epoch={j['epoch']}  {j['lifetime']}")
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(60)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait(10)
    _say("all workers stopped")
    jaeger = env.get("JAEGER_QUERY_URL", "http://127.0.0.1:16686")
    print(f"traces: {jaeger}/search?service=fenceworker-demo  (API: {jaeger}/api/traces?"
          "service=fenceworker-demo); producer spans under service fencectl-produce")
    print(f"worker logs: {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
