"""ops.stack.procs with real (harmless) processes: spawn detached, track, stop by pid."""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path

from ops.stack.procs import (
    alive,
    log_tail,
    port_free,
    read_pid,
    spawn,
    stop_pid,
    tracked_pid,
    wait_until,
)

_SLEEPER = "import sys, time; print('ready', sys.argv[1], flush=True); time.sleep(60)"


def _spawn_sleeper(tmp_path: Path, marker: str) -> int:
    return spawn(
        [sys.executable, "-c", _SLEEPER, marker],
        log_path=tmp_path / "svc.log",
        pid_path=tmp_path / "svc.pid",
    )


def test_spawned_process_is_tracked_until_stopped(tmp_path: Path) -> None:
    marker = str(tmp_path / "marker")
    pid = _spawn_sleeper(tmp_path, marker)
    try:
        assert read_pid(tmp_path / "svc.pid") == pid
        # Popen returns once exec closed its CLOEXEC pipe, but the kernel fills the new
        # image's argv (/proc/<pid>/cmdline) a moment later (load_elf_binary sets arg_start
        # after begin_new_exec closes the descriptors): under load the command line can still
        # be empty here. Services are tracked long after they started; wait for the sleeper.
        assert wait_until(lambda: "ready" in log_tail(tmp_path / "svc.log"), timeout_s=10)
        assert tracked_pid(tmp_path / "svc.pid", marker=marker) == pid
        # a pid file whose process does not mention the marker is not trusted
        assert tracked_pid(tmp_path / "svc.pid", marker=str(tmp_path / "other")) is None
        assert log_tail(tmp_path / "svc.log").splitlines()[-1] == f"ready {marker}"
    finally:
        graceful = stop_pid(pid, sig=signal.SIGTERM, grace_s=10)
    assert graceful
    assert not alive(pid)
    assert tracked_pid(tmp_path / "svc.pid", marker=marker) is None


def test_spawned_process_has_its_own_session(tmp_path: Path) -> None:
    import os

    pid = _spawn_sleeper(tmp_path, "session")
    try:
        assert os.getsid(pid) == pid != os.getsid(0)
    finally:
        stop_pid(pid, sig=signal.SIGTERM, grace_s=10)


def test_stop_escalates_to_sigkill_after_grace(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('armed', flush=True); time.sleep(60)"
    )
    pid = spawn([sys.executable, "-c", code], log_path=tmp_path / "l", pid_path=tmp_path / "p")
    assert wait_until(lambda: "armed" in log_tail(tmp_path / "l"), timeout_s=10)
    assert stop_pid(pid, sig=signal.SIGTERM, grace_s=0.5) is False
    assert not alive(pid)


def test_missing_or_garbage_pid_file(tmp_path: Path) -> None:
    assert read_pid(tmp_path / "none.pid") is None
    (tmp_path / "bad.pid").write_text("not a pid")
    assert tracked_pid(tmp_path / "bad.pid", marker="x") is None


def test_port_free_sees_a_listener() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert not port_free(port)
    assert port_free(port)


def test_wait_until_uses_injected_clock_and_sleep() -> None:
    now = [0.0]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += s

    assert not wait_until(
        lambda: False, timeout_s=1.0, poll_s=0.25, clock=lambda: now[0], sleep=sleep
    )
    assert sleeps == [0.25] * 4
    assert wait_until(lambda: True, timeout_s=0, clock=lambda: now[0], sleep=sleep)
