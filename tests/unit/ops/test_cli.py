"""fencectl: the subcommand registry and the `stack` command's output and exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ops import cli
from ops.stack.config import PORT_ENV, SERVICE_ENV

ROOT = Path(__file__).resolve().parents[3]
FENCECTL = Path(sys.executable).parent / "fencectl"


def _isolate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FENCE_STACK_DIR", str(tmp_path / "stack"))
    monkeypatch.setenv("FENCE_CACHE_DIR", str(tmp_path / "cache"))
    for i, (name, _default) in enumerate(PORT_ENV.values()):
        monkeypatch.setenv(name, str(42000 + i))


def test_every_registered_module_builds_its_parser() -> None:
    parser = cli.build_parser()
    for action in ("up", "down", "status", "env"):
        args = parser.parse_args(["stack", action])
        assert args.command == "stack" and args.action == action and callable(args.func)


def test_stack_requires_an_action(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["stack"])
    assert exc.value.code == 2


def test_stack_env_prints_export_lines(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _isolate(monkeypatch, tmp_path)
    assert cli.main(["stack", "env"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("=", 1)[0] for line in lines] == [
        f"export {n}" for n in (*SERVICE_ENV, "KAFKA_CONNECT_URL", "FENCE_SOURCE_DSN")]
    assert "export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:42001" in lines


def test_stack_status_of_a_stopped_stack_exits_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _isolate(monkeypatch, tmp_path)
    assert cli.main(["stack", "status"]) == 1
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [r[:2] for r in rows] == [["postgres", "down"], ["kafka", "down"], ["jaeger", "down"],
                                     ["prometheus", "down"], ["registry", "down"]]
    assert rows[0][2:] == ["pid=-", "port=42000"]


def test_bad_port_override_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _isolate(monkeypatch, tmp_path)
    monkeypatch.setenv("FENCE_KAFKA_PORT", "nope")
    assert cli.main(["stack", "env"]) == 2
    assert "FENCE_KAFKA_PORT" in capsys.readouterr().err


def test_console_script_env_configures_a_shell(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _isolate(monkeypatch, tmp_path)
    script = f'eval "$({FENCECTL} stack env)" && echo "$KAFKA_BOOTSTRAP_SERVERS $JAEGER_QUERY_URL"'
    out = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=True, cwd=ROOT
    )
    port = {field: 42000 + i for i, field in enumerate(PORT_ENV)}
    assert out.stdout.split() == [f"127.0.0.1:{port['kafka']}",
                                  f"http://127.0.0.1:{port['jaeger_query']}"]


def test_no_command_takes_an_abbreviated_flag() -> None:
    """A truncated flag is refused, not read as the flag it begins (a docs page or a unit file
    must name flags whole for the docs' flag checks to mean anything)."""
    from ops.cli import build_parser

    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["run", "--topic", "t", "--group", "g",
                                   "--shutdown-timeout", "5"])
    assert refused.value.code == 2
    args = build_parser().parse_args(["run", "--topic", "t", "--group", "g",
                                      "--shutdown-timeout-s", "5"])
    assert args.shutdown_timeout_s == 5
