"""Checks of what a ``fencectl`` subprocess printed, shared by the CLI-mistake tests."""

from __future__ import annotations

import subprocess

__all__ = ["one_line"]


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The single line the command printed (stderr), after checking there is nothing else:
    no traceback, nothing on stdout."""
    out = done.stdout + done.stderr
    assert "Traceback" not in out, out[-3000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and not done.stdout.strip(), out[-3000:]
    return lines[0]
