"""``make bench``, latency section: produce-to-commit latency under steady load, and how long
a partition pauses when it moves between members.

Long because the steady runs (at shares of capacity, with ``--processes 2``, at fixed low
rates) and the moves share one harness: the member or set, the paced producer, the plain
consumer beside them and the histograms they write.

- Steady load: the reference handler and the table sink (upsert on ``id``, batches of 2,000
  as ``fencectl run --sink``), one member with default settings on a fresh topic of
  ``partitions``, assigned before the first record is produced; a producer process at a
  fixed rate, ``RATE_SHARES`` of the capacity (c) the same bench run measured, for
  ``warmup_s`` + ``seconds``. Measured: the records produced after the warm-up; their
  latency from the Kafka timestamp (the producer's ``CreateTime``) to the worker's wall clock
  when the reply to their batch's ``COMMIT`` was read (``ops.bench.clock``'s ``latency``),
  p50, p95, p99 and max; and the same up to the batch's handler call (what a record waited
  before its transaction began). Also with ``--processes 2`` (``PROCESSES_SHARES`` of the
  one-member capacity), and at the fixed ``LOW_RATES`` ``LOW_REPEAT`` times each (10 s
  measured after 3 s), so their spread from run to run shows; and at ``LINGER_SHARES`` with
  each of ``LINGERS_MS`` as ``--batch-linger-ms`` (the default is 5 ms): what a longer
  linger buys in CPU per record and costs in latency; and at ``ONE_PARTITION`` (a share, a
  rate) on a topic of one partition, so one partition's transactions carry what six did:
  the bound of what fewer transactions per record buy.
- Beside each run's member CPU: the whole machine's busy CPU (``/proc/stat``) and
  PostgreSQL's (``ops.bench.pgcpu``) while the producer ran, warm-up included: the cores
  the run kept busy, of the two the producer, Kafka, PostgreSQL, the member and the plain
  consumer share.
- Beside every steady run, the plain consumer (``ops.bench.control``): a consumer in its own
  group on the same topic with the member's fetch settings, whose latency is its receive
  time minus the same Kafka timestamp: what Kafka's path costs on the shared machine at
  that moment, without batching or transactions.
- Moves, per group setup (``ops.bench.scale.SETUPS``; classic sessions of 6 s, KIP-848's
  broker-side session 6 s on the local stack), at ``MOVE_SHARE`` of the reference
  handler's capacity: member A runs alone (from its first commit on every partition); B
  joins; once B committed, B is SIGKILLed. The
  pause of a partition that moves to B is from A's last commit on it to B's first; of a
  partition that returns to A after the kill, from the SIGKILL to A's first commit on it
  (the session timeout, the rebalance, the claim). Partitions that stay with A: their
  longest gap between two commits while B joined (an eager assignor revokes them too).
- ``python -m ops.bench.trees --before COMMIT --latency KIND --rates R,R``: the steady run
  from that commit's worktree and this tree, alternating: how a change to the path of a
  record is measured.
- The producer (``ops.bench.paced``) paces itself on ``CLOCK_MONOTONIC`` in 1 ms steps,
  ``linger.ms=5`` (librdkafka's default); its process shares the machine with the worker,
  PostgreSQL and Kafka.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ops.bench import clock
from ops.bench.paced import create_topic, finish_producer, start_producer
from ops.bench.pgcpu import PgCpu
from ops.bench.runs import (
    COOPERATIVE,
    PY,
    ROOT,
    Run,
    env,
    fresh_schema,
    log_dir,
    machine_ticks,
    new_topic,
    scratch,
    uid,
    worker_argv,
)
from ops.operator.db import connection

__all__ = ["LINGERS_MS", "LINGER_SHARES", "LOW_RATES", "MOVE_SHARE", "ONE_PARTITION",
           "PROCESSES_SHARES", "RATE_SHARES", "merged", "pauses", "percentiles", "run_all",
           "steady", "window"]

RATE_SHARES = (0.25, 0.4, 0.5, 0.9)
PROCESSES_SHARES = (0.25, 0.5, 0.9)  # of the one-member capacity, with --processes 2
LOW_RATES = (1_000, 5_000)  # records/s, whatever the capacity
LINGER_SHARES = (0.25, 0.5)  # of the capacity, with each of LINGERS_MS
LINGERS_MS = (20, 50)  # --batch-linger-ms beside the default 5 ms of the steady runs
ONE_PARTITION = (0.25, 1_000)  # a share of the capacity, and a rate: on a topic of 1 partition
LOW_REPEAT = 5
MOVE_SHARE = 0.25
QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
SINK_ARGS = ("--batch-max-records", "2000")  # fencectl run --sink's default


# ---- histograms ----------------------------------------------------------------------------

def window(hist: Mapping[str, Mapping[str, int]], first_s: float, last_s: float
           ) -> dict[int, int]:
    """The latency histogram (ms -> records) of the records produced in the whole seconds
    ``[first_s, last_s)``."""
    out: dict[int, int] = {}
    for second, per in hist.items():
        if first_s <= int(second) < last_s:
            for ms, n in per.items():
                out[int(ms)] = out.get(int(ms), 0) + n
    return out


def merged(hists: Iterable[Mapping[str, Mapping[str, int]]]) -> dict[str, dict[str, int]]:
    """Several processes' histograms (per produce second) as one."""
    out: dict[str, dict[str, int]] = {}
    for hist in hists:
        for second, per in hist.items():
            into = out.setdefault(second, {})
            for ms, n in per.items():
                into[ms] = into.get(ms, 0) + n
    return out


def percentiles(hist: Mapping[int, int]) -> dict[str, Any]:
    """p50, p95, p99 and max (ms) of a histogram, and its record count (None when empty):
    a quantile is the least latency at or below which that share of the records lies."""
    total = sum(hist.values())
    if not total:
        return {"records": 0, **{name: None for name, _ in QUANTILES}, "max": None}
    out: dict[str, Any] = {"records": total}
    keys = sorted(hist)
    for name, q in QUANTILES:
        need, seen = q * total, 0
        for ms in keys:
            seen += hist[ms]
            if seen >= need:
                out[name] = ms
                break
    out["max"] = keys[-1]
    return out


# ---- runs ----------------------------------------------------------------------------------

async def _claimed(dsn: str, schema: str, group: str) -> int:
    async with connection(dsn) as conn:
        return int(await conn.fetchval(
            f'SELECT count(*) FROM "{schema}".partitions WHERE group_id = $1', group) or 0)


async def _committed(dsn: str, schema: str, group: str) -> int:
    async with connection(dsn) as conn:
        return int(await conn.fetchval(
            f'SELECT coalesce(sum(frontier), 0) FROM "{schema}".partitions '
            "WHERE group_id = $1", group) or 0)


def _wait(what: str, ok: Any, timeout_s: float, every_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise TimeoutError(f"latency bench: {what} not within {timeout_s:.0f} s")
        time.sleep(every_s)


def _run_of(kind: str, *, batches: bool = False) -> Run:
    settings = ("latency=1", *(("batches=1",) if batches else ()))
    if kind == "sink":
        return Run("latency_sink", "sink", "worker", SINK_ARGS, topic="sink", handler="sink",
                   settings=("table=bench_sink", "key=id", *settings))
    return Run("latency", "reference", "worker", settings=settings)


def _start_worker(run: Run, topic: str, group: str, schema: str, marks: Path,
                  setup: Sequence[str] = (), log: Path | None = None, root: Path = ROOT,
                  ) -> subprocess.Popen[bytes]:
    argv = worker_argv(run, topic, group, schema, marks)
    if setup:  # the group setup replaces the cooperative one worker_argv names
        at = next(i for i in range(len(argv)) if argv[i:i + len(COOPERATIVE)] == COOPERATIVE)
        argv[at:at + len(COOPERATIVE)] = list(setup)
    out = open(log, "wb") if log is not None else subprocess.DEVNULL
    return subprocess.Popen(argv, env=env(root), cwd=root, stdout=out, stderr=out)


def _stop(procs: Iterable[subprocess.Popen[bytes]]) -> list[int | None]:
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    codes: list[int | None] = []
    for p in procs:
        try:
            codes.append(p.wait(60))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    return codes


def steady(kind: str, rate: float, *, seconds: float, warmup_s: float, dsn: str,
           partitions: int, root: Path = ROOT, extra: Sequence[str] = (),
           processes: int = 0) -> dict[str, Any]:
    """One member (or a set of ``processes``) under ``rate`` records/s of ``kind``, and the
    plain consumer beside it (see the module docstring); ``root``: the tree whose worker
    runs (``ops.bench.trees``), ``extra``: more ``fencectl run`` flags."""
    topic, group, schema = new_topic(f"lat{kind}"), uid("gl"), fresh_schema(dsn)
    create_topic(topic, partitions)
    pg = PgCpu(dsn)
    tmp = scratch(f"bench-latency-{kind}-")
    produced, control = tmp / "producer.json", tmp / "control.json"
    run = _run_of(kind)
    run = dataclasses.replace(run, args=(*run.args, *extra), processes=processes)
    worker = _start_worker(run, topic, group, schema, tmp / "member-{pid}.json", root=root)
    # the plain consumer is this tree's (a tree compared by ops.bench.trees may predate it)
    plain = subprocess.Popen([PY, "-m", "ops.bench.control", "--topic", topic, "--group",
                              uid("glc"), "--out", str(control)], env=env(), cwd=ROOT)
    try:
        _wait("the assignment", lambda: asyncio.run(_claimed(dsn, schema, group)) == partitions,
              120)
        before = _cpu_now(pg)
        prod = start_producer(topic, kind, rate, warmup_s + seconds, partitions, produced)
        summary = finish_producer(prod, produced, warmup_s + seconds + 300)
        after = _cpu_now(pg)
        _wait("every record committed", lambda: clock.combined(
            clock.member_files(tmp))["records"] >= summary["produced"], 300)
        time.sleep(2 * clock.FLUSH_S)
    finally:
        [code, _] = _stop([worker, plain])
    members = clock.read(clock.member_files(tmp))
    total = clock.combined(clock.member_files(tmp))
    seen = json.loads(control.read_text()) if control.exists() else {"lat": {}}
    cpu_us = total["cpu_s"] * 1e6 / total["records"] if total.get("records") else None
    first = math.ceil(summary["start_wall"] + warmup_s)  # whole seconds of produce time
    last = min(first + seconds, math.floor(summary["end_wall"]))
    lat, begin = (window(merged(m.get(k, {}) for m in members), first, last)
                  for k in ("lat", "lat_begin"))
    return {"handler": kind, "rate": round(rate), "rate_achieved": summary["rate_achieved"],
            "produced": summary["produced"], "seconds": last - first, "warmup_s": warmup_s,
            "processes": max(processes, 1), "commit_ms": percentiles(lat),
            "handler_call_ms": percentiles(begin),
            "control_ms": percentiles(window(seen["lat"], first, last)),
            "control_cpu_us_per_record": (round(seen["cpu_s"] * 1e6 / seen["records"], 1)
                                          if seen.get("records") else None),
            "mean_batch": total.get("mean_batch"),
            "cpu_us_per_record": round(cpu_us, 1) if cpu_us else None,
            **_cpu_while(before, after, summary), "exit": code}


def _machine_cpu_s() -> float:
    """Every CPU's busy time so far (``runs.machine_ticks`` but idle and iowait), in seconds."""
    ticks = machine_ticks()[:8]  # guest time is in user already
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _cpu_now(pg: PgCpu) -> tuple[float, float, float | None]:
    return time.monotonic(), _machine_cpu_s(), pg.seconds()


def _cpu_while(before: tuple[float, float, float | None],
               after: tuple[float, float, float | None], summary: Mapping[str, Any]
               ) -> dict[str, Any]:
    """The machine's and PostgreSQL's CPU while the producer ran (its warm-up included):
    cores busy on average, and per record produced."""
    wall, n = after[0] - before[0], summary["produced"]
    machine = after[1] - before[1]
    pg = after[2] - before[2] if after[2] is not None and before[2] is not None else None
    return {"machine_cores": round(machine / wall, 2) if wall > 0 else None,
            "machine_cpu_us_per_record": round(machine * 1e6 / n, 1) if n else None,
            "pg_cpu_us_per_record": round(pg * 1e6 / n, 1) if n and pg is not None else None}


def _log_of(report: dict[str, Any]) -> list[list[float]]:
    return [list(x) for x in report.get("batch_log", [])]


def pauses(a_log: Sequence[Sequence[float]], b_log: Sequence[Sequence[float]],
           joined_s: float, killed_s: float) -> dict[str, Any]:
    """The pauses of a move (see the module docstring) from the two members' batch logs
    (partition, commit wall time, records, largest latency ms)."""
    moved = sorted({int(b[0]) for b in b_log})
    join, back = [], []
    for p in moved:
        b_first = min(b[1] for b in b_log if b[0] == p)
        a_before = [a[1] for a in a_log if a[0] == p and a[1] <= b_first]
        if a_before:
            join.append(b_first - max(a_before))
        a_after = [a[1] for a in a_log if a[0] == p and a[1] > killed_s]
        if a_after:
            back.append(min(a_after) - killed_s)
    stayed: list[float] = []
    for p in sorted({int(a[0]) for a in a_log} - set(moved)):
        times = sorted(a[1] for a in a_log if a[0] == p and joined_s - 1 <= a[1] <= killed_s)
        stayed += [y - x for x, y in itertools.pairwise(times)]

    def summary(xs: list[float]) -> dict[str, Any]:
        return {"partitions": len(xs), "max_s": round(max(xs), 3) if xs else None,
                "median_s": round(statistics.median(xs), 3) if xs else None}

    return {"join": summary(join), "kill": summary(back),
            "stayed_longest_gap_s": round(max(stayed), 3) if stayed else None}


def moves(setup: str, rate: float, *, dsn: str, partitions: int, quick: bool
          ) -> dict[str, Any]:
    """A joins alone, B joins, B is SIGKILLed, under ``rate`` records/s (reference)."""
    from ops.bench.scale import SETUPS

    topic, group, schema = new_topic("move"), uid("gm"), fresh_schema(dsn)
    create_topic(topic, partitions)
    tmp = log_dir(f"move-{setup}-{round(rate)}")
    run = _run_of("reference", batches=True)
    files = [tmp / "a.json", tmp / "b.json"]
    before_join_s, b_runs_s = (2, 2) if quick else (5, 5)
    most_s = before_join_s + 60  # the producer's bound; stopped once A resumed B's partitions
    a = _start_worker(run, topic, group, schema, files[0], SETUPS[setup], tmp / "a.log")
    procs = [a]
    try:
        _wait("A's assignment",
              lambda: asyncio.run(_claimed(dsn, schema, group)) == partitions, 120)
        prod = start_producer(topic, "reference", rate, most_s, partitions, tmp / "p.json")
        # the producer first makes every record it may send (rate x most_s of them, seconds
        # of work): B joins once A has committed on every partition for before_join_s

        def a_on_all() -> bool:
            marks = clock.read([files[0]])
            return bool(marks) and len({int(x[0]) for x in _log_of(marks[0])}) == partitions

        _wait("A's first commit on every partition", a_on_all, 120)
        time.sleep(before_join_s)
        joined = time.time()
        b = _start_worker(run, topic, group, schema, files[1], SETUPS[setup], tmp / "b.log")
        procs.append(b)
        _wait("B's first commit", lambda: clock.combined([files[1]])["records"] > 0, 60)
        time.sleep(b_runs_s)
        killed = time.time()
        os.kill(b.pid, signal.SIGKILL)
        b.wait(30)
        moved = {int(x[0]) for x in _log_of(clock.read([files[1]])[0])}
        _wait("A's commits on B's partitions after the kill", lambda: moved <= {
            int(x[0]) for x in _log_of(clock.read([files[0]])[0]) if x[1] > killed}, 120)
        time.sleep(1.0)
        prod.send_signal(signal.SIGTERM)
        produced = finish_producer(prod, tmp / "p.json", 300)["produced"]
        _wait("every record committed",
              lambda: asyncio.run(_committed(dsn, schema, group)) >= produced, 300)
        time.sleep(2 * clock.FLUSH_S)
    finally:
        codes = _stop(procs)
    a_rep, b_rep = (clock.read([f])[0] for f in files)
    session = 6.0  # SETUPS: session.timeout.ms=6000; KIP-848: the stack's broker setting
    return {"setup": setup, "rate": round(rate), "session_timeout_s": session,
            **pauses(_log_of(a_rep), _log_of(b_rep), joined, killed),
            "exit_a": codes[0], "logs": str(tmp.relative_to(ROOT))}


def run_all(capacity: Mapping[str, float], *, dsn: str, quick: bool, partitions: int = 6
            ) -> dict[str, Any]:
    """Steady runs at ``RATE_SHARES`` of each handler's capacity (records/s by handler
    kind: ``reference``, ``sink``), at ``PROCESSES_SHARES`` with ``--processes 2``, at the
    fixed ``LOW_RATES`` ``LOW_REPEAT`` times each, then the moves at ``MOVE_SHARE`` of the
    reference's."""
    from ops.bench.scale import SETUPS

    seconds, warmup_s = (3.0, 1.0) if quick else (20.0, 5.0)
    low_seconds, low_warmup_s, low_repeat = (3.0, 1.0, 1) if quick else (10.0, 3.0, LOW_REPEAT)
    out: dict[str, Any] = {"rate_shares": list(RATE_SHARES), "capacity": dict(capacity),
                           "steady": [], "low": [], "processes": [], "linger": [],
                           "one_partition": [], "moves": []}
    for kind, cap in capacity.items():
        for share in RATE_SHARES:
            print(f"latency: {kind} at {share:.0%} of {cap:,.0f} records/s ...", flush=True)
            got = steady(kind, share * cap, seconds=seconds, warmup_s=warmup_s, dsn=dsn,
                         partitions=partitions)
            out["steady"].append({"share": share, **got})
            print(f"  {got}", flush=True)
        for share in PROCESSES_SHARES[:1] if quick else PROCESSES_SHARES:
            print(f"latency: {kind} at {share:.0%} of {cap:,.0f} records/s, --processes 2 ...",
                  flush=True)
            got = steady(kind, share * cap, seconds=seconds, warmup_s=warmup_s, dsn=dsn,
                         partitions=partitions, processes=2)
            out["processes"].append({"share": share, **got})
            print(f"  {got}", flush=True)
        for share, ms in itertools.product(*(((LINGER_SHARES[0],), LINGERS_MS[:1]) if quick
                                             else (LINGER_SHARES, LINGERS_MS))):
            print(f"latency: {kind} at {share:.0%} of {cap:,.0f} records/s, "
                  f"--batch-linger-ms {ms} ...", flush=True)
            got = steady(kind, share * cap, seconds=seconds, warmup_s=warmup_s, dsn=dsn,
                         partitions=partitions, extra=("--batch-linger-ms", str(ms)))
            out["linger"].append({"share": share, "linger_ms": ms, **got})
            print(f"  {got}", flush=True)
        for rate in LOW_RATES:
            tries = []
            for i in range(low_repeat):
                print(f"latency: {kind} at {rate:,} records/s, run {i + 1} of {low_repeat} ...",
                      flush=True)
                tries.append(steady(kind, rate, seconds=low_seconds, warmup_s=low_warmup_s,
                                    dsn=dsn, partitions=partitions))
                print(f"  {tries[-1]}", flush=True)
            out["low"].append({"handler": kind, "rate": rate, "runs": tries})
        share, rate = ONE_PARTITION
        for offered, at_share in ((share * cap, share), (rate, None)):
            low_run = at_share is None
            print(f"latency: {kind} at {offered:,.0f} records/s on one partition ...",
                  flush=True)
            got = steady(kind, offered, seconds=low_seconds if low_run else seconds,
                         warmup_s=low_warmup_s if low_run else warmup_s, dsn=dsn,
                         partitions=1)
            out["one_partition"].append({"share": at_share, "partitions": 1, **got})
            print(f"  {got}", flush=True)
    ref = capacity.get("reference")
    if ref:
        for setup in (["cooperative-sticky"] if quick else list(SETUPS)):
            print(f"latency: moves, {setup} ...", flush=True)
            got = moves(setup, MOVE_SHARE * ref, dsn=dsn, partitions=partitions, quick=quick)
            out["moves"].append(got)
            print(f"  {got}", flush=True)
    return out
