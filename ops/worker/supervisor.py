"""``fencectl run --processes N``: N worker processes of one group, supervised as one set.

One worker process is bound by one Python thread (consuming, translating and the handler
share its GIL); a host with more cores runs more members. The set is N ``fencectl run``
processes, each its own consumer in the same group, started and watched by one parent.

Rules
- Member ``i`` (0..N-1) is ``python -m ops.cli`` with the parent's own arguments and
  ``FENCE_MEMBER_INDEX=i``, ``FENCE_MEMBERS=N`` in its environment; a process with
  ``FENCE_MEMBER_INDEX`` set runs as a worker, never as another set. With an HTTP port P
  (``--http-port``/``FENCE_HTTP_PORT``) member ``i`` serves ``/metrics``, ``/healthz`` and
  ``/readyz`` on P + i (0 stays 0: any free port each, logged by the member).
- A member whose process ends with a restartable code is started again after a backoff and
  counted: 3 (retired), 5 (unavailable), or killed by a signal (an OOM kill, a SIGKILL: the
  process left no code; the fence keeps each of its batches whole). The backoff is 1 s,
  doubling per consecutive restart to at most 30 s, and back to 1 s for a member that ran
  60 s.
- Any other code (0, 1, 2, 4, 6) ends the set: every other member gets SIGTERM and drains.
- SIGTERM or SIGINT to the parent: SIGTERM to every running member (a member waiting for its
  restart is not started again); each drains within its own ``--shutdown-timeout-s``. A
  member still running ``grace_s`` after the stop began is SIGKILLed and counts as 6; one
  that the stop's SIGTERM ended by the signal's default action (it was still starting: a
  worker handles SIGTERM from before it connects anywhere) counts as 0.
- The set's exit code is the most severe of the codes that ended its members for good
  (a code answered by a restart does not count): 6 > 1 > 4 > 2 > 5 > 3 > 0.
- If the parent dies, every member gets SIGTERM (``PR_SET_PDEATHSIG``): no orphans.
- The decisions (``restartable``, ``most_severe``, ``backoff_s``) are pure; ``Supervisor``
  takes its spawn function, clock and sleep as arguments.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from consumer.exits import ExitCode
from fencing.errors import ConfigError

__all__ = ["MEMBERS_ENV", "MEMBER_ENV", "Member", "Supervisor", "backoff_s", "cores",
           "member_code", "member_index", "members_asked", "most_severe", "restartable",
           "run_set", "spawn_member"]

log = logging.getLogger("fenceworker.processes")

MEMBER_ENV = "FENCE_MEMBER_INDEX"
MEMBERS_ENV = "FENCE_MEMBERS"
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
STEADY_S = 60.0  # a member that ran this long starts its backoff from the first step again
POLL_S = 0.1

_RESTARTABLE = frozenset({ExitCode.RETIRED, ExitCode.UNAVAILABLE})
#: most severe first: abandoned work, a bug, a refused source, configuration, unavailable
_SEVERITY = (ExitCode.SHUTDOWN_TIMEOUT, ExitCode.INTERNAL, ExitCode.SOURCE_REFUSED,
             ExitCode.CONFIG, ExitCode.UNAVAILABLE, ExitCode.RETIRED, ExitCode.OK)


def cores() -> int:
    """The cores this process may run on (its CPU affinity): what ``--processes auto`` is."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def member_index(env: Mapping[str, str]) -> int | None:
    """This process's index in a set (``FENCE_MEMBER_INDEX``), None outside a set."""
    raw = env.get(MEMBER_ENV, "").strip()
    return int(raw) if raw.isdigit() else None


def members_asked(raw: str | None, env: Mapping[str, str]) -> int | None:
    """The members ``--processes`` asks for (``auto``: ``cores()``); None: run as one worker,
    also inside a set (a member never starts another set). Raises ``ConfigError``."""
    if raw is None or member_index(env) is not None:
        return None
    text = str(raw).strip().lower()
    if text == "auto":
        return cores()
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"--processes {raw}: a number of members >= 1, or auto (the cores "
                          "this process may use)")
    return int(text)


def member_code(returncode: int) -> ExitCode:
    """A member's ``Popen.returncode`` as an exit code: killed by a signal (negative) counts
    as 3, a lifetime that ended without saying why; an unknown code as 1."""
    if returncode < 0:
        return ExitCode.RETIRED
    try:
        return ExitCode(returncode)
    except ValueError:
        return ExitCode.INTERNAL


def restartable(returncode: int) -> bool:
    """Whether a member that ended with ``returncode`` is started again (see Rules)."""
    return returncode < 0 or returncode in _RESTARTABLE


def most_severe(codes: Sequence[ExitCode]) -> ExitCode:
    """The set's exit code: the most severe of ``codes`` (0 for none)."""
    return min(codes, key=_SEVERITY.index, default=ExitCode.OK)


def backoff_s(consecutive: int) -> float:
    """Seconds before the ``consecutive``-th restart in a row (1-based) of one member."""
    return min(BACKOFF_FIRST_S * 2 ** max(consecutive - 1, 0), BACKOFF_MAX_S)


class Proc(Protocol):
    """What the supervisor needs of a member process (``subprocess.Popen``)."""

    pid: int

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...


@dataclass(slots=True)
class Member:
    """One member slot of the set: its current process and its restart count."""

    index: int
    proc: Proc | None = None
    started_s: float = 0.0
    restarts: int = 0
    consecutive: int = 0  # restarts in a row without a steady run between them
    restart_at_s: float | None = None
    final: ExitCode | None = None  # the code that ended this member for good


class Supervisor:
    """Starts ``n`` members with ``spawn(index)`` and supervises them; ``run()`` returns
    the set's exit code. ``request_stop()`` is the parent's SIGTERM/SIGINT."""

    def __init__(self, *, n: int, spawn: Callable[[int], Proc], grace_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.members = [Member(i) for i in range(n)]
        self._spawn = spawn
        self._grace_s = grace_s
        self._clock = clock
        self._sleep = sleep
        self._stop_asked = False
        self._stop_deadline_s: float | None = None

    @property
    def restarts(self) -> int:
        return sum(m.restarts for m in self.members)

    def request_stop(self) -> None:
        self._stop_asked = True

    def run(self) -> ExitCode:
        for m in self.members:
            self._start(m)
        while any(m.final is None for m in self.members):
            if self._stop_asked and self._stop_deadline_s is None:
                self._stop("stop requested")
            now = self._clock()
            for m in self.members:
                self._step(m, now)
            if self._stop_deadline_s is not None and now >= self._stop_deadline_s:
                self._kill_stragglers()
            self._sleep(POLL_S)
        code = most_severe([m.final for m in self.members if m.final is not None])
        log.info("set of %d ends with exit %d (%s); members' codes %s; %d restarts",
                 len(self.members), int(code), code.name,
                 [int(m.final) for m in self.members if m.final is not None], self.restarts)
        return code

    def _start(self, m: Member) -> None:
        m.proc = self._spawn(m.index)
        m.started_s, m.restart_at_s = self._clock(), None
        log.info("member %d started (pid %d)%s", m.index, m.proc.pid,
                 f", restart {m.restarts}" if m.restarts else "")

    def _step(self, m: Member, now: float) -> None:
        if m.final is not None:
            return
        if m.proc is None:  # waiting for its restart
            if self._stop_deadline_s is not None:
                m.final = ExitCode.OK  # stopped before it was started again
            elif m.restart_at_s is not None and now >= m.restart_at_s:
                self._start(m)
            return
        rc = m.proc.poll()
        if rc is None:
            return
        pid, m.proc = m.proc.pid, None
        how = f"killed by signal {-rc}" if rc < 0 else f"exited {rc}"
        if self._stop_deadline_s is None and restartable(rc):
            m.consecutive = 1 if now - m.started_s >= STEADY_S else m.consecutive + 1
            m.restarts += 1
            delay = backoff_s(m.consecutive)
            m.restart_at_s = now + delay
            log.warning("member %d (pid %d) %s: restart %d in %.1f s", m.index, pid, how,
                        m.restarts, delay)
            return
        stopped_early = self._stop_deadline_s is not None and rc == -signal.SIGTERM
        m.final = ExitCode.OK if stopped_early else member_code(rc)
        log.log(logging.INFO if rc == 0 else logging.ERROR, "member %d (pid %d) %s", m.index,
                pid, how)
        if self._stop_deadline_s is None:
            self._stop(f"member {m.index} {how}")

    def _stop(self, why: str) -> None:
        self._stop_deadline_s = self._clock() + self._grace_s
        running = [m for m in self.members if m.proc is not None]
        log.info("stopping the set (%s): SIGTERM to %d member(s)", why, len(running))
        for m in running:
            if m.proc is not None:
                _signal(m.proc, signal.SIGTERM)

    def _kill_stragglers(self) -> None:
        for m in self.members:
            if m.proc is not None and m.final is None:
                log.error("member %d (pid %d) still running %.0f s after the stop: SIGKILL "
                          "(counts as exit 6)", m.index, m.proc.pid, self._grace_s)
                _signal(m.proc, signal.SIGKILL)
                m.proc, m.final = None, ExitCode.SHUTDOWN_TIMEOUT


def _signal(proc: Proc, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux ``prctl``)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):
        pass


def spawn_member(argv: Sequence[str], n: int) -> Callable[[int], Proc]:
    """The spawn function of a set: ``python -m ops.cli ARGV`` with the member's index and
    the set's size in its environment, its output the parent's."""

    def spawn(index: int) -> Proc:
        env = dict(os.environ, **{MEMBER_ENV: str(index), MEMBERS_ENV: str(n)})
        return subprocess.Popen([sys.executable, "-m", "ops.cli", *argv], env=env,
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None)

    return spawn


def run_set(argv: Sequence[str] | None, members: int, group: str, *, grace_s: float,
            stop_early: bool = False) -> int:
    """``fencectl run --processes N``: the set of ``members`` started with ``argv`` (the
    command line after ``fencectl``), supervised until it ends; its exit code. SIGTERM and
    SIGINT stop it (``stop_early``: one arrived already)."""
    if argv is None:
        print("fencectl run: --processes needs the command line (run it as fencectl)",
              file=sys.stderr)
        return int(ExitCode.CONFIG)
    sup = Supervisor(n=members, spawn=spawn_member(argv, members), grace_s=grace_s)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _sig, _frame: sup.request_stop())
    if stop_early:
        sup.request_stop()
    log.info("running a set of %d members of group %s", members, group)
    return int(sup.run())
