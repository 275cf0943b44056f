"""The bench's peak memory per process is the process's own (``VmHWM``), not ``ru_maxrss``,
which Linux carries over from the spawning harness's address space across ``exec``."""

from __future__ import annotations

import os
import subprocess
import sys

from ops.bench.runs import _reap, hwm_kib


def test_a_child_s_peak_is_its_own_not_the_harness_s() -> None:
    held = bytearray(160 << 20)  # this process (the harness) holds 160 MiB
    for i in range(0, len(held), 4096):
        held[i] = 1
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    out: dict[int, tuple[int, int]] = {}
    peaks: dict[int, int] = {}
    [(code, peak_kib)] = _reap([proc], out, peaks, timeout_s=30)
    assert code == 0
    assert 0 < peak_kib < 80 << 10, peak_kib  # a sleeping interpreter, far below 160 MiB
    # what ru_maxrss would have said: at least the harness's resident size at the spawn
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    _pid, _status, usage = os.wait4(child.pid, 0)
    assert usage.ru_maxrss > 160 << 10
    del held


def test_hwm_of_a_live_and_of_a_gone_process() -> None:
    assert hwm_kib(os.getpid()) > 0
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert hwm_kib(proc.pid) == 0
