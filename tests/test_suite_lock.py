"""The suite's readers-writer lock (``tests/suite_lock.py``): independent tests side by side,
an exclusive test alone, and a waiting exclusive test not starved by later shared ones.
(``flock`` locks belong to the open file, so threads with their own opens contend like the
xdist workers' processes do.)"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.suite_lock import holding


def _hold(folder: Path, exclusive: bool, log: list[str], name: str, hold_s: float,
          started: threading.Event | None = None) -> threading.Thread:
    def run() -> None:
        with holding(folder, exclusive=exclusive):
            log.append(f"+{name}")
            if started is not None:
                started.set()
            time.sleep(hold_s)
            log.append(f"-{name}")

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_shared_holders_overlap_and_an_exclusive_one_runs_alone(tmp_path: Path) -> None:
    log: list[str] = []
    first = threading.Event()
    a = _hold(tmp_path, False, log, "a", 0.3, first)
    first.wait(5)
    b = _hold(tmp_path, False, log, "b", 0.1)
    b.join(5)
    assert log[:3] == ["+a", "+b", "-b"], log  # b ran beside a
    x = _hold(tmp_path, True, log, "x", 0.1)
    a.join(5)
    x.join(5)
    assert log[3:] == ["-a", "+x", "-x"], log  # x waited for a


def test_a_waiting_exclusive_holder_goes_before_later_shared_ones(tmp_path: Path) -> None:
    log: list[str] = []
    first = threading.Event()
    a = _hold(tmp_path, False, log, "a", 0.4, first)
    first.wait(5)
    x = _hold(tmp_path, True, log, "x", 0.1)
    time.sleep(0.1)  # x waits for a, holding the turnstile
    c = _hold(tmp_path, False, log, "c", 0.0)
    for thread in (a, x, c):
        thread.join(5)
    assert log == ["+a", "-a", "+x", "-x", "+c", "-c"], log
