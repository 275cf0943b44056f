"""The set of ``fencectl run --processes N`` (``ops.worker.supervisor``): its pure decisions,
and the supervision loop driven by fake processes on a logical clock."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

import pytest

from consumer.exits import ExitCode
from ops.worker.supervisor import (
    Supervisor,
    backoff_s,
    member_code,
    member_index,
    most_severe,
    restartable,
)


def test_restartable_codes_are_retired_unavailable_and_signal_deaths() -> None:
    assert [c for c in range(7) if restartable(c)] == [3, 5]
    assert restartable(-signal.SIGKILL) and restartable(-signal.SIGSEGV)


def test_most_severe_orders_abandoned_work_first() -> None:
    assert most_severe([]) is ExitCode.OK
    assert most_severe([ExitCode.OK, ExitCode.RETIRED]) is ExitCode.RETIRED
    assert most_severe([ExitCode.UNAVAILABLE, ExitCode.CONFIG]) is ExitCode.CONFIG
    assert most_severe([ExitCode.CONFIG, ExitCode.SOURCE_REFUSED]) is ExitCode.SOURCE_REFUSED
    assert most_severe([ExitCode.SOURCE_REFUSED, ExitCode.INTERNAL]) is ExitCode.INTERNAL
    assert most_severe([ExitCode.INTERNAL, ExitCode.SHUTDOWN_TIMEOUT, ExitCode.OK]) \
        is ExitCode.SHUTDOWN_TIMEOUT


def test_member_code_and_index() -> None:
    assert member_code(-9) is ExitCode.RETIRED and member_code(2) is ExitCode.CONFIG
    assert member_code(77) is ExitCode.INTERNAL
    assert member_index({"FENCE_MEMBER_INDEX": "3"}) == 3 and member_index({}) is None


def test_backoff_doubles_to_its_bound() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 4, 5, 6, 7)] == [1, 2, 4, 8, 16, 30, 30]


@dataclass
class FakeProc:
    pid: int
    script: list[tuple[float, int]]  # (at logical time, exit code) -- the first one that comes
    clock: FakeClock
    signals: list[int] = field(default_factory=list)
    exit_on_term: int | None = 0  # code once SIGTERM arrived (None: ignores it)
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            for at, code in self.script:
                if self.clock.now >= at:
                    self.returncode = code
                    break
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if self.returncode is not None:
            return
        if sig == signal.SIGKILL:
            self.returncode = -signal.SIGKILL
        elif sig == signal.SIGTERM and self.exit_on_term is not None:
            self.script.insert(0, (self.clock.now + 0.5, self.exit_on_term))


@dataclass
class FakeClock:
    now: float = 0.0

    def sleep(self, s: float) -> None:
        self.now = round(self.now + s, 6)


class Spawner:
    """Member processes from a per-index list of scripts, one per start."""

    def __init__(self, clock: FakeClock, scripts: dict[int, list[list[tuple[float, int]]]],
                 *, ignore_term: set[int] = frozenset(),  # type: ignore[assignment]
                 term_codes: dict[int, int] | None = None) -> None:
        self.clock, self.scripts, self.ignore_term = clock, scripts, ignore_term
        self.term_codes = term_codes or {}  # index -> its code on SIGTERM (default 0)
        self.started: list[tuple[int, float, FakeProc]] = []

    def __call__(self, index: int) -> FakeProc:
        runs = self.scripts.get(index, [])
        script = [(self.clock.now + at, c) for at, c in runs.pop(0)] if runs else []
        proc = FakeProc(1000 + len(self.started), script, self.clock,
                        exit_on_term=None if index in self.ignore_term
                        else self.term_codes.get(index, 0))
        self.started.append((index, self.clock.now, proc))
        return proc


def _supervisor(spawner: Spawner, clock: FakeClock, n: int, *, stop_at: float | None = None,
                grace_s: float = 20.0) -> Supervisor:
    def sleep(s: float) -> None:
        clock.sleep(s)
        if stop_at is not None and clock.now >= stop_at:
            sup.request_stop()

    sup = Supervisor(n=n, spawn=spawner, grace_s=grace_s, clock=lambda: clock.now, sleep=sleep)
    return sup


def test_a_killed_member_is_restarted_with_backoff_and_counted() -> None:
    clock = FakeClock()
    # member 1 is SIGKILLed at 2 s, its restart dies at once (exit 3), the next one runs
    spawner = Spawner(clock, {1: [[(2.0, -9)], [(0.3, 3)], []]})
    sup = _supervisor(spawner, clock, 2, stop_at=30.0)
    assert sup.run() is ExitCode.OK  # the stop drained every member: exit 0
    starts = [(i, round(t, 1)) for i, t, _ in spawner.started]
    assert starts == [(0, 0.0), (1, 0.0), (1, 3.0), (1, 5.3)]  # backoffs of 1 s, then 2 s
    assert [m.restarts for m in sup.members] == [0, 2] and sup.restarts == 2
    assert [p.signals for _, _, p in spawner.started] == [[signal.SIGTERM], [], [],
                                                          [signal.SIGTERM]]


def test_a_non_restartable_code_ends_the_set_with_it() -> None:
    clock = FakeClock()
    spawner = Spawner(clock, {0: [[(1.0, 2)]]})
    sup = _supervisor(spawner, clock, 3)
    assert sup.run() is ExitCode.CONFIG
    assert len(spawner.started) == 3  # nothing restarted
    others = [p for i, _, p in spawner.started if i != 0]
    assert all(p.signals == [signal.SIGTERM] and p.returncode == 0 for p in others)


def test_a_member_that_does_not_drain_is_killed_past_the_grace_and_counts_as_6() -> None:
    clock = FakeClock()
    spawner = Spawner(clock, {}, ignore_term={1})
    sup = _supervisor(spawner, clock, 2, stop_at=1.0, grace_s=5.0)
    assert sup.run() is ExitCode.SHUTDOWN_TIMEOUT
    stuck = spawner.started[1][2]
    assert stuck.signals == [signal.SIGTERM, signal.SIGKILL]
    assert 6.0 <= clock.now <= 6.5


def test_a_member_waiting_for_its_restart_is_not_started_after_a_stop() -> None:
    clock = FakeClock()
    spawner = Spawner(clock, {0: [[(1.0, 5)]]})
    sup = _supervisor(spawner, clock, 1, stop_at=1.5)  # its restart was due at 2.0
    assert sup.run() is ExitCode.OK
    assert len(spawner.started) == 1 and sup.restarts == 1


@pytest.mark.parametrize("ran_s", [0.5, 61.0])
def test_the_backoff_starts_over_after_a_steady_run(ran_s: float) -> None:
    clock = FakeClock()
    spawner = Spawner(clock, {0: [[(0.2, 3)], [(ran_s, 3)], []]})
    sup = _supervisor(spawner, clock, 1, stop_at=ran_s + 10)
    assert sup.run() is ExitCode.OK
    gap = spawner.started[2][1] - (spawner.started[1][1] + ran_s)
    assert gap == pytest.approx(2.0 if ran_s < 60 else 1.0, abs=0.15)


def test_a_member_the_stop_ended_while_it_was_still_starting_counts_as_stopped() -> None:
    clock = FakeClock()
    spawner = Spawner(clock, {}, term_codes={1: -signal.SIGTERM})  # no handler installed yet
    sup = _supervisor(spawner, clock, 2, stop_at=0.5)
    assert sup.run() is ExitCode.OK
    assert [m.final for m in sup.members] == [ExitCode.OK, ExitCode.OK]


def test_processes_flag() -> None:
    from fencing.errors import ConfigError
    from ops.worker.supervisor import cores, members_asked

    assert members_asked(None, {}) is None  # one worker
    assert members_asked("3", {}) == 3 and members_asked("auto", {}) == cores()
    assert members_asked("3", {"FENCE_MEMBER_INDEX": "0"}) is None  # a member: no new set
    for bad in ("0", "-1", "two"):
        with pytest.raises(ConfigError, match="--processes"):
            members_asked(bad, {})


def test_each_member_of_a_set_has_its_own_instance_id() -> None:
    """--processes N with --instance-id: member i is ID-i, so the set's members never share
    one static id (Kafka would fence one with the other); outside a set the id is as given."""
    from ops import cli
    from ops.commands.run import config_from_args

    args = cli.build_parser().parse_args(
        ["run", "--topic", "t", "--group", "g", "--instance-id", "pod-0", "--processes", "2"])
    base = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "FENCE_DSN": "postgresql://x@h/d"}
    assert config_from_args(args, base).instance_id == "pod-0"
    ids = [config_from_args(args, {**base, "FENCE_MEMBER_INDEX": str(i)}).instance_id
           for i in range(2)]
    assert ids == ["pod-0-0", "pod-0-1"]
    plain = cli.build_parser().parse_args(["run", "--topic", "t", "--group", "g"])
    assert config_from_args(plain, {**base, "FENCE_MEMBER_INDEX": "1"}).instance_id is None
