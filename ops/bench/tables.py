"""The generated tables of the evidence pages, rendered from the JSON in ``docs/bench/``:
``docs/benchmarks.md`` (the headline first, then every section's tables; the table sink's
through ``ops.bench.sink_tables``) and ``docs/crash-matrix.md`` (``ops.bench.crash_tables``).

Long because each generated region of the pages has its renderer here, beside the registry
that names them.

``python -m ops.bench.tables`` rewrites every generated region of those pages; ``--check``
only compares and exits 1 naming the regions that differ. A region is the text between

    <!-- generated: NAME -->
    <!-- end generated -->

and NAME is a key of ``REGIONS``: the JSON file it reads and how it renders it.

Rules:
- each region with a table opens with one provenance line, "Measured by `COMMAND` at commit
  C on DATE (`docs/bench/FILE`)", from the JSON's ``provenance``: a figure on the page
  cannot drift from the file the tool wrote, and names what reproduces it;
- the page's text outside the regions is never touched;
- a region the page names but ``REGIONS`` lacks, or a region left unclosed, is an error;
- rendering is pure: the same JSON gives the same text.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.bench import crash_tables, sink_tables, suite

__all__ = ["PAGE", "PAGES", "REGIONS", "headline", "main", "render_page", "stale_regions"]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "benchmarks.md"
BENCH = ROOT / "docs" / "bench"

_REGION = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end generated -->)", re.S)

Report = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Region:
    source: str  # file name under docs/bench/
    render: Callable[[Report], list[str]]
    page: str = "benchmarks.md"  # the page under docs/ that holds the region


def _n(value: float) -> str:
    return f"{round(value):,}"


def _pct(share: float) -> str:
    return f"{share * 100:.1f}%"


def _made(report: Report, source: str) -> str:
    """"`COMMAND` at commit C on DATE (`docs/bench/SOURCE`)." from the JSON's provenance."""
    p = report.get("provenance") or {}
    return (f"`{p.get('command', '?')}` at commit {p.get('commit', '?')} on "
            f"{p.get('date', '?')} (`docs/bench/{source}`).")


def _tries(run: Report) -> str:
    tries = run.get("all_records_per_s") or [run["records_per_s"]]
    if len(tries) == 1:
        return f"{_n(run['records_per_s'])} (one try)"
    return f"{_n(run['records_per_s'])} ({'; '.join(_n(t) for t in tries)})"


def _us(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}"


def _runs_table(report: Report, names: Sequence[str]) -> list[str]:
    lines = ["| run | records/s (median; all tries) | CPU µs per record (median) "
             "| PostgreSQL CPU µs per record | mean batch | peak RSS |",
             "|---|---|---:|---:|---:|---:|"]
    for name in names:
        run = report["runs"][name]
        cpu = run.get("median_cpu_us_per_record", run["cpu_us_per_record"])
        lines.append(f"| {run['label']} | {_tries(run)} | {_us(cpu)} "
                     f"| {_us(run.get('median_pg_cpu_us_per_record'))} | {_n(run['mean_batch'])} "
                     f"| {run['peak_rss_mib']:.0f} MiB |")
    return lines


def _machine(report: Report) -> str:
    m, steal = report["machine"], report.get("steal_share") or {}
    text = f"{m['cpus']} CPUs, Python {m['python']}"
    if steal:
        text += (f"; CPU stolen by the hypervisor: median {_pct(steal['median'])}, "
                 f"at most {_pct(steal['max'])} over every try")
    return text + "."


def _in_order(report: Report) -> list[str]:
    return [f"Measured by {_made(report, 'sink-in-order.json')}", "",
            *sink_tables.in_order(report)]


def _decode(report: Report) -> list[str]:
    return [f"Measured by {_made(report, 'sink-decode.json')}", "",
            *sink_tables.decode(report)]


def _avro_runs(report: Report) -> list[str]:
    return [f"Measured by {_made(report, 'worker-quiet.json')}", "",
            *sink_tables.avro_runs(report)]


def _lanes(report: Report) -> list[str]:
    return [f"Measured by {_made(report, 'lanes.json')} A handler that sleeps "
            f"{report['wait_ms']} ms per call of up to {report['batch_max_records']} records:",
            "", *str(report["table"]).splitlines()]


def _cdc(report: Report) -> list[str]:
    return [f"Measured by {_made(report, 'cdc.json')}", "", *sink_tables.cdc(report)]


def worker_runs(report: Report) -> list[str]:
    names = [n for n in report["runs"] if "sink" not in n]
    return [f"Measured by {_made(report, 'worker-quiet.json')} {_machine(report)}", "",
            *_runs_table(report, names)]


def sink_runs(report: Report) -> list[str]:
    names = [n for n in report["runs"] if "sink" in n]
    target = report["targets"].get("c_sink_fenceworker_records_per_s")
    lines = [f"Measured by {_made(report, 'worker-quiet.json')}", "",
             *_runs_table(report, names)]
    if target and "c_sink_fenceworker" in report["runs"]:
        got = report["runs"]["c_sink_fenceworker"]["records_per_s"]
        lines += ["", f"Target: one member upserting ≥ {_n(target)} records/s — "
                      f"{'**met**' if got >= target else '**not met**'} ({_n(got)})."]
    upsert = report["runs"].get("c_sink_fenceworker") or {}
    worker_us = upsert.get("median_cpu_us_per_record")
    pg_us = upsert.get("median_pg_cpu_us_per_record")
    if worker_us is not None and pg_us is not None:
        met = "**met**" if worker_us <= pg_us else "**not met**"
        lines += ["", f"Target: the worker's CPU per record at most PostgreSQL's for the same "
                      f"upsert — {met} ({worker_us:,.1f} against {pg_us:,.1f} µs)."]
    return lines


_PRIME, _DOUBLE_PRIME = "\u2032", "\u2033"  # b', e'' as the page writes them
_RATIOS = (
    ("c_over_b", "c/b"), ("c_over_b_prime", f"c/b{_PRIME}"), ("c_over_e", "c/e"),
    ("c_over_e_prime", f"c/e{_PRIME}"), ("e_prime_over_e", f"e{_PRIME}/e"),
    ("e_second_over_e", f"e{_DOUBLE_PRIME}/e"), ("c_over_d", "c/d"),
    ("c_sink_over_b_sink", "sink c/b"), ("c_sink_over_b_prime_sink", f"sink c/b{_PRIME}"),
    ("c_sink_over_e_sink", "sink c/e"), ("c_sink_routed_over_single", "sink routed/single"),
)


def ratios(report: Report) -> list[str]:
    lines = [f"Measured by {_made(report, 'worker-quiet.json')}", "",
             "| ratio | of the medians | paired (median of per-try ratios) | per CPU-second "
             "| target |", "|---|---:|---:|---:|---|"]

    def cell(key: str, value: float | None) -> str:
        return "—" if value is None else f"{value:.3f}"

    for key, label in _RATIOS:
        if key not in report["ratios"]:
            continue
        median = report["ratios"][key]
        target = report["targets"].get(key)
        verdict = "—" if target is None or median is None else (
            f"≥ {target}: {'met' if median >= target else 'not met'}")
        lines.append(f"| {label} | {cell(key, median)} "
                     f"| {cell(key, report['paired_ratios'].get(key))} "
                     f"| {cell(key, report['cpu_ratios'].get(key))} | {verdict} |")
    return lines


def assignment(report: Report) -> list[str]:
    rows = report["scale"]["assignment"]
    return [f"Measured by {_made(report, 'worker-quiet.json')}", "",
            "| partitions per member | " + " | ".join(str(r["partitions"]) for r in rows) + " |",
            "|---|" + "---:|" * len(rows),
            "| claim + seek | " + " | ".join(f"{r['claim_seek_s'] * 1000:.0f} ms"
                                             for r in rows) + " |"]


def rebalances(report: Report) -> list[str]:
    scale = report["scale"]
    joins = {r["setup"]: r for r in scale["join_3x48"]}
    moves = {r["setup"]: r for r in scale.get("rebalance", [])}  # not in --quick
    lines = [f"Measured by {_made(report, 'worker-quiet.json')}", "",
             "| group setup | 3 members start on 48 partitions: all owned and committed "
             "| 1 member joins a running one: first commit on a moved partition |",
             "|---|---:|---:|"]
    for setup in joins:
        move = moves.get(setup)
        moved = "—" if move is None else (
            f"{move['join_to_moved_partition_processing_s']:.2f} s "
            f"({move['partitions_moved']} partitions move)")
        lines.append(f"| {setup} | {joins[setup]['join_to_all_committed_s']:.2f} s | {moved} |")
    return lines


def members(report: Report) -> list[str]:
    scale = report["scale"]
    lines = [f"Measured by {_made(report, 'worker-quiet.json')}", "",
             "| run | records | records/s | CPU µs per record | peak RSS (largest member) |",
             "|---|---:|---:|---:|---:|"]

    def row(label: str, run: Report) -> str:
        return (f"| {label} | {_n(run['records'])} | {_n(run['records_per_s'])} "
                f"| {run['cpu_us_per_record']:,.1f} | {run['peak_rss_mib']:.0f} MiB |")

    for run in scale["members_12_partitions"]:
        n = run["members"]
        lines.append(row(f"{n} member{'s' if n > 1 else ''}, 12 partitions", run))
    backlog = scale.get("backlog")
    if backlog:
        lines.append(row(f"{backlog['members']} members drain a backlog, 12 partitions "
                         f"({backlog['elapsed_s']:.1f} s)", backlog))
    large = scale.get("large_records")
    if large:
        lines.append(row(f"1 member, 6 partitions of {large['record_bytes'] >> 20} MiB records "
                         "(batches of one)", large))
    return lines


def memory_bound(report: Report) -> list[str]:
    lines = [f"Measured by {_made(report, 'worker-quiet.json')}", "",
             "| run | partitions at the peak | bound: base + queues + deliveries + handler "
             "+ allocator + librdkafka | peak RSS | below the bound |",
             "|---|---:|---|---:|---:|"]
    for m in report["memory"]:
        t = m["bound_terms"]
        terms = " + ".join(f"{t[k]:g}" for k in ("base", "queues", "deliveries", "handler",
                                                 "allocator", "librdkafka"))
        margin = (1 - m["peak_rss_mib"] / m["bound_mib"]) if m["within_bound"] else None
        lines.append(f"| {m['run']} | {m['partitions']} | {terms} = {m['bound_mib']:g} MiB "
                     f"| {m['peak_rss_mib']:g} MiB "
                     f"| {'EXCEEDED' if margin is None else f'{margin:.0%}'} |")
    return lines


def store(report: Report) -> list[str]:
    m, pg = report["machine"], report["postgres"]
    lines = [f"Measured by {_made(report, 'store.json')} {m['nproc']} cores "
             f"\"{m['cpu_model']}\", PostgreSQL {pg['server_version']} (fsync {pg['fsync']}, "
             f"synchronous_commit {pg['synchronous_commit']}), asyncpg {m['asyncpg']}, "
             f"{report['clients']} client, {report['rounds']} runs per size.", "",
             "| batch | fenced rec/s | unfenced rec/s | ratio (throughput) "
             "| median batch ms fenced / unfenced | fence cost ms/batch (paired median) "
             "| ratio (paired) |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["results"]:
        lines.append(
            f"| {r['batch_size']} | {_n(r['fenced_records_per_s'])} "
            f"| {_n(r['unfenced_records_per_s'])} | {r['ratio_throughput']:.2f} "
            f"| {r['fenced_median_batch_ms']:.2f} / {r['unfenced_median_batch_ms']:.2f} "
            f"| {r['fence_cost_median_paired_ms']:.2f} | {r['ratio_paired']:.2f} |")
    def verdict(ratio: float) -> str:
        return f"{'met' if ratio >= 0.9 else 'not met'} ({ratio:.2f})"

    verdicts = [f"batch {r['batch_size']}: by throughput {verdict(r['ratio_throughput'])}, "
                f"paired {verdict(r['ratio_paired'])}"
                for r in report["results"] if r["batch_size"] > 1]
    return [*lines, "", "Target: the fenced path at ≥ 0.90 of the unfenced — "
                        + "; ".join(verdicts) + "."]


_NOT_YET = ("Not measured in `docs/bench/worker-quiet.json` yet: the next `make bench` on a "
            "quiet machine writes this table.")


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f} ms"


def _lat_made(report: Report) -> str:
    """The latency section's provenance: its own when ``make bench-latency`` measured it."""
    lat = report.get("latency") or {}
    return _made(lat if lat.get("provenance") else report, "worker-quiet.json")


def _cpu_cell(r: Report, backlog: Report) -> str:
    cpu, base = r.get("cpu_us_per_record"), backlog.get(r["handler"])
    if cpu is None or not base:
        return _us(cpu)
    return f"{_us(cpu)} ({cpu / base:.1f}x)"


def _steady_rows(rows: Sequence[Report], backlog: Report) -> list[str]:
    lines = ["| handler | offered rate (share of capacity) | commit p50 | p95 | p99 | max "
             "| plain consumer: p50 / p99 | waited before the transaction: p50 / p99 "
             "| mean batch | CPU µs per record (x the backlog's) | machine: cores busy |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        c, h, k = r["commit_ms"], r["handler_call_ms"], r.get("control_ms") or {}
        lines.append(f"| {r['handler']} | {_n(r['rate'])}/s ({r['share']:.0%}) "
                     f"| {_ms(c['p50'])} | {_ms(c['p95'])} | {_ms(c['p99'])} | {_ms(c['max'])} "
                     f"| {_ms(k.get('p50'))} / {_ms(k.get('p99'))} "
                     f"| {_ms(h['p50'])} / {_ms(h['p99'])} | {r['mean_batch'] or 0:,.1f} "
                     f"| {_cpu_cell(r, backlog)} | {_cores(r)} |")
    return lines


def _cores(r: Report) -> str:
    cores = r.get("machine_cores")
    return "—" if cores is None else f"{cores:.2f}"


def _linger_rows(lat: Report, backlog: Report) -> list[str]:
    """The linger runs beside the default's steady rows at the same shares."""
    shares = {r["share"] for r in lat["linger"]}
    rows = [{**r, "linger_ms": None} for r in lat["steady"] if r["share"] in shares]
    rows = sorted([*rows, *lat["linger"]], key=lambda r: (
        r["handler"], r["share"], r["linger_ms"] or 0))
    lines = ["| handler | offered rate (share of capacity) | `--batch-linger-ms` | commit p50 "
             "| p99 | plain consumer p99 | mean batch | CPU µs per record (x the backlog's) "
             "| PostgreSQL CPU µs per record | machine: cores busy |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        c, k = r["commit_ms"], r.get("control_ms") or {}
        linger = "5 (default)" if r["linger_ms"] is None else str(r["linger_ms"])
        lines.append(f"| {r['handler']} | {_n(r['rate'])}/s ({r['share']:.0%}) | {linger} "
                     f"| {_ms(c['p50'])} | {_ms(c['p99'])} | {_ms(k.get('p99'))} "
                     f"| {r['mean_batch'] or 0:,.1f} | {_cpu_cell(r, backlog)} "
                     f"| {_us(r.get('pg_cpu_us_per_record'))} | {_cores(r)} |")
    return lines


def _spread(values: Sequence[float | None], unit: str = " ms") -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "—"
    lo, hi = f"{min(got):,.0f}", f"{max(got):,.0f}"
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def _one_partition_rows(lat: Report, backlog: Report, partitions: int) -> list[str]:
    """Each one-partition run below its counterpart on ``partitions``: the steady row of
    the same share, or the first run at the same fixed rate."""
    lines = ["| handler | offered rate | partitions | commit p50 | p99 | mean batch "
             "| CPU µs per record (x the backlog's) | PostgreSQL CPU µs per record "
             "| machine: cores busy |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for one in lat["one_partition"]:
        same = [r for r in lat.get("steady", []) if one["share"] is not None
                and (r["handler"], r["share"]) == (one["handler"], one["share"])]
        same += [x["runs"][0] for x in lat.get("low", []) if one["share"] is None
                 and (x["handler"], x["rate"]) == (one["handler"], one["rate"])]
        for r, n in [*([(same[0], partitions)] if same else []), (one, 1)]:
            c = r["commit_ms"]
            rate = f"{_n(one['rate'])}/s" + (f" ({one['share']:.0%})" if one["share"] else "")
            lines.append(f"| {one['handler']} | {rate} | {n} | {_ms(c['p50'])} "
                         f"| {_ms(c['p99'])} | {r['mean_batch'] or 0:,.1f} "
                         f"| {_cpu_cell(r, backlog)} "
                         f"| {_us(r.get('pg_cpu_us_per_record'))} | {_cores(r)} |")
    return lines


def latency_runs(report: Report) -> list[str]:
    lat = report.get("latency")
    if not lat or not lat.get("steady"):
        return [_NOT_YET]
    backlog = lat.get("backlog_cpu_us_per_record") or {}
    lines = [f"Measured by {_lat_made(report)} One member, {report['partitions']} "
             "partitions; the capacity is (c) of the same run"
             + (f" (reference {_n(lat['capacity']['reference'])}/s, sink "
                f"{_n(lat['capacity']['sink'])}/s; CPU per record with a backlog: reference "
                f"{_us(backlog.get('reference'))} µs, sink {_us(backlog.get('sink'))} µs)"
                if backlog and {'reference', 'sink'} <= set(lat.get("capacity", {})) else "")
             + ".", "", *_steady_rows(lat["steady"], backlog)]
    if lat.get("processes"):
        lines += ["", "The same with `--processes 2` (two members of one set; the shares are "
                  "of the one-member capacity; CPU summed over both members):", "",
                  *_steady_rows(lat["processes"], backlog)]
    if lat.get("low"):
        lines += ["", "At fixed low rates, each run the same way several times (10 s measured "
                  "after 3 s); the spread from run to run (least-most):", "",
                  "| handler | rate | runs | commit p50 | commit p99 | max "
                  "| plain consumer p99 | mean batch | CPU µs per record |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for low in lat["low"]:
            runs = low["runs"]
            lines.append(
                f"| {low['handler']} | {_n(low['rate'])}/s | {len(runs)} "
                f"| {_spread([r['commit_ms']['p50'] for r in runs])} "
                f"| {_spread([r['commit_ms']['p99'] for r in runs])} "
                f"| {_spread([r['commit_ms']['max'] for r in runs])} "
                f"| {_spread([(r.get('control_ms') or {}).get('p99') for r in runs])} "
                f"| {_spread([r['mean_batch'] for r in runs], '')} "
                f"| {_spread([r['cpu_us_per_record'] for r in runs], '')} |")
    if lat.get("linger"):
        lines += ["", "The batch linger's trade: the same runs with a longer "
                  "`--batch-linger-ms` beside the default's rows above:", "",
                  *_linger_rows(lat, backlog)]
    if lat.get("one_partition"):
        lines += ["", "Fewer, larger batches: the same rates on a topic of one partition, "
                  f"so one partition's transactions carry what {report['partitions']} "
                  "partitions' did (each below its row above):", "",
                  *_one_partition_rows(lat, backlog, report["partitions"])]
    return [*lines, "", "![commit latency against the offered rate](bench/latency.png)"]


def _pause(p: Report) -> str:
    if not p.get("partitions"):
        return "—"
    return f"{p['max_s']:.2f} s (median {p['median_s']:.2f} s, {p['partitions']} partitions)"


def moves(report: Report) -> list[str]:
    lat = report.get("latency")
    if not lat or not lat.get("moves"):
        return [_NOT_YET]
    lines = [f"Measured by {_lat_made(report)}", "",
             "| group setup | rate | a member joins: longest pause of a moved partition "
             "| partitions that stayed: longest gap between commits "
             "| a member is SIGKILLed: its partitions resume after | session timeout |",
             "|---|---:|---:|---:|---:|---:|"]
    for m in lat["moves"]:
        stayed = m.get("stayed_longest_gap_s")
        lines.append(f"| {m['setup']} | {_n(m['rate'])}/s | {_pause(m['join'])} "
                     f"| {'—' if stayed is None else f'{stayed:.2f} s'} | {_pause(m['kill'])} "
                     f"| {m['session_timeout_s']:g} s |")
    return lines


def scaling_runs(report: Report) -> list[str]:
    sc = report.get("scaling")
    if not sc or not sc.get("runs"):
        return [_NOT_YET]
    lines = [f"Measured by {_made(report, 'worker-quiet.json')} {sc['cores']} cores.", "",
             "| handler | processes | records/s | speed-up | each process: CPU s (µs per "
             "record) | PostgreSQL CPU µs per record |", "|---|---:|---:|---:|---|---:|"]
    base: dict[str, float] = {}
    for r in sc["runs"]:
        base.setdefault(r["handler"], r["records_per_s"])
        each = "; ".join(f"{c:.2f} s ({c * 1e6 / n:,.1f})" if n else "—"
                         for c, n in zip(r["member_cpu_s"], r["member_records"], strict=True))
        lines.append(f"| {r['handler']} | {r['processes']} | {_n(r['records_per_s'])} "
                     f"| {r['records_per_s'] / base[r['handler']]:.2f} | {each} "
                     f"| {_us(r.get('pg_cpu_us_per_record'))} |")
    return lines


def prediction(report: Report) -> list[str]:
    from ops.bench.scaling import predict

    sc = report.get("scaling")
    if not sc or not sc.get("runs"):
        return [_NOT_YET]
    lines = [f"From the one-process runs of {_made(report, 'worker-quiet.json')}", "",
             "| handler | worker CPU µs per record | PostgreSQL CPU µs per record "
             + "".join(f"| {c} cores " for c in (sc["cores"], 8, 16, 32)) + "|",
             "|---|---:|---:|" + "---:|" * 4]
    for handler in dict.fromkeys(r["handler"] for r in sc["runs"]):
        got = [predict(sc["runs"], c, handler) for c in (sc["cores"], 8, 16, 32)]
        if got[0] is None:
            continue
        cells = "".join(f"| {_n(g['records_per_s'])}/s ({g['members']} "
                        f"process{'es' if g['members'] > 1 else ''}) "
                        for g in got if g is not None)
        lines.append(f"| {handler} | {got[0]['worker_us_per_record']:,.1f} "
                     f"| {got[0]['pg_us_per_record']:,.1f} {cells}|")
    return lines


def peer_runs(report: Report) -> list[str]:
    pr = report.get("peer")
    if not pr or not pr.get("runs"):
        return [_NOT_YET if not pr else f"Not measured: {pr.get('skipped')}."]
    lines = [f"Measured by {_made(report, 'worker-quiet.json')} {_n(pr['records'])} records, "
             f"{pr['requirement']} from its own virtualenv.", "",
             "| tool | mode | records/s (median; all tries) | CPU µs per record "
             "| PostgreSQL CPU µs per record |", "|---|---|---|---:|---:|"]
    for r in sorted(pr["runs"].values(), key=lambda r: (r["mode"], r["tool"])):
        tries = r["all_records_per_s"]
        rate = (f"{_n(r['records_per_s'])} (one try)" if len(tries) == 1 else
                f"{_n(r['records_per_s'])} ({'; '.join(_n(t) for t in tries)})")
        lines.append(f"| {r['tool']} | {r['mode']} | {rate} "
                     f"| {_us(r['median_cpu_us_per_record'])} "
                     f"| {_us(r.get('pg_cpu_us_per_record'))} |")
    lines += ["", "| tool | upsert at a fixed rate: row written p50 | p99 | max "
                  "| SIGKILL at 40% and a restart (insert): rows | duplicates | missing |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    kills = {k["tool"]: k for k in pr.get("kill", [])}
    for lat in pr.get("latency", []):
        k = kills.get(lat["tool"], {})
        ms = lat["row_ms"]
        lines.append(f"| {lat['tool']} ({_n(lat['rate'])}/s) | {_ms(ms['p50'])} "
                     f"| {_ms(ms['p99'])} | {_ms(ms['max'])} | {_n(k.get('rows', 0))} "
                     f"| {_n(k.get('duplicates', 0))} | {_n(k.get('missing', 0))} |")
    return lines


def _paired(paired: Report, key: str) -> str:
    """`` (0.99 paired)`` when the run paired its tries (a quick run has one try: none)."""
    value = paired.get(key)
    return "" if value is None else f" ({value:.2f} paired)"


def _headline_rows(report: Report) -> list[tuple[str, str, str]]:
    """(what, figure, section link) of each headline figure the report holds."""
    runs, ratios, paired = report["runs"], report["ratios"], report["paired_ratios"]
    rows: list[tuple[str, str, str]] = []
    if "c_fenceworker" in runs and "c_over_b" in ratios:
        rows.append(("The reference handler, one member",
                     f"{_n(runs['c_fenceworker']['records_per_s'])} records/s: "
                     f"{ratios['c_over_b']:.2f} of an unfenced pipelined consumer's rate"
                     f"{_paired(paired, 'c_over_b')}", "[Throughput](#throughput)"))
    sink = runs.get("c_sink_fenceworker")
    if sink:
        cpu = ""
        if sink.get("median_pg_cpu_us_per_record") is not None:
            cpu = (f"; the worker's CPU {sink['median_cpu_us_per_record']:,.1f} µs per record "
                   f"against PostgreSQL's {sink['median_pg_cpu_us_per_record']:,.1f}")
        rows.append(("The table sink upserting, one member",
                     f"{_n(sink['records_per_s'])} records/s{cpu}",
                     "[The table sink](#the-table-sink)"))
    if "c_sink_avro_over_json" in ratios:
        rows.append(("Avro records against JSON into the same table",
                     f"{ratios['c_sink_avro_over_json']:.2f} of JSON's rate"
                     f"{_paired(paired, 'c_sink_avro_over_json')}",
                     "[Avro and JSON](#avro-and-json)"))
    lat = report.get("latency") or {}
    steady = lat.get("steady") or []
    if steady:
        low = min(r["share"] for r in steady)
        cells = [f"{r['handler']} at {_n(r['rate'])}/s: p50 {_ms(r['commit_ms']['p50'])}, "
                 f"p99 {_ms(r['commit_ms']['p99'])}" for r in steady if r["share"] == low]
        own = lat.get("provenance") or {}
        if own and own.get("commit") != (report.get("provenance") or {}).get("commit"):
            cells.append(f"by `{own.get('command')}` at commit {own.get('commit')}")
        rows.append((f"Produce to committed at {low:.0%} of capacity", "; ".join(cells),
                     "[Latency](#latency-under-steady-load)"))
    memory = report.get("memory") or []
    if memory:
        first = memory[0]
        below = all(m["within_bound"] for m in memory)
        margin = min(1 - m["peak_rss_mib"] / m["bound_mib"] for m in memory)
        rows.append(("Memory of one member",
                     f"peak {first['peak_rss_mib']:.0f} MiB on {first['partitions']} partitions, "
                     f"bound {first['bound_mib']:.0f} MiB; "
                     + (f"every run below its bound (margin ≥ {margin:.0%})" if below
                        else "**a run exceeded its bound**"), "[Memory](#memory)"))
    peer = report.get("peer") or {}
    by = {(r["tool"], r["mode"]): r for r in (peer.get("runs") or {}).values()}
    if ("fenceworker", "insert") in by and ("quixstreams", "insert") in by:
        rows.append(("Beside Quix Streams' PostgreSQL sink, inserting",
                     f"fenceworker {_n(by['fenceworker', 'insert']['records_per_s'])} rows/s, "
                     f"Quix Streams {_n(by['quixstreams', 'insert']['records_per_s'])}",
                     "[A peer side by side](#a-peer-side-by-side)"))
    kills = {k["tool"]: k for k in peer.get("kill") or []}
    if "fenceworker" in kills and "quixstreams" in kills:
        rows.append(("Duplicate rows after a SIGKILL and a restart",
                     f"fenceworker {_n(kills['fenceworker']['duplicates'])}, Quix Streams "
                     f"{_n(kills['quixstreams']['duplicates'])} (of "
                     f"{_n(kills['fenceworker']['records'])} records)",
                     "[A peer side by side](#a-peer-side-by-side)"))
    return rows


def headline(report: Report) -> list[str]:
    """The handful of figures a user asks for first, each linking to its section."""
    return [f"Measured by {_made(report, 'worker-quiet.json')} {_machine(report)}", "",
            "| what | measured | section |", "|---|---|---|",
            *(f"| {what} | {figure} | {link} |" for what, figure, link in _headline_rows(report))]


def _suite(report: Report) -> list[str]:
    tests, wall = report["tests"], report["wall_s"]
    return [f"Measured by {_made(report, 'suite.json')} {tests['passed']:,} passed, "
            f"{tests['failed']:,} failed, {tests['skipped']:,} skipped; {wall / 60:.1f} min "
            "wall, the install and the services included.", "", *suite.render(report)]


def _recovery(report: Report) -> list[str]:
    return [f"Measured by {_made(report, 'crash-matrix.json')}", "",
            *crash_tables.recovery(report)]


REGIONS: dict[str, Region] = {
    "headline": Region("worker-quiet.json", headline),
    "store": Region("store.json", store),
    "worker-runs": Region("worker-quiet.json", worker_runs),
    "worker-ratios": Region("worker-quiet.json", ratios),
    "sink-runs": Region("worker-quiet.json", sink_runs),
    "assignment": Region("worker-quiet.json", assignment),
    "rebalances": Region("worker-quiet.json", rebalances),
    "members": Region("worker-quiet.json", members),
    "memory": Region("worker-quiet.json", memory_bound),
    "latency": Region("worker-quiet.json", latency_runs),
    "moves": Region("worker-quiet.json", moves),
    "scaling": Region("worker-quiet.json", scaling_runs),
    "prediction": Region("worker-quiet.json", prediction),
    "peer": Region("worker-quiet.json", peer_runs),
    "sink-in-order": Region("sink-in-order.json", _in_order),
    "sink-decode": Region("sink-decode.json", _decode),
    "sink-avro": Region("worker-quiet.json", _avro_runs),
    "sink-cdc": Region("cdc.json", _cdc),
    "lanes": Region("lanes.json", _lanes),
    "suite-slowest": Region("suite.json", _suite, "testing.md"),
    "crash-recovery": Region("crash-matrix.json", _recovery),
    "crash-matrix": Region("crash-matrix.json", crash_tables.crash_matrix, "crash-matrix.md"),
}
#: every page with generated regions
PAGES = tuple(sorted({ROOT / "docs" / r.page for r in REGIONS.values()}))


def render_page(text: str, bench_dir: Path = BENCH) -> str:
    """``text`` with every generated region rendered from its JSON in ``bench_dir``."""
    if text.count("<!-- generated: ") != len(_REGION.findall(text)):
        raise ValueError("a generated region is not closed by '<!-- end generated -->'")
    loaded: dict[str, Report] = {}

    def fill(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in REGIONS:
            raise ValueError(f"unknown generated region {name!r}; known: {', '.join(REGIONS)}")
        region = REGIONS[name]
        if region.source not in loaded:
            loaded[region.source] = json.loads((bench_dir / region.source).read_text())
        body = "\n".join(region.render(loaded[region.source]))
        return f"{match.group(1)}{body}\n{match.group(4)}"

    return _REGION.sub(fill, text)


def stale_regions(text: str, bench_dir: Path = BENCH) -> list[str]:
    """Names of the regions whose text differs from what their JSON renders."""
    fresh = dict((m.group(2), m.group(3)) for m in _REGION.finditer(render_page(text, bench_dir)))
    return [m.group(2) for m in _REGION.finditer(text) if fresh[m.group(2)] != m.group(3)]


def merge_latency(source: Path, bench_dir: Path = BENCH) -> None:
    """Replace the latency section of ``worker-quiet.json`` with ``source``'s (which carries
    its own provenance: ``latency_runs`` names it)."""
    latency = json.loads(source.read_text())["latency"]
    if not latency.get("provenance"):
        raise ValueError(f"{source}: its latency section names no provenance")
    target = bench_dir / "worker-quiet.json"
    report = json.loads(target.read_text())
    report["latency"] = latency
    target.write_text(json.dumps(report, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.tables",
                                description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--check", action="store_true",
                   help="compare only; exit 1 naming the regions that differ from their JSON")
    p.add_argument("--page", type=Path, action="append", default=None,
                   help="only this page (repeatable; default every page with regions)")
    p.add_argument("--latency-from", type=Path, default=None, metavar="JSON",
                   help="first put this run's latency section (make bench-latency) into "
                        "docs/bench/worker-quiet.json")
    a = p.parse_args(argv)
    if a.latency_from is not None:
        merge_latency(a.latency_from)
    code = 0
    for page in a.page or PAGES:
        text = page.read_text(encoding="utf-8")
        if a.check:
            stale = stale_regions(text)
            if stale:
                print(f"{page}: generated tables differ from docs/bench: {', '.join(stale)}; "
                      "run `python -m ops.bench.tables`", file=sys.stderr)
                code = 1
            continue
        page.write_text(render_page(text), encoding="utf-8")
        print(f"wrote {page}")
    return code


if __name__ == "__main__":
    sys.exit(main())
