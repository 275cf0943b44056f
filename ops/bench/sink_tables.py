"""The table sink's measured tables of ``docs/benchmarks.md``, rendered from the JSON
its tools wrote in ``docs/bench/`` (registered as regions in ``ops.bench.tables``, which
rewrites and checks them): ``python -m ops.bench.sink --in-order`` (``sink-in-order.json``),
``python -m ops.bench.sink --decode`` (``sink-decode.json``) and the Avro and JSON sink runs
of the published ``make bench`` (``worker-quiet.json``), and ``make bench-cdc``'s change
events and replication lag (``cdc.json``). Pure: the same JSON gives the same text."""

from __future__ import annotations

from typing import Any

__all__ = ["avro_runs", "cdc", "decode", "in_order"]

Report = dict[str, Any]

#: the steps of ``python -m ops.bench.sink --decode``, in the page's order
_DECODE_STEPS = {
    "json_parse": "JSON: parse (`rows.parse_json`)",
    "avro_deserializer": "Avro: confluent-kafka's `AsyncAvroDeserializer`, whole",
    "avro_sink_reader": "Avro: the sink's reader (fastavro, schema resolved once)",
    "json_convert": "JSON: parse + conversion to a row",
    "avro_convert": "Avro: the sink's reader + conversion to a row",
}


def in_order(report: Report) -> list[str]:
    """Milliseconds per batch of the in-order and last-wins lanes, per key repetition."""
    rows = sorted((int(name.split("_")[1]), lanes) for name, lanes in report.items()
                  if name.startswith("repeats_"))
    return ["| R (each key's records in a batch) | in order: ms per batch | last wins: ms per "
            "batch | in order / last wins (records/s) |", "|---:|---:|---:|---:|",
            *(f"| {r} | {lanes['in_order']['ms_per_batch']} | "
              f"{lanes['last_wins']['ms_per_batch']} | {lanes['in_order_over_last_wins']} |"
              for r, lanes in rows)]


def decode(report: Report) -> list[str]:
    """CPU nanoseconds per record of each decode step."""
    ns = report["ns_per_record"]
    return ["| step | ns per record |", "|---|---:|",
            *(f"| {label} | {ns[step]:,} |" for step, label in _DECODE_STEPS.items())]


#: the worker bench's runs of the same records as JSON and as Avro into one typed table
AVRO_RUNS = ("c_sink_typed_json", "c_sink_typed_avro")


def avro_runs(report: Report) -> list[str]:
    """The Avro and JSON sink runs of the worker bench, every try, and their ratios."""
    lines = ["| run | records/s (median; all tries) | CPU µs per record (median; all tries) |",
             "|---|---|---|"]
    for run in (report["runs"][name] for name in AVRO_RUNS):
        rates = "; ".join(f"{x:,}" for x in run["all_records_per_s"])
        cpu = "; ".join(str(x) for x in run["all_cpu_us_per_record"])
        lines.append(f"| {run['label']} | {run['records_per_s']:,} ({rates}) | "
                     f"{run['median_cpu_us_per_record']} ({cpu}) |")
    ratio = "c_sink_avro_over_json"
    return [*lines, "", f"Avro over JSON: {report['ratios'][ratio]} by the medians' rates, "
                        f"{report['paired_ratios'][ratio]} paired try by try, "
                        f"{report['cpu_ratios'][ratio]} per CPU-second (target ≥ 0.9)."]


def cdc(report: Report) -> list[str]:
    """The change-event runs beside the plain sink, every try, their ratios, and the lag
    through a real Debezium per rate."""
    lines = ["| run | records/s (median; all tries) | CPU µs per record (median; all tries) |",
             "|---|---|---|"]
    for run in report["runs"].values():
        rates = "; ".join(f"{x:,}" for x in run["all_records_per_s"])
        cpu = "; ".join(str(x) for x in run["all_cpu_us_per_record"])
        lines.append(f"| {run['label']} | {run['records_per_s']:,} ({rates}) | "
                     f"{run['median_cpu_us_per_record']} ({cpu}) |")
    r, targets = report["ratios"], report.get("targets", {})
    runs = report["runs"]

    def per_cpu(num: str, den: str) -> str:  # records per CPU-second of the member
        a, b = (runs.get(n, {}).get("median_cpu_us_per_record") for n in (num, den))
        return f"{b / a:.3f}" if a and b else "—"

    lines += ["", f"Change events over the plain sink (the same rows): {r['cdc_over_plain']} "
              f"(target ≥ {targets.get('cdc_over_plain', 0.8)}); with each record's schema: "
              f"{r['cdc_schemas_over_plain']}; the version guard over the unguarded: "
              f"{r['guarded_over_cdc']} (records/s of the medians). Per CPU-second of the "
              f"member: {per_cpu('c_sink_cdc', 'c_sink_typed_json')}, "
              f"{per_cpu('c_sink_cdc_schemas', 'c_sink_typed_json')} and "
              f"{per_cpu('c_sink_cdc_guarded', 'c_sink_cdc')}.", "",
              "| rows/s into the source | achieved | rows | lag p50 | lag p99 | lag max | "
              "to Kafka p50 / p99 | the sink's p50 / p99 |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {one['rate_per_s']:,.0f} | {one['achieved_per_s']:,.1f} | {one['rows']:,} | "
              f"{one['p50_ms']:,} ms | {one['p99_ms']:,} ms | {one['max_ms']:,} ms | "
              f"{one['to_kafka_p50_ms']:,} / {one['to_kafka_p99_ms']:,} ms | "
              f"{one['sink_p50_ms']:,} / {one['sink_p99_ms']:,} ms |"
              for one in report["lag"]]
    return lines
