"""``make bench``, peer section: Quix Streams' PostgreSQL sink beside ``fencectl run --sink``.

Both tools as their users run them, one process each, on the same topic (the sink runs'
100-byte JSON values), into the same typed table in a fresh schema each run
(``id text``, ``amount bigint``, ``status text``, ``note text``, ``produced_ms bigint``, and
``written_at timestamptz DEFAULT clock_timestamp()``, which neither tool writes: the
instant PostgreSQL inserted the row), on the same PostgreSQL; insert, and upsert on ``id``
(``PRIMARY KEY``); the tries alternate tool by tool.

- Throughput: from the moment the group is assigned (the harness polls the group's
  description every 50 ms) to the last row's ``written_at``: records/s; the process's CPU
  over the same interval, per record; PostgreSQL's (``ops.bench.pgcpu``) from just before
  the process starts, per record (its start-up statements are a few milliseconds of it; a
  run of the quick bench's 6,000 records lasts about as long as the poll, which saw only
  its tail: 0 ticks of PostgreSQL CPU). Done is when
  the group's committed offsets reach the end of the topic (both tools commit offsets to
  Kafka after their PostgreSQL commit; polled every 0.25 s, no query on the table).
- Latency at a fixed rate: on an empty topic, once the group is assigned, a paced producer
  (``ops.bench.latency``) writes values that carry their ``produced_ms``; per row
  ``written_at`` minus ``produced_ms``, over the rows produced after the warm-up.
- Duplicates after a SIGKILL: insert mode; once the table holds 40% of the records the
  process is SIGKILLed and started again with the same group; when its offsets reach the
  end: rows beyond one per ``id`` (duplicates) and ids missing.

Quix Streams runs from its own virtualenv (``.venv-peer``, ``ensure_venv``): quixstreams
3.28.1 requires confluent-kafka < 2.13, and fenceworker's environment has a newer one.
Kafka Connect's JDBC sink is not measured: it is not published on Maven Central, the one
Java registry reachable here.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fencing.postgres.schema import quote_ident
from ops.bench.latency import percentiles
from ops.bench.paced import create_topic, finish_producer, start_producer
from ops.bench.pgcpu import PgCpu
from ops.bench.runs import PY, ROOT, env, fresh_schema, log_dir, new_topic, uid
from ops.operator.db import connection

__all__ = ["PEER_REQUIREMENT", "PEER_VENV", "ensure_venv", "run_all"]

PEER_VENV = ROOT / ".venv-peer"
PEER_REQUIREMENT = "quixstreams[postgresql]==3.28.1"
PEER_SCRIPT = ROOT / "ops" / "bench" / "peer_quix.py"
TOOLS = ("fenceworker", "quixstreams")
TABLE = "peer"


def ensure_venv() -> Path | None:
    """``.venv-peer/bin/python`` with ``PEER_REQUIREMENT`` installed (made when missing);
    None, with the reason printed, when it cannot be installed."""
    python = PEER_VENV / "bin" / "python"
    stamp = PEER_VENV / f".installed-{PEER_REQUIREMENT}"
    if stamp.exists():
        return python
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", PEER_REQUIREMENT],
                       check=True, timeout=900)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"peer: cannot install {PEER_REQUIREMENT} into {PEER_VENV}: {exc}",
              file=sys.stderr)
        return None
    stamp.touch()
    return python


async def _make_table(dsn: str, schema: str, upsert: bool) -> None:
    key = " PRIMARY KEY" if upsert else ""
    async with connection(dsn) as conn:
        await conn.execute(
            f"CREATE TABLE {quote_ident(schema)}.{TABLE} (id text{key}, amount bigint, "
            "status text, note text, produced_ms bigint, "
            "written_at timestamptz NOT NULL DEFAULT clock_timestamp())")


async def _query(dsn: str, sql: str) -> Any:
    async with connection(dsn) as conn:
        return await conn.fetchrow(sql)


def _argv(tool: str, peer_python: Path, topic: str, group: str, schema: str,
          upsert: bool, logs: Path) -> list[str]:
    """The tool's command line; Quix keeps its state folder under ``logs`` (a SIGKILLed
    run leaves it there, the next ``log_dir`` empties it)."""
    if tool == "fenceworker":
        return [PY, "-m", "ops.cli", "run", "--topic", topic, "--group", group, "--schema",
                schema, "--log-level", "WARNING", "--sink", f"table={schema}.{TABLE}",
                *(("--sink-key", "id") if upsert else ())]
    return [str(peer_python), str(PEER_SCRIPT), "--topic", topic, "--group", group,
            "--schema", schema, "--table", TABLE, "--state-dir", str(logs / "quix-state" / group),
            *(("--upsert",) if upsert else ())]


def _cpu_s(pid: int) -> float:
    """User + system seconds of a live process (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Group:
    """The consumer group's state as Kafka reports it (an admin client of the harness)."""

    def __init__(self, group: str) -> None:
        from confluent_kafka.admin import AdminClient

        self.group = group
        self.admin = AdminClient({"bootstrap.servers": os.environ["KAFKA_BOOTSTRAP_SERVERS"]})

    def assigned(self, partitions: int) -> bool:
        try:
            [desc] = [f.result(10) for f in
                      self.admin.describe_consumer_groups([self.group]).values()]
        except Exception:  # not known yet
            return False
        owned = sum(len(m.assignment.topic_partitions) for m in desc.members
                    if m.assignment is not None)
        return str(desc.state).endswith("STABLE") and owned == partitions

    def committed(self) -> int:
        from confluent_kafka import ConsumerGroupTopicPartitions

        try:
            [got] = [f.result(10) for f in self.admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(self.group)]).values()]
        except Exception:
            return 0
        return sum(tp.offset for tp in got.topic_partitions if tp.offset > 0)


def _wait(what: str, ok: Callable[[], bool], timeout_s: float, every_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise TimeoutError(f"peer bench: {what} not within {timeout_s:.0f} s")
        time.sleep(every_s)


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(argv, env=env(), cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)


def throughput(tool: str, peer_python: Path, topic: str, total: int, partitions: int,
               dsn: str, upsert: bool, logs: Path) -> dict[str, Any]:
    """One tool drains ``topic`` into a fresh table (see the module docstring)."""
    schema, group = fresh_schema(dsn), uid("gpeer")
    asyncio.run(_make_table(dsn, schema, upsert))
    kafka, pg = _Group(group), PgCpu(dsn)
    pg0 = pg.seconds()  # before the start: a short run may be over when the poll sees it
    proc = _start(_argv(tool, peer_python, topic, group, schema, upsert, logs),
                  logs / f"{tool}-{group}.log")
    try:
        _wait("the assignment", lambda: kafka.assigned(partitions), 120, 0.05)
        began, cpu0 = time.time(), _cpu_s(proc.pid)
        _wait("every offset committed", lambda: kafka.committed() >= total, 900, 0.25)
        cpu1, pg1 = _cpu_s(proc.pid), pg.seconds()
    finally:
        code = _stop(proc)
    row = asyncio.run(_query(dsn, f"SELECT count(*) AS n, count(DISTINCT id) AS ids, "
                                  f"extract(epoch FROM max(written_at)) AS last "
                                  f"FROM {quote_ident(schema)}.{TABLE}"))
    span = float(row["last"]) - began
    return {"tool": tool, "mode": "upsert" if upsert else "insert", "records": total,
            "rows": row["n"], "ids": row["ids"],
            "records_per_s": round(total / span) if span > 0 else None,
            "cpu_us_per_record": round((cpu1 - cpu0) * 1e6 / total, 1),
            "pg_cpu_us_per_record": (None if pg0 is None or pg1 is None
                                     else round((pg1 - pg0) * 1e6 / total, 1)),
            "exit": code}


def latency(tool: str, peer_python: Path, rate: float, seconds: float, warmup_s: float,
            partitions: int, dsn: str, logs: Path) -> dict[str, Any]:
    """Upsert at ``rate`` records/s: ``written_at`` - ``produced_ms`` per row."""
    topic, schema, group = new_topic("peerlat"), fresh_schema(dsn), uid("gpeerlat")
    create_topic(topic, partitions)
    asyncio.run(_make_table(dsn, schema, True))
    kafka = _Group(group)
    proc = _start(_argv(tool, peer_python, topic, group, schema, True, logs),
                  logs / f"{tool}-{group}.log")
    try:
        _wait("the assignment", lambda: kafka.assigned(partitions), 120, 0.05)
        out = logs / f"producer-{group}.json"
        prod = start_producer(topic, "peer", rate, warmup_s + seconds, partitions, out)
        summary = finish_producer(prod, out, warmup_s + seconds + 300)
        _wait("every offset committed", lambda: kafka.committed() >= summary["produced"],
              300, 0.25)
    finally:
        code = _stop(proc)
    first_ms = math.ceil((summary["start_wall"] + warmup_s) * 1000)
    rows = asyncio.run(_rows_latency(dsn, schema, first_ms))
    hist: dict[int, int] = {}
    for ms in rows:
        hist[ms] = hist.get(ms, 0) + 1
    return {"tool": tool, "rate": round(rate), "rate_achieved": summary["rate_achieved"],
            "row_ms": percentiles(hist), "exit": code}


async def _rows_latency(dsn: str, schema: str, first_ms: int) -> list[int]:
    async with connection(dsn) as conn:
        return [int(r[0]) for r in await conn.fetch(
            f"SELECT greatest(floor(extract(epoch FROM written_at) * 1000) - produced_ms, 0) "
            f"FROM {quote_ident(schema)}.{TABLE} WHERE produced_ms >= $1", first_ms)]


def killed(tool: str, peer_python: Path, topic: str, total: int, partitions: int, dsn: str,
           logs: Path) -> dict[str, Any]:
    """Insert mode, SIGKILL at 40% of the rows, restart: duplicates and missing ids."""
    schema, group = fresh_schema(dsn), uid("gpeerkill")
    asyncio.run(_make_table(dsn, schema, False))
    kafka = _Group(group)
    argv = _argv(tool, peer_python, topic, group, schema, False, logs)
    log = logs / f"{tool}-{group}.log"
    count = f"SELECT count(*) AS n FROM {quote_ident(schema)}.{TABLE}"
    proc = _start(argv, log)
    try:
        _wait("40% of the rows", lambda: asyncio.run(_query(dsn, count))["n"] >= 0.4 * total,
              600, 0.05)
        at = asyncio.run(_query(dsn, count))["n"]
        proc.kill()
        proc.wait(30)
        proc = _start(argv, log)
        _wait("every offset committed after the restart",
              lambda: kafka.committed() >= total, 900, 0.25)
    finally:
        code = _stop(proc)
    row = asyncio.run(_query(dsn, f"SELECT count(*) AS n, count(DISTINCT id) AS ids "
                                  f"FROM {quote_ident(schema)}.{TABLE}"))
    return {"tool": tool, "records": total, "rows_at_kill": at, "rows": row["n"],
            "duplicates": row["n"] - row["ids"], "missing": total - row["ids"],
            "exit": code}


def run_all(dsn: str, topic: str, total: int, *, partitions: int, repeat: int, quick: bool
            ) -> dict[str, Any]:
    """Every peer run (see the module docstring); ``topic`` holds ``total`` sink values."""
    peer_python = ensure_venv()
    if peer_python is None:
        return {"skipped": f"{PEER_REQUIREMENT} could not be installed into {PEER_VENV}"}
    logs = log_dir("peer")
    tries: dict[str, list[dict[str, Any]]] = {}
    for i in range(repeat):
        for upsert in (False, True):
            for tool in TOOLS:
                print(f"peer: {tool} {'upsert' if upsert else 'insert'} #{i + 1} ...",
                      flush=True)
                got = throughput(tool, peer_python, topic, total, partitions, dsn, upsert,
                                 logs)
                tries.setdefault(f"{tool}/{got['mode']}", []).append(got)
                print(f"  {got}", flush=True)
    runs = {name: _median(ts) for name, ts in tries.items()}
    slower = min(r["records_per_s"] or 0 for r in runs.values() if r["mode"] == "upsert")
    rate = max(round(0.5 * slower), 100)  # both sustain it: half the slower one's rate
    seconds, warmup_s = (4.0, 1.0) if quick else (20.0, 5.0)
    lat = []
    for tool in TOOLS:
        print(f"peer: {tool} latency at {rate} records/s ...", flush=True)
        lat.append(latency(tool, peer_python, rate, seconds, warmup_s, partitions, dsn, logs))
        print(f"  {lat[-1]}", flush=True)
    kills = []
    for tool in TOOLS:
        print(f"peer: {tool} SIGKILL and restart ...", flush=True)
        kills.append(killed(tool, peer_python, topic, total, partitions, dsn, logs))
        print(f"  {kills[-1]}", flush=True)
    return {"requirement": PEER_REQUIREMENT, "records": total, "repeat": repeat,
            "runs": runs, "latency": lat, "kill": kills, "logs": str(logs.relative_to(ROOT))}


def _median(tries: list[dict[str, Any]]) -> dict[str, Any]:
    """The try at the (upper) median records/s, with every try's rate."""
    ordered = sorted(tries, key=lambda t: t["records_per_s"] or 0)
    return {**ordered[len(ordered) // 2],
            "all_records_per_s": [t["records_per_s"] for t in tries],
            "median_cpu_us_per_record": statistics.median_high(
                [t["cpu_us_per_record"] for t in tries])}


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m ops.bench.peer")
    p.add_argument("--ensure-venv", action="store_true",
                   help=f"install {PEER_REQUIREMENT} into {PEER_VENV.name} if missing")
    a = p.parse_args(argv)
    if a.ensure_venv:
        return 0 if ensure_venv() is not None else 1
    p.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
