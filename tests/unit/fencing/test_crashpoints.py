"""Crash points: pure parsing, inert when unarmed, and a real process killed at the n-th reach."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fencing import crashpoints
from fencing.crashpoints import POINTS, CrashSpec, parse_spec
from fencing.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("text", "expected"), [
    ("after-claim", CrashSpec("after-claim", 1)),
    ("in-handler@3", CrashSpec("in-handler", 3)),
    (" commit-in-flight@1 ", CrashSpec("commit-in-flight", 1)),
])
def test_parse_spec(text: str, expected: CrashSpec) -> None:
    assert parse_spec(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("after-claims", "unknown crash point 'after-claims'"),
    ("in-handler@0", "@<n> needs a positive integer"),
    ("in-handler@x", "@<n> needs a positive integer"),
    ("in-handler@", "@<n> needs a positive integer"),
])
def test_parse_spec_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_spec(text)


def test_signal_is_kill_or_stop() -> None:
    assert parse_spec("in-handler", signal_name="stop").signal_name == "STOP"
    with pytest.raises(ValueError, match="use KILL or STOP"):
        parse_spec("in-handler", signal_name="TERM")


def test_arming_error_is_a_config_error() -> None:
    armed, error = crashpoints._arm({"FENCE_CRASH_AT": "nowhere"})
    assert armed is None and error is not None and "unknown crash point" in error
    assert crashpoints._arm({}) == (None, None)


def test_unarmed_points_do_nothing() -> None:
    assert os.environ.get("FENCE_CRASH_AT") is None
    assert crashpoints.armed() is None
    for point in POINTS:
        crashpoints.crash_point(point, partition="t[0]")  # returns: this process lives on
    assert not crashpoints.is_armed_for("in-handler")


_SCRIPT = """
import sys
import time
from fencing.crashpoints import crash_point
for i in range(5):
    crash_point("after-validate", i=i)
    crash_point("after-commit", partition="t[0]", epoch=7, i=i)
    print(i, flush=True)
"""


def _run(tmp_path: Path, at: str, signal_name: str = "KILL") -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FENCE_CRASH_AT": at,
           "FENCE_CRASH_SIGNAL": signal_name, "FENCE_CRASH_MARKER": str(tmp_path / "m.jsonl")}
    return subprocess.Popen([sys.executable, "-c", _SCRIPT], env=env, stdout=subprocess.PIPE,
                            text=True)


def test_armed_point_writes_marker_and_kills_at_nth_reach(tmp_path: Path) -> None:
    proc = _run(tmp_path, "after-commit@3")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert out.split() == ["0", "1"]  # killed at the third reach, before printing 2
    (line,) = (tmp_path / "m.jsonl").read_text().splitlines()
    marker = json.loads(line)
    assert marker["point"] == "after-commit" and marker["n"] == 3 and marker["i"] == 2
    assert marker["partition"] == "t[0]" and marker["epoch"] == 7 and marker["pid"] == proc.pid


def test_stop_freezes_at_the_point_and_goes_on_after_sigcont(tmp_path: Path) -> None:
    proc = _run(tmp_path, "after-validate@2", "STOP")
    try:
        marker = tmp_path / "m.jsonl"
        for _ in range(300):
            if marker.exists() and marker.read_text().endswith("\n"):
                break
            time.sleep(0.05)
        # The marker is written before the process signals itself: between
        # the two it still runs, so wait for the stop rather than read the state once.
        state = ""
        for _ in range(300):
            state = Path(f"/proc/{proc.pid}/stat").read_text().split()[2]
            if state == "T":
                break
            time.sleep(0.05)
        assert state == "T", state
        assert proc.poll() is None  # frozen, not exited
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and out.split() == ["0", "1", "2", "3", "4"]
    assert json.loads(marker.read_text())["signal"] == "STOP"


def test_bad_arming_is_refused_by_armed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crashpoints, "_ARMING_ERROR", "FENCE_CRASH_AT 'x': unknown crash point")
    with pytest.raises(ConfigError, match="unknown crash point"):
        crashpoints.armed()


def test_every_point_sits_where_its_description_says() -> None:
    """Each point (worker and tool) is reached by a ``crash_point("<name>"`` call in the
    module its description names, and no call names a point that is not listed."""
    named = {**POINTS, **crashpoints.TOOL_POINTS}
    for point, where in named.items():
        module = where.split(":", 1)[0]
        source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
        assert f'crash_point("{point}"' in source, f"{point}: no call in {module}"
    calls = set()
    for tree in ("consumer", "fencing", "ops"):
        for path in (ROOT / tree).rglob("*.py"):
            calls |= set(re.findall(r'crash_point\(\s*"([\w-]+)"', path.read_text()))
    assert calls == set(named)
