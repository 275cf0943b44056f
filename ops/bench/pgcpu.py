"""PostgreSQL's CPU time, read from ``/proc``: what the database spent on a benchmark run.

Rules
- The server is the one ``FENCE_DSN`` reaches: its postmaster is the parent of the backend
  that answers ``pg_backend_pid()`` (so another cluster on the same machine, e.g. another
  worktree's stack, is never counted). A server on another machine cannot be read: None.
- Its CPU so far is the postmaster's own user + system time, plus the children it already
  reaped (``cutime``/``cstime``: a backend that exits keeps counting), plus every live
  child's user + system time. Two readings bracket a run; their difference is what the
  server spent in between, on every connection (a run's own, and the start-up statements
  of its processes).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from ops.operator.db import connection

__all__ = ["PgCpu"]

_HZ = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (field 3 is index 0)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


async def _postmaster(dsn: str) -> int | None:
    """The parent of this connection's backend, read while the backend lives."""
    async with connection(dsn) as conn:
        fields = _stat(int(await conn.fetchval("SELECT pg_backend_pid()")))
        return None if fields is None else int(fields[1])


class PgCpu:
    """Readings of one local PostgreSQL server's CPU seconds (``seconds()``); ``None`` when
    the server's processes are not readable here."""

    def __init__(self, dsn: str) -> None:
        self.postmaster: int | None = None
        try:
            self.postmaster = asyncio.run(_postmaster(dsn))
        except (OSError, ValueError):
            return

    def seconds(self) -> float | None:
        if self.postmaster is None:
            return None
        own = _stat(self.postmaster)
        if own is None:
            return None
        ticks = sum(int(own[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            fields = _stat(int(d.name))
            if fields is not None and int(fields[1]) == self.postmaster:
                ticks += int(fields[11]) + int(fields[12])
        return ticks / _HZ
