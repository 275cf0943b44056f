"""Replay: a saved trace reproduces its report byte for byte; bad traces are rejected with
a message naming the offending place (exit 1); bad usage exits 2."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from ops.commands import sim as sim_cmd
from ops.sim import TraceError, dumps, make_trace, parse


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fencectl")
    sim_cmd.register(parser.add_subparsers(dest="command", required=True))
    try:
        args = parser.parse_args(["sim-worker", *argv])
    except SystemExit as exc:
        return int(exc.code or 0)
    return int(args.func(args))


def test_replay_reproduces_the_report_byte_for_byte(tmp_path: Path, capsys: Any) -> None:
    trace, report = tmp_path / "t.json", tmp_path / "r.json"
    assert cli(["--seed", "1", "--class", "conflict", "--out", str(trace),
                "--report", str(report)]) == 0
    first = capsys.readouterr().out
    replayed = tmp_path / "r2.json"
    assert cli(["--replay", str(trace), "--report", str(replayed)]) == 0
    assert capsys.readouterr().out == first
    assert report.read_bytes() == replayed.read_bytes() == first.encode()
    assert json.loads(first)["label"] == "production-worker-lifecycle; memory I/O and logical time"


def test_fencectl_registers_sim_worker() -> None:
    from ops.cli import COMMAND_MODULES

    assert "ops.commands.sim" in COMMAND_MODULES


def _saved() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(dumps(make_trace(3, klass="conflict")))
    return data


def _first_step(data: dict[str, Any], actor: str) -> int:
    return next(i for i, s in enumerate(data["steps"]) if s["actor"] == actor)


def _reject(text: str) -> str:
    with pytest.raises(TraceError) as info:
        parse(text)
    return str(info.value)


def test_unknown_fields_are_rejected_by_place() -> None:
    data = _saved()
    data["extra"] = 1
    assert _reject(json.dumps(data)) == "trace.extra: unknown field"
    data = _saved()
    data["steps"][2]["colour"] = "red"
    assert _reject(json.dumps(data)) == "steps[2].colour: unknown field"
    data = _saved()
    data["records"][0]["ts"] = 0
    assert _reject(json.dumps(data)) == "records[0].ts: unknown field"


def test_trailing_content_is_rejected() -> None:
    assert "trailing content" in _reject(dumps(make_trace(3)) + "{}")


def test_incompatible_provenance_is_rejected() -> None:
    data = _saved()
    data["toolchain"]["python"] = "2.7"
    assert _reject(json.dumps(data)).startswith("toolchain.python: trace made with '2.7'")
    data = _saved()
    data["implementation"] = "worker-schedule-v0"
    assert _reject(json.dumps(data)).startswith("trace.implementation")
    data = _saved()
    data["config"]["batch_max"] += 1
    assert _reject(json.dumps(data)).startswith("config_digest")


def test_invalid_choices_are_rejected_by_place() -> None:
    data = _saved()
    i = _first_step(data, "assign")
    data["steps"][i]["faults"] = [{"operation": "validate", "call": 1,
                                   "outcome": "unknown-committed"}]
    assert _reject(json.dumps(data)).startswith(f"steps[{i}].faults[0]: outcome unknown-committed")
    data["steps"][i]["faults"] = [{"operation": "process", "call": 1, "outcome": "commit"}]
    assert _reject(json.dumps(data)).startswith(f"steps[{i}].faults[0].operation")
    data["steps"][i]["faults"] = [{"operation": "claim", "call": 0, "outcome": "commit"}]
    assert _reject(json.dumps(data)).startswith(f"steps[{i}].faults[0].call")
    data["steps"][i]["faults"] = [{"operation": "claim", "call": 1, "outcome": "maybe"}]
    assert _reject(json.dumps(data)).startswith(f"steps[{i}].faults[0].outcome")
    data["steps"][i]["faults"] = [{"operation": "claim", "call": 1, "outcome": "commit",
                                   "interleave": {"at": "during", "stop": True}}]
    assert _reject(json.dumps(data)).startswith(f"steps[{i}].faults[0].interleave")


def test_reuse_of_a_lifetime_id_is_rejected() -> None:
    data = _saved()
    data["steps"].insert(1, {"actor": "start", "worker": 1})
    assert _reject(json.dumps(data)) == "steps[1].worker: lifetime id 1 is already used"
    data = _saved()
    i = _first_step(data, "assign")
    data["steps"][i]["faults"] = [{"operation": "claim", "call": 1, "outcome": "commit",
                                   "interleave": {"at": "before", "replacement": 1}}]
    assert _reject(json.dumps(data)) == (
        f"steps[{i}].faults[0].interleave.replacement: lifetime id 1 is already used")
    data = _saved()
    data["steps"].append({"actor": "seek", "worker": 99, "partition": 0})
    assert "lifetime 99 is not started" in _reject(json.dumps(data))


def test_cli_exit_codes_for_rejections_and_usage(tmp_path: Path, capsys: Any) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(dumps(make_trace(3)) + "junk")
    assert cli(["--replay", str(bad)]) == 1
    assert "trace rejected: trace: trailing content" in capsys.readouterr().err
    assert cli(["--replay", str(tmp_path / "missing.json")]) == 2
    assert cli([]) == 2
    assert cli(["--sweep", "9..3"]) == 2
    assert cli(["--seed", "1", "--replay", str(bad)]) == 2
    no_drain = tmp_path / "r.json"
    assert cli(["--seed", "2", "--steps", "6", "--no-drain", "--report", str(no_drain)]) == 1
    assert json.loads(no_drain.read_text())["status"] == "INCOMPLETE"
