"""The table sink's measured figures in ``docs/table-sink-formats.md`` are the ones the tools
wrote (``docs/bench/sink-*.json``): a figure cannot drift from its JSON."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PAGE = (ROOT / "docs" / "table-sink-formats.md").read_text()
BENCH = ROOT / "docs" / "bench"


def test_the_in_order_table_is_the_json_of_ops_bench_sink_in_order() -> None:
    got = json.loads((BENCH / "sink-in-order.json").read_text())
    for name, lanes in got.items():
        if name.startswith("repeats_"):
            row = (f"| {name.split('_')[1]} | {lanes['in_order']['ms_per_batch']} | "
                   f"{lanes['last_wins']['ms_per_batch']} | {lanes['in_order_over_last_wins']} |")
            assert row in PAGE, row


def test_the_decode_table_is_the_json_of_ops_bench_sink_decode() -> None:
    got = json.loads((BENCH / "sink-decode.json").read_text())["ns_per_record"]
    assert len(got) == 5
    for ns in got.values():
        assert f"| {ns:,} |" in PAGE, ns


def test_the_avro_bench_rows_and_ratios_are_the_json_of_the_worker_bench() -> None:
    got = json.loads((BENCH / "sink-avro.json").read_text())
    for run in got["runs"].values():
        rates = "; ".join(f"{x:,}" for x in run["all_records_per_s"])
        cpu = "; ".join(str(x) for x in run["all_cpu_us_per_record"])
        row = (f"| {run['label']} | {run['records_per_s']:,} ({rates}) | "
               f"{run['median_cpu_us_per_record']} ({cpu}) |")
        assert row in PAGE, row
    for key in ("ratios", "paired_ratios", "cpu_ratios"):
        assert str(got[key]["c_sink_avro_over_json"]) in PAGE, key
