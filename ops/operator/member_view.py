"""Pure view of ``members`` rows for ``fencectl status`` and the replay's handler choice:
is a member observed now, or unavailable?

Rules
- A member row whose state is final (``stopped``, ``retired``) is *observed* in that state
  at any age: a final state is never revised, so it cannot be stale.
- Any other member row is *observed* only while ``now - last_seen`` is within the row's own
  bound (``detail.unavailable_after_s``, else ``default_bound_s``). Past it the member is
  *unavailable*: ``state`` is None and the last row is reported under ``last_observed``,
  never in ``state``.
- ``now`` is the database's clock (read with the rows), so client clock skew cannot make a
  member look alive or dead.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["DEFAULT_BOUND_S", "FINAL_STATES", "Availability", "MemberRow", "MemberView",
           "classify_member"]

FINAL_STATES = frozenset({"stopped", "retired"})
DEFAULT_BOUND_S = 15.0


class Availability(enum.Enum):
    OBSERVED = "observed"  # the state field is current
    UNAVAILABLE = "unavailable"  # no heartbeat within the bound: the state is unknown now


@dataclass(frozen=True, slots=True)
class MemberRow:
    """One ``members`` row as read."""

    lifetime_id: str
    group_id: str
    member_id: str | None
    host: str
    pid: int | None
    state: str
    started_at: datetime
    last_seen: datetime
    detail: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class MemberView:
    lifetime_id: str
    group_id: str
    member_id: str | None
    host: str
    pid: int | None
    started_at: datetime
    availability: Availability
    state: str | None  # current state; None when unavailable
    last_seen_age_s: float
    unavailable_after_s: float
    last_observed: tuple[str, datetime] | None  # (state, at) when unavailable
    detail: Mapping[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "lifetime": self.lifetime_id,
            "group": self.group_id,
            "member_id": self.member_id,
            "host": self.host,
            "pid": self.pid,
            "started_at": self.started_at.isoformat(),
            "availability": self.availability.value,
            "state": self.state,
            "last_seen_age_s": round(self.last_seen_age_s, 3),
            "unavailable_after_s": self.unavailable_after_s,
            "last_observed": None if self.last_observed is None else {
                "state": self.last_observed[0], "at": self.last_observed[1].isoformat()},
            "reason": self.detail.get("reason"),
            "sink_unknown_fields": self.detail.get("sink_unknown_fields") or {},
            "sink_stale_changes": self.detail.get("sink_stale_changes") or {},
        }


def _bound_s(detail: Mapping[str, Any], default_bound_s: float) -> float:
    value = detail.get("unavailable_after_s")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return default_bound_s


def classify_member(
    row: MemberRow, *, now: datetime, default_bound_s: float = DEFAULT_BOUND_S
) -> MemberView:
    """Pure: observed (with its current state) or unavailable (with its last observation)."""
    age_s = max(0.0, (now - row.last_seen).total_seconds())
    bound_s = _bound_s(row.detail, default_bound_s)
    observed = row.state in FINAL_STATES or age_s <= bound_s
    return MemberView(
        lifetime_id=row.lifetime_id,
        group_id=row.group_id,
        member_id=row.member_id,
        host=row.host,
        pid=row.pid,
        started_at=row.started_at,
        availability=Availability.OBSERVED if observed else Availability.UNAVAILABLE,
        state=row.state if observed else None,
        last_seen_age_s=age_s,
        unavailable_after_s=bound_s,
        last_observed=None if observed else (row.state, row.last_seen),
        detail=row.detail,
    )
