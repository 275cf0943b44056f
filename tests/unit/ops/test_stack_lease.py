"""ops.stack.lease: the last live session stops what sessions started, nothing else."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from ops.stack import lease as stack_lease
from ops.stack.config import Service, StackSettings, settings_from
from ops.stack.procs import stop_pid


def _settings(tmp_path: Path) -> StackSettings:
    return settings_from({"FENCE_STACK_DIR": str(tmp_path / "stack"), "HOME": str(tmp_path)})


def _quiet(_line: str) -> None:
    pass


def test_last_live_lease_stops_session_started_services(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stack_lease.acquire(s)
        stack_lease.acquire(s, pid=other.pid)
        stack_lease.record_started(s, [Service.KAFKA])
        stack_lease.record_started(s, [Service.POSTGRES])
        # another live session still holds a lease: nothing stops
        assert stack_lease.release(s, out=_quiet) == []
    finally:
        stop_pid(other.pid, sig=signal.SIGKILL, grace_s=5)
        other.wait()
    assert stack_lease.release(s, pid=other.pid, out=_quiet) == [
        Service.POSTGRES,
        Service.KAFKA,
    ]
    # the record is consumed: a later session that finds them running leaves them
    assert stack_lease.release(s, out=_quiet) == []


def test_dead_leases_do_not_pin_the_stack(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stack_lease.acquire(s, pid=dead.pid)
    stack_lease.acquire(s)
    stack_lease.record_started(s, [Service.JAEGER])
    assert stack_lease.release(s, out=_quiet) == [Service.JAEGER]


def test_nothing_recorded_means_nothing_stopped(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    stack_lease.acquire(s)
    stack_lease.record_started(s, [])
    assert stack_lease.release(s, out=_quiet) == []
