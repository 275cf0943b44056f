"""``make bench``: the worker benchmark (a benchmark, not a timed test).

On one produced source (``--count`` records, default 200,000, ``--partitions`` 6, reference
domain, valid class) it runs every entry of ``RUNS`` (``ops.bench.runs``), each as its own
process(es) with its own group and schema, timed by one clock (``ops.bench.clock``):
(a) raw consumption without a database; (b) a pipelined unfenced at-least-once consumer;
(b') today's stop-and-wait unfenced consumer; (e) the database ceiling (the same handler
over the same records from memory, no Kafka); (e') (e) with the worker's consume path in
the same process (``ops.bench.baselines``); (c) the worker; (d) the worker with batches
of one on the first ``--single-count`` records of a second topic (a rate). The table sink
(``fencectl run --sink``) gets the same b/b'/e/c runs on a third topic of ``--count``
100-byte JSON values (``ops.bench.sink.produce_values``), upserting on ``id`` into a fresh
table per run, and one worker run in insert mode (no key); ``--sink-only`` runs just those
(``make bench-sink``); the sink also runs with 2 and 3 members (one try each). The Avro sink
runs beside a JSON sink run on the same records (a fourth topic holds them in Avro,
``ops.bench.sink.produce_avro_values``) into the same typed table (``TYPED_DDL``: a column
per field), alternating: ``c_sink_avro_over_json`` is their ratio. The routed sink
(``--sink table='{topic}'``) reads three topics of a third of the records each (a third of
the partitions each: as many in all) into three tables, alternating with the single-table
upsert run: ``c_sink_routed_over_single``. The repeated
runs alternate ``--repeat`` times on the same data; the median by records/s is reported.
Then scale (``ops.bench.scale``): assignment cost, join → first commit, members 1..3, the
backlog drain and memory; each reported peak RSS is checked against the memory
bound of docs/benchmarks.md (``ops.bench.memory``, ``result["memory"]``). Results:
``artifacts/bench/worker.json`` and PNG charts next to it (``ops.bench.plots``).
``--quick``: small sizes, one repeat (the smoke test's mode).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

from ops.bench import latency, memory, peer, scale, scaling
from ops.bench.provenance import provenance
from ops.bench.runs import (
    ROOT,
    TOPICS,
    Run,
    delete_topics,
    execute,
    interpreter_mib,
)
from ops.bench.sink import produce_values
from ops.bench.sources import produce, produce_topics
from ops.commands.run import SINK_BATCH_MAX_RECORDS

OUT = ROOT / "artifacts" / "bench" / "worker.json"
EXTRA = ("scaling", "latency", "peer")  # the sections after the throughput runs
PY = sys.executable

#: every throughput run, in the order they are run (see ``ops.bench.runs.Run``). A variant
#: is one more entry here and its ratios one more line of ``RATIOS``.
RUNS: list[Run] = [
    Run("a_raw", "(a) raw consume, no DB", "baseline", ("raw",), repeat=False),
    Run("a_raw_aioconsumer", "(a') raw via AIOConsumer", "baseline", ("raw-aio",),
        repeat=False),
    Run("b_pipelined", "(b) unfenced, pipelined", "baseline", ("pipelined",)),
    Run("b_pipelined_default_gc", "(b) with CPython's default collector", "baseline",
        ("pipelined", "--default-gc"), repeat=False),
    Run("b_prime_stop_and_wait", "(b') unfenced, stop-and-wait", "baseline",
        ("stop-and-wait",)),
    Run("e_db_ceiling", "(e) DB ceiling, from memory", "baseline", ("memory",)),
    Run("e_prime_consume", "(e') DB ceiling + consuming in-process", "baseline",
        ("memory-consume",)),
    Run("e_second_consume_process", "(e'') DB ceiling + a consumer process feeding it",
        "baseline", ("memory-consume-process",)),
    Run("c_fenceworker", "(c) fenceworker", "worker"),
    Run("d_fenceworker_batch1", "(d) fenceworker, batch 1", "worker",
        ("--batch-max-records", "1"), topic="single", repeat=False),
]
# the sink's runs, baselines included, use the batch bound `fencectl run --sink` defaults to
BATCH = ("--batch-max-records", str(SINK_BATCH_MAX_RECORDS))
SINK = ("--sink", "bench_sink", "--sink-key", "id", *BATCH)


def _sink_worker(name: str, label: str, *, args: tuple[str, ...] = BATCH, key: bool = True,
                 members: int = 1, repeat: bool = False, topic: str = "sink",
                 table: str = "bench_sink", more: tuple[str, ...] = ()) -> Run:
    """A worker run of the table sink into ``bench_sink`` (upsert on ``id``; insert without)."""
    return Run(name, label, "worker", args, topic=topic, handler="sink", members=members,
               repeat=repeat, settings=(f"table={table}", *(("key=id",) if key else ()),
                                        *more))


#: the table sink's runs: same clock, 100-byte JSON values, upsert on ``id`` (insert: no key)
SINK_RUNS: list[Run] = [
    Run("b_sink_pipelined", "(b) sink: unfenced, pipelined", "baseline",
        ("pipelined", *SINK), topic="sink"),
    Run("b_prime_sink_stop_and_wait", "(b') sink: unfenced, stop-and-wait", "baseline",
        ("stop-and-wait", *SINK), topic="sink"),
    Run("e_sink_db_ceiling", "(e) sink: DB ceiling, from memory", "baseline",
        ("memory", *SINK), topic="sink"),
    _sink_worker("c_sink_fenceworker", "(c) sink: fenceworker, upsert", repeat=True),
    _sink_worker("c_sink_insert", "(c) sink: fenceworker, insert", key=False),
    _sink_worker("c_sink_batch_500", "(c) sink: batches of 500",
                 args=("--batch-max-records", "500")),
    _sink_worker("c_sink_2_members", "(c) sink: 2 members, upsert", members=2),
    _sink_worker("c_sink_3_members", "(c) sink: 3 members, upsert", members=3),
    _sink_worker("c_sink_typed_json", "(c) sink: JSON into columns", repeat=True,
                 table="bench_sink_typed", more=("layout=typed",)),
    _sink_worker("c_sink_typed_avro", "(c) sink: Avro into columns", repeat=True,
                 topic="sink_avro", table="bench_sink_typed", more=("format=avro",)),
    _sink_worker("c_sink_routed", "(c) sink: 3 topics into 3 tables, upsert", repeat=True,
                 topic="sink_routed", table="{topic}"),
]
RUNS += SINK_RUNS
#: ratio name -> (numerator run, denominator run), of records/s
RATIOS: dict[str, tuple[str, str]] = {
    "c_over_b": ("c_fenceworker", "b_pipelined"),
    "c_over_b_prime": ("c_fenceworker", "b_prime_stop_and_wait"),
    "c_over_e": ("c_fenceworker", "e_db_ceiling"),
    "c_over_d": ("c_fenceworker", "d_fenceworker_batch1"),
    "c_over_e_prime": ("c_fenceworker", "e_prime_consume"),
    "e_second_over_e": ("e_second_consume_process", "e_db_ceiling"),
    "e_prime_over_e": ("e_prime_consume", "e_db_ceiling"),
    "c_sink_over_b_sink": ("c_sink_fenceworker", "b_sink_pipelined"),
    "c_sink_over_b_prime_sink": ("c_sink_fenceworker", "b_prime_sink_stop_and_wait"),
    "c_sink_over_e_sink": ("c_sink_fenceworker", "e_sink_db_ceiling"),
    "c_sink_avro_over_json": ("c_sink_typed_avro", "c_sink_typed_json"),
    "c_sink_routed_over_single": ("c_sink_routed", "c_sink_fenceworker"),
}
TARGETS = {"c_over_b": 0.95, "c_over_e": 0.8, "c_over_d": 10,
           "c_sink_fenceworker_records_per_s": 60_000, "c_sink_avro_over_json": 0.9,
           "c_sink_routed_over_single": 0.9}


def throughput(runs: list[Run], topics: dict[str, tuple[str, int]], repeat: int,
               dsn: str) -> dict[str, Any]:
    """Run ``runs`` (the repeated ones alternating ``repeat`` times); median by records/s."""
    tries: dict[str, list[dict[str, Any]]] = {r.name: [] for r in runs}
    for i in range(repeat):
        for r in runs:
            if i and not r.repeat:
                continue
            topic, total = topics[r.topic]
            print(f"run {r.name} #{i + 1} ...", flush=True)
            tries[r.name].append(execute(r, topic, total, dsn))
            print(f"  {tries[r.name][-1]}", flush=True)
    return {r.name: {"label": r.label, **summarize(tries[r.name])} for r in runs}


def summarize(tries: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's tries (``execute`` results) as ``worker.json`` reports them: the try at the
    median rate (the upper median), every try's rate, CPU per record and steal, and the
    upper median of CPU per record (``ops.bench.trees`` reports its trees' tries the same)."""
    ordered = sorted(tries, key=lambda x: x["records_per_s"])
    cpu = [x["cpu_us_per_record"] for x in tries if x.get("cpu_us_per_record")]
    pg = [x["pg_cpu_us_per_record"] for x in tries if x.get("pg_cpu_us_per_record")]
    return {**ordered[len(ordered) // 2],
            "median_pg_cpu_us_per_record": statistics.median_high(pg) if pg else None,
            "all_records_per_s": [x["records_per_s"] for x in tries],
            "all_cpu_us_per_record": [x.get("cpu_us_per_record") for x in tries],
            "all_steal_share": [x.get("steal_share") for x in tries],
            # the upper median, as the rate's (``ordered[len // 2]``)
            "median_cpu_us_per_record": statistics.median_high(cpu) if cpu else None}


def _per_try(n: dict[str, Any], d: dict[str, Any]) -> float | None:
    """The median of try i of ``n`` over try i of ``d`` (alternated, minutes apart)."""
    pairs = [x / y for x, y in zip(n.get("all_records_per_s", ()),
                                   d.get("all_records_per_s", ()), strict=False) if y]
    return round(statistics.median(pairs), 3) if len(pairs) > 1 else None


def _per_cpu(n: dict[str, Any], d: dict[str, Any]) -> float | None:
    """Records per CPU-second of ``n`` over ``d`` (medians of CPU per record)."""
    cn, cd = n.get("median_cpu_us_per_record"), d.get("median_cpu_us_per_record")
    return round(cd / cn, 3) if cn and cd else None


def steal_summary(result: dict[str, Any]) -> dict[str, float]:
    """Median and largest share of CPU time stolen by the hypervisor over every try of the
    throughput runs: what "a quiet machine" was, as a number."""
    shares = [x for r in result["runs"].values() for x in r.get("all_steal_share", ())
              if x is not None]
    return ({"median": statistics.median(shares), "max": max(shares)} if shares else {})


def ratios(runs: dict[str, Any], how: str = "rate") -> dict[str, float | None]:
    """Every ratio of ``RATIOS`` whose runs were chosen, one of three ways: ``rate`` the
    medians' records/s (what the targets name); ``paired`` the median of the per-try ratios
    (a slow spell of the shared machine moves the two runs of one try alike); ``cpu``
    records per CPU-second of each run's own process(es) (what the numerator costs per
    record next to the denominator, whatever the machine's speed: CPU time is not spent
    waiting for a stolen core or a stalled disk)."""
    of = {"paired": _per_try, "cpu": _per_cpu}.get(how)
    out: dict[str, float | None] = {}
    for name, (num, den) in RATIOS.items():
        if num not in runs and den not in runs:  # neither was chosen (--only, --sink-only)
            continue
        n, d = runs.get(num), runs.get(den)
        if n is None or d is None:
            out[name] = None
        elif of is not None:
            out[name] = of(n, d)
        else:
            out[name] = (round(n["records_per_s"] / d["records_per_s"], 3)
                         if d["records_per_s"] else None)
    return out


def _extra(a: argparse.Namespace, dsn: str, runs: dict[str, Any],
           topics: dict[str, tuple[str, int]]) -> dict[str, Any]:
    """The scaling, latency and peer sections, on the topics and capacity just measured."""
    capacity = {kind: runs[name]["records_per_s"] for kind, name in
                (("reference", "c_fenceworker"), ("sink", "c_sink_fenceworker")) if name in runs}
    def fill(kind: str, topic: str, count: int, partitions: int) -> None:
        if kind == "sink":
            produce_values(topic, count, partitions, os.environ["KAFKA_BOOTSTRAP_SERVERS"])
        else:
            produce(topic, count, partitions, 1)

    sections = set(a.extra.split(","))
    out: dict[str, Any] = {}
    if "scaling" in sections:
        out["scaling"] = scaling.run_all(dsn, a.count, fill)
    if "latency" in sections:
        out["latency"] = latency.run_all(capacity, dsn=dsn, quick=a.quick,
                                         partitions=a.partitions)
    if "sink" in topics and "peer" in sections:
        out["peer"] = peer.run_all(dsn, *topics["sink"], partitions=a.partitions,
                                   repeat=a.repeat, quick=a.quick)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.worker")
    p.add_argument("--count", type=int, default=200_000)
    p.add_argument("--single-count", type=int, default=6_000)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--quick", action="store_true",
                   help="small sizes, one repeat, small scale section (smoke test)")
    p.add_argument("--only", default="", help="comma-separated run names (default: all)")
    p.add_argument("--sink-only", action="store_true",
                   help="only the table sink's runs, no scale section (make bench-sink)")
    p.add_argument("--no-scale", action="store_true", help="skip the scale section")
    p.add_argument("--no-extra", action="store_true",
                   help="skip the scaling, latency and peer sections")
    p.add_argument("--extra", default=",".join(EXTRA),
                   help=f"comma-separated sections of {', '.join(EXTRA)} (default: all)")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)
    if a.quick:
        a.count, a.single_count, a.repeat = min(a.count, 6_000), min(a.single_count, 300), 1
    if a.sink_only:
        a.only, a.no_scale, a.no_extra = ",".join(r.name for r in SINK_RUNS), True, True
        if a.out == OUT:
            a.out = OUT.with_name("worker_sink.json")
    try:
        return _bench(a)
    finally:
        print(f"deleted the bench's topics: {' '.join(delete_topics()) or 'none'}", flush=True)


def _bench(a: argparse.Namespace) -> int:
    dsn = os.environ["FENCE_DSN"]
    # as the user typed it: the Makefile names its target (FENCE_BENCH_COMMAND)
    measured = provenance(os.environ.get("FENCE_BENCH_COMMAND")
                          or " ".join(["python -m ops.bench.worker", *a.argv]))
    only = {n for n in a.only.split(",") if n}
    chosen = [r for r in RUNS if not only or r.name in only]
    topics = produce_topics((r.topic for r in chosen), a.count, a.single_count, a.partitions)
    interpreter = interpreter_mib()  # part of the memory bound's base (ops.bench.memory)
    runs = throughput(chosen, topics, a.repeat, dsn)
    if "d_fenceworker_batch1" in runs:
        runs["d_fenceworker_batch1"]["note"] = (
            f"measured on {a.single_count} records of the same generator (a rate)")
    result: dict[str, Any] = {
        "provenance": measured,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
        "count": a.count, "partitions": a.partitions, "repeat": a.repeat, "quick": a.quick,
        "clock": "CLOCK_MONOTONIC, first handler call -> last handler return (ops.bench.clock)",
        "sink": "table sink: 100-byte JSON values, upsert on id (c_sink_insert: no key), "
                "binary COPY (the default method); c_sink_typed_json and c_sink_typed_avro: "
                "the same records as JSON and as Avro into one typed table; c_sink_routed: "
                "three topics into three tables (--sink table='{topic}')",
        "runs": runs, "ratios": ratios(runs), "paired_ratios": ratios(runs, "paired"),
        "cpu_ratios": ratios(runs, "cpu"), "targets": TARGETS,
        "interpreter_mib": interpreter,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    partial = a.out.with_suffix(".partial.json")  # what a section that fails would lose
    partial.write_text(json.dumps(result, indent=2) + "\n")
    if not a.no_extra:  # one process per core, latency at shares of (c), the peer
        result.update(_extra(a, dsn, runs, topics))
        partial.write_text(json.dumps(result, indent=2) + "\n")
        if "latency" in result:  # its own provenance: make bench-latency measures it alone
            result["latency"]["provenance"] = measured
            result["latency"]["backlog_cpu_us_per_record"] = {
                kind: runs[name].get("median_cpu_us_per_record") for kind, name in
                (("reference", "c_fenceworker"), ("sink", "c_sink_fenceworker")) if name in runs}
    if not a.no_scale:
        result["scale"] = scale.run_all(dsn, quick=a.quick, produce=produce)
    result["memory"] = memory.checks(result)  # the documented bound against each peak
    result["topics"] = list(TOPICS)  # deleted when the bench ends (ops.bench.runs.new_topic)
    result["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    result["steal_share"] = steal_summary(result)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    partial.unlink(missing_ok=True)
    from ops.bench import plots

    charts = plots.write_all(result, a.out.parent, "_sink" if a.sink_only else "")
    for key in ("ratios", "paired_ratios", "cpu_ratios"):
        print(key, json.dumps(result[key], indent=2))
    print("CPU stolen by the hypervisor over the runs:", result["steal_share"])
    for m in result["memory"]:
        print(f"memory: {m['run']}: peak {m['peak_rss_mib']} MiB, bound {m['bound_mib']} MiB"
              f" ({'within' if m['within_bound'] else 'EXCEEDED'})")
    print("wrote", a.out, *(str(c) for c in charts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
