"""How one benchmark run is started and timed: baselines and workers, one clock.

Long because starting, timing, sampling memory and CPU (the machine's, the processes', the
database's) and stopping one run are one procedure that every section of the bench shares.

Rules
- A run is a ``Run`` in a registry (``ops.bench.worker.RUNS``): a name (the JSON key), a
  label (the chart and docs/benchmarks.md), a kind (``baseline``: ``ops.bench.baselines MODE``;
  ``worker``: ``fencectl run`` with the timed handler ``ops.bench.clock:clocked``), extra
  arguments, the topic it reads and how many members it starts. Adding a variant (a sink,
  another batch size) is one more ``Run``; a ratio is one more entry of ``RATIOS``.
- Every run gets its own group and schema (fresh effect tables), and is timed only by the
  marks of ``ops.bench.clock`` (first handler call to last handler return, all processes
  of the run on one ``CLOCK_MONOTONIC``). The harness waits by polling the marks files
  every 0.2 s, never the database.
- Peak memory is each process's own high-water mark of resident memory (``VmHWM`` in
  ``/proc/<pid>/status``, read every 0.2 s while it runs and once more before it is
  stopped), the largest of the run's. Not ``ru_maxrss``: Linux carries the pre-exec
  address space's high-water mark into it (``exec_mmap`` keeps the old mm's
  ``hiwater_rss``), and ``subprocess`` spawns from this harness, so every child reported at
  least the harness's own RSS (measured: a child sleeping 0.5 s under a parent holding
  200 MiB: ``ru_maxrss`` 213 MiB, ``VmHWM`` 13 MiB; earlier benches reported ~112-116 MiB
  for every process smaller than the harness).
- PostgreSQL is brought to the same state before every run of every section (latency,
  scaling, the peer and scale too: ``fresh_schema``), as pgbench practice asks: the
  previous run's schema is dropped (else autovacuum vacuums and analyzes its 200,000
  fresh rows while a later run is measured) and a ``CHECKPOINT`` runs (else a run pays for
  an earlier run's dirty buffers, or crosses the checkpoint that ~500 MB of WAL triggers
  at the default ``max_wal_size``; the dev stack grants ``pg_checkpoint``). Measured on the
  quiet machine without these: the same run varied by up to 40% between tries.
- Files: a run's marks files live in a ``scratch`` folder, removed when the bench process
  exits; the processes' logs that a section's JSON points to go to
  ``artifacts/bench/logs/<section>`` (``log_dir``: emptied when the section runs again).
  Nothing is left in the system's temporary folder.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from fencing.postgres.schema import quote_ident
from ops.bench import clock
from ops.bench.pgcpu import PgCpu
from ops.operator.db import connection

ROOT = Path(__file__).resolve().parents[2]
#: the logs a section's JSON points to (``log_dir``), kept until that section runs again
LOGS = ROOT / "artifacts" / "bench" / "logs"
PY = sys.executable
COOPERATIVE = ["--group-protocol", "classic", "--assignment-strategy", "cooperative-sticky",
               "-X", "session.timeout.ms=6000", "-X", "heartbeat.interval.ms=500"]

__all__ = ["COOPERATIVE", "ROOT", "Run", "env", "execute", "fresh_schema", "quiesce", "uid"]


@dataclass(frozen=True)
class Run:
    name: str
    label: str
    kind: str  # "baseline" | "worker"
    args: tuple[str, ...] = ()
    topic: str = "main"  # which produced topic: "main", "single" (the batch-1 subset), "sink"
    #                      (100-byte JSON values), "sink_avro" (the same records in Avro) or
    #                      "sink_routed" (three topics sharing such records)
    members: int = 1
    processes: int = 0  # > 0: one ``fencectl run --processes N`` (a set) instead of members
    repeat: bool = True  # alternates with the other repeated runs ``--repeat`` times
    handler: str = "reference"  # "reference", "accept" (only the fence) or "sink" (table sink)
    settings: tuple[str, ...] = field(default_factory=tuple)  # extra --handler-setting


def scratch(prefix: str) -> Path:
    """A folder for a run's marks files, removed when this process exits."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, True)
    return path


def log_dir(name: str) -> Path:
    """``artifacts/bench/logs/<name>``, emptied: the processes' logs of one section."""
    path = LOGS / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


#: the topics this benchmark process named with ``new_topic``, deleted by ``delete_topics``
TOPICS: list[str] = []


def new_topic(prefix: str) -> str:
    """A fresh topic name, remembered so that the benchmark deletes the topic when it ends:
    a full ``make bench`` writes ~1.7 million records, and kept they grew the stack's Kafka
    log directory with every run (to 4.8 GB here, when Kafka's log recovery at start-up
    outlasted ``fencectl stack up``'s health wait)."""
    name = uid(prefix)
    TOPICS.append(name)
    return name


def delete_topics() -> list[str]:
    """Delete every topic ``new_topic`` named that exists; the names deleted. A failure is
    reported, never raised: the results are already written."""
    from confluent_kafka.admin import AdminClient

    asked, TOPICS[:] = list(TOPICS), []
    if not asked:
        return []
    try:
        admin = AdminClient({"bootstrap.servers": os.environ["KAFKA_BOOTSTRAP_SERVERS"]})
        names = [t for t in asked if t in admin.list_topics(timeout=30).topics]
        if names:
            for done in admin.delete_topics(names, operation_timeout=30).values():
                done.result(60)
    except Exception as exc:  # reported, not raised: the bench's results stand
        print(f"bench: deleting its topics {asked} failed: {exc}", file=sys.stderr)
        return []
    return names


def env(root: Path = ROOT) -> dict[str, str]:
    """The environment of a run's processes, whose code is the tree at ``root``."""
    e = dict(os.environ)
    e["OTEL_TRACES_EXPORTER"] = "none"
    e["OTEL_METRICS_EXPORTER"] = "none"
    e["PYTHONPATH"] = str(root)
    return e


async def _quiesce(dsn: str, drops: Sequence[str]) -> None:
    async with connection(dsn) as conn:
        for drop in drops:
            await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(drop)} CASCADE")
        try:
            await conn.execute("CHECKPOINT")
        except asyncpg.InsufficientPrivilegeError:
            global _CHECKPOINT_REFUSED
            if not _CHECKPOINT_REFUSED:
                print("bench: CHECKPOINT refused (the role lacks pg_checkpoint): runs are not "
                      "isolated from earlier runs' checkpoints", file=sys.stderr)
            _CHECKPOINT_REFUSED = True


_CHECKPOINT_REFUSED = False


def quiesce(dsn: str, *, drop: str | None = None) -> None:
    """Drop ``drop`` (a finished run's schema), then CHECKPOINT (see the module Rules)."""
    asyncio.run(_quiesce(dsn, () if drop is None else (drop,)))


async def _schema(dsn: str) -> str:
    from fencing.postgres.schema import migrate
    from ops.reference.pg import ensure_tables

    schema = uid("bench")
    async with connection(dsn) as conn:
        await migrate(conn, schema)
        await ensure_tables(conn, schema)
    return schema


_MADE: list[str] = []  # the schemas ``fresh_schema`` made in this process, not dropped yet


def fresh_schema(dsn: str) -> str:
    """A new schema with the fence and reference tables, on a quiesced PostgreSQL: the
    schemas made before by this process dropped (their runs are over: every section runs
    one run at a time), then CHECKPOINT (module Rules) — so no run shares the machine with
    the autovacuum or checkpoint of the rows an earlier run of any section wrote."""
    asyncio.run(_quiesce(dsn, _MADE))
    _MADE.clear()
    schema = asyncio.run(_schema(dsn))
    _MADE.append(schema)
    return schema


def worker_argv(run: Run, topic: str, group: str, schema: str, clock_file: Path) -> list[str]:
    """``fencectl run`` of ``run``; a set's members mark ``clock_file`` with their pid;
    ``topic``: one name, or several joined by ``,`` (one ``--topic`` each)."""
    sets = ("--processes", str(run.processes)) if run.processes else ()
    topics = [x for t in topic.split(",") for x in ("--topic", t)]
    return [PY, "-m", "ops.cli", "run", *topics, "--group", group, "--schema", schema,
            "--log-level", "WARNING", *COOPERATIVE, *sets,
            "--handler", f"{clock.__name__}:{clock.clocked.__name__}",
            "--handler-setting", f"clock_file={clock_file}",
            "--handler-setting", f"handler={run.handler}",
            *(x for s in run.settings for x in ("--handler-setting", s)),
            *(("--handler-setting", f"registry={os.environ['SCHEMA_REGISTRY_URL']}")
              if "format=avro" in run.settings else ()), *run.args]


def hwm_kib(pid: int) -> int:
    """``VmHWM`` of a live process in KiB (0 once it exited: a zombie has no memory)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def interpreter_mib() -> float:
    """``VmHWM`` of an interpreter that imported confluent-kafka and the Kafka adapter and
    does nothing: what (a) and (d) both contain once (``ops.bench.memory``'s base)."""
    proc = subprocess.Popen([PY, "-c", "import time, confluent_kafka\n"
                             "from consumer.kafka import adapter\ntime.sleep(1.5)"],
                            env=env(), cwd=ROOT)
    time.sleep(1.0)
    peak = hwm_kib(proc.pid)
    proc.wait()
    return round(peak / 1024, 1)


def machine_ticks() -> list[int]:
    """The machine's CPU ticks so far, ``/proc/stat``'s ``cpu`` line: user nice system idle
    iowait irq softirq steal guest guest_nice (guest time is also counted in user)."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def cpu_ticks() -> tuple[int, int]:
    """The machine's (steal, all) CPU ticks so far (guest left out: it is in user)."""
    ticks = machine_ticks()[:8]
    return ticks[7], sum(ticks)


def steal_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the machine's CPU time the hypervisor gave to others between two
    ``cpu_ticks``: on a shared VM the one cause of a slow run that the run cannot see."""
    return round((after[0] - before[0]) / max(after[1] - before[1], 1), 3)


def _sample(procs: list[subprocess.Popen[bytes]], peaks: dict[int, int],
            reaped: dict[int, tuple[int, int]]) -> None:
    """Raise each unreaped process's peak to its ``VmHWM`` now (a reaped pid may already
    belong to another process)."""
    for proc in procs:
        if proc.pid not in reaped:
            peaks[proc.pid] = max(peaks.get(proc.pid, 0), hwm_kib(proc.pid))


def _collect(procs: list[subprocess.Popen[bytes]], out: dict[int, tuple[int, int]],
             peaks: dict[int, int]) -> bool:
    """Sample every live process's peak, reap the ones that ended (exit code, peak KiB) into
    ``out``; True once all ended."""
    _sample(procs, peaks, out)
    for proc in procs:
        if proc.pid not in out:
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                out[proc.pid] = (proc.returncode, peaks.get(proc.pid, 0))
    return len(out) == len(procs)


def _reap(procs: list[subprocess.Popen[bytes]], out: dict[int, tuple[int, int]],
          peaks: dict[int, int], timeout_s: float) -> list[tuple[int, int]]:
    """Wait for every process (kill after ``timeout_s``); (exit code, peak KiB) each."""
    deadline = time.monotonic() + timeout_s
    while not _collect(procs, out, peaks):
        if time.monotonic() > deadline:
            for proc in procs:
                if proc.pid not in out:
                    os.kill(proc.pid, signal.SIGKILL)
        time.sleep(0.05)
    return [out[p.pid] for p in procs]


def _pg_over_span(first: tuple[float, float | None] | None, after: float | None,
                  got: dict[str, Any], start: float | None = None) -> float | None:
    """PostgreSQL's CPU seconds over a run's span: read from the first poll that saw a mark
    (up to a poll and a marks flush after the first handler call) to the end, and scaled
    from that interval to the whole span at the same rate (the database is idle after the
    last return, which the end reading follows). A run whose every record was handled
    before a poll saw one (a short run on a loaded machine) falls back to ``start``, read
    before its records were produced: that interval holds the whole span and only idle
    time besides."""
    if after is None:
        return None
    if first is not None and first[1] is not None and got.get("last"):
        covered = got["last"] - first[0]  # both on CLOCK_MONOTONIC
        if covered > 0:
            return (after - first[1]) * got["elapsed_s"] / covered
    return None if start is None else after - start


def execute(run: Run, topic: str, total: int, dsn: str, *,
            timeout_s: float = 1800, root: Path = ROOT,
            ready: Callable[[str, str], None] | None = None) -> dict[str, Any]:
    """Start ``run`` on ``topic``, wait until its processes handled ``total`` records (by
    their marks), stop them; the run's span, rate, peak RSS and exit codes. ``root``: the
    tree whose code the processes run (``ops.bench.trees``: another commit's); ``ready``:
    called with the run's schema and group once the processes started (the scaling runs
    produce their records there, once every member owns partitions). PostgreSQL's CPU per
    record is over the span (``_pg_over_span``)."""
    schema, group = fresh_schema(dsn), uid("gb" if run.kind == "baseline" else "gw")
    pg = PgCpu(dsn)
    ticks = cpu_ticks()
    pg_first: tuple[float, float | None] | None = None  # (monotonic, PostgreSQL CPU s)
    tmp = scratch(f"bench-{run.name}-")
    files = [tmp / f"member-{i}.json" for i in range(run.members)]
    if run.processes:  # one set: its members write member-<pid>.json
        files = [tmp / "member-{pid}.json"]
    procs: list[subprocess.Popen[bytes]] = []
    for f in files:
        if run.kind == "baseline":
            argv = [PY, "-m", "ops.bench.baselines", *run.args, "--bootstrap",
                    os.environ["KAFKA_BOOTSTRAP_SERVERS"], "--group", group, "--topic", topic,
                    "--total", str(total), "--schema", schema, "--clock-file", str(f)]
        else:
            argv = worker_argv(run, topic, group, schema, f)
        procs.append(subprocess.Popen(argv, env=env(root), cwd=root, stdout=subprocess.DEVNULL))
    if run.processes:
        files = []  # read by marks() below: the members' own files

    def marks() -> list[Path]:
        return files or clock.member_files(tmp)

    deadline = time.monotonic() + timeout_s
    ended: dict[int, tuple[int, int]] = {}
    peaks: dict[int, int] = {}
    pg_start = pg.seconds()  # the fallback of _pg_over_span: before any record is produced
    if ready is not None:
        ready(schema, group)
    got = clock.combined(marks())
    while got["records"] < total and time.monotonic() < deadline:
        if _collect(procs, ended, peaks):
            break
        time.sleep(0.2)
        got = clock.combined(marks())
        if pg_first is None and got["records"]:
            pg_first = (time.monotonic(), pg.seconds())
    time.sleep(2 * clock.FLUSH_S)  # the last flush of every member
    got = clock.combined(marks())
    pg_after = pg.seconds()  # before the stop: a backend's CPU then still counts as the run's
    members = clock.read(marks())
    member_peaks = {m["pid"]: hwm_kib(m["pid"]) for m in members if run.processes}
    _sample(procs, peaks, ended)  # the peak so far of each process still running
    for p in procs:
        if p.pid not in ended:
            os.kill(p.pid, signal.SIGTERM)  # not send_signal: its poll() would reap it
    reaped = _reap(procs, ended, peaks, 60)
    steal = steal_share(ticks, cpu_ticks())
    quiesce(dsn, drop=schema)
    elapsed = got["elapsed_s"]
    pg_s = _pg_over_span(pg_first, pg_after, got, pg_start)
    if member_peaks:  # a set: its members' peaks, not the supervising parent's
        reaped = [(c, max(member_peaks.values())) for c, _ in reaped]
    return {"records": got["records"], "elapsed_s": round(elapsed, 3),
            "records_per_s": round(got["records"] / elapsed) if elapsed > 0 else 0,
            "mean_batch": got.get("mean_batch"),
            "cpu_s": round(got.get("cpu_s", 0.0), 3),
            "cpu_us_per_record": (round(got["cpu_s"] * 1e6 / got["records"], 2)
                                  if got["records"] and got.get("cpu_s") else None),
            "peak_rss_mib": round(max(r for _, r in reaped) / 1024, 1),
            "steal_share": steal,
            "exit": [c for c, _ in reaped] if run.members > 1 else reaped[0][0],
            "members": run.members,
            "member_cpu_s": [round((m.get("cpu_last") or 0.0) - (m.get("cpu_first") or 0.0), 3)
                             for m in members],
            "member_records": [m.get("records", 0) for m in members],
            "pg_cpu_s": None if pg_s is None else round(pg_s, 3),
            "pg_cpu_us_per_record": (round(pg_s * 1e6 / got["records"], 2)
                                     if pg_s is not None and got["records"] else None)}
