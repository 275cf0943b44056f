"""``make bench`` cannot rot: its quick mode (``BENCH_ARGS=--quick``) runs every registered
run and the scale section on small sizes against the real services, and must produce a
complete result (every run handled every record and marked its CPU time, every ratio, no
failed scale step), whose JSON renders every generated table of docs/benchmarks.md, and
delete the topics it made.

The scaling, latency and peer sections (one process per core, paced producers, Quix Streams
from its own virtualenv) take several minutes even in quick mode: ``make test`` runs the
quick bench without them (``--no-extra``); ``make test-bench`` (``FENCE_BENCH_SMOKE=full``)
runs it whole and checks every figure of those sections and that no table of the page is
left a placeholder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from ops.bench import tables
from ops.bench.latency import LINGER_SHARES, LINGERS_MS, LOW_RATES, ONE_PARTITION, RATE_SHARES
from ops.bench.worker import RATIOS, RUNS
from ops.worker.supervisor import cores
from tests.integration.workers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.exclusive]  # loads both cores

ROOT = Path(__file__).resolve().parents[2]


#: the whole quick bench, the scaling, latency and peer sections included (make test-bench)
FULL = os.environ.get("FENCE_BENCH_SMOKE") == "full"


def test_quick_bench_produces_every_run_ratio_and_scale_point(services, tmp_path: Path) -> None:
    out = tmp_path / "worker.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    extra = () if FULL else ("--no-extra",)
    proc = subprocess.run([sys.executable, "-m", "ops.bench.worker", "--quick", *extra,
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    result = json.loads(out.read_text())
    assert set(result["runs"]) == {r.name for r in RUNS}
    for r in RUNS:
        got = result["runs"][r.name]
        want = 300 if r.topic == "single" else result["count"]  # main and sink: --count
        assert got["records"] >= want and got["records_per_s"] > 0, (r.name, got)
        exits = got["exit"] if isinstance(got["exit"], list) else [got["exit"]]
        assert exits == [0] * r.members, (r.name, got)  # one exit code per member
        # each process marked its own CPU time over the span (ops.bench.clock)
        assert got["cpu_s"] > 0 and got["median_cpu_us_per_record"] > 0, (r.name, got)
        assert 0 <= got["steal_share"] < 1, (r.name, got)
    assert any(r.handler == "sink" for r in RUNS)  # the table sink's runs are registered
    assert set(result["ratios"]) == set(RATIOS) >= {"c_sink_over_b_sink", "c_sink_over_e_sink"}
    assert all(v is not None and v > 0 for v in result["ratios"].values()), result["ratios"]
    # records per CPU-second for every ratio; one try each in --quick: nothing to pair
    assert set(result["cpu_ratios"]) == set(result["paired_ratios"]) == set(RATIOS)
    assert all(v is not None and v > 0 for v in result["cpu_ratios"].values())
    assert all(v is None for v in result["paired_ratios"].values())
    assert 0 <= result["steal_share"]["median"] <= result["steal_share"]["max"] < 1
    scale = result["scale"]
    assert [a["partitions"] for a in scale["assignment"]] == [1, 8]
    assert all("claim_seek_s" in a for a in scale["assignment"]), scale["assignment"]
    assert all("join_to_all_committed_s" in j for j in scale["join_3x48"]), scale["join_3x48"]
    assert [m["members"] for m in scale["members_12_partitions"]] == [1, 2, 3]
    assert scale["backlog"]["records"] >= 20_000
    assert scale["large_records"]["records"] >= 12
    # the documented memory bound, computed term by term, holds for every peak it covers
    assert [m["run"] for m in result["memory"]] == [
        "c_fenceworker", "1 member, 12 partitions", "3 members drain the backlog (largest)",
        "1 MiB records, 6 partitions"]
    assert all(m["within_bound"] for m in result["memory"]), result["memory"]
    for chart in ("throughput.png", "scale.png", *(("latency.png",) if FULL else ())):
        assert (tmp_path / chart).stat().st_size > 1000, chart
    if FULL:
        _check_extra_sections(result)
    # the page's generated tables render from this JSON, none of them a placeholder
    bench = tmp_path / "docs-bench"
    shutil.copytree(tables.BENCH, bench)
    shutil.copy(out, bench / "worker-quiet.json")
    page = tables.render_page(tables.PAGE.read_text(encoding="utf-8"), bench)
    if FULL:  # without the extra sections their tables say they were not measured
        assert tables._NOT_YET not in page and "Not measured" not in page
    # every topic it made (the runs', the scale section's) is deleted when it ends
    made = set(result["topics"])
    assert {t.split("_")[0] for t in made} >= {"bench", "benchsink", "assign", "backlog", "large"}
    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap})
    wait_until(lambda: not made & set(admin.list_topics(timeout=10).topics), timeout_s=30,
               what="the bench's topics deleted")


def test_trees_runs_a_commit_and_this_tree_alternately(services, tmp_path: Path) -> None:
    """``python -m ops.bench.trees``: both trees handle every record, each try is reported,
    and the temporary worktree of the commit is gone afterwards."""
    out = tmp_path / "trees.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "ops.bench.trees", "--before", "HEAD",
                           "--only", "c_fenceworker", "--pairs", "1", "--count", "2000",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    by_tree = json.loads(out.read_text())["runs"]["c_fenceworker"]
    assert set(by_tree) == {"before (HEAD)", "this tree"}
    for summary in by_tree.values():
        [got] = summary["tries"]
        assert got["records"] >= 2000 and got["exit"] == 0 and got["cpu_s"] > 0, got
        assert summary["records_per_s"] == got["records_per_s"] > 0
    listed = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True,
                            text=True, check=True).stdout
    assert "bench-trees-" not in listed


def _check_extra_sections(result: dict[str, Any]) -> None:
    """Scaling (1 .. the cores, both handlers), latency (every share, both handlers; one
    move) and the peer (both tools, both modes; no duplicate or missing row of ours)."""
    scaling = result["scaling"]["runs"]
    assert [(r["handler"], r["processes"]) for r in scaling] == [
        (h, n) for h in ("reference", "sink") for n in range(1, cores() + 1)]
    for r in scaling:
        assert r["records"] >= result["count"] and r["exit"] == 0, r
        assert len(r["member_cpu_s"]) == r["processes"] and all(r["member_cpu_s"]), r
        assert sum(r["member_records"]) == r["records"] and r["pg_cpu_us_per_record"] > 0, r
    steady = result["latency"]["steady"]
    assert [(r["handler"], r["share"]) for r in steady] == [
        (h, s) for h in ("reference", "sink") for s in RATE_SHARES]
    lat = result["latency"]
    low = [r for x in lat["low"] for r in x["runs"]]
    assert [(x["handler"], x["rate"]) for x in lat["low"]] == [
        (h, rate) for h in ("reference", "sink") for rate in LOW_RATES]
    assert [(r["handler"], r["processes"]) for r in lat["processes"]] == [
        ("reference", 2), ("sink", 2)]  # quick: the first share only
    assert [(r["handler"], r["share"], r["linger_ms"]) for r in lat["linger"]] == [
        (h, LINGER_SHARES[0], LINGERS_MS[0]) for h in ("reference", "sink")]  # quick: one
    share, rate = ONE_PARTITION
    assert [(r["handler"], r["share"], r["partitions"]) for r in lat["one_partition"]] == [
        (h, s, 1) for h in ("reference", "sink") for s in (share, None)]
    assert [r["rate"] for r in lat["one_partition"]][1::2] == [rate, rate]
    for r in [*steady, *lat["processes"], *low, *lat["linger"], *lat["one_partition"]]:
        assert r["exit"] == 0 and r["commit_ms"]["records"] > 0, r
        assert 0 < r["machine_cores"] <= cores() and r["pg_cpu_us_per_record"] > 0, r
        assert 0 <= r["handler_call_ms"]["p50"] <= r["commit_ms"]["p50"], r
        assert r["commit_ms"]["p50"] <= r["commit_ms"]["p99"] <= r["commit_ms"]["max"], r
        # the plain consumer saw the same records produced in the window
        assert r["control_ms"]["records"] == r["commit_ms"]["records"], r
    assert set(lat["backlog_cpu_us_per_record"]) == {"reference", "sink"}, lat
    [move] = result["latency"]["moves"]
    assert move["join"]["partitions"] > 0 and move["kill"]["partitions"] > 0, move
    assert move["exit_a"] == 0, move
    peer = result["peer"]
    assert set(peer["runs"]) == {f"{t}/{m}" for t in ("fenceworker", "quixstreams")
                                 for m in ("insert", "upsert")}, peer
    for r in peer["runs"].values():
        assert r["rows"] >= r["records"] and r["ids"] == r["records"], r
        assert r["records_per_s"] > 0 and r["pg_cpu_us_per_record"] > 0, r
    assert all(x["row_ms"]["records"] > 0 for x in peer["latency"]), peer["latency"]
    kills = {k["tool"]: k for k in peer["kill"]}
    assert kills["fenceworker"]["duplicates"] == 0, kills  # exactly once through a SIGKILL
    assert all(k["missing"] == 0 for k in kills.values()), kills  # nobody loses a record


def test_quick_lanes_bench_drains_every_run_and_writes_its_table(services,
                                                                 tmp_path: Path) -> None:
    """``make bench-lanes`` (the last part of ``make bench``) in its quick mode: every run
    drained its records, the table names each run against its one lane."""
    out = tmp_path / "lanes.json"
    proc = subprocess.run([sys.executable, "-m", "ops.bench.lanes", "--quick", "--out",
                           str(out)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, timeout=900)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    result = json.loads(out.read_text())
    assert [(r["partitions"], r["lanes"]) for r in result["runs"]] == [(1, 1), (1, 4), (6, 1),
                                                                       (6, 4)]
    for r in result["runs"]:
        assert r["records"] > 0 and r["rate"] > 0, r
    assert result["table"].count("\n") == 5 and "make bench-lanes" in str(
        result["provenance"])
