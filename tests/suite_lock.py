"""Tests that share the machine, and tests that must have it alone, under ``pytest -n N``.

Rules
- ``make test`` runs the suite in two pytest-xdist workers. Most tests are independent
  (their own topics, groups, schemas and members) and run beside another test. A test
  marked ``exclusive`` — it stops or freezes a service the other tests share (the schema
  registry), runs on the three-node cluster, or measures the machine — runs alone: it waits
  until the test running beside it has ended, and no test starts beside it until it ends.
- The lock is a readers-writer lock of two ``flock``-ed files in one folder per run
  (``PYTEST_XDIST_TESTRUNUID``): every test passes a turnstile, then holds the main lock
  shared (an independent test) or exclusive (an ``exclusive`` test); an exclusive test
  holds the turnstile until it has the main lock, so tests arriving after it wait behind
  it instead of starving it.
- ``flock`` locks belong to the open file, and the kernel drops them when their process
  dies: a killed worker never leaves the suite locked.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["folder_for_run", "holding"]


def folder_for_run(run_id: str) -> Path:
    """The lock folder shared by every worker of the run ``run_id``."""
    folder = Path(tempfile.gettempdir()) / f"fenceworker-suite-{run_id}"
    folder.mkdir(exist_ok=True)
    return folder


@contextmanager
def holding(folder: Path, *, exclusive: bool) -> Iterator[None]:
    """The suite's lock in ``folder``, shared or exclusive, for the duration of the block."""
    turnstile = os.open(folder / "turnstile", os.O_RDWR | os.O_CREAT, 0o600)
    main = os.open(folder / "main", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(main, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(main, fcntl.LOCK_UN)
    finally:
        os.close(main)
        os.close(turnstile)
