"""Processes of the local stack: spawn detached, track by pid file, stop by pid.

Rules:
- A service process is started in its own session (it outlives ``fencectl`` and
  pytest) with stdout/stderr appended to its log file.
- A pid file is trusted only while that pid is alive *and* its command line
  contains the service's marker (its data directory or config file), so a recycled
  pid is never signalled.
- Stopping sends one signal, waits up to a bound, then SIGKILL; never by name.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from ops.stack.config import HOST

__all__ = [
    "alive",
    "file_lock",
    "log_tail",
    "port_free",
    "read_pid",
    "spawn",
    "stop_pid",
    "tracked_pid",
    "wait_until",
]

# Popen objects of services started by this process: kept so they are reaped
# (no zombies) when this same process stops them, e.g. at the end of a pytest session.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def spawn(
    argv: Sequence[str],
    *,
    log_path: Path,
    pid_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    user: str | None = None,
) -> int:
    """Start ``argv`` detached (own session), append to ``log_path``, write ``pid_path``.

    Returns the pid. Raises OSError when the executable cannot be started.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            user=user,
            start_new_session=True,
            close_fds=True,
        )
    _CHILDREN[proc.pid] = proc
    pid_path.write_text(f"{proc.pid}\n")
    return proc.pid


def read_pid(pid_path: Path) -> int | None:
    """The pid recorded in ``pid_path``, or None when absent or unreadable."""
    try:
        return int(pid_path.read_text().strip())
    except (OSError, ValueError):
        return None


def _reap(pid: int) -> None:
    proc = _CHILDREN.get(pid)
    if proc is not None and proc.poll() is not None:
        _CHILDREN.pop(pid, None)


def alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie."""
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def tracked_pid(pid_path: Path, *, marker: str) -> int | None:
    """The live pid from ``pid_path`` whose command line contains ``marker``, else None."""
    pid = read_pid(pid_path)
    if pid is None or not alive(pid) or marker not in _cmdline(pid):
        return None
    return pid


def stop_pid(pid: int, *, sig: signal.Signals, grace_s: float, poll_s: float = 0.1,
             signalled: bool = False) -> bool:
    """Send ``sig`` to ``pid`` (unless ``signalled`` already), wait ``grace_s``, then SIGKILL;
    True when it exited gracefully."""
    try:
        if not signalled:
            os.kill(pid, sig)
    except ProcessLookupError:
        return True
    if wait_until(lambda: not alive(pid), timeout_s=grace_s, poll_s=poll_s):
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not alive(pid), timeout_s=10.0, poll_s=poll_s)
    return False


def wait_until(
    predicate: Callable[[], bool],
    *,
    timeout_s: float,
    poll_s: float = 0.2,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Poll ``predicate`` until it is true (True) or ``timeout_s`` has passed (False)."""
    deadline = clock() + timeout_s
    while True:
        if predicate():
            return True
        if clock() >= deadline:
            return False
        sleep(poll_s)


def port_free(port: int, *, host: str = HOST) -> bool:
    """True when nothing listens on ``host:port`` (a bind with SO_REUSEADDR succeeds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def log_tail(path: Path, *, lines: int = 25) -> str:
    """The last ``lines`` lines of ``path`` (empty when it does not exist)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (serialises concurrent ``stack up``/``down``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
