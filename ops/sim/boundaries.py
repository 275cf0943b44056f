"""The simulator's two boundaries outside the data path: member heartbeats and the source
check's refusal (Kafka deleted records a partition still owes).

Rules
- A ``heartbeat`` step is one tick of the production ``MemberHeartbeat`` of its lifetime,
  after ``HEARTBEAT_INTERVAL_S`` (+1 ms) of logical time (the observer's loop ticks once per
  interval): a live lifetime writes ``running``; a stopped or retired one closes its
  heartbeat once with ``stopped`` / ``retired`` and writes nothing afterwards.
- Oracle rules of a heartbeat (checked after every heartbeat step): it never changes fence
  state (rows, writes, journal) nor its lifetime (state, tokens), whatever its outcome
  (the fence, not the heartbeat, protects the data); the member row holds the state and
  time of the last applied write and is otherwise unchanged; a failed write is not
  retried sooner than one interval later; a final row (stopped, retired) never changes.
- Oracle rules of a refusal (checked after every assign): an assign that ended
  ``refused`` had a partition to refuse (a durable frontier below Kafka's low watermark
  without ``allow_retention_gap``, or another topic id), claimed nothing and retains no
  token of its partitions; an assign with such a partition (and no interleave that could
  have changed it) does not end ``ok``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from consumer.decisions import LifetimeState
from consumer.lifecycle import Lifecycle
from consumer.observability.heartbeat import MemberHeartbeat, MemberIdentity, MemberState
from fencing.types import Token, TopicPartition

if TYPE_CHECKING:
    from ops.sim.checks import Checker

__all__ = ["HEARTBEAT_INTERVAL_S", "Heartbeats", "refusal_rules"]

HEARTBEAT_INTERVAL_S = 0.5
_FINAL = {LifetimeState.STOPPED: MemberState.STOPPED}


class Heartbeats:
    """The member heartbeats of one run's lifetimes (``run``: the runner's ``_Run``)."""

    def __init__(self, run: Any) -> None:
        self._run = run
        self._beats: dict[int, MemberHeartbeat] = {}
        self._failed_at_us: dict[str, int] = {}

    def writes_more(self, worker: int, lc: Lifecycle) -> bool:
        """False once ``worker``'s heartbeat is closed, or will close without a row
        (a lifetime that ended before its first beat still writes its final row)."""
        beat = self._beats.get(worker)
        return beat is None or beat.state not in (MemberState.STOPPED, MemberState.RETIRED)

    def _fence_state(self) -> tuple[Any, ...]:
        store = self._run.store
        return (len(store.writes), len(store.journal_rows), len(store.quarantine),
                tuple(sorted((str(tp), r) for tp, r in store.rows.items())))

    def _life(self, lc: Lifecycle) -> tuple[LifetimeState, tuple[Token | None, ...]]:
        run = self._run
        return lc.state, tuple(lc.token(run.tp(q)) for q in range(run.trace.config.partitions))

    async def tick(self, worker: int, lc: Lifecycle) -> str:
        """One tick of ``worker``'s heartbeat; the outcome the store reported (or
        ``closed`` when nothing is written any more)."""
        run, label = self._run, str(worker)
        beat = self._beats.get(worker)
        if beat is None:
            beat = self._beats[worker] = MemberHeartbeat(
                store=run.store, identity=MemberIdentity(label, "sim", worker),
                clock=run.clock, interval_s=HEARTBEAT_INTERVAL_S, min_gap_s=0.0)
        await run._wait(HEARTBEAT_INTERVAL_S + 0.001)  # due whatever the float rounding
        first = len(run.events)
        fence, life = self._fence_state(), self._life(lc)
        row_before = run.store.members.get(label)
        if lc.state is LifetimeState.LIVE:
            beat.set_state(MemberState.RUNNING)
            await beat.tick()
        else:
            await beat.close(_FINAL.get(lc.state, MemberState.RETIRED))
        mine = [e for e in run.events[first:] if e["operation"] == "heartbeat"]
        self._check(f"attempt {run.attempt_index}", label, lc, mine, row_before, fence, life)
        if mine:
            return str(mine[-1]["observed"])
        return "not-due" if lc.state is LifetimeState.LIVE else "closed"

    def _check(self, place: str, label: str, lc: Lifecycle, mine: Sequence[dict[str, Any]],
               row_before: Any, fence: tuple[Any, ...],
               life: tuple[LifetimeState, tuple[Token | None, ...]]) -> None:
        run, checker = self._run, self._run.checker
        if self._fence_state() != fence:
            checker.fail(place, f"heartbeat of lifetime {label} changed fence state")
        if self._life(lc) != life:
            checker.fail(place, f"heartbeat of lifetime {label} changed the lifetime: "
                                f"{life[0].value} -> {lc.state.value}")
        row = run.store.members.get(label)
        applied = [e for e in mine if e["applied"]]
        if applied:
            want = ("running" if lc.state is LifetimeState.LIVE else
                    _FINAL.get(lc.state, MemberState.RETIRED).value)
            if row is None or row.state != want or round(row.last_seen_s * 1e6) != \
                    applied[-1]["t_us"]:
                checker.fail(place, f"member row of lifetime {label} is {row}, its last "
                                    f"applied heartbeat wrote {want} at "
                                    f"{applied[-1]['t_us']} us")
        elif row != row_before:
            checker.fail(place, f"member row of lifetime {label} changed without an "
                                f"applied heartbeat: {row_before} -> {row}")
        if row_before is not None and row_before.state in ("stopped", "retired") and \
                row != row_before:
            checker.fail(place, f"final member row of lifetime {label} changed: "
                                f"{row_before.state} -> {None if row is None else row.state}")
        for e in mine:
            failed_us = self._failed_at_us.get(label)
            if failed_us is not None and e["t_us"] - failed_us < HEARTBEAT_INTERVAL_S * 1e6:
                checker.fail(place, f"lifetime {label} retried its heartbeat "
                                    f"{(e['t_us'] - failed_us) // 1000} ms after a failure")
            if e["observed"] != "ok":
                self._failed_at_us[label] = e["t_us"]


def refusal_rules(checker: Checker, place: str, *, worker: int, result: str,
                  refusable: Sequence[int], claimed: Sequence[TopicPartition],
                  interleaved: bool, tokens: Sequence[Token | None]) -> None:
    """The refusal rules of one assign (see the module Rules)."""
    if result == "refused":
        if not refusable:
            checker.fail(place, f"assign by lifetime {worker} was refused with nothing to "
                                "refuse")
        if claimed:
            checker.fail(place, f"refused assign by lifetime {worker} claimed "
                                f"{sorted(tp.partition for tp in claimed)}")
        if any(t is not None for t in tokens):
            checker.fail(place, f"refused assign by lifetime {worker} retains a token")
    elif result == "ok" and refusable and not interleaved:
        checker.fail(place, f"assign by lifetime {worker} of partitions {list(refusable)} "
                            "succeeded although their records were deleted unprocessed")
