"""``make bench-profile``: the worker at full speed under py-spy (all threads, no idle).

Produces ``--count`` reference records, starts one worker (the timed handler of
``ops.bench.clock``), attaches ``py-spy record --format raw`` to it until the marks reach
``--count``, then ranks functions by own samples (where the CPU was) and by inclusive
samples, splits the samples into the worker's parts (``PARTS``: the handler, the Kafka
thread, the delivery on the loop, the worker's frame around the handler), and writes
``artifacts/bench/profile.json`` plus the raw stacks. ``--sink``: the table sink's worker
run instead (100-byte JSON values, upsert on ``id``, as ``make bench``'s
``c_sink_fenceworker``) -> ``artifacts/bench/profile_sink.json``; with ``--gil``
``profile_gil.json``. Next to the profile it
reports where the machine's CPU went over the measured span (``cpu``: seconds and share of
all cores, from ``/proc``, for the worker, PostgreSQL's processes, Kafka's JVM and the rest
of the machine), which tells whether the worker or the database is the limit. py-spy is in the
``bench`` extra; it needs ptrace rights on the worker (root, or ``CAP_SYS_PTRACE``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ops.bench import clock
from ops.bench.runs import (
    ROOT,
    Run,
    delete_topics,
    env,
    fresh_schema,
    machine_ticks,
    scratch,
    uid,
    worker_argv,
)

OUT = ROOT / "artifacts" / "bench" / "profile.json"
_FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^:]+)(?::\d+)?\)$")


def _name(frame: str) -> str:
    """``func (path/to/file.py:12)`` -> ``file.py:func`` relative to the repository."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m["file"]
    for marker in ("/site-packages/", str(ROOT) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{path}:{m['func']}"


#: where a sample belongs, by the first rule whose marker is one of its frames' names
PARTS = (
    ("handler", ("ops/bench/clock.py:", "ops/reference/", "fencing/postgres/sink/")),
    ("kafka thread (consume() and hand-over)", ("consumer/kafka/adapter.py:KafkaThread._main",)),
    ("delivery on the loop (translate, buffer)", ("consumer/lifetime_run.py:"
                                                 "LifetimeRun._take_delivery",)),
    ("worker frame outside the handler (lifecycle, fence, spans, metrics)",
     ("consumer/", "fencing/")),
)


def part_of(frames: list[str]) -> str:
    """The ``PARTS`` name of one sample's stack (``other``: the event loop itself, start-up)."""
    for name, markers in PARTS:
        if any(f.startswith(markers) for f in frames):
            return name
    return "other"


def rank(raw: str, top: int = 10) -> dict[str, Any]:
    """Own and inclusive samples per function from py-spy's raw (collapsed) stacks, and
    the samples per ``PARTS`` entry."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    parts: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_name(f) for f in stack.split(";")]
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        parts[part_of(frames)] += n
        for f in set(frames):
            inclusive[f] += n

    def share(c: Counter[str]) -> list[dict[str, Any]]:
        return [{"function": f, "samples": n, "share": round(n / max(total, 1), 3)}
                for f, n in c.most_common(top)]
    return {"samples": total, "own": share(own), "inclusive": share(inclusive),
            "parts": {p: round(n / max(total, 1), 3) for p, n in parts.most_common()}}


def per_record_us(parts: dict[str, float], samples: int, rate: int, records: int
                  ) -> dict[str, float]:
    """Sampled microseconds per record of each part (its share of ``samples`` taken at
    ``rate`` per second): with ``--gil`` the time the part held the GIL, which the loop and
    the Kafka thread share. Start-up's samples fall in ``other``."""
    return {p: round(share * samples / rate / max(records, 1) * 1e6, 2)
            for p, share in parts.items()}


def _ticks() -> tuple[dict[int, tuple[str, int]], int]:
    """Per process (comm, utime + stime in clock ticks), and the machine's busy ticks."""
    procs: dict[int, tuple[str, int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat.rsplit(")", 1)[1]
            fields = rest.split()
            procs[int(d.name)] = (comm, int(fields[11]) + int(fields[12]))
    cpu = machine_ticks()
    return procs, sum(cpu) - cpu[3] - cpu[4]  # all but idle and iowait


def cpu_share(before: tuple[dict[int, tuple[str, int]], int],
              after: tuple[dict[int, tuple[str, int]], int], worker: int,
              elapsed_s: float) -> dict[str, Any]:
    """CPU seconds between two ``_ticks`` by group, and each as a share of all cores."""
    hz = os.sysconf("SC_CLK_TCK")
    groups: Counter[str] = Counter()
    for pid, (comm, ticks) in after[0].items():
        used = ticks - before[0].get(pid, (comm, 0))[1]
        group = ("worker" if pid == worker else "postgres" if comm.startswith("postgres")
                 else "kafka" if comm == "java" else "py-spy" if comm == "py-spy" else "")
        if group:
            groups[group] += used
    groups["machine"] = after[1] - before[1]
    cores = os.cpu_count() or 1
    return {"elapsed_s": round(elapsed_s, 2), "cores": cores, **{
        g: {"cpu_s": round(t / hz, 2), "share_of_all_cores": round(t / hz / elapsed_s / cores, 3)}
        for g, t in groups.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.profile")
    p.add_argument("--count", type=int, default=200_000)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    p.add_argument("--sink", action="store_true", help="profile the table sink's run")
    p.add_argument("--run", default=None, metavar="NAME",
                   help="profile this run of ops.bench.worker's or ops.bench.cdc's RUNS "
                        "instead (e.g. c_sink_typed_avro, c_sink_cdc) -> profile_<NAME>.json")
    p.add_argument("--gil", action="store_true",
                   help="sample only the thread holding the GIL (py-spy --gil): where the "
                        "one resource the loop and the Kafka thread share goes")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    try:
        return _profile(a)
    finally:
        delete_topics()


def _profile(a: argparse.Namespace) -> int:
    from ops.bench.cdc import RUNS as CDC_RUNS
    from ops.bench.sources import produce_topics
    from ops.bench.worker import RUNS, SINK_RUNS

    dsn = os.environ["FENCE_DSN"]
    run = (next(r for r in [*RUNS, *CDC_RUNS] if r.name == a.run) if a.run
           else next(r for r in SINK_RUNS if r.name == "c_sink_fenceworker") if a.sink
           else Run("profile", "profile", "worker"))
    topic, _ = produce_topics([run.topic], a.count, a.count, a.partitions)[run.topic]
    name = f"_{a.run}" if a.run else "_sink" * a.sink
    a.out = a.out or OUT.with_name("profile" + name + "_gil" * a.gil + ".json")
    tmp = scratch("bench-profile-")
    marks, raw = tmp / "marks.json", a.out.with_suffix(".raw.txt")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    worker = subprocess.Popen(worker_argv(run, topic, uid("gp"), fresh_schema(dsn), marks),
                              env=env(), cwd=ROOT)
    spy = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "-p",
                            str(worker.pid), "--format", "raw", "-o", str(raw), "--rate",
                            str(a.rate), "--nonblocking", *(["--gil"] if a.gil else [])],
                           cwd=ROOT)
    start: tuple[dict[int, tuple[str, int]], int] | None = None
    try:
        while clock.combined([marks])["records"] < a.count and worker.poll() is None:
            if start is None and clock.combined([marks])["records"]:
                start, started = _ticks(), time.monotonic()
            time.sleep(0.05 if start is None else 0.2)
        end, ended = _ticks(), time.monotonic()
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        spy.wait(60)
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    got = clock.combined([marks])
    result = {"records": got["records"], "elapsed_s": round(got["elapsed_s"], 3),
              "records_per_s": round(got["records"] / max(got["elapsed_s"], 1e-9)),
              "py_spy_rate": a.rate, "gil_only": a.gil,
              "raw": str(raw.relative_to(ROOT) if raw.is_relative_to(ROOT) else raw),
              "load_average_1m": round(os.getloadavg()[0], 2),
              "cpu": cpu_share(start, end, worker.pid, ended - started) if start else None,
              **rank(raw.read_text())}
    result["parts_us_per_record"] = per_record_us(result["parts"], result["samples"], a.rate,
                                                  got["records"])
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
