"""The benchmark's table sink runs: the worker run gives the sink what ``fencectl run --sink``
gives it, the baselines build the same spec, and the ratios name registered runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fencing.errors import ConfigError
from fencing.handler import HandlerContext, build_handler
from fencing.postgres.sink import SinkSpec
from fencing.postgres.sink.catalog import schema_ddl
from fencing.postgres.sink.schemas import avro_fields
from ops import cli
from ops.bench.clock import sink_spec
from ops.bench.runs import worker_argv
from ops.bench.sink import AVRO_SCHEMA, TYPED_DDL
from ops.bench.worker import BATCH, RATIOS, RUNS, SINK, SINK_RUNS, ratios
from ops.commands.run import SINK_BATCH_MAX_RECORDS, SINK_HANDLER, config_from_args

ENV = {"KAFKA_BOOTSTRAP_SERVERS": "localhost:9092", "FENCE_DSN": "postgresql://x/y"}


def _settings(argv: list[str]) -> dict[str, str]:
    cfg = config_from_args(cli.build_parser().parse_args(argv[argv.index("run"):]), ENV)
    return dict(cfg.handler_settings)


def test_the_sink_worker_run_passes_the_sink_the_settings_of_fencectl_run_sink() -> None:
    run = next(r for r in SINK_RUNS if r.name == "c_sink_fenceworker")
    argv = worker_argv(run, "t", "g", "s1", Path("/tmp/m.json"))[2:]  # after "python -m"
    assert argv[:2] == ["ops.cli", "run"] and "ops.bench.clock:clocked" in argv
    timed = _settings(argv[1:])
    assert timed.pop("clock_file") == "/tmp/m.json" and timed.pop("handler") == "sink"
    plain = _settings(["run", "--topic", "t", "--group", "g", "--sink",
                       f"table={timed['table']}", "--sink-key", timed["key"]])
    assert timed == plain == {"table": "bench_sink", "key": "id"}
    # the baselines' flags name the same table and key
    assert SINK == ("--sink", plain["table"], "--sink-key", plain["key"], *BATCH)
    # ... and every sink run batches as `fencectl run --sink` does by default
    assert BATCH == ("--batch-max-records", str(SINK_BATCH_MAX_RECORDS))
    assert all(r.args[-2:] == BATCH for r in SINK_RUNS if r.name != "c_sink_batch_500")


def test_sink_spec_places_an_unqualified_table_in_the_runs_schema() -> None:
    settings = {"clock_file": "/tmp/m.json", "handler": "sink", "table": "bench_sink",
                "key": "id"}
    assert sink_spec(settings, "bench_1") == SinkSpec("bench_1.bench_sink", keys=("id",))
    assert sink_spec({"table": "other.t"}, "bench_1") == SinkSpec("other.t")
    with pytest.raises(ConfigError, match="expected table=NAME"):
        sink_spec({"handler": "sink"}, "bench_1")


def test_clocked_with_handler_sink_builds_the_sink_and_its_table_setup() -> None:
    loaded = build_handler("ops.bench.clock:clocked", HandlerContext(
        "bench_1", "g", ("t",), {"clock_file": "/tmp/m.json", "handler": "sink",
                                 "table": "bench_sink", "key": "id"}))
    assert loaded.ensure_tables is not None
    assert SINK_HANDLER == "fencing.postgres.sink:table_sink"


def test_every_ratio_names_registered_runs_and_unchosen_ones_are_left_out() -> None:
    names = {r.name for r in RUNS}
    assert all(num in names and den in names for num, den in RATIOS.values())
    assert {r.topic for r in SINK_RUNS} == {"sink", "sink_avro", "sink_routed"}
    got = ratios({"c_sink_fenceworker": {"records_per_s": 30},
                  "b_sink_pipelined": {"records_per_s": 40}})
    assert got == {"c_sink_over_b_sink": 0.75, "c_sink_over_b_prime_sink": None,
                   "c_sink_over_e_sink": None, "c_sink_routed_over_single": None}


def test_the_avro_run_and_its_json_twin_write_one_typed_table(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """Same records, same table: the JSON run creates ``TYPED_DDL``, which is the table the
    Avro run's sink creates from ``AVRO_SCHEMA``; the Avro run is given the registry."""
    monkeypatch.setenv("SCHEMA_REGISTRY_URL", "http://127.0.0.1:1/apis/ccompat/v7")
    runs = {r.name: r for r in SINK_RUNS}
    avro_run, json_run = runs["c_sink_typed_avro"], runs["c_sink_typed_json"]
    assert RATIOS["c_sink_avro_over_json"] == (avro_run.name, json_run.name)
    assert avro_run.topic == "sink_avro" and json_run.topic == "sink"
    timed = {}
    for run in (avro_run, json_run):
        argv = worker_argv(run, "t", "g", "s1", Path("/tmp/m.json"))
        timed[run.name] = dict(a.split("=", 1) for i, a in enumerate(argv)
                               if argv[i - 1] == "--handler-setting")
    assert timed["c_sink_typed_avro"]["registry"] == "http://127.0.0.1:1/apis/ccompat/v7"
    assert timed["c_sink_typed_avro"]["format"] == "avro"
    assert timed["c_sink_typed_json"]["layout"] == "typed"
    assert timed["c_sink_typed_avro"]["table"] == timed["c_sink_typed_json"]["table"]
    created = schema_ddl(SinkSpec("t", keys=("id",)), avro_fields(json.loads(AVRO_SCHEMA)))

    def norm(ddl: str) -> str:
        return " ".join(ddl.replace('"', "").replace("(", " ( ").replace(")", " ) ")
                        .replace(",", " , ").split())
    assert norm(created) == norm(TYPED_DDL.format("t"))
