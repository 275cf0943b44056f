"""Member heartbeats: one row per worker lifetime in the ``members`` table, at a bounded rate.

Rules
- A write is due when nothing was written yet, when the wanted state differs from the last
  written one (but never sooner than ``min_gap_s`` after the previous write), or when
  ``interval_s`` passed since the previous write. Otherwise nothing is written.
- After a failed write the next attempt waits ``interval_s`` whatever the state: a store
  outage never turns heartbeats into a tight loop. A failed write raises nothing: the fence,
  not the heartbeat, protects the data.
- Each row stores its own bound: ``detail.heartbeat_interval_s`` and
  ``detail.unavailable_after_s`` (= ``unavailable_factor`` x interval). ``fencectl status``
  reads the bound from the row, so members with different intervals are judged fairly.
- A write returns the group's partitions an operator owns now (a ``fencectl reset`` no
  member has claimed since); when there are any, ``on_operator_owned`` gets them, so the
  lifetime that held one claims it again at its next heartbeat, also when idle.
- ``detail`` given at construction goes into every row (each write replaces the row's
  detail), beside the bound and the state's extra detail.
- ``close`` writes the final state (``stopped`` or ``retired``) once, bounded by
  ``final_timeout_s``.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import socket
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from consumer.observability.readiness import Phase
from fencing.crashpoints import crash_point
from fencing.errors import FenceError
from fencing.types import TopicPartition

__all__ = [
    "HeartbeatStore",
    "MemberHeartbeat",
    "MemberIdentity",
    "MemberState",
    "heartbeat_delay_s",
    "state_for_phase",
]

log = logging.getLogger("fenceworker.heartbeat")


class MemberState(enum.Enum):
    STARTING = "starting"
    WAITING = "waiting"  # joined, no assignment positioned yet
    REBALANCING = "rebalancing"
    RUNNING = "running"  # assignment claimed and positioned
    STOPPING = "stopping"
    STOPPED = "stopped"  # clean exit (final)
    RETIRED = "retired"  # fenced or unresolved: never writes again (final)


_BY_PHASE = {
    Phase.STARTING: MemberState.STARTING,
    Phase.WAITING: MemberState.WAITING,
    Phase.REBALANCING: MemberState.REBALANCING,
    Phase.READY: MemberState.RUNNING,
    Phase.STOPPING: MemberState.STOPPING,
    Phase.RETIRED: MemberState.RETIRED,
}


def state_for_phase(phase: Phase) -> MemberState:
    """The member state shown for a readiness phase."""
    return _BY_PHASE[phase]


def heartbeat_delay_s(
    *,
    now_s: float,
    last_write_s: float | None,
    written: MemberState | None,
    wanted: MemberState,
    interval_s: float,
    min_gap_s: float,
    failed: bool = False,
) -> float:
    """Pure: seconds until the next write is due (0.0: write now). See the module Rules."""
    if last_write_s is None:
        return 0.0
    since = max(0.0, now_s - last_write_s)
    if failed or wanted == written:
        return max(0.0, interval_s - since)
    return max(0.0, min_gap_s - since)


class HeartbeatStore(Protocol):
    """``fencing.postgres.store.PgFenceStore.heartbeat`` (upsert, ``last_seen := now()``;
    returns the group's partitions an operator owns now, ``fencing.store.ResetStore``)."""

    async def heartbeat(self, *, lifetime: str, member_id: str | None, host: str, pid: int,
                        state: str, detail: Mapping[str, Any] | None = None
                        ) -> Collection[TopicPartition] | None: ...


@dataclass(frozen=True, slots=True)
class MemberIdentity:
    lifetime_id: str
    host: str
    pid: int

    @classmethod
    def of_this_process(cls, lifetime_id: str) -> MemberIdentity:
        return cls(lifetime_id=lifetime_id, host=socket.gethostname(), pid=os.getpid())


class MemberHeartbeat:
    """Writes this lifetime's member row when due; the caller's loop calls ``tick()``."""

    def __init__(
        self,
        *,
        store: HeartbeatStore,
        identity: MemberIdentity,
        clock: Callable[[], float],
        member_id: Callable[[], str | None] = lambda: None,
        interval_s: float = 5.0,
        min_gap_s: float = 0.5,
        unavailable_factor: float = 3.0,
        final_timeout_s: float = 2.0,
        detail: Mapping[str, Any] | None = None,
        live_detail: Callable[[], Mapping[str, Any]] | None = None,
        on_operator_owned: Callable[[Collection[TopicPartition]], None] | None = None,
    ) -> None:
        """``detail``: written in every row of this lifetime (e.g. the handler's
        declaration, which ``fencectl status`` reads); ``live_detail``: read at each write
        and added (e.g. the table sink's fields without a column)."""
        if interval_s <= 0 or min_gap_s < 0 or unavailable_factor < 1:
            raise ValueError("heartbeat: interval_s > 0, min_gap_s >= 0, unavailable_factor >= 1")
        self._store = store
        self.identity = identity
        self._clock = clock
        self._member_id = member_id
        self.interval_s = interval_s
        self.min_gap_s = min_gap_s
        self.unavailable_after_s = unavailable_factor * interval_s
        self._final_timeout_s = final_timeout_s
        self._fixed = dict(detail or {})  # written in every row (e.g. the run's handler)
        self._on_operator_owned = on_operator_owned
        self._live = live_detail
        self._wanted = MemberState.STARTING
        self._extra: dict[str, Any] = dict(detail or {})
        self._written: MemberState | None = None
        self._last_write_s: float | None = None
        self._failed = False
        self._closed = False

    @property
    def state(self) -> MemberState:
        return self._wanted

    def set_state(self, state: MemberState, **detail: Any) -> None:
        """Record the wanted state (and extra detail, e.g. ``reason``) for the next write."""
        if self._closed:
            return
        self._wanted = state
        self._extra.update(detail)

    def delay_s(self) -> float:
        return heartbeat_delay_s(
            now_s=self._clock(), last_write_s=self._last_write_s, written=self._written,
            wanted=self._wanted, interval_s=self.interval_s, min_gap_s=self.min_gap_s,
            failed=self._failed)

    async def tick(self) -> bool:
        """Write now if due; True when a row was written."""
        if self._closed or self.delay_s() > 0:
            return False
        return await self._write(self._wanted)

    async def _write(self, state: MemberState) -> bool:
        detail = {**self._fixed, "heartbeat_interval_s": self.interval_s,
                  "unavailable_after_s": self.unavailable_after_s, **self._extra,
                  **(self._live() if self._live is not None else {})}
        self._last_write_s = self._clock()
        try:
            owned = await self._store.heartbeat(
                lifetime=self.identity.lifetime_id, member_id=self._member_id(),
                host=self.identity.host, pid=self.identity.pid, state=state.value,
                detail=detail)
        except FenceError as exc:
            self._failed = True
            log.warning("member heartbeat failed (next try in %.1f s): %s", self.interval_s, exc)
            return False
        self._failed = False
        self._written = state
        if owned and self._on_operator_owned is not None and not self._closed:
            self._on_operator_owned(owned)
        crash_point("in-heartbeat", lifetime=self.identity.lifetime_id, state=state.value)
        return True

    async def close(self, final: MemberState = MemberState.STOPPED, **detail: Any) -> None:
        """Write ``final`` once (bounded by ``final_timeout_s``); later calls do nothing."""
        if self._closed:
            return
        self._extra.update(detail)
        self._wanted = final
        self._closed = True
        try:
            await asyncio.wait_for(self._write(final), timeout=self._final_timeout_s)
        except TimeoutError:
            log.warning("final member heartbeat (%s) timed out", final.value)
